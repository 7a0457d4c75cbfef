"""The spread of repeated measurements beside their median: one median over repetitions says nothing about the
noise of a shared machine, so every median the bench prints comes with its range and count."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..timing import median


def finite(values: Iterable[Any]) -> list[float]:
    """The values that are real numbers (None, NaN and infinities left out), as floats, in their order."""
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def spread(values: Iterable[Any]) -> dict[str, float | int]:
    """``{"median", "min", "max", "n"}`` of the finite ``values`` (one per repetition); NaN statistics and n=0
    when there is none."""
    xs = finite(values)
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def format_spread(values: Iterable[Any], fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """``"MEDIAN (MIN-MAX, n=N)"`` of the finite ``values``, each number ``fmt.format(x * scale)``.

    ``format_spread([1.1, 1.4, 1.23], "{:.2f}x")`` is ``"1.23x (1.10x-1.40x, n=3)"``; a single value is
    ``"1.23x (n=1)"`` (no range to show); no finite value is a dash.
    """
    s = spread(values)
    if not s["n"]:
        return "–"
    med = fmt.format(s["median"] * scale)
    if s["n"] == 1:
        return f"{med} (n=1)"
    return f"{med} ({fmt.format(s['min'] * scale)}-{fmt.format(s['max'] * scale)}, n={s['n']})"


def spread_phrase(values: Iterable[Any], fmt: str = "{:.4f}", scale: float = 1.0) -> str:
    """``"median M (min A, max B, n=N)"``: :func:`format_spread` in words, for a line of console output."""
    s = spread(values)
    if not s["n"]:
        return "no measurement"
    f = lambda x: fmt.format(x * scale)  # noqa: E731 - one formatter for the four numbers
    return f"median {f(s['median'])} (min {f(s['min'])}, max {f(s['max'])}, n={s['n']})"
