"""MiniVista's scenes: each family's seeded drawing and the question, caption, OCR text and reference
response that go with it (:data:`BUILDERS`; :mod:`asymspec_mm.eval.minivista` wraps them into MathVista
records).

A family's drawing and its wording stay in one function: both draw from the same seeded ``rng`` in a
fixed order, so separating them would reorder the draws and change every problem.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

IMAGE_SIZE = 128
# Four colours, always offered as choices in this order (like MathVista's fixed option lists), so
# a colour maps to one option letter; the shapes likewise.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 30),
}
SHAPES = ("circle", "square", "triangle")
LETTERS = "ABCDEFGH"
BAR_SLOT = IMAGE_SIZE // 4  # figure: one bar per 32-px column


# ---------------------------------------------------------------------------------------------
# Drawing helpers
# ---------------------------------------------------------------------------------------------

_FONT = None


def _font():
    """The text font, loaded once."""
    global _FONT
    if _FONT is None:
        from PIL import ImageFont

        _FONT = ImageFont.load_default_imagefont()  # bitmap font: identical pixels on every machine
    return _FONT


class _Canvas:
    """A white 128x128 image that remembers the text it draws (for the OCR text) and where (``labels``: each
    string and its box ``[x0, y0, x1, y1]`` in pixels, x1 and y1 exclusive)."""

    def __init__(self):
        from PIL import Image, ImageDraw

        self.image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
        self.draw = ImageDraw.Draw(self.image)
        self.texts: list[tuple[float, float, str]] = []
        self.labels: list[tuple[str, list[float]]] = []

    def text(self, x: float, y: float, s: str, anchor_center: bool = True) -> None:
        left, top, right, bottom = _font().getbbox(s)
        w, h = right - left, bottom - top
        x0, y0 = (x - w / 2, y - h / 2) if anchor_center else (x, y)
        x0 = min(max(0, x0), IMAGE_SIZE - w)
        y0 = min(max(0, y0), IMAGE_SIZE - h)
        self.draw.text((round(x0), round(y0)), s, fill=(0, 0, 0), font=_font())
        self.texts.append((y0 + h / 2, x0, s))
        self.labels.append((s, [round(x0), round(y0), round(x0) + w, round(y0) + h]))

    def ocr(self) -> str:
        """Drawn strings in reading order: rows (text centres within 6 px) top to bottom, then left to right."""
        items = sorted(self.texts)
        rows: list[list[tuple[float, float, str]]] = []
        for it in items:
            if rows and abs(it[0] - rows[-1][0][0]) <= 6:
                rows[-1].append(it)
            else:
                rows.append([it])
        return " ".join(s for row in rows for _, _, s in sorted(row, key=lambda r: r[1]))


def _join(words: Sequence[str]) -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


# ---------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------


def _bar_chart(rng: random.Random) -> tuple[_Canvas, list[str], list[int], list[list[float]]]:
    """Four bars of distinct colours and distinct values 1..9 over a labelled 0..10 axis; the last item is each
    bar's box ``[x0, y0, x1, y1]`` (pixels, x1 and y1 exclusive), in the order of the colours."""
    n = 4
    colors = rng.sample(list(COLORS), n)
    values = rng.sample(range(1, 10), n)  # distinct, so tallest/shortest is unique
    cv = _Canvas()
    d = cv.draw
    y0, unit = 116, 10  # value v -> top at y0 - v*unit; the axis spans 0..10
    x_axis = 13
    d.line([(x_axis, y0), (126, y0)], fill=(0, 0, 0))
    d.line([(x_axis, y0), (x_axis, y0 - 10 * unit)], fill=(0, 0, 0))
    for v in range(0, 11, 2):
        y = y0 - v * unit
        d.line([(x_axis - 3, y), (x_axis, y)], fill=(0, 0, 0))
        cv.text(x_axis - 8, y, str(v))
    # bar i fills the middle of the image's i-th 32-px column (one column of image tokens), so every
    # bar is seen whole by one column of merged patches
    boxes = []
    for i, (c, v) in enumerate(zip(colors, values)):
        xl = i * BAR_SLOT + 16
        d.rectangle([xl, y0 - v * unit, xl + 13, y0 - 1], fill=COLORS[c])
        boxes.append([xl, y0 - v * unit, xl + 14, y0])  # the rectangle's corners are inclusive
    return cv, colors, values, boxes


