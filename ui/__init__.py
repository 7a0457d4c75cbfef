"""The browser demo: a Gradio "steering inspector" for AsymSpec (see :mod:`ui.app`).

Modules: :mod:`ui.app` (the page), :mod:`ui.render` (HTML and charts), :mod:`ui.examples`,
:mod:`ui.jobs` (request handling) and :mod:`ui.serve` (launching, the ``demo`` sub-command).
Importing this package is cheap: Gradio, torch and matplotlib load only when an app is built.
"""

from __future__ import annotations

import os
from typing import Any

# Gradio reads this when it is imported, which any part of the package may do first.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

__all__ = ["build_app", "launch", "add_demo_parser", "render_trace_html", "load_examples"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'ui' has no attribute {name!r}")
