"""MathVista's query text: :func:`build_query` reproduces ``query.json`` (and ``build_query.py``'s prompt layout);
:func:`mathvista_question` writes a question of the user's in it (``from asymspec_mm import mathvista_question``).

Zero-shot, shot type ``solution``, no caption/OCR in the query: hint line, ``Question: ...`` with
``(Unit: u)``, then ``Choices:`` with ``(A) ...`` lines, stripped. The pipeline gets this query as
the question and the compressed view separately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base.errors import UnknownOptionError
from .questions import check_question

HINTS: dict[str, str] = {
    "multi_choice": "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.",
    "integer": "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end.",
    "float1": "Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final value, e.g., 1.2, 1.3, 1.4, at the end.",
    "float2": "Hint: Please answer the question requiring a floating-point number with two decimal places and provide the final value, e.g., 1.23, 1.34, 1.45, at the end.",
    "list": "Hint: Please answer the question requiring a Python list as an answer and provide the final list, e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.",
    "code": "Hint: Please generate a python code to solve the problem",
}


def hint_text(problem: Mapping[str, Any], shot_type: str = "solution") -> str:
    """MathVista's hint line for a problem (by question/answer type and precision)."""
    if shot_type == "code":
        return HINTS["code"]
    if shot_type != "solution":
        raise UnknownOptionError(f"shot_type={shot_type!r}: expected 'solution' or 'code'")
    if problem.get("question_type") == "multi_choice":
        return HINTS["multi_choice"]
    answer_type = problem.get("answer_type")
    if answer_type == "integer":
        return HINTS["integer"]
    if answer_type == "float":
        precision = problem.get("precision")
        return HINTS["float2"] if precision is not None and int(precision) == 2 else HINTS["float1"]
    if answer_type == "list":
        return HINTS["list"]
    raise UnknownOptionError(f"pid {problem.get('pid')}: no MathVista hint for answer_type={answer_type!r}")


def question_text(problem: Mapping[str, Any]) -> str:
    """``Question: ...`` with `` (Unit: u)`` when the problem has a unit."""
    text = f"Question: {problem['question']}"
    if problem.get("unit"):
        text += f" (Unit: {problem['unit']})"
    return text


def choices_text(choices: Sequence[str] | None) -> str:
    """``Choices:`` followed by one ``(A) text`` line per option (``""`` without choices)."""
    if not choices:
        return ""
    lines = ["Choices:"] + [f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(choices)]
    return "\n".join(lines)


def build_query(
    problem: Mapping[str, Any],
    *,
    layout: str = "query",
    shot_type: str = "solution",
    caption: str = "",
    ocr: str = "",
) -> str:
    """MathVista's query text for one problem.

    ``layout="query"`` (default) reproduces ``query.json`` / the HF ``query`` field: hint,
    question, choices. ``layout="prompt"`` is ``build_query.py``'s zero-shot test prompt:
    question, choices, ``Image description: ...``, ``Image detected text: ...``, hint, then
    ``Solution: `` (or ``Python code: `` for ``shot_type="code"``).
    """
    hint = hint_text(problem, shot_type)
    q = question_text(problem)
    ch = choices_text(problem.get("choices"))
    if layout == "query":
        parts = [hint, q, ch]
    elif layout == "prompt":
        cap = f"Image description: {caption}" if caption else ""
        oc = f"Image detected text: {ocr}" if ocr else ""
        tail = "Solution: " if shot_type == "solution" else "Python code: "
        parts = [q, ch, cap, oc, hint, tail]
    else:
        raise UnknownOptionError(f"layout={layout!r}: expected 'query' or 'prompt'")
    return "\n".join(p for p in parts if p != "").strip()


def mathvista_question(
    question: str, choices: list[str] | tuple[str, ...] | None = None, answer_type: str | None = None, unit: str | None = None
) -> str:
    """``question`` in MathVista's query layout: the hint line, ``Question: ...``, then ``Choices:`` with
    ``(A) ...`` lines. ``choices`` makes it multiple choice; otherwise ``answer_type`` is ``integer``,
    ``float1``, ``float2`` (decimal places) or ``list``. It is how MathVista asks its models, and the only
    layout the bundled tiny pair was trained on.
    """
    question = check_question(question).strip()
    if bool(choices) == bool(answer_type):
        raise UnknownOptionError("give choices (multiple choice) or answer_type (free form: integer, float1, float2, list), one of them")
    if choices:
        problem = {"question": question, "question_type": "multi_choice", "choices": list(choices), "unit": unit}
    else:
        kinds = {"integer": ("integer", None), "float1": ("float", 1), "float2": ("float", 2), "list": ("list", None)}
        if answer_type not in kinds:
            raise UnknownOptionError(f"answer_type={answer_type!r} is not valid; choose one of {', '.join(kinds)}")
        kind, precision = kinds[answer_type]
        problem = {"question": question, "question_type": "free_form", "answer_type": kind, "precision": precision, "unit": unit}
    return build_query(problem)
