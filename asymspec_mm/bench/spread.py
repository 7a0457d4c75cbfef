"""The spread of repeated measurements beside their median: one median over repetitions says nothing about the
noise of a shared machine, so every median the bench prints comes with its range and count."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..base.checks import is_number
from ..base.timing import median


def finite(values: Iterable[Any]) -> list[float]:
    """The values that are real numbers (None, NaN and infinities left out), as floats, in their order."""
    return [float(v) for v in values if is_number(v) and math.isfinite(v)]


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


#: Repetitions a verdict needs: with fewer, one noisy repetition could decide it.
MIN_REPS = 3


def verdict(values: Iterable[Any], threshold: float, *, at_most: bool, fmt: str = "{:.4f}", min_reps: int = MIN_REPS) -> str:
    """A target's verdict from its repetitions: ``"met"`` when at least ``min_reps`` finite values all lie on the
    target's side of ``threshold`` (``<=`` it when ``at_most``, else ``>=``), ``"NOT met"`` when they all lie past
    it, else ``"inconclusive (n=2, range 0.9200-1.6104)"`` (``"inconclusive (no repetitions)"`` without any).

    ``verdict([1.58, 1.64], 1.3, at_most=False)`` is ``"inconclusive (n=2, range 1.5800-1.6400)"``: two
    repetitions on a loaded machine do not show a speed-up; the median alone would have said met.
    """
    xs = finite(values)
    if not xs:
        return "inconclusive (no repetitions)"
    inside = [x <= threshold if at_most else x >= threshold for x in xs]
    if len(xs) >= min_reps and all(inside):
        return "met"
    if len(xs) >= min_reps and not any(inside):
        return "NOT met"
    return f"inconclusive (n={len(xs)}, range {fmt.format(min(xs))}-{fmt.format(max(xs))})"
