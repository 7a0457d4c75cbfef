"""Error types of asymspec-mm.

Every error a user can cause derives from :class:`AsymSpecError` (a ``ValueError``), and its
message names the problem and what to do about it.

The base class and the errors raised by the lower packages are defined at the bottom of the
import order (:mod:`vision_cache.errors`, :mod:`captioning.errors`), because those packages may
not import :mod:`asymspec_mm`; this module re-exports them under their usual names, so
``from asymspec_mm.base.errors import ...`` and ``except AsymSpecError`` cover every package.
"""

from __future__ import annotations

from captioning.errors import (
    DatasetUnavailableError,
    MissingCompressedViewError,
    OCRUnavailableError,
    UnknownOptionError,
)
from vision_cache.errors import AsymSpecError, InvalidImageError

__all__ = [
    "AsymSpecError",
    "EmptyQuestionError",
    "InvalidQuestionError",
    "InvalidTextError",
    "ContextOverflowError",
    "VocabularyMismatchError",
    "UnknownOptionError",
    "MissingCompressedViewError",
    "OCRUnavailableError",
    "DatasetUnavailableError",
    "InvalidImageError",
    "TextDrafterImageError",
]


class EmptyQuestionError(AsymSpecError):
    """The question is empty or only whitespace."""


class InvalidQuestionError(AsymSpecError):
    """The question is not text, or not valid UTF-8."""


class InvalidTextError(AsymSpecError):
    """A text field holds something UTF-8 cannot encode (a lone surrogate, e.g. JSON's ``"\\ud800"``).

    ``param`` is the field's path (``messages[0].content``, ``tools[0].function.description``, ``--caption``), which
    the message starts with; see :mod:`asymspec_mm.base.unicode_check`.
    """

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflowError(AsymSpecError):
    """A prompt plus the requested new tokens does not fit a model's context window.

    ``too_long`` says what to shorten: ``"prompt"`` (the question or the caption/OCR text: the prompt does not
    fit even with one new token) or ``"max_new_tokens"`` (the prompt fits; the new-token budget does not).
    """

    def __init__(self, message: str = "", *, too_long: str = "prompt") -> None:
        super().__init__(message)
        self.too_long = too_long


class VocabularyMismatchError(AsymSpecError):
    """Drafter and verifier do not share one output vocabulary."""


class TextDrafterImageError(InvalidImageError):
    """An image sent to a pair whose drafter is a text-only model (no vision tower reads it)."""
