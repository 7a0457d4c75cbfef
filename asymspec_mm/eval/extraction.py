"""Answer extraction for MathVista-style responses.

Two extractors, both returning the *extraction* string that :mod:`.scoring` then normalises:

* :func:`rule_extract` - deterministic rules, no model: ``\\boxed{...}``, "the answer is ..." /
  "Answer: ..." anchors, option letters ("(B)", "B", "Answer: B", "option B") or the option's
  text for multiple choice, the last number (commas, negatives, decimals, simple fractions) for
  free-form questions, and a Python-style list for list answers.
* :func:`llm_extract` - MathVista's few-shot extraction prompt (``prompts/ext_ans.py``) sent to a
  callable ``llm(prompt) -> str``; the lead passes the verifier. It applies the official quick
  checks first (empty response, response equal to a choice, a bare int/float).

:func:`extract_answer` combines them: rules first, and the LLM only when the rules found no
anchored answer and an ``llm`` is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

# Few-shot demonstration of MathVista's answer extractor (prompts/ext_ans.py, CC BY-SA 4.0 data).
DEMO_PROMPT = """
Please read the following example. Then extract the answer from the model response and type it at the end of the prompt.

Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end.
Question: Which number is missing?

Model response: The number missing in the sequence is 14.

Extracted answer: 14

Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final value, e.g., 1.2, 1.3, 1.4, at the end.
Question: What is the fraction of females facing the camera?

Model response: The fraction of females facing the camera is 0.6, which means that six out of ten females in the group are facing the camera.

Extracted answer: 0.6

Hint: Please answer the question requiring a floating-point number with two decimal places and provide the final value, e.g., 1.23, 1.34, 1.45, at the end.
Question: How much money does Luca need to buy a sour apple candy and a butterscotch candy? (Unit: $)

Model response: Luca needs $1.45 to buy a sour apple candy and a butterscotch candy.

Extracted answer: 1.45

Hint: Please answer the question requiring a Python list as an answer and provide the final list, e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.
Question: Between which two years does the line  graph saw its maximum peak?

Model response: The line graph saw its maximum peak between 2007 and 2008.

Extracted answer: [2007, 2008]

Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.
Question: What fraction of the shape is blue?\nChoices:\n(A) 3/11\n(B) 8/11\n(C) 6/11\n(D) 3/5

Model response: The correct answer is (B) 8/11.

Extracted answer: B
"""

LLM = Callable[[str], str]


class Extraction(NamedTuple):
    """An extracted answer and the rule that produced it (``"none"`` when nothing was found)."""

    answer: str
    rule: str

    @property
    def anchored(self) -> bool:
        """True when the answer came from an explicit marker rather than a fallback guess."""
        return self.rule in _ANCHORED_RULES


_ANCHORED_RULES = frozenset({"empty", "exact", "boxed", "anchor", "anchor-next-line", "quoted", "final-line"})

_THINK = re.compile(r"<think>.*?</think>", re.S)
_ANCHOR = re.compile(
    r"(?:final\s+answer|correct\s+answer|correct\s+option|correct\s+choice|right\s+answer|\banswer)"
    r"\s*(?:is|:|=|would\s+be|should\s+be|will\s+be|must\s+be)\s*:?[ \t]*(?P<rest>[^\n]*)",
    re.I,
)
_QUOTED = re.compile(r'The answer is "(.*)"\.')
_NUMBER = re.compile(r"(?<![\w)\]])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])|(?<![\w)\]])-?\.\d+")
_PAREN_LETTER = re.compile(r"\(([A-Za-z])\)")
_LEAD_LETTER = re.compile(r"^[\s\*\(\[\{\"'$]*(?:option|choice)?\s*\(?([A-Z])\)?(?![A-Za-z0-9'])")
_KEYWORD_LETTER = re.compile(r"\b(?:option|choice)\s*\(?([A-Z])\)?(?![A-Za-z0-9])", re.I)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}")
_SIMPLE_FRAC = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?![\w.])")
_LIST = re.compile(r"\[([^\[\]]*)\]")
_WORD_NUMBERS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}


def strip_reasoning(text: str) -> str:
    """Drop ``<think>...</think>`` blocks (and anything before a lone ``</think>``)."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1]
    return None


def clean_latex(text: str) -> str:
    """Remove LaTeX/markdown decoration around an answer (``$``, ``\\text{}``, degrees, bold)."""
    t = text.replace("**", "")
    t = re.sub(r"\\(?:text|mathrm|mathbf|textbf|operatorname)\s*\{([^{}]*)\}", r"\1", t)
    t = re.sub(r"\^\s*\{?\\circ\}?|\\circ|\\degree", "°", t)
    t = t.replace("\\%", "%").replace("\\$", "$").replace("\\,", "").replace("\\!", "").replace("\\ ", " ")
    t = t.replace("\\left", "").replace("\\right", "").replace("−", "-").replace("–", "-")
    t = t.replace("$", "")
    return t.strip()


