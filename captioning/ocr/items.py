"""OCR result items and their text forms.

:class:`OCRItem` is one detected text region (box, text, confidence); :func:`group_lines` and
:func:`order_items` put items in reading order; :func:`render_plain`, :func:`render_inline` and
:func:`render_mathvista` are the text forms (layouts) of a result, chosen by name with
:func:`render_text` (:data:`OCR_LAYOUTS`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from captioning.errors import UnknownOptionError
from vision_cache.checks import is_number

__all__ = [
    "NOMINAL_LINE_HEIGHT",
    "OCR_LAYOUTS",
    "Point",
    "Box",
    "OCRItem",
    "group_lines",
    "order_items",
    "render_plain",
    "render_inline",
    "render_mathvista",
    "render_text",
    "check_ocr_layout",
]

# Height assumed for point-only items when no item has a real box (about one line of small
# print in a typical MathVista image).
NOMINAL_LINE_HEIGHT = 10.0

Point = tuple[int, int]
Box = tuple[Point, Point, Point, Point]


def _to_int(value: Any) -> int:
    """``int()`` of a coordinate; truncation matches MathVista's own ``int(...)`` conversion."""
    if not (is_number(value) or isinstance(value, (np.integer, np.floating))):
        raise ValueError(f"box coordinate must be a number, got {value!r}")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise ValueError(f"box coordinate must be finite, got {value!r}")
    return int(value)


def _normalize_box(box: Any) -> Box:
    """Turn 4 ``[x, y]`` corners (any numbers, numpy included) into a tuple of int pairs.

    A single ``[x, y]`` point is accepted as a degenerate box: MathVista's refined OCR strings
    (``[([x, y], 'text'), ...]``) keep only the top-left corner.
    """
    points = list(box) if isinstance(box, (Sequence, np.ndarray)) else None
    if points is None:
        raise ValueError(f"box must be a sequence of [x, y] points, got {box!r}")
    if len(points) == 2 and all(not isinstance(c, (Sequence, np.ndarray)) for c in points):
        point = (_to_int(points[0]), _to_int(points[1]))
        return (point, point, point, point)
    if len(points) != 4:
        raise ValueError(f"box must have 4 corner points, got {len(points)}: {box!r}")
    corners = []
    for p in points:
        if not isinstance(p, (Sequence, np.ndarray)) or len(p) != 2:
            raise ValueError(f"box corner must be [x, y], got {p!r}")
        corners.append((_to_int(p[0]), _to_int(p[1])))
    return (corners[0], corners[1], corners[2], corners[3])


@dataclass(frozen=True)
class OCRItem:
    """One detected text region.

    Attributes:
        box: the 4 corners ``((x, y), ...)`` as ints, clockwise from the top-left corner (the
            order EasyOCR and RapidOCR both use). Any sequence of 4 numeric pairs is accepted
            and normalized; floats are truncated like MathVista's ``int(...)``.
        text: the recognized text.
        confidence: recognition confidence in [0, 1]; 1.0 when the source gives none.
    """

    box: Box
    text: str
    confidence: float = 1.0

    def __post_init__(self) -> None:
        # frozen dataclass: normalize through object.__setattr__ so callers may pass lists,
        # numpy arrays or numpy scalars and still get hashable, comparable items.
        object.__setattr__(self, "box", _normalize_box(self.box))
        object.__setattr__(self, "text", str(self.text))
        object.__setattr__(self, "confidence", float(self.confidence))

    @property
    def top_left(self) -> Point:
        """The first corner, which MathVista's prompt form keeps."""
        return self.box[0]

    @property
    def x_min(self) -> int:
        return min(p[0] for p in self.box)

    @property
    def x_max(self) -> int:
        return max(p[0] for p in self.box)

    @property
    def y_min(self) -> int:
        return min(p[1] for p in self.box)

    @property
    def y_max(self) -> int:
        return max(p[1] for p in self.box)

    @property
    def center_y(self) -> float:
        return (self.y_min + self.y_max) / 2.0

    @property
    def height(self) -> int:
        return self.y_max - self.y_min


