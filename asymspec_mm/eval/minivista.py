"""MiniVista: a small, deterministic, synthetic benchmark in MathVista's schema.

Every problem is drawn with Pillow from a seeded scene description and comes with its own
*compressed view*: a caption generated from the scene description and the OCR text of what was
drawn (top-to-bottom, left-to-right). Four task families mirror MathVista's:

- ``figure``: bar charts (which bar is tallest/shortest; the value of a bar read from the axis).
  The caption names the chart and its bars' colours but not the values: the view loses the
  decisive numbers, only the pixels have them.
- ``visual``: coloured shapes on a 4x4 grid (a shape's colour, how many shapes, which shape is
  furthest left/right). The caption lists the shape kinds only: colour, count and position are lost.
- ``geometry``: a triangle with two labelled angles, asking for the third. The numbers are printed
  in the figure, so the OCR text carries them and the view is nearly lossless; the answer needs
  arithmetic (180 - p - q).
- ``mixed`` (MathVista's "math word problem"): the sum of two bars of a chart, or how much taller
  one is than the other. It needs both: the values are only in the pixels (as in ``figure``) and
  the answer is arithmetic on them (as in ``geometry``).

Reference responses are short sentences that put the decisive word (a colour, a number, a shape)
early and end in a parsable final answer: ``"The green bar is the tallest, so the answer is (B)."``,
``"Angle C = 180 - 50 - 60 = 70, so the answer is 70."``, ``"Red is 7, blue is 3; 7 + 3 = 10, so the
answer is 10."``; where the decisive word is itself the final value it is not repeated (``"Red is
7."``, ``"There are 3 shapes."``): the answer is the last number.

>>> probs = generate(3, seed=1)
>>> sorted(probs[0])[:4]
['answer', 'answer_type', 'caption', 'choices']
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

FAMILIES = ("figure", "visual", "geometry", "mixed")
FAMILY_TASK = {
    "figure": "figure question answering",
    "visual": "visual question answering",
    "geometry": "geometry problem solving",
    "mixed": "math word problem",
}
TASK_FAMILY = {v: k for k, v in FAMILY_TASK.items()}
CHART_FAMILIES = ("figure", "mixed")  # drawn by the same bar-chart painter
# every answer a `mixed` problem can have: two distinct bar values 1..9 give sums 3..17, differences 1..8
MIXED_ANSWERS = tuple(range(1, 18))

# Seeds used by the bundled tiny pair (see asymspec_mm/tiny/README.md).
TRAIN_SEED = 0
HELDOUT_SEED = 1
EXAMPLES_SEED = 2

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

HINT_CHOICE = "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end."
HINT_INT = "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end."
HINT_FLOAT1 = (
    "Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final value, "
    "e.g., 1.2, 1.3, 1.4, at the end."
)
HINT_FLOAT2 = (
    "Hint: Please answer the question requiring a floating-point number with two decimal places and provide the final value, "
    "e.g., 1.23, 1.34, 1.45, at the end."
)
HINT_LIST = (
    "Hint: Please answer the question requiring a Python list as an answer and provide the final list, "
    "e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end."
)

REQUIRED_KEYS = (
    "pid", "question", "image", "decoded_image", "choices", "unit", "precision", "answer",
    "question_type", "answer_type", "metadata", "query",
)  # fmt: skip
QUESTION_TYPES = ("multi_choice", "free_form")
ANSWER_TYPES = ("text", "integer", "float", "list")

_FONT = None


def _font():
    global _FONT
    if _FONT is None:
        from PIL import ImageFont

        _FONT = ImageFont.load_default_imagefont()  # bitmap font: identical pixels on every machine
    return _FONT


# ---------------------------------------------------------------------------------------------
# MathVista query format
# ---------------------------------------------------------------------------------------------


def build_query(problem: dict[str, Any]) -> str:
    """The query text exactly as MathVista's ``build_query`` writes it (zero-shot, no caption/OCR)."""
    qt, at, prec = problem["question_type"], problem["answer_type"], problem.get("precision")
    if qt == "multi_choice":
        hint = HINT_CHOICE
    elif at == "integer":
        hint = HINT_INT
    elif at == "float" and prec == 1:
        hint = HINT_FLOAT1
    elif at == "float" and prec == 2:
        hint = HINT_FLOAT2
    else:
        hint = HINT_LIST
    question = f"Question: {problem['question']}"
    if problem.get("unit"):
        question += f" (Unit: {problem['unit']})"
    parts = [hint, question]
    if problem.get("choices"):
        parts.append("Choices:\n" + "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(problem["choices"])))
    return "\n".join(parts).strip()


# ---------------------------------------------------------------------------------------------
# Drawing helpers
# ---------------------------------------------------------------------------------------------


class _Canvas:
    """A white 128x128 image that remembers the text it draws (for the OCR text)."""

    def __init__(self):
        from PIL import Image, ImageDraw

        self.image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
        self.draw = ImageDraw.Draw(self.image)
        self.texts: list[tuple[float, float, str]] = []

    def text(self, x: float, y: float, s: str, anchor_center: bool = True) -> None:
        l, t, r, b = _font().getbbox(s)
        w, h = r - l, b - t
        x0, y0 = (x - w / 2, y - h / 2) if anchor_center else (x, y)
        x0 = min(max(0, x0), IMAGE_SIZE - w)
        y0 = min(max(0, y0), IMAGE_SIZE - h)
        self.draw.text((round(x0), round(y0)), s, fill=(0, 0, 0), font=_font())
        self.texts.append((y0 + h / 2, x0, s))

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
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


_NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}