def _fractions_to_decimal(text: str) -> str:
    def frac(m: re.Match[str]) -> str:
        try:
            den = float(m.group(2))
            return repr(float(m.group(1)) / den) if den else m.group(0)
        except ValueError:
            return m.group(0)

    text = _FRAC.sub(frac, text)
    return _SIMPLE_FRAC.sub(frac, text)


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def _format_number(num: str) -> str:
    """``"2,014"`` -> ``"2014"``; keep the written form otherwise."""
    return num.replace(",", "")


def _anchor_span(text: str) -> tuple[str, str] | None:
    """Text after the last "answer is / Answer:" marker (``(span, rule)``), or ``None``."""
    plain = text.replace("**", "")
    quoted = _QUOTED.findall(plain)
    if quoted:
        return quoted[-1], "quoted"
    matches = list(_ANCHOR.finditer(plain))
    for m in reversed(matches):
        rest = m.group("rest").strip()
        if rest.strip(" .:*"):
            return rest, "anchor"
        after = plain[m.end() :].strip()
        if after:
            return after.split("\n", 1)[0].strip(), "anchor-next-line"
    return None


def _last_paragraph(text: str) -> str:
    parts = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return parts[-1].strip() if parts else ""


def _choice_pattern(choice: str) -> re.Pattern[str]:
    body = re.escape(choice.strip())
    return re.compile(r"(?<![A-Za-z0-9])" + body + r"(?![A-Za-z0-9]|\.\d)", re.I)


def _match_choice_text(span: str, choices: Sequence[str], *, last: bool) -> str | None:
    """The choice whose text occurs in ``span`` (earliest or latest occurrence; longest on ties)."""
    best: tuple[int, int, str] | None = None
    for choice in choices:
        c = str(choice).strip()
        if not c:
            continue
        for m in _choice_pattern(c).finditer(span):
            key = (m.end() if last else -m.start(), len(c), c)
            if best is None or key > best:
                best = key
    return best[2] if best else None


def _valid_letter(letter: str, n: int) -> bool:
    return len(letter) == 1 and "A" <= letter.upper() < chr(ord("A") + n)


def _choice_from_span(span: str, choices: Sequence[str]) -> str | None:
    """An option letter or choice text from an anchored span (first mention wins)."""
    n = len(choices)
    span = clean_latex(span)
    exact = [c for c in choices if str(c).strip().lower() == span.strip(" .").lower()]
    if exact:
        return str(exact[0])
    m = _LEAD_LETTER.match(span)
    if m and _valid_letter(m.group(1), n):
        return m.group(1).upper()
    for m in _PAREN_LETTER.finditer(span):
        if _valid_letter(m.group(1), n):
            return m.group(1).upper()
    m = _KEYWORD_LETTER.search(span)
    if m and _valid_letter(m.group(1), n):
        return m.group(1).upper()
    return _match_choice_text(span, [str(c) for c in choices], last=False)


def _choice_unanchored(text: str, choices: Sequence[str]) -> tuple[str, str] | None:
    """Fallbacks for multiple choice: a bare final letter, the last "(X)", a choice text at the end."""
    n = len(choices)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines:
        last_line = clean_latex(lines[-1]).strip(" .*")
        m = re.fullmatch(r"\(?([A-Z])\)?", last_line)
        if m and _valid_letter(m.group(1), n):
            return m.group(1), "final-line"
    tail = clean_latex(_last_paragraph(text))
    for region in (tail, clean_latex(text)):
        letters = [m.group(1).upper() for m in _PAREN_LETTER.finditer(region) if _valid_letter(m.group(1), n)]
        keyword = [m.group(1).upper() for m in _KEYWORD_LETTER.finditer(region) if _valid_letter(m.group(1), n)]
        if letters or keyword:
            # the letter mentioned last in the region
            cands = [(m.end(), m.group(1).upper()) for m in _PAREN_LETTER.finditer(region) if _valid_letter(m.group(1), n)]
            cands += [(m.end(), m.group(1).upper()) for m in _KEYWORD_LETTER.finditer(region) if _valid_letter(m.group(1), n)]
            return max(cands)[1], "letter"
        text_choice = _match_choice_text(region, [str(c) for c in choices], last=True)
        if text_choice is not None:
            return text_choice, "choice-text"
    return None


def _number_from_span(span: str, answer_type: str, *, first: bool) -> str | None:
    t = clean_latex(span)
    if answer_type == "float":
        t = _fractions_to_decimal(t)
    nums = _numbers(t)
    if nums:
        return _format_number(nums[0] if first else nums[-1])
    words = re.findall(r"[A-Za-z]+", t.lower())
    found = [str(_WORD_NUMBERS[w]) for w in words if w in _WORD_NUMBERS]
    if found and first:
        return found[0]
    return None


def _list_from_span(span: str) -> str | None:
    t = clean_latex(span)
    lists = _LIST.findall(t)
    for body in reversed(lists):
        nums = _numbers(body)
        if nums:
            return "[" + ", ".join(nums) + "]"
    nums = _numbers(t)
    if len(nums) >= 2:
        return "[" + ", ".join(nums) + "]"
    return None