def group_lines(items: Iterable[OCRItem], tolerance: float = 0.5) -> list[list[OCRItem]]:
    """Group items into text lines, top to bottom, each line sorted left to right.

    Two items share a line when their vertical centres differ by at most ``tolerance`` times
    the mean of the line's height and the item's height. Comparing centres (not top edges)
    keeps a line together when a detector's boxes jitter by a few pixels or a word has
    ascenders/descenders; scaling by height keeps large and small fonts both working.
    Items without height (MathVista's single-point form) count as high as the median item
    with a height, or :data:`NOMINAL_LINE_HEIGHT` pixels when none has one.
    """
    ordered = sorted(items, key=lambda it: (it.center_y, it.x_min))
    heights = sorted(it.height for it in ordered if it.height > 0)
    default_height = float(heights[len(heights) // 2]) if heights else NOMINAL_LINE_HEIGHT

    def height_of(item: OCRItem) -> float:
        return float(item.height) if item.height > 0 else default_height

    lines: list[list[OCRItem]] = []
    centre = 0.0  # running mean centre of the current line
    height = 0.0  # running mean height of the current line
    for item in ordered:
        if lines:
            limit = tolerance * max((height + height_of(item)) / 2.0, 1.0)
            if abs(item.center_y - centre) <= limit:
                line = lines[-1]
                line.append(item)
                n = len(line)
                centre += (item.center_y - centre) / n
                height += (height_of(item) - height) / n
                continue
        lines.append([item])
        centre, height = item.center_y, height_of(item)
    for line in lines:
        line.sort(key=lambda it: (it.x_min, it.y_min))
    return lines


def order_items(items: Iterable[OCRItem], tolerance: float = 0.5) -> list[OCRItem]:
    """Items in reading order: lines top to bottom (see :func:`group_lines`), then by x."""
    return [item for line in group_lines(items, tolerance) for item in line]


def _line_words(items: Iterable[OCRItem]) -> list[list[str]]:
    """The non-blank texts of each text line (see :func:`group_lines`), blank lines dropped."""
    lines = ([it.text.strip() for it in line if it.text.strip()] for line in group_lines(items))
    return [words for words in lines if words]


def render_plain(items: Iterable[OCRItem]) -> str:
    """Plain text: one text line per output line, items on one line separated by a space."""
    return "\n".join(" ".join(words) for words in _line_words(items))


def render_inline(items: Iterable[OCRItem]) -> str:
    """One line: every item in reading order (lines top to bottom, each left to right), separated by a space.

    The layout of MiniVista's OCR texts, which the tiny pair was trained on (an axis' tick labels read
    ``10 8 6 4 2 0``, not one label per line).
    """
    return " ".join(word for words in _line_words(items) for word in words)


def render_mathvista(items: Iterable[OCRItem]) -> str:
    """MathVista's prompt form of an EasyOCR result: ``[([x, y], 'text'), ...]``.

    Mirrors ``refine_ocr`` of the official MathVista query builder: each item keeps its first
    (top-left) corner as ints and its text, confidences are dropped, the list is written with
    Python's ``str`` (so quoting follows ``repr``), item order is kept as given, and an empty
    result is the empty string.
    """
    pairs = [([it.box[0][0], it.box[0][1]], it.text) for it in items]
    return str(pairs) if pairs else ""


# name -> text form of a result; the layouts a pipeline's ``ocr_layout`` accepts
_RENDERERS = {"plain": render_plain, "inline": render_inline, "mathvista": render_mathvista}
OCR_LAYOUTS = tuple(_RENDERERS)


def check_ocr_layout(layout: str) -> str:
    """``layout`` when it names an OCR text layout of :data:`OCR_LAYOUTS`.

    Raises:
        UnknownOptionError: any other name.
    """
    if layout not in _RENDERERS:
        raise UnknownOptionError(f"Unknown OCR text layout {layout!r}; use {', '.join(repr(n) for n in OCR_LAYOUTS)}.")
    return layout


def render_text(items: Iterable[OCRItem], style: str) -> str:
    """``items`` in the layout ``style``: ``"plain"`` (:func:`render_plain`), ``"inline"``
    (:func:`render_inline`) or ``"mathvista"`` (:func:`render_mathvista`).

    Raises:
        UnknownOptionError: any other ``style``.
    """
    return _RENDERERS[check_ocr_layout(style)](items)
