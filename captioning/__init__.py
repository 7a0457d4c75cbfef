"""Compressed views of images for the text-only verifier: captions, OCR, length limits."""

from captioning.ocr import (
    EasyOCREngine,
    NoOCREngine,
    OCRCache,
    OCREngine,
    OCRItem,
    RapidOCREngine,
    StaticOCR,
    get_ocr_engine,
    render_mathvista,
    render_plain,
)
from captioning.captioner import CAPTION_PROMPT, DrafterCaptioner, compress
from captioning.static import StaticCaptioner
from captioning.truncate import truncate_text
from captioning.view import CompressedView

__all__ = [
    "compress",
    "DrafterCaptioner",
    "CAPTION_PROMPT",
    "CompressedView",
    "OCRItem",
    "OCREngine",
    "NoOCREngine",
    "OCRCache",
    "EasyOCREngine",
    "RapidOCREngine",
    "StaticOCR",
    "StaticCaptioner",
    "get_ocr_engine",
    "render_plain",
    "render_mathvista",
    "truncate_text",
]
