"""What the hover box says about one token: the gate's decision with its numbers, and what fusion did.

Pure functions of a trace event's fields (a :class:`~asymspec_mm.decode.TokenEvent` or its ``as_dict()``);
no Gradio, no tokenizer (token texts are passed in).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["FUSION_CHANGED", "FUSION_SAME", "fusion_kind", "fusion_line", "gate_line", "num"]

#: The two kinds of a fused token (``data-fusion`` of its span).
FUSION_CHANGED = "changed"
FUSION_SAME = "same"


def _get(ev: Any, name: str, default: Any = None) -> Any:
    if isinstance(ev, dict):
        return ev.get(name, default)
    return getattr(ev, name, default)


def num(x: float | None, digits: int = 3) -> str:
    """A probability or threshold as shown in the hover box (``?`` when absent)."""
    if x is None:
        return "?"
    x = float(x)
    return "nan" if math.isnan(x) else f"{x:.{digits}g}"


def gate_line(ev: Any, draft_text: str = "") -> str | None:
    """The gate's decision at this token, spelled out with the event's values, e.g.
    ``gate: p_v = 0.31 > gamma_eff * p_base = 0.5 * 0.62 = 0.31 -> accepted``; None when no gate decided it.

    An accepted token's probabilities are the draft's own (the gate compared them). A fused token's are the
    fused token's: the trace does not keep the rejected draft's, so that line states the rule it failed.
    """
    source = _get(ev, "source")
    pv, pb, ge = _get(ev, "p_verifier"), _get(ev, "p_base"), _get(ev, "gamma_eff")
    if source == "accepted" and ge is not None and pv is not None and pb is not None:
        bound = float(ge) * float(pb)
        rel = ">" if float(pv) > bound else "<="
        return f"gate: p_v = {num(pv)} {rel} gamma_eff * p_base = {num(ge)} * {num(pb)} = {num(bound)} -> accepted"
    if source == "accepted":  # symmetric SD: the draft matched the verifier's argmax
        return "gate: the draft equals the verifier's own token -> accepted"
    if source == "fused":
        draft = f" {draft_text!r}" if draft_text else ""
        return (
            f"gate: draft{draft} rejected: p_v(draft) <= gamma_eff * p_base(draft), gamma_eff = {num(ge)}; "
            f"fused token: p_v = {num(pv)}, p_base = {num(pb)}"
        )
    if source == "corrected":
        return "gate: draft rejected (it is not the verifier's own token) -> the verifier's token"
    if source == "bonus":
        return "no gate: the verifier's own token after K accepted drafts"
    return None


def fusion_kind(ev: Any) -> str | None:
    """For a fused token: :data:`FUSION_CHANGED` when fusion changed the verifier's token, :data:`FUSION_SAME`
    when the verifier alone would have emitted it too; None for other sources."""
    if _get(ev, "source") != "fused":
        return None
    return FUSION_CHANGED if bool(_get(ev, "steered", False)) else FUSION_SAME


def fusion_line(ev: Any, verifier_text: str = "") -> str | None:
    """What fusion did at a fused token (the image's steer only where it changed the verifier's token)."""
    kind = fusion_kind(ev)
    if kind == FUSION_CHANGED:
        return f"fused, changed the verifier's token (verifier alone: {verifier_text!r}): the image's steer"
    if kind == FUSION_SAME:
        return "fused, same token as the verifier alone: fusion changed nothing here"
    return None