def _figure(rng: random.Random) -> dict[str, Any]:
    cv, colors, values, boxes = _bar_chart(rng)
    caption = f"A bar chart with {_join(colors)} bars."
    kind = rng.choice(["tallest", "shortest", "value"])
    if kind in ("tallest", "shortest"):
        idx = values.index(max(values) if kind == "tallest" else min(values))
        choices = list(COLORS)
        letter = LETTERS[choices.index(colors[idx])]
        question = f"Which bar is the {kind}?"
        response = f"The {colors[idx]} bar is the {kind}, so the answer is ({letter})."
        rec = dict(question=question, choices=choices, answer=colors[idx], question_type="multi_choice", answer_type="text")
        decisive = colors[idx]
    else:
        idx = rng.randrange(len(colors))
        question = f"What is the value of the {colors[idx]} bar?"
        response = f"{colors[idx].capitalize()} is {values[idx]}."  # the colour word keys the reading, as in `mixed`
        rec = dict(question=question, choices=None, answer=str(values[idx]), question_type="free_form", answer_type="integer")
        decisive = str(values[idx])
    meta = dict(context="bar chart", category="math-targeted-vqa", skills=["statistical reasoning"], kind=kind)
    return dict(rec, image_obj=cv.image, caption=caption, ocr=cv.ocr(), response=response, decisive=decisive, meta=meta,
                scene=dict(colors=colors, values=values, boxes=boxes, labels=cv.labels))  # fmt: skip


def _mixed(rng: random.Random) -> dict[str, Any]:
    """A bar chart and arithmetic on two of its bars: the values are only in the pixels (the drafter's
    side), the sum or difference is reasoning (the verifier's side, once the values are written out)."""
    cv, colors, values, boxes = _bar_chart(rng)
    i, j = rng.sample(range(len(colors)), 2)
    kind = rng.choice(["sum", "difference"])
    if kind == "difference" and values[i] < values[j]:
        i, j = j, i  # "how much taller": the taller bar first, so the answer is positive
    x, y = values[i], values[j]
    if kind == "sum":
        question = f"What is the sum of the {colors[i]} bar and the {colors[j]} bar?"
        r, work = x + y, f"{x} + {y} = {x + y}"
    else:
        question = f"How much taller is the {colors[i]} bar than the {colors[j]} bar?"
        r, work = x - y, f"{x} - {y} = {x - y}"
    # the two readings come first (tokens 3 and 7: draft positions, not the first step's bonus position)
    response = f"{colors[i].capitalize()} is {x}, {colors[j]} is {y}; {work}, so the answer is {r}."
    rec = dict(question=question, choices=None, answer=str(r), question_type="free_form", answer_type="integer")
    caption = f"A bar chart with {_join(colors)} bars."
    meta = dict(context="bar chart", category="math-targeted-vqa", skills=["statistical reasoning", "arithmetic reasoning"], kind=kind)
    return dict(rec, image_obj=cv.image, caption=caption, ocr=cv.ocr(), response=response, decisive=str(r), meta=meta,
                scene=dict(colors=colors, values=values, asked=[colors[i], colors[j]], boxes=boxes, labels=cv.labels))  # fmt: skip


def _draw_shape(d, kind: str, cx: float, cy: float, r: float, color) -> list[float]:
    """Draw one shape; returns its box ``[x0, y0, x1, y1]`` (the pixels it fills, x1 and y1 exclusive)."""
    if kind == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
        return [cx - r, cy - r, cx + r + 1, cy + r + 1]
    if kind == "square":
        s = r * 0.85
        d.rectangle([cx - s, cy - s, cx + s, cy + s], fill=color)
        return [math.floor(cx - s), math.floor(cy - s), math.floor(cx + s) + 1, math.floor(cy + s) + 1]  # PIL floors them
    d.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=color)
    return [cx - r, cy - r, cx + r + 1, math.floor(cy + r * 0.8) + 1]


