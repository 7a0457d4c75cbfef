"""The gate's decision at one token, in words and numbers (Eq. 4): shared by the command line and the demo.

Works on a :class:`~asymspec_mm.decode.TokenEvent` or its ``as_dict()``.
"""

from __future__ import annotations

import math
from typing import Any


def field(ev: Any, name: str, default: Any = None) -> Any:
    """Field ``name`` of a trace event, whether it is a ``TokenEvent`` or its ``as_dict()``."""
    if isinstance(ev, dict):
        return ev.get(name, default)
    return getattr(ev, name, default)


def num(x: float | None, digits: int = 3) -> str:
    """A probability or threshold as shown to a reader (``?`` when absent)."""
    if x is None:
        return "?"
    x = float(x)
    return "nan" if math.isnan(x) else f"{x:.{digits}g}"


def gate_decision(ev: Any, draft_text: str = "") -> str | None:
    """The gate's comparison with its numbers, or ``None`` where AsymSpec's gate did not decide this token.

    Accepted: ``p_v = 0.31 > gamma_eff * p_base = 0.49 * 0.62 = 0.3 -> accepted`` (the draft's own numbers).
    Fused: the same comparison for the rejected draft (``draft_p_verifier`` / ``draft_p_base``), which is what
    the gate compared, ``-> draft rejected``; ``draft_text`` names the draft. A sampled row's token (``accept_prob``
    set) says whether the draft was in the gate's set and, outside it, the probability it was kept with.
    """
    source, gamma_eff = field(ev, "source"), field(ev, "gamma_eff")
    if gamma_eff is None:
        return None
    if source == "accepted":
        p_v, p_b, verdict, what = field(ev, "p_verifier"), field(ev, "p_base"), "accepted", "p_v"
    elif source == "fused":
        p_v, p_b, verdict = field(ev, "draft_p_verifier"), field(ev, "draft_p_base"), "draft rejected"
        what = f"p_v(draft {draft_text!r})" if draft_text else "p_v(draft)"
    else:
        return None
    if p_v is None or p_b is None:
        return None
    bound = float(gamma_eff) * float(p_b)
    rel = ">" if float(p_v) > bound else "<="
    alpha = field(ev, "accept_prob")
    if alpha is not None:  # the sampled rule: in the set, kept; outside, kept with probability alpha
        if rel == ">":
            verdict = "in the gate's set: accepted"
        else:
            verdict = f"outside the gate's set: kept with probability min(1, f/q) = {num(alpha)}, " + (
                "kept" if source == "accepted" else "rejected"
            )
    return f"{what} = {num(p_v)} {rel} gamma_eff * p_base = {num(gamma_eff)} * {num(p_b)} = {num(bound)} -> {verdict}"
