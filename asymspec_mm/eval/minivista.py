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

Each family's scene (drawing and wording) is in :mod:`asymspec_mm.eval.minivista_scenes`; this module
makes MathVista records of them, and holds the query format, the answer check and the schema check.

>>> probs = generate(3, seed=1)
>>> sorted(probs[0])[:4]
['answer', 'answer_type', 'caption', 'choices']
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Any

# the scene constants are part of this module's API (colours and shapes in choice order, option letters)
from .minivista_scenes import BAR_SLOT, BUILDERS, COLORS, IMAGE_SIZE, LETTERS, SHAPES  # noqa: F401 - re-exported: tiny.data and the tests read them here

FAMILIES = ("figure", "visual", "geometry", "mixed")
FAMILY_TASK = {
    "figure": "figure question answering",
    "visual": "visual question answering",
    "geometry": "geometry problem solving",
    "mixed": "math word problem",
}
TASK_FAMILY = {v: k for k, v in FAMILY_TASK.items()}
# a report's column of a MiniVista task where MathVista's short name would misname the family: `mixed` is
# arithmetic on a chart's bars, not a word problem ("MWP"); the other families are what their task says
REPORT_LABELS = {FAMILY_TASK["mixed"]: "mixed"}
CHART_FAMILIES = ("figure", "mixed")  # drawn by the same bar-chart painter
# every answer a `mixed` problem can have: two distinct bar values 1..9 give sums 3..17, differences 1..8
MIXED_ANSWERS = tuple(range(1, 18))

# Seeds used by the bundled tiny pair (see asymspec_mm/tiny/README.md).
TRAIN_SEED = 0
HELDOUT_SEED = 1
EXAMPLES_SEED = 2

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
# Public API
# ---------------------------------------------------------------------------------------------


def make_problem(seed: int, index: int, family: str | None = None) -> dict[str, Any]:
    """Problem ``index`` of the set drawn with ``seed`` (deterministic; independent of other indices).

    Families rotate figure, visual, geometry, mixed unless ``family`` is given. ``family="agent"`` (not in the rotation):
    a task that needs a tool call, in its own shape (:func:`~asymspec_mm.eval.minivista_agent.make_agent_problem`).
    """
    if family == "agent":
        from .minivista_agent import make_agent_problem

        return make_agent_problem(seed, index)
    fam = family or FAMILIES[index % len(FAMILIES)]
    if fam not in BUILDERS:
        raise ValueError(f"unknown family {fam!r}; expected one of {FAMILIES}")
    rng = random.Random(f"minivista/{seed}/{fam}/{index}")
    raw = BUILDERS[fam](rng)
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
        if f not in BUILDERS:
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
