"""The question text of a request: checked once, before any model runs.

Torch-free, so the CLI can refuse a bad question before it loads a model.
"""

from __future__ import annotations

from ..base.errors import EmptyQuestionError, InvalidQuestionError
from ..base.unicode_check import first_bad_character

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
