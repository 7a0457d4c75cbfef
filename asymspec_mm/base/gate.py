"""The AsymSpec gate and fusion: pure tensor math, batched over the positions of one step.

Shapes: ``a``, ``b``, ``t`` are logits ``[P, V]`` for P positions (K drafts, or K+1 with the bonus
position) from the drafter on the full view, the drafter on the compressed view and the verifier.
``drafts`` is ``[P]`` token ids. ``gamma``, ``beta`` and ``lam`` are a float for every position or a
float32 tensor ``[P]`` (:data:`Setting`), so rows of a batch with different settings share one call; a
position's result is the same either way. Everything is computed in float32 whatever the models' dtype, so a
bf16 run takes the same decisions as an fp32 one up to the logits themselves.

Paper (section 3): delta = a - b (Eq. 1); fused = argmax(t + beta * delta) (Eq. 2);
gamma_eff = gamma * exp(-JSD(softmax a || softmax b)) (Eq. 3); accept d iff
softmax(t)[d] > gamma_eff * softmax(b)[d] (Eq. 4). Ablations: a fixed gamma; the tuned lambda gate
as the paper's Appendix B text reads (``tuned``: the log-ratio at the draft) and as the released code
computes it (``tuned_kl``: lambda * KL over the whole distribution); KL in place of JSD (``kl``,
Table 14); and delta sources raw (a) and SCD (t - b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import DELTAS, GATES  # noqa: F401 - re-exported

LN2 = math.log(2.0)
#: The gates whose divergence is KL(p_a || p_b) rather than the JSD.
KL_GATES = ("kl", "tuned_kl")
#: A gate setting: one value for every position, or one per position ``[P]``.
Setting = float | torch.Tensor


def per_position(value: Setting, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a float32 tensor shaped like ``like`` ``[P]`` (a float broadcast, a ``[P]`` tensor moved there)."""
    return torch.as_tensor(value, dtype=torch.float32, device=like.device).expand_as(like)


def jsd(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in nats between rows of two log-distributions ``[P, V]`` -> ``[P]``.

    Computed from log-probabilities so that tokens with probability underflowing to 0 contribute
    exactly 0 instead of NaN; bounded by ln 2.
    """
    log_m = torch.logaddexp(log_p, log_q) - LN2
    p, q = log_p.exp(), log_q.exp()
    # p * (log p - log m) is 0 where p == 0; torch.where avoids 0 * (-inf) = NaN.
    kl_pm = torch.where(p > 0, p * (log_p - log_m), torch.zeros_like(p)).sum(-1)
    kl_qm = torch.where(q > 0, q * (log_q - log_m), torch.zeros_like(q)).sum(-1)
    return (0.5 * (kl_pm + kl_qm)).clamp(0.0, LN2)


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats between rows of two log-distributions ``[P, V]`` -> ``[P]`` (unbounded, >= 0).

    From log-probabilities: tokens with p == 0 (masked, -inf, or underflowing) contribute exactly 0, and a
    token with p > 0 that q masks makes the divergence +inf (never NaN).
    """
    p = log_p.exp()
    # where p == 0 the term is 0 even if log_q is -inf (0 * inf would be NaN); torch.where avoids it
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)  # rounding can leave a tiny negative for equal rows


def context_gain(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor, source: str = "contrast") -> torch.Tensor:
    """The steering signal delta ``[P, V]``: contrast ``a - b`` (the paper), raw ``a``, or SCD ``t - b``.

    Entries that are not finite become 0: a token masked (-inf) in one stream would otherwise give delta
    = +-inf or NaN (-inf - -inf), and t + beta * delta would rank a masked token first or turn the row into
    NaN. With 0 there the verifier's own logit decides, and a token the verifier masks stays -inf.
    """
    if source == "contrast":
        delta = a - b
    elif source == "raw":
        delta = a
    elif source == "scd":
        delta = t - b
    else:
        raise ValueError(f"unknown delta source {source!r}; choose one of {DELTAS}")
    return torch.where(torch.isfinite(delta), delta, torch.zeros_like(delta))


def effective_threshold(
    gamma: Setting,
    gate: str,
    divergence: torch.Tensor,
    log_ratio: torch.Tensor | None = None,
    lam: Setting = 0.1,
) -> torch.Tensor:
    """Per-position acceptance threshold ``[P]``.

    cda: ``gamma * exp(-JSD)`` in [gamma/2, gamma] (``divergence`` is the JSD); fixed: ``gamma``;
    tuned: ``gamma * exp(-lam * (log_softmax a - log_softmax b)[d])`` (``log_ratio`` at the draft, the paper
    text's reading); tuned_kl: ``gamma * exp(-lam * KL(p_a || p_b))`` (the released code's tuned gate) and
    kl: ``gamma * exp(-KL(p_a || p_b))`` (Table 14), both with ``divergence`` the KL (possibly +inf: then
    the threshold is 0, and with lam = 0 it stays gamma).
    """
    if gate in ("cda", "kl"):  # the same discount of two divergences (the caller passes the JSD or the KL)
        return gamma * torch.exp(-divergence)
    if gate == "fixed":
        return per_position(gamma, divergence).clone()
    if gate == "tuned":
        if log_ratio is None:
            raise ValueError("the tuned gate needs log_ratio (log p_a - log p_b at the draft)")
        return gamma * torch.exp(-lam * log_ratio)
    if gate == "tuned_kl":
        # lambda 0 switches the discount off, even where KL is infinite; an infinite KL scales to +-inf by lambda's
        # sign itself (lam * inf in float32 is NaN once lam underflows). A float lam is judged before any cast.
        if not isinstance(lam, torch.Tensor):
            if lam == 0:
                return per_position(gamma, divergence).clone()
            signed_inf = torch.full_like(divergence, math.copysign(math.inf, lam))
            return gamma * torch.exp(-torch.where(torch.isinf(divergence), signed_inf, lam * divergence))
        lam_p = per_position(lam, divergence)
        signed_inf = torch.where(lam_p < 0, -math.inf, math.inf)
        scaled = torch.where(torch.isinf(divergence), signed_inf, lam_p * divergence)
        return gamma * torch.exp(-torch.where(lam_p == 0, torch.zeros_like(scaled), scaled))
    raise ValueError(f"unknown gate {gate!r}; choose one of {GATES}")


