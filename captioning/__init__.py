"""Compressed views of images for the text-only verifier: captions, OCR, length limits.

Names are imported on first use, so that importing a light submodule (``captioning.errors``,
which :mod:`asymspec_mm.base.errors` re-exports) does not pull in numpy, Pillow and the OCR engines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "compress": "captioning.captioner",
    "Captioner": "captioning.captioner",
    "CaptionCache": "captioning.captioner",
    "CAPTION_PROMPT": "captioning.captioner",
    "CompressedView": "captioning.view",
    "OCRItem": "captioning.ocr",
    "OCREngine": "captioning.ocr",
    "NoOCREngine": "captioning.ocr",
    "OCRCache": "captioning.ocr",
    "EasyOCREngine": "captioning.ocr",
    "RapidOCREngine": "captioning.ocr",
    "StaticOCR": "captioning.ocr",
    "StaticCaptioner": "captioning.static",
    "get_ocr_engine": "captioning.ocr",
    "render_plain": "captioning.ocr",
    "render_inline": "captioning.ocr",
    "render_mathvista": "captioning.ocr",
    "truncate_text": "captioning.truncate",
}

_SUBMODULES = frozenset({"captioner", "errors", "ocr", "static", "truncate", "view"})

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"captioning.{name}")
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


if TYPE_CHECKING:  # pragma: no cover
    from captioning.captioner import CAPTION_PROMPT, CaptionCache, Captioner, compress
    from captioning.ocr import (
        EasyOCREngine,
        NoOCREngine,
        OCRCache,
        OCREngine,
        OCRItem,
        RapidOCREngine,
        StaticOCR,
        get_ocr_engine,
        render_inline,
        render_mathvista,
        render_plain,
    )
    from captioning.static import StaticCaptioner
    from captioning.truncate import truncate_text
    from captioning.view import CompressedView
