"""The pipeline facade: :class:`AsymSpecPipeline`, :func:`mm_generate` and the named presets.

The names are loaded on first use, so that importing :mod:`asymspec_mm.pipeline.presets` (e.g. for the CLI's
``--help``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_FACADE = ("AsymSpecPipeline", "MMResult", "Prompts", "mm_generate")
__all__ = list(_FACADE)


def __getattr__(name: str) -> Any:
    if name in _FACADE:
        from . import facade

        return getattr(facade, name)
    raise AttributeError(f"module 'asymspec_mm.pipeline' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .facade import AsymSpecPipeline, MMResult, Prompts, mm_generate
