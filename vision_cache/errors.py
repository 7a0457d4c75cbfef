"""The toolkit's error base class, and the errors of image intake.

:class:`AsymSpecError` is the base of every user-facing error of asymspec-mm. It lives here, in
the lowest package, because imports only go upwards (``vision_cache`` < ``captioning`` <
``asymspec_mm`` < ``ui``): every package can derive from it and ``except AsymSpecError``
catches the errors of all of them. :mod:`asymspec_mm.base.errors` re-exports it.
"""

from __future__ import annotations

__all__ = ["AsymSpecError", "InvalidImageError"]


class AsymSpecError(ValueError):
    """Base class of all user-facing errors of this toolkit."""


class InvalidImageError(AsymSpecError):
    """An image input that cannot be used: missing, unreadable, corrupt, too big, or wrong type."""
