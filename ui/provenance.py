"""What the hover box says about one token: the gate's decision with its numbers, and what fusion did.

Pure functions of a trace event's fields (a :class:`~asymspec_mm.decode.TokenEvent` or its ``as_dict()``);
no Gradio, no tokenizer (token texts are passed in).
"""

from __future__ import annotations

from typing import Any

from asymspec_mm.frontend.explain import field, gate_decision, num

__all__ = ["FUSION_CHANGED", "FUSION_SAME", "fusion_kind", "fusion_line", "gate_line", "num", "sampling_line"]

#: The two kinds of a fused token (``data-fusion`` of its span).
FUSION_CHANGED = "changed"
FUSION_SAME = "same"


def gate_line(ev: Any, draft_text: str = "") -> str | None:
    """The gate's decision at this token, spelled out with the event's values, e.g.
    ``gate: p_v = 0.31 > gamma_eff * p_base = 0.5 * 0.62 = 0.31 -> accepted``; None when no gate decided it.

    Accepted and fused tokens: :func:`asymspec_mm.frontend.explain.gate_decision` (a fused token's line compares the
    rejected draft's numbers, which is what the gate did).
    """
    source = field(ev, "source")
    decision = gate_decision(ev, draft_text)
    if decision is not None:
        return f"gate: {decision}"
    if source == "accepted":  # symmetric SD: the draft matched the verifier's argmax
        return "gate: the draft equals the verifier's own token -> accepted"
    if source == "fused":  # a trace without the draft's numbers
        draft = f" {draft_text!r}" if draft_text else ""
        return f"gate: draft{draft} rejected: p_v(draft) <= gamma_eff * p_base(draft), gamma_eff = {num(field(ev, 'gamma_eff'))}"
    if source == "corrected":
        return "gate: draft rejected (it is not the verifier's own token) -> the verifier's token"
    if source == "bonus":
        return "no gate: the verifier's own token after K accepted drafts"
    return None


def fusion_kind(ev: Any) -> str | None:
    """For a fused token: :data:`FUSION_CHANGED` when fusion changed the verifier's token, :data:`FUSION_SAME`
    when the verifier alone would have emitted it too; None for other sources."""
    if field(ev, "source") != "fused":
        return None
    return FUSION_CHANGED if bool(field(ev, "steered", False)) else FUSION_SAME


def fusion_line(ev: Any, verifier_text: str = "") -> str | None:
    """What fusion did at a fused token (the image's steer only where it changed the verifier's token)."""
    kind = fusion_kind(ev)
    if kind is not None and bool(field(ev, "residual", False)):
        alone = f" (verifier alone: {verifier_text!r})" if kind == FUSION_CHANGED else ", the verifier alone's token"
        return f"sampled at the rejection from the residual norm((f - q)+) of the fused target{alone}"
    if kind == FUSION_CHANGED:
        return f"fused, changed the verifier's token (verifier alone: {verifier_text!r}): the image's steer"
    if kind == FUSION_SAME:
        return "fused, same token as the verifier alone: fusion changed nothing here"
    return None


def sampling_line(ev: Any) -> str | None:
    """A sampled token's acceptance probability and gate excess E (how far the emitted distribution is from the fused
    target here), or None for a greedy one."""
    alpha, excess = field(ev, "accept_prob"), field(ev, "gate_excess")
    if alpha is None and excess is None:
        return None
    parts = [f"acceptance probability {num(alpha)}"] if alpha is not None else []
    if excess is not None:
        parts.append(f"gate excess E {num(excess)}")
    return "sampled: " + ", ".join(parts)
