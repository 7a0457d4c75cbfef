"""Precomputed OCR results (MathVista ``ocrs_easyocr.json``), served by problem id."""

from __future__ import annotations

import ast
import threading
from typing import Any

from captioning.errors import AsymSpecError
from captioning.static import MissingStaticTextError, PidTable, TextSource, load_text_table
from vision_cache.checks import is_number

from .items import OCRItem, render_text

__all__ = ["OCRParseError", "MissingOCRTextError", "parse_ocr_literal", "StaticOCR"]


class OCRParseError(AsymSpecError):
    """A stored OCR string is not a literal list of ``(box, text[, confidence])`` entries."""


class MissingOCRTextError(MissingStaticTextError):
    """No precomputed OCR result exists for a problem id."""


_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)
NOT_A_LITERAL = object()


def ocr_literal(text: str) -> Any:
    """``ast.literal_eval(text)`` (stored OCR is data, so never ``eval``), or :data:`NOT_A_LITERAL`."""
    try:
        return ast.literal_eval(text)
    except _LITERAL_ERRORS:
        return NOT_A_LITERAL


def refine_mathvista_ocr(raw: Any) -> str:
    """EasyOCR output -> MathVista's plain OCR text ``[([x, y], 'text'), ...]`` (top-left corner + text), as
    the official ``build_query.py`` forgives it: empty or malformed input gives ``""``.

    ``raw`` is the stored literal or an already parsed list of ``(box, text[, confidence])``; a box is 4
    points or one point. Unlike :func:`parse_ocr_literal` (which validates), nothing raises.
    """
    if raw is None:
        return ""
    items = raw
    if isinstance(raw, str):
        if not raw.strip():
            return ""
        items = ocr_literal(raw)
        if items is NOT_A_LITERAL:
            return ""
    try:
        rows = []
        for item in items:
            box = item[0]
            corner = box[0] if isinstance(box[0], (list, tuple)) else box
            rows.append(([int(corner[0]), int(corner[1])], item[1]))
    except (TypeError, IndexError, ValueError, KeyError, OverflowError):
        return ""
    return str(rows) if rows else ""


def parse_ocr_literal(text: str) -> list[OCRItem]:
    """Parse ``str()`` of an EasyOCR ``readtext`` result into :class:`OCRItem` s.

    The string is read with :func:`ast.literal_eval`, which only accepts Python literals, so a
    crafted entry such as ``"__import__('os').system('x')"`` is rejected rather than run.
    Accepted entries are ``(box, text, confidence)`` and ``(box, text)`` (confidence 1.0),
    where ``box`` is 4 corners or MathVista's single top-left ``[x, y]``. An empty or blank
    string means "no text" (MathVista stores that for some images).

    Raises:
        OCRParseError: not a literal, or not of the above shape.
    """
    if not text.strip():
        return []
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise OCRParseError(f"OCR string is not a Python literal list ({type(exc).__name__}: {exc}): {text[:80]!r}") from exc
    if not isinstance(value, (list, tuple)):
        raise OCRParseError(f"OCR string must hold a list, got {type(value).__name__}: {text[:80]!r}")
    items = []
    for entry in value:
        if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
            raise OCRParseError(f"OCR entry must be (box, text[, confidence]), got {entry!r}")
        box, label = entry[0], entry[1]
        confidence = entry[2] if len(entry) == 3 else 1.0
        if not isinstance(label, str):
            raise OCRParseError(f"OCR entry text must be a string, got {label!r}")
        if not is_number(confidence):
            raise OCRParseError(f"OCR entry confidence must be a number, got {confidence!r}")
        try:
            items.append(OCRItem(box=box, text=label, confidence=confidence))
        except ValueError as exc:
            raise OCRParseError(f"bad OCR box {box!r}: {exc}") from exc
    return items


class StaticOCR(PidTable):
    """Serves precomputed OCR strings (MathVista ``ocrs_easyocr.json``) by problem id.

    Args:
        texts: the parsed JSON (``{"texts": {pid: str}}`` or ``{pid: str}``) or its path.
        fallback: OCR string used for pids without an entry (``""`` = no text); ``None``
            (default) raises :class:`MissingOCRTextError` instead.

    Items keep the recorded order (not re-sorted), so :func:`render_mathvista` of
    :meth:`for_pid` reproduces exactly what MathVista's own query builder puts in prompts.
    Strings are parsed lazily and memoized.
    """

    name = "static"

    def __init__(self, texts: TextSource, fallback: str | None = None) -> None:
        self._texts, self.metadata, self.origin = load_text_table(texts, "OCR")
        if fallback is not None:
            parse_ocr_literal(fallback)  # fail now, not at the first missing pid
        self.fallback = fallback
        self._parsed: dict[str, tuple[OCRItem, ...]] = {}
        self._lock = threading.Lock()

    def raw(self, pid: str | int) -> str:
        """The stored OCR string of ``pid`` (or the fallback when it has none).

        Raises:
            MissingOCRTextError: no entry and no fallback.
        """
        key = str(pid)
        if key in self._texts:
            value = self._texts[key]
            return value if isinstance(value, str) else ""
        if self.fallback is not None:
            return self.fallback
        raise MissingOCRTextError(
            f"No OCR result for pid {key!r} in {self.origin} ({len(self._texts)} entries). "
            "Pass fallback='' to StaticOCR to continue without OCR text, or run an OCR engine "
            "(get_ocr_engine) on the image."
        )

    def for_pid(self, pid: str | int) -> list[OCRItem]:
        """The OCR items of ``pid`` in recorded order.

        Raises:
            MissingOCRTextError: no entry and no fallback.
            OCRParseError: the stored string is malformed.
        """
        raw = self.raw(pid)
        key = str(pid) if str(pid) in self._texts else "\0fallback"
        with self._lock:
            cached = self._parsed.get(key)
        if cached is None:
            try:
                cached = tuple(parse_ocr_literal(raw))
            except OCRParseError as exc:
                raise OCRParseError(f"pid {str(pid)!r} in {self.origin}: {exc}") from exc
            with self._lock:
                self._parsed[key] = cached
        return list(cached)

    def text_for(self, pid: str | int, style: str = "mathvista") -> str:
        """The OCR text of ``pid`` as ``"mathvista"`` (official prompt form) or ``"plain"``."""
        return render_text(self.for_pid(pid), style)