# ---------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------


def _bar_chart(rng: random.Random) -> tuple[_Canvas, list[str], list[int]]:
    """Four bars of distinct colours and distinct values 1..9 over a labelled 0..10 axis."""
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
    for i, (c, v) in enumerate(zip(colors, values)):
        xl = i * BAR_SLOT + 16
        d.rectangle([xl, y0 - v * unit, xl + 13, y0 - 1], fill=COLORS[c])
    return cv, colors, values


def _figure(rng: random.Random) -> dict[str, Any]:
    cv, colors, values = _bar_chart(rng)
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
                scene=dict(colors=colors, values=values))  # fmt: skip


def _mixed(rng: random.Random) -> dict[str, Any]:
    """A bar chart and arithmetic on two of its bars: the values are only in the pixels (the drafter's
    side), the sum or difference is reasoning (the verifier's side, once the values are written out)."""
    cv, colors, values = _bar_chart(rng)
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
                scene=dict(colors=colors, values=values, asked=[colors[i], colors[j]]))  # fmt: skip


def _draw_shape(d, kind: str, cx: float, cy: float, r: float, color) -> None:
    if kind == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif kind == "square":
        s = r * 0.85
        d.rectangle([cx - s, cy - s, cx + s, cy + s], fill=color)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=color)


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
    for cell, k, c in zip(cells, kinds, cols):
        cx = (cell % 4) * 32 + 16 + rng.randint(-2, 2)
        cy = (cell // 4) * 32 + 16 + rng.randint(-2, 2)
        _draw_shape(cv.draw, k, cx, cy, rng.randint(10, 12), COLORS[c])
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
    meta = dict(context="synthetic scene", category="general-vqa", skills=["numeric commonsense" if kind == "count" else "logical reasoning"], kind=kind)
    return dict(rec, image_obj=cv.image, caption=caption, ocr="", response=response, decisive=decisive, meta=meta,
                scene=dict(cells=cells, kinds=kinds, colors=cols))  # fmt: skip


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
    meta = dict(context="geometry diagram", category="math-targeted-vqa", skills=["geometry reasoning", "arithmetic reasoning"], kind="angle")
    return dict(rec, image_obj=cv.image, caption=caption, ocr=ocr, response=response, decisive=str(r), meta=meta,
                scene=dict(angles=angles, unknown=unknown))  # fmt: skip


_BUILDERS = {"figure": _figure, "visual": _visual, "geometry": _geometry, "mixed": _mixed}


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def make_problem(seed: int, index: int, family: str | None = None) -> dict[str, Any]:
    """Problem ``index`` of the set drawn with ``seed`` (deterministic; independent of other indices).

    Families rotate figure, visual, geometry, mixed unless ``family`` is given.
    """
    fam = family or FAMILIES[index % len(FAMILIES)]
    if fam not in _BUILDERS:
        raise ValueError(f"unknown family {fam!r}; expected one of {FAMILIES}")
    rng = random.Random(f"minivista/{seed}/{fam}/{index}")
    raw = _BUILDERS[fam](rng)
    pid = str(index + 1)
    meta = raw["meta"]
    prob: dict[str, Any] = {
        "pid": pid,
        "question": raw["question"],
        "image": f"images/{pid}.png",
        "decoded_image": raw["image_obj"],
        "choices": raw["choices"],
        "unit": None,
        "precision": None,
        "answer": raw["answer"],
        "question_type": raw["question_type"],
        "answer_type": raw["answer_type"],
        "metadata": {
            "split": f"minivista-seed{seed}",
            "language": "english",
            "img_width": IMAGE_SIZE,
            "img_height": IMAGE_SIZE,
            "source": "MiniVista",
            "category": meta["category"],
            "task": FAMILY_TASK[fam],
            "context": meta["context"],
            "grade": "not applicable",
            "skills": meta["skills"],
            "family": fam,
            "kind": meta["kind"],
            "seed": seed,
        },
        "caption": raw["caption"],
        "ocr": raw["ocr"],
        "response": raw["response"],
        "decisive": raw["decisive"],
        "scene": raw["scene"],
    }
    prob["query"] = build_query(prob)
    return prob


def generate(n: int, seed: int = HELDOUT_SEED, families: Iterable[str] | None = None, start: int = 0) -> list[dict[str, Any]]:
    """``n`` problems drawn with ``seed`` (indices ``start..start+n-1``), families rotating."""
    fams = tuple(families) if families is not None else FAMILIES
    for f in fams:
        if f not in _BUILDERS:
            raise ValueError(f"unknown family {f!r}; expected one of {FAMILIES}")
    out = []
    for i in range(start, start + n):
        out.append(make_problem(seed, i, fams[i % len(fams)]))
    return out


def family_of(problem: dict[str, Any]) -> str:
    return problem["metadata"].get("family") or TASK_FAMILY[problem["metadata"]["task"]]


def decisive_token_index(problem: dict[str, Any], tokenizer) -> int | None:
    """Where the decisive token sits in the tokenized reference response: its last occurrence before
    `` so`` (or in the whole response); None when the decisive word is not a single token there."""
    ref = tokenizer(problem["response"], add_special_tokens=False)["input_ids"]
    dec = tokenizer(" " + problem["decisive"], add_special_tokens=False)["input_ids"]
    so = tokenizer(" so", add_special_tokens=False)["input_ids"][0]
    if len(dec) != 1:
        return None
    cut = ref.index(so) if so in ref else len(ref)
    return max((i for i in range(cut) if ref[i] == dec[0]), default=None)


def reading_token_indices(problem: dict[str, Any], tokenizer) -> list[int]:
    """``mixed``: where the two bar readings sit in the tokenized reference response (``"Red is 7, blue
    is 3; ..."``: the values of the two bars asked about, in order); ``[]`` for the other families."""
    if family_of(problem) != "mixed":
        return []
    scene = problem["scene"]
    ref = tokenizer(problem["response"], add_special_tokens=False)["input_ids"]
    idx, start = [], 0
    for colour in scene["asked"]:
        value = scene["values"][scene["colors"].index(colour)]
        start = ref.index(tokenizer(f" {value}", add_special_tokens=False)["input_ids"][0], start)
        idx.append(start)
        start += 1
    return idx


def view_text(problem: dict[str, Any]) -> str:
    """The compressed view the verifier reads (CompressedView(caption, ocr).render())."""
    from captioning.view import CompressedView

    return CompressedView(caption=problem["caption"], ocr_text=problem["ocr"]).render()


def corpus(n: int = 3000, seed: int = TRAIN_SEED) -> list[str]:
    """Text for training the tokenizer: queries, views and responses, plus every number 0..180."""
    texts = []
    for p in generate(n, seed):
        texts.append(view_text(p) + "\n\n" + p["query"] + "\n" + p["response"])
    nums = " ".join(str(i) for i in range(0, 181))
    texts.extend([nums] * 60)
    texts.extend([" ".join(f"({c}) {c}" for c in LETTERS[:4])] * 40)
    return texts


_MC_RE = re.compile(r"answer is \(?([A-H])\)?(?![a-z])")
_NUM_RE = re.compile(r"answer is (-?\d+(?:\.\d+)?)")


def extract_answer(response: str, problem: dict[str, Any]) -> str | None:
    """The final answer of a response in the problem's answer space (choice text or number), or None."""
    if problem["question_type"] == "multi_choice":
        m = _MC_RE.findall(response)
        letter = m[-1] if m else None
        if letter is None:
            m2 = re.findall(r"\(([A-H])\)", response)
            letter = m2[-1] if m2 else None
        if letter is None:
            return None
        i = LETTERS.index(letter)
        return problem["choices"][i] if i < len(problem["choices"]) else None
    m = _NUM_RE.findall(response)
    if not m:
        m = re.findall(r"-?\d+(?:\.\d+)?", response)
    return m[-1] if m else None


def is_correct(response: str, problem: dict[str, Any]) -> bool:
    ans = extract_answer(response, problem)
    if ans is None:
        return False
    if problem["answer_type"] == "integer":
        try:
            return int(float(ans)) == int(problem["answer"])
        except ValueError:
            return False
    return ans.strip() == str(problem["answer"]).strip()


def validate(problem: dict[str, Any]) -> None:
    """Raise ValueError if ``problem`` does not follow MathVista's schema and query format."""
    for k in REQUIRED_KEYS:
        if k not in problem:
            raise ValueError(f"missing key {k!r}")
    if problem["question_type"] not in QUESTION_TYPES:
        raise ValueError(f"bad question_type {problem['question_type']!r}")
    if problem["answer_type"] not in ANSWER_TYPES:
        raise ValueError(f"bad answer_type {problem['answer_type']!r}")
    if problem["question_type"] == "multi_choice":
        if not problem["choices"] or problem["answer"] not in problem["choices"]:
            raise ValueError("multi_choice needs choices containing the answer")
    elif problem["choices"] is not None:
        raise ValueError("free_form problems have choices=None")
    if problem["answer_type"] == "integer":
        int(problem["answer"])
    if problem["query"] != build_query(problem):
        raise ValueError("query does not match MathVista's build_query")
    for k in ("task", "context", "category", "source", "split", "language", "skills"):
        if k not in problem["metadata"]:
            raise ValueError(f"metadata lacks {k!r}")


def to_record(problem: dict[str, Any]) -> dict[str, Any]:
    """A JSON-serialisable copy (no PIL image)."""
    return {k: v for k, v in problem.items() if k != "decoded_image"}


def example_problems(n: int = 10, seed: int = EXAMPLES_SEED) -> list[dict[str, Any]]:
    """The first problem of each question kind drawn with ``seed`` (families rotating), at most ``n``."""
    seen, out, i = set(), [], 0
    while len(out) < n and i < 1000:
        p = make_problem(seed, i)
        key = (family_of(p), p["metadata"]["kind"])
        if key not in seen:
            seen.add(key)
            out.append(p)
        i += 1
    return out


def write_examples(out_dir, n: int = 10, seed: int = EXAMPLES_SEED) -> list[dict[str, Any]]:
    """Write :func:`example_problems` as PNGs plus ``examples.json``: a list of
    ``{image, question, caption, ocr, answer, family, kind, pid, seed}`` (``question`` is the MathVista query)."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = []
    for p in example_problems(n, seed):
        fam = family_of(p)
        name = f"minivista_{fam}_{p['pid']}.png"
        p["decoded_image"].save(out / name, format="PNG")
        items.append({"image": name, "question": p["query"], "caption": p["caption"], "ocr": p["ocr"],
                      "answer": p["answer"], "family": fam, "kind": p["metadata"]["kind"], "pid": p["pid"], "seed": seed})  # fmt: skip
    (out / "examples.json").write_text(json.dumps(items, indent=1, ensure_ascii=False) + "\n")
    return items
