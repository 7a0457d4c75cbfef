"""OCR engines and precomputed OCR results for the compressed view.

The text-only verifier never sees the image; whatever text the image contains reaches it only
through OCR. The package is split by responsibility:

* :mod:`.items`: :class:`OCRItem` (one detected text region: box, text, confidence), reading
  order (:func:`group_lines`, :func:`order_items`) and the text layouts of a result,
  :func:`render_plain` / :func:`render_inline` / :func:`render_mathvista` (:data:`OCR_LAYOUTS`);
* :mod:`.cache`: :class:`OCRCache`, a thread-safe result cache keyed by image content;
* :mod:`.base`: :class:`OCREngine`, the engine interface, and :class:`NoOCREngine`;
* :mod:`.easyocr_weights` and :mod:`.easyocr_engine`: :class:`EasyOCREngine` (what MathVista
  used) and the location and MD5 check of its weights;
* :mod:`.rapidocr_engine`: :class:`RapidOCREngine` (ONNX models inside the wheel, works offline);
* :mod:`.static`: :class:`StaticOCR`, which serves MathVista's precomputed ``ocrs_easyocr.json``;
* :mod:`.selection`: :func:`get_ocr_engine`, engine selection with an actionable error when
  nothing is usable;
* :mod:`.workers`: :class:`ProcessOCREngine`, an engine run in worker processes (beside a decode
  loop: off its interpreter lock, its threads bounded), and :class:`OCRWorkerError`.

Every public name is re-exported here, so ``from captioning.ocr import X`` works for all of them.
"""

from __future__ import annotations

from vision_cache.hashing import image_content_hash

# The OCR path's RGB conversion is the vision path's; kept under its old private name here.
from vision_cache.rgb import to_rgb as _to_rgb

from .base import EASYOCR_OFFLINE_PACKAGE, OCR_INSTALL_HINT, NoOCREngine, OCREngine
from .cache import DEFAULT_OCR_CACHE, OCRCache
from .easyocr_engine import EasyOCREngine
from .easyocr_weights import (
    check_easyocr_weights,
    default_easyocr_model_dir,
    easyocr_required_weights,
    find_easyocr_weights,
    locate_offline_easyocr_weights,
    offline_easyocr_models_dir,
)
from .items import (
    NOMINAL_LINE_HEIGHT,
    OCR_LAYOUTS,
    Box,
    OCRItem,
    Point,
    check_ocr_layout,
    group_lines,
    order_items,
    render_inline,
    render_mathvista,
    render_plain,
    render_text,
)
from .rapidocr_engine import RapidOCREngine
from .selection import get_ocr_engine
from .static import MissingOCRTextError, OCRParseError, StaticOCR, parse_ocr_literal
from .workers import OCRWorkerError, ProcessOCREngine

__all__ = [
    "Box",
    "OCRItem",
    "OCREngine",
    "NoOCREngine",
    "EasyOCREngine",
    "RapidOCREngine",
    "StaticOCR",
    "ProcessOCREngine",
    "OCRWorkerError",
    "OCRCache",
    "OCRParseError",
    "MissingOCRTextError",
    "DEFAULT_OCR_CACHE",
    "EASYOCR_OFFLINE_PACKAGE",
    "OCR_INSTALL_HINT",
    "group_lines",
    "order_items",
    "render_plain",
    "render_inline",
    "render_mathvista",
    "render_text",
    "check_ocr_layout",
    "OCR_LAYOUTS",
    "parse_ocr_literal",
    "image_content_hash",
    "easyocr_required_weights",
    "default_easyocr_model_dir",
    "offline_easyocr_models_dir",
    "check_easyocr_weights",
    "locate_offline_easyocr_weights",
    "find_easyocr_weights",
    "get_ocr_engine",
]
