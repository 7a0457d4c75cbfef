"""asymspec-mm: cross-modal, context-asymmetric speculative decoding (AsymSpec).

A vision-language drafter reads the image; a text-only verifier reads only a compressed view
(caption + OCR). Both share one vocabulary, so the drafter steers the verifier on the output side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "AsymSpecPipeline": "asymspec_mm.pipeline.facade",
    "mm_generate": "asymspec_mm.pipeline.facade",
    "MMResult": "asymspec_mm.pipeline.facade",
    "Prompts": "asymspec_mm.pipeline.facade",
    "AsymSpecConfig": "asymspec_mm.base.config",
    "GenerationStream": "asymspec_mm.request.session",
    "Session": "asymspec_mm.request.session",
    "Request": "asymspec_mm.request.request",
    "Compression": "asymspec_mm.request.compression",
    "TokenEvent": "asymspec_mm.decode",
    "mathvista_question": "asymspec_mm.request.mathvista_query",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import asymspec_mm` (e.g. for the CLI's --help) does not import torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asymspec_mm' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .base.config import AsymSpecConfig
    from .decode import TokenEvent
    from .pipeline.facade import AsymSpecPipeline, MMResult, Prompts, mm_generate
    from .request.compression import Compression
    from .request.mathvista_query import mathvista_question
    from .request.request import Request
    from .request.session import GenerationStream, Session
