"""Error types of asymspec-mm.

Every error a user can cause derives from :class:`AsymSpecError` (a ``ValueError``), and its
message names the problem and what to do about it.
"""

from __future__ import annotations


class AsymSpecError(ValueError):
    """Base class of all user-facing errors of this toolkit."""


class EmptyQuestionError(AsymSpecError):
    """The question is empty or only whitespace."""


class ContextOverflowError(AsymSpecError):
    """A prompt plus the requested new tokens does not fit a model's context window."""


class VocabularyMismatchError(AsymSpecError):
    """Drafter and verifier do not share one output vocabulary."""


class UnknownOptionError(AsymSpecError):
    """A method, gate, delta source, bonus rule or view name that does not exist."""


class MissingCompressedViewError(AsymSpecError):
    """No caption/OCR text was given and none could be produced."""


class OCRUnavailableError(AsymSpecError):
    """No usable OCR engine (package or weights missing)."""


class DatasetUnavailableError(AsymSpecError):
    """A benchmark's problems or images cannot be found."""
