"""The page's run settings checked: the question, the compressed view's fields and the decoding settings, each bad
one a :class:`~ui.errors.DemoInputError` naming it (one line)."""

from __future__ import annotations

from typing import Any

from asymspec_mm.base.config import METHODS, RANGES

from .errors import DemoInputError

MAX_QUESTION_CHARS = 4000
MAX_VIEW_CHARS = 8000
#: Largest draft length K the page offers and accepts (the one range of ``k``).
MAX_K = int(RANGES["k"].high)


def check_settings(
    question, caption, ocr, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, max_new_tokens_limit: int
) -> tuple[str, str, str, str, dict[str, Any]]:
    """``(question, caption, ocr, method, config overrides)`` from the page's inputs, or the first bad one refused."""
    question = "" if question is None else str(question)
    caption = "" if caption is None else str(caption)
    ocr = "" if ocr is None else str(ocr)
    if len(question) > MAX_QUESTION_CHARS:
        raise DemoInputError(f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}")
    for name, text in (("caption", caption), ("OCR text", ocr)):
        if len(text) > MAX_VIEW_CHARS:
            raise DemoInputError(f"the {name} is {len(text)} characters; the limit is {MAX_VIEW_CHARS}")
    if not question.strip():
        raise DemoInputError("the question is empty: ask something about the image, e.g. 'Which bar is the tallest?'")
    method = str(method or "asymspec")
    if method not in METHODS:
        raise DemoInputError(f"method={method!r} is not valid; choose one of {', '.join(METHODS)}")
    try:
        max_new = int(max_new_tokens)
        k_int = int(k)
        overrides = dict(
            k=k_int,
            beta=float(beta),
            gamma=float(gamma),
            gate=str(gate),
            delta=str(delta),
            bonus=str(bonus),
            max_new_tokens=max_new,
            drafter_view=str(drafter_view),
        )
    except (TypeError, ValueError) as exc:
        raise DemoInputError(f"bad setting: {exc}") from None
    if not 1 <= max_new <= max_new_tokens_limit:
        raise DemoInputError(f"max new tokens must be between 1 and {max_new_tokens_limit}")
    if not 1 <= k_int <= MAX_K:
        raise DemoInputError(f"K must be between 1 and {MAX_K}")
    return question, caption, ocr, method, overrides