def accept(p_verifier: torch.Tensor, p_base: torch.Tensor, gamma_eff: torch.Tensor) -> torch.Tensor:
    """Eq. 4, elementwise ``[P]`` -> bool ``[P]``: softmax(t)[d] > gamma_eff * softmax(b)[d]."""
    return p_verifier > gamma_eff * p_base


def fusion_logits(t: torch.Tensor, delta: torch.Tensor, beta: Setting) -> torch.Tensor:
    """The steered logits ``t + beta * delta`` ``[P, V]`` (``t`` itself where beta = 0)."""
    if isinstance(beta, torch.Tensor):
        beta = beta.to(t.device, torch.float32)[:, None]
        return torch.where(beta == 0, t, t + beta * delta)
    return t if beta == 0.0 else t + beta * delta


def fuse(t: torch.Tensor, delta: torch.Tensor, beta: Setting) -> torch.Tensor:
    """Eq. 2: ``argmax(t + beta * delta)`` per row ``[P, V]`` -> ``[P]``; beta = 0 is the verifier's argmax."""
    return fusion_logits(t, delta, beta).argmax(-1)


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """Number of leading accepted positions (0-d long tensor): the index of the first rejection, or P."""
    return torch.cumprod(accepted.to(torch.long), dim=0).sum()


@dataclass
class GateOutput:
    """Per-position quantities of one step, all ``[P]`` on the logits' device (float32 / long / bool),
    plus the two full rows the trace reads (``[P, V]`` float32, kept rather than recomputed)."""

    accepted: torch.Tensor
    gamma_eff: torch.Tensor
    jsd: torch.Tensor  # JSD(a, b) whatever the gate (the trace's divergence)
    p_verifier: torch.Tensor
    p_base: torch.Tensor
    fused: torch.Tensor
    verifier_argmax: torch.Tensor
    p_verifier_fused: torch.Tensor
    p_base_fused: torch.Tensor
    log_verifier: torch.Tensor | None = None  # log_softmax(t)
    log_base: torch.Tensor | None = None  # log_softmax(b)
    fused_logits: torch.Tensor | None = None  # t + beta * delta
    log_fused: torch.Tensor | None = None  # log_softmax(t + beta * delta): the fused target at temperature 1
    alone: torch.Tensor | None = None  # [P] bool: positions where the verifier decides alone (two vocabularies)


def gate_step(
    a: torch.Tensor,
    b: torch.Tensor,
    t: torch.Tensor,
    drafts: torch.Tensor,
    *,
    gamma: Setting = 0.5,
    beta: Setting = 1.0,
    gate: str = "cda",
    delta: str = "contrast",
    lam: Setting = 0.1,
    alone: torch.Tensor | None = None,
) -> GateOutput:
    """Gate every drafted position and precompute the fused token for each (no host sync).

    Computing fusion for all P rows at once costs P argmaxes but lets the caller fetch the
    decision and every token it may emit in a single device-to-host transfer.

    ``alone`` ``[P]`` bool (a cross-family pair, :mod:`asymspec_mm.base.vocab_bridge`): where it is set the verifier's
    best token lies outside the tokens both models have, and the verifier decides alone: no steering (the fused token
    is ``argmax t``) and the draft is kept only if it is that token (the greedy limit of speculative sampling, whose
    gate set is then empty: :func:`asymspec_mm.base.sampling.gate_set` callers drop these positions).
    """
    a, b, t = a.float(), b.float(), t.float()
    log_a, log_b, log_t = a.log_softmax(-1), b.log_softmax(-1), t.log_softmax(-1)
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    divergence = jsd(log_a, log_b)
    log_ratio = (log_a[rows, drafts] - log_b[rows, drafts]) if gate == "tuned" else None
    gate_divergence = kl(log_a, log_b) if gate in KL_GATES else divergence
    if isinstance(gamma, torch.Tensor):
        gamma = gamma.to(a.device, torch.float32)
    gamma_eff = effective_threshold(gamma, gate, gate_divergence, log_ratio, lam)
    p_verifier = log_t[rows, drafts].exp()
    p_base = log_b[rows, drafts].exp()
    steered = fusion_logits(t, context_gain(a, b, t, delta), beta)
    accepted = accept(p_verifier, p_base, gamma_eff)
    if alone is not None:
        alone = alone.to(t.device)
        steered = torch.where(alone[:, None], t, steered)
        accepted = torch.where(alone, drafts == t.argmax(-1), accepted)
    log_f = steered.log_softmax(-1)
    fused = steered.argmax(-1)
    return GateOutput(
        accepted=accepted,
        gamma_eff=gamma_eff,
        jsd=divergence,
        p_verifier=p_verifier,
        p_base=p_base,
        fused=fused,
        verifier_argmax=t.argmax(-1),
        p_verifier_fused=log_t[rows, fused].exp(),
        p_base_fused=log_b[rows, fused].exp(),
        log_verifier=log_t,
        log_base=log_b,
        fused_logits=steered,
        log_fused=log_f,
        alone=alone,
    )
