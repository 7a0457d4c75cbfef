"""Type checks of user-given numbers, shared by every package.

``True`` and ``False`` are ints in Python, so ``isinstance(v, int)`` alone lets ``--workers true`` through as 1;
these checks refuse a bool wherever a count or a number is asked for. They live at the bottom of the import order
(like :class:`~vision_cache.errors.AsymSpecError`) so that every package can use them; each caller raises its own
error, whose message names the setting and the fix.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_int", "is_number"]


def is_int(value: Any, minimum: int | None = None, maximum: int | None = None) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) with ``minimum <= value <= maximum`` (a bound of None is open)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a ``float`` (not a ``bool``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
