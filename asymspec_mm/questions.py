"""The question text of a request: checked once, before any model runs.

Torch-free, so the CLI can refuse a bad question before it loads a model.
"""

from __future__ import annotations

from .errors import EmptyQuestionError, InvalidQuestionError
from .unicode_check import first_bad_character

EXAMPLE = "e.g. 'What is the largest value?'"


def _bad_byte(text: str) -> tuple[int, str]:
    """Index and byte (``"0xff"``) of the first character that is not encodable as UTF-8: a command line or file
    read with ``surrogateescape`` keeps undecodable bytes as lone surrogates U+DC80..U+DCFF, the byte their low
    half; any other lone surrogate is named as a code point (``"U+D800"``)."""
    index, code = first_bad_character(text) or (0, 0)
    return index, f"0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"


def check_question(question: object) -> str:
    """``question`` as text, or an error naming what is wrong with it.

    Accepts ``str`` and UTF-8 ``bytes``. Raises :class:`InvalidQuestionError` for other types, bytes that
    are not UTF-8 and text holding undecodable bytes (lone surrogates); :class:`EmptyQuestionError` when
    empty or only whitespace.
    """
    if isinstance(question, (bytes, bytearray)):
        try:
            question = bytes(question).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidQuestionError(
                f"the question is not valid UTF-8 (byte 0x{question[exc.start]:02x} at offset {exc.start}): save or pass it as UTF-8 text"
            ) from None
    if not isinstance(question, str):
        raise InvalidQuestionError(f"the question must be text (str), not {type(question).__name__}: pass a string, {EXAMPLE}")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        index, byte = _bad_byte(question)
        raise InvalidQuestionError(
            f"the question is not valid UTF-8 ({byte} at character {index}): pass UTF-8 text "
            "(check the terminal's or the file's encoding, e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if not question.strip():
        raise EmptyQuestionError(f"the question is empty: ask something about the image, {EXAMPLE}")
    return question


def mathvista_question(
    question: str, choices: list[str] | tuple[str, ...] | None = None, answer_type: str | None = None, unit: str | None = None
) -> str:
    """``question`` in MathVista's query layout: the hint line, ``Question: ...``, then ``Choices:`` with
    ``(A) ...`` lines. ``choices`` makes it multiple choice; otherwise ``answer_type`` is ``integer``,
    ``float1``, ``float2`` (decimal places) or ``list``. It is how MathVista asks its models, and the only
    layout the bundled tiny pair was trained on.
    """
    from .errors import UnknownOptionError
    from .eval.mathvista.query import build_query

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
