"""GAIA's quasi-exact-match scorer, written from the benchmark's published rules (Mialon et al., 2024, section 3.3
and the leaderboard's scoring notes): an answer is a number, a few words, or a comma-separated list of either, and
it scores 1 when it matches the ground truth after a light normalisation that depends on the ground truth's type.

* **number** (the ground truth parses as one): the answer with its units and thousands separators taken out
  (``$``, ``%``, ``,``) must parse as the same number.
* **list** (the ground truth holds a ``,`` or ``;``): both split on those separators into as many elements, each
  compared by the rule of its ground-truth element (a number as above, text without its spaces, case-insensitive).
* **string**: equal once spaces and punctuation are dropped and case is folded.
"""

from __future__ import annotations

import re
import string

#: what the number rule removes before it parses an answer (units and thousands separators)
NUMBER_NOISE = ("$", "%", ",")
LIST_SEPARATORS = re.compile(r"[,;]")


def as_number(text: str) -> float | None:
    """``text`` as a float once :data:`NUMBER_NOISE` and spaces are removed, or None when it is no number."""
    cleaned = str(text)
    for noise in NUMBER_NOISE:
        cleaned = cleaned.replace(noise, "")
    try:
        return float(cleaned.strip().replace(" ", ""))
    except ValueError:
        return None


def is_number(text: str) -> bool:
    return as_number(text) is not None


def normalized_text(text: str, drop_punctuation: bool = True) -> str:
    """``text`` without whitespace, case-folded, and (``drop_punctuation``) without ASCII punctuation."""
    out = re.sub(r"\s+", "", str(text)).lower()
    if drop_punctuation:
        out = out.translate(str.maketrans("", "", string.punctuation))
    return out


def _element_matches(answer: str, truth: str) -> bool:
    if is_number(truth):
        return as_number(answer) == as_number(truth)
    return normalized_text(answer, drop_punctuation=False) == normalized_text(truth, drop_punctuation=False)


def gaia_match(answer: str | None, truth: str) -> bool:
    """Whether ``answer`` scores under GAIA's rules against the ground truth ``truth`` (None never does)."""
    if answer is None:
        return False
    answer, truth = str(answer), str(truth)
    if is_number(truth):
        return as_number(answer) == as_number(truth)
    if LIST_SEPARATORS.search(truth):
        got, want = LIST_SEPARATORS.split(answer), LIST_SEPARATORS.split(truth)
        return len(got) == len(want) and all(_element_matches(g.strip(), w.strip()) for g, w in zip(got, want))
    return normalized_text(answer) == normalized_text(truth)


FINAL_ANSWER = re.compile(r"final[ \t]*answer[ \t]*:[ \t]*(.*)", re.IGNORECASE)


def final_answer_of(text: str | None) -> str | None:
    """The answer a reply gives: what follows its last ``FINAL ANSWER:`` (to the end of that line), else the whole
    reply stripped; None stays None."""
    if text is None:
        return None
    found = [a.strip() for a in FINAL_ANSWER.findall(str(text)) if a.strip()]
    return found[-1] if found else str(text).strip()
