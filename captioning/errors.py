"""Errors raised by the compressed-view package (captions, OCR, precomputed texts).

They derive from :class:`vision_cache.errors.AsymSpecError`, the toolkit-wide base, and are
re-exported by :mod:`asymspec_mm.base.errors` under the same names. They are defined here rather
than in :mod:`asymspec_mm` because ``captioning`` must not import the package above it.
"""

from __future__ import annotations

from vision_cache.errors import AsymSpecError

__all__ = [
    "AsymSpecError",
    "UnknownOptionError",
    "MissingCompressedViewError",
    "OCRUnavailableError",
    "DatasetUnavailableError",
]


class UnknownOptionError(AsymSpecError):
    """A method, gate, delta source, bonus rule or view name that does not exist (or that this pair cannot run).

    ``param``, where given, is the request field as an HTTP client spells it (``asymspec.method``), so that the
    server's 400 names it."""

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class MissingCompressedViewError(AsymSpecError):
    """No caption/OCR text was given and none could be produced."""


class OCRUnavailableError(AsymSpecError):
    """No usable OCR engine (package or weights missing)."""


class DatasetUnavailableError(AsymSpecError):
    """A benchmark's problems or images cannot be found."""