def rule_extract(response: str, problem: Mapping[str, Any]) -> Extraction:
    """Extract an answer from ``response`` by rules only (see the module docstring)."""
    question_type = str(problem.get("question_type", ""))
    answer_type = str(problem.get("answer_type", ""))
    choices = [str(c) for c in (problem.get("choices") or [])]
    text = strip_reasoning(response or "")
    if not text:
        return Extraction("", "empty")

    # official quick checks: the whole response is already an answer
    if question_type == "multi_choice" and text in choices:
        return Extraction(text, "exact")
    if answer_type == "integer" and re.fullmatch(r"-?\d+", text):
        return Extraction(str(int(text)), "exact")
    if answer_type == "float" and re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", text):
        return Extraction(str(float(text)), "exact")

    spans: list[tuple[str, str]] = []
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        spans.append((boxed, "boxed"))
    anchor = _anchor_span(text)
    if anchor is not None:
        spans.append(anchor)

    if question_type == "multi_choice" and choices:
        for span, rule in spans:
            found = _choice_from_span(span, choices)
            if found is not None:
                return Extraction(found, rule)
        fallback = _choice_unanchored(text, choices)
        if fallback is not None:
            return Extraction(*fallback)
        for span, rule in spans:
            # an answer that names no option (e.g. a computed value): the scorer maps it to the closest choice
            cleaned = clean_latex(span).strip(" .")
            if cleaned:
                return Extraction(cleaned, f"{rule}-unmatched")
        return Extraction("", "none")

    if answer_type == "list":
        for span, rule in spans:
            found = _list_from_span(span)
            if found is not None:
                return Extraction(found, rule)
        found = _list_from_span(_last_paragraph(text))
        return Extraction(found, "last-list") if found is not None else Extraction("", "none")

    if answer_type in ("integer", "float"):
        for span, rule in spans:
            found = _number_from_span(span, answer_type, first=True)
            if found is not None:
                return Extraction(found, rule)
        found = _number_from_span(text, answer_type, first=False)
        return Extraction(found, "last-number") if found is not None else Extraction("", "none")

    # any other (free text) answer: the anchored span itself
    for span, rule in spans:
        cleaned = clean_latex(span).strip(" .")
        if cleaned:
            return Extraction(cleaned, rule)
    return Extraction(_last_paragraph(text), "last-paragraph")


def build_extraction_prompt(query: str, response: str, demo_prompt: str = DEMO_PROMPT) -> str:
    """MathVista's extraction prompt: the demos, the query, the response, then "Extracted answer: "."""
    return f"{demo_prompt.strip()}\n\n{query}\n\n{response}\n\nExtracted answer: "


def _clean_llm_output(text: str) -> str:
    text = strip_reasoning(text or "")
    if text.lower().startswith("extracted answer:"):
        text = text[len("extracted answer:") :]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def llm_extract(response: str, problem: Mapping[str, Any], llm: LLM, *, quick_extract: bool = False) -> str:
    """MathVista's LLM extraction: quick checks, then the few-shot prompt sent to ``llm``.

    ``problem`` needs ``query`` (built with :func:`asymspec_mm.eval.mathvista.build_query` when absent).
    Errors of ``llm`` propagate.
    """
    question_type = problem.get("question_type")
    answer_type = problem.get("answer_type")
    choices = problem.get("choices") or []
    if response == "":
        return ""
    if question_type == "multi_choice" and response in choices:
        return response
    if answer_type == "integer":
        try:
            return str(int(response))
        except ValueError:
            pass
    if answer_type == "float":
        try:
            return str(float(response))
        except ValueError:
            pass
    if quick_extract:
        m = _QUOTED.search(response)
        if m:
            return m.group(1)
    query = problem.get("query")
    if not query:
        from ..request.mathvista_query import build_query

        query = build_query(problem)
    return _clean_llm_output(llm(build_extraction_prompt(str(query), response)))


def extract_answer_detailed(response: str, problem: Mapping[str, Any], llm: LLM | None = None, mode: str = "auto") -> Extraction:
    """:func:`extract_answer` returning the rule used (``"llm"`` when the LLM answered).

    ``mode``: ``"rules"`` (never the LLM), ``"llm"`` (official flow: quick checks then the LLM),
    ``"auto"`` (rules; the LLM only when no anchored answer was found and ``llm`` is given).
    """
    if mode not in ("auto", "rules", "llm"):
        raise ValueError(f"mode={mode!r}: expected 'auto', 'rules' or 'llm'")
    if mode == "llm":
        if llm is None:
            raise ValueError("mode='llm' needs an llm callable")
        return Extraction(llm_extract(response, problem, llm), "llm")
    found = rule_extract(response, problem)
    if mode == "auto" and llm is not None and not found.anchored:
        return Extraction(llm_extract(response, problem, llm), "llm")
    return found


def extract_answer(response: str, problem: Mapping[str, Any], llm: LLM | None = None, mode: str = "auto") -> str:
    """The extraction string for ``response`` to ``problem`` (MathVista schema)."""
    return extract_answer_detailed(response, problem, llm, mode).answer
