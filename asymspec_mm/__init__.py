"""asymspec-mm: cross-modal, context-asymmetric speculative decoding (AsymSpec).

A vision-language drafter reads the image; a text-only verifier reads only a compressed view
(caption + OCR). Both share one vocabulary, so the drafter steers the verifier on the output side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "AsymSpecPipeline": "asymspec_mm.pipeline",
    "mm_generate": "asymspec_mm.pipeline",
    "MMResult": "asymspec_mm.pipeline",
    "Prompts": "asymspec_mm.pipeline",
    "AsymSpecConfig": "asymspec_mm.config",
    "GenerationStream": "asymspec_mm.session",
    "Session": "asymspec_mm.session",
    "Request": "asymspec_mm.batch",
    "TokenEvent": "asymspec_mm.decode",
    "mathvista_question": "asymspec_mm.questions",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import asymspec_mm` (e.g. for the CLI's --help) does not import torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asymspec_mm' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .batch import Request
    from .config import AsymSpecConfig
    from .decode import TokenEvent
    from .pipeline import AsymSpecPipeline, MMResult, Prompts, mm_generate
    from .questions import mathvista_question
    from .session import GenerationStream, Session
