"""The browser demo: a Gradio "steering inspector" for AsymSpec (see :mod:`ui.app`).

Importing this package is cheap: Gradio, torch and matplotlib load only when an app is built.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_app", "launch", "add_demo_parser", "render_trace_html", "load_examples"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'ui' has no attribute {name!r}")
