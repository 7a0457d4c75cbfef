"""``asymspec-mm serve``: an OpenAI-compatible HTTP server on the continuous-batching scheduler.

:func:`create_app` builds the FastAPI app for a pipeline, :func:`serve` runs it with uvicorn on a socket
from :func:`bind_socket`, :class:`ServerThread` runs it in the background (tests, notebooks). Lazy, so the
CLI's start-up imports neither FastAPI nor torch.
"""

from __future__ import annotations

from typing import Any

from .net import is_loopback

_LAZY = {
    "create_app": "asymspec_mm.serve.app",
    "bind_socket": "asymspec_mm.serve.server",
    "serve": "asymspec_mm.serve.server",
    "ServerThread": "asymspec_mm.serve.server",
    "RequestError": "asymspec_mm.serve.errors",
}

__all__ = sorted([*_LAZY, "is_loopback"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asymspec_mm.serve' has no attribute {name!r}")
