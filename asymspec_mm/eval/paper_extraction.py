"""The paper's answer extraction and scoring (the released harness; ``--extract paper``): regular
expressions instead of MathVista's extraction prompt.

Anchor (the part of the response holding the answer; the response is stripped first), the first that applies:

1. ``boxed``: the content of the last ``\\boxed{...}`` (no nested braces);
2. ``final_answer``: what follows the first "final answer" (any case, optional ``:`` or ``-``, spaces,
   optional ``**``) up to the end of the line or a ``*``, stripped, a trailing ``.`` removed;
3. ``answer_is``: the rest of the first line whose text after "answer is" / "answer:" (optional ``**``
   around it) runs to the end of the line without a ``*``, same clean-up;
4. ``last_line``: the last non-empty line.

Multiple choice: ``letter`` (the first standalone capital A-F in the anchor), else ``choice_text`` (the
first choice whose normalised text the normalised anchor starts with or equals), else ``last_letter``
(the last standalone capital A-F anywhere in the response), else ``anchor_prefix`` (the anchor's first
20 characters). Free form: the last number (optional minus sign, optional decimals) in the anchor
(``number_anchor``), else in the response's last line (``number_last_line``), else anywhere
(``number_anywhere``), written without a fractional part when it is whole and as ``%g`` otherwise; else
``anchor_prefix`` (30 characters).

Scoring: :func:`paper_normalize` lower-cases, strips, removes trailing ``.``/``°`` and all whitespace; a
multiple-choice prediction is correct when it is the gold choice's letter (when the gold answer is one of
the choices), any other when its normalised form equals the gold answer's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_BOXED = re.compile(r"\\boxed\{([^{}]+)\}")
_FINAL = re.compile(r"final\s*answer\s*[:\-]?\s*\*{0,2}([^\n*]+)\*{0,2}", re.IGNORECASE)
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\*{0,2}([^\n*]+?)\*{0,2}\s*$", re.IGNORECASE | re.MULTILINE)
_LETTER = re.compile(r"\b([A-F])\b")
_NUMBER = re.compile(r"-?\d+\.?\d*")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class PaperExtraction:
    """An extracted prediction, the anchor it came from, and which rules gave them (``anchor/answer``)."""

    answer: str
    anchor: str
    rule: str


def paper_normalize(value: Any) -> str:
    """Lower-case, strip, drop trailing ``.``/``°`` characters, remove all whitespace."""
    return re.sub(r"\s+", "", str(value).lower().strip().rstrip(".°"))


def find_anchor(response: str) -> tuple[str, str]:
    """``(anchor, rule)`` of a stripped response (see the module docstring)."""
    boxed = _BOXED.findall(response)
    if boxed:
        return boxed[-1], "boxed"
    for pattern, rule in ((_FINAL, "final_answer"), (_ANSWER_IS, "answer_is")):
        m = pattern.search(response)
        if m:
            return m.group(1).strip().rstrip("."), rule
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return (lines[-1] if lines else response.strip()), "last_line"


def _number_text(number: str) -> str:
    """A matched number as the harness writes it: ``3.0`` -> ``3``, ``2.50`` -> ``2.5``, ``-0`` -> ``0``."""
    value = float(number)
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _choice_letter(anchor: str, choices: Sequence[Any]) -> str | None:
    norm = paper_normalize(anchor)
    for i, choice in enumerate(choices):
        c = paper_normalize(choice)
        if norm.startswith(c) or norm == c:
            return _LETTERS[i]
    return None


def paper_extract(response: str, problem: Mapping[str, Any]) -> PaperExtraction:
    """The prediction of ``response`` for ``problem`` (``question_type``, ``choices``) by the paper's rules."""
    text = str(response or "").strip()
    anchor, where = find_anchor(text)
    if problem.get("question_type") == "multi_choice":
        if m := _LETTER.search(anchor):
            return PaperExtraction(m.group(1), anchor, f"{where}/letter")
        if problem.get("choices") and (letter := _choice_letter(anchor, problem["choices"])) is not None:
            return PaperExtraction(letter, anchor, f"{where}/choice_text")
        if letters := _LETTER.findall(text):
            return PaperExtraction(letters[-1], anchor, f"{where}/last_letter")
        return PaperExtraction(anchor[:20], anchor, f"{where}/anchor_prefix")
    for source, rule in ((anchor, "number_anchor"), (text.split("\n")[-1], "number_last_line"), (text, "number_anywhere")):
        if numbers := _NUMBER.findall(source):
            return PaperExtraction(_number_text(numbers[-1]), anchor, f"{where}/{rule}")
    return PaperExtraction(anchor[:30], anchor, f"{where}/anchor_prefix")


def paper_is_correct(prediction: str, problem: Mapping[str, Any]) -> bool:
    """Whether ``prediction`` scores under the paper's rule for ``problem`` (``answer``, ``question_type``, ``choices``)."""
    gold = problem.get("answer")
    choices = problem.get("choices") or []
    if problem.get("question_type") == "multi_choice" and choices and gold in choices:
        return str(prediction).upper() == _LETTERS[list(choices).index(gold)]
    return paper_normalize(prediction) == paper_normalize(gold)


def paper_score(response: str, problem: Mapping[str, Any]) -> tuple[PaperExtraction, bool]:
    """:func:`paper_extract` then :func:`paper_is_correct`."""
    ext = paper_extract(response, problem)
    return ext, paper_is_correct(ext.answer, problem)