def _visual(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["color", "count", "leftmost", "rightmost"])
    while True:
        n = rng.randint(2, 5) if kind == "count" else rng.randint(2, 4)
        cells = rng.sample(range(16), n)  # 4x4 grid of 32-px cells (one image token each)
        kinds = [rng.choice(SHAPES) for _ in range(n)]
        cols = [rng.choice(list(COLORS)) for _ in range(n)]
        xs = [c % 4 for c in cells]
        if kind == "color":
            uniq = [k for k in SHAPES if kinds.count(k) == 1]
            if uniq:
                target = rng.choice(uniq)
                break
        elif kind in ("leftmost", "rightmost"):
            ext = min(xs) if kind == "leftmost" else max(xs)
            if xs.count(ext) == 1:
                target = kinds[xs.index(ext)]
                break
        else:
            break
    cv = _Canvas()
    boxes = []
    for cell, k, c in zip(cells, kinds, cols):
        cx = (cell % 4) * 32 + 16 + rng.randint(-2, 2)
        cy = (cell // 4) * 32 + 16 + rng.randint(-2, 2)
        boxes.append(_draw_shape(cv.draw, k, cx, cy, rng.randint(10, 12), COLORS[c]))
    present = [k for k in SHAPES if k in kinds]
    caption = f"Colored shapes, including {_join(['a ' + k for k in present])}."
    if kind == "color":
        true = cols[kinds.index(target)]
        choices = list(COLORS)
        question = f"What color is the {target}?"
        response = f"The {target} is {true}, so the answer is ({LETTERS[choices.index(true)]})."
        rec = dict(question=question, choices=choices, answer=true, question_type="multi_choice", answer_type="text")
        decisive = true
    elif kind == "count":
        question = "How many shapes are there?"
        response = f"There are {n} shapes."
        rec = dict(question=question, choices=None, answer=str(n), question_type="free_form", answer_type="integer")
        decisive = str(n)
    else:
        choices = list(SHAPES)
        side = "left" if kind == "leftmost" else "right"
        question = f"Which shape is furthest to the {side}?"
        response = f"The {target} is the {kind} shape, so the answer is ({LETTERS[choices.index(target)]})."
        rec = dict(question=question, choices=choices, answer=target, question_type="multi_choice", answer_type="text")
        decisive = target
    meta = dict(
        context="synthetic scene",
        category="general-vqa",
        skills=["numeric commonsense" if kind == "count" else "logical reasoning"],
        kind=kind,
    )
    return dict(rec, image_obj=cv.image, caption=caption, ocr="", response=response, decisive=decisive, meta=meta,
                scene=dict(cells=cells, kinds=kinds, colors=cols, boxes=boxes))  # fmt: skip


def _geometry(rng: random.Random) -> dict[str, Any]:
    while True:
        a = rng.randrange(30, 90, 10)  # base angles of the drawn triangle (A left, B right), C at the top
        b = rng.randrange(30, 90, 10)
        c = 180 - a - b
        if c >= 20:
            break
    ta, tb = math.tan(math.radians(a)), math.tan(math.radians(b))
    px, h = tb / (ta + tb), tb * ta / (ta + tb)  # apex for a unit base
    base = min(96.0, 88.0 / h) if h > 0 else 96.0
    x0 = (IMAGE_SIZE - base) / 2 + rng.randint(-4, 4)
    yb = 104 + rng.randint(-3, 3)
    A, B, C = (x0, yb), (x0 + base, yb), (x0 + px * base, yb - h * base)
    cv = _Canvas()
    cv.draw.polygon([A, B, C], outline=(0, 0, 0))
    cv.text(A[0] - 6, A[1] + 7, "A")
    cv.text(B[0] + 6, B[1] + 7, "B")
    cv.text(C[0], C[1] - 8, "C")
    angles = {"A": a, "B": b, "C": c}
    unknown = rng.choice("ABC")
    known = [v for v in "ABC" if v != unknown]
    cx, cy = (A[0] + B[0] + C[0]) / 3, (A[1] + B[1] + C[1]) / 3
    for v, P in zip("ABC", (A, B, C)):
        if v in known:  # the value sits inside the angle, a little towards the centroid
            dx, dy = cx - P[0], cy - P[1]
            nrm = math.hypot(dx, dy) or 1.0
            cv.text(P[0] + dx / nrm * 17, P[1] + dy / nrm * 13, f"{angles[v]}°")
    ocr = cv.ocr()
    # the work quotes the two printed values in reading order, so the OCR text alone determines it
    p, q = sorted((angles[v] for v in known), key=lambda val: ocr.find(f"{val}°"))
    r = angles[unknown]
    question = f"As shown in the figure, what is the measure of angle {unknown}?"
    work = f"Angle {unknown} = 180 - {p} - {q} = {r}"
    response = f"{work}, so the answer is {r}."
    rec = dict(question=question, choices=None, answer=str(r), question_type="free_form", answer_type="integer")
    caption = "A triangle ABC with two marked angles."
    meta = dict(
        context="geometry diagram", category="math-targeted-vqa", skills=["geometry reasoning", "arithmetic reasoning"], kind="angle"
    )
    return dict(rec, image_obj=cv.image, caption=caption, ocr=ocr, response=response, decisive=str(r), meta=meta,
                scene=dict(angles=angles, unknown=unknown, labels=cv.labels))  # fmt: skip


# family -> builder: ``builder(rng)`` gives the raw problem (question, choices, answer, types, image_obj,
# caption, ocr, response, decisive, meta, scene)
BUILDERS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "figure": _figure,
    "visual": _visual,
    "geometry": _geometry,
    "mixed": _mixed,
}
