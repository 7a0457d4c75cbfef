"""Sampled AsymSpec (temperature > 0): the rule as pure tensor math over the positions of one step.

Terms, per drafted position i, with temperature ``tau > 0`` and ``F`` the top-k then top-p filter of a row of
tempered logits (the same filter for every distribution):

* ``q_i = softmax(F(a_i / tau))``: the drafter's proposal on the full view; the draft is ``d_i ~ q_i``.
* ``f_i = softmax(F((t_i + beta * delta_i) / tau))``: the fused target (``delta_i = a_i - b_i``).
* ``A_i = {x : softmax(t_i)[x] > gamma_eff_i * softmax(b_i)[x]}``: the gate's set, from **untempered**,
  unfiltered probabilities and the unchanged ``gamma_eff`` (:mod:`asymspec_mm.base.gate`).
* ``alpha_i = 1`` if ``d_i`` is in ``A_i``, else ``min(1, f_i(d_i) / q_i(d_i))``: the acceptance probability.
* ``r_i = norm((f_i - q_i)+)``: what is sampled at the first rejection (``f_i`` itself where ``q_i = f_i``).
* ``E_i = sum_{x in A_i} (q_i - f_i)+(x)``: the *gate excess*.

Each emitted token is then an exact draw from ``P_i = f_i + 1_{A_i} (q_i - f_i)+ - E_i r_i``, and
``TV(P_i, f_i) = E_i`` (:func:`emitted_distribution`). With ``A_i`` empty this is lossless speculative sampling of
``f_i`` (Leviathan et al., Chen et al.); with ``A_i`` empty and beta = 0 it samples the verifier on the compressed
view; as tau -> 0 it becomes the greedy rule. Symmetric SD is the case ``A`` empty, ``f = softmax(F(t / tau))``.

Randomness comes in as uniforms (``u`` in [0, 1)), drawn per row from the row's own generator
(:func:`row_generator`), so a seeded request gives the same tokens alone, in any batch, and on any backend that
computes the same logits. Tokens are drawn by inverting the cumulative distribution in float64.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p filtering of each row of ``logits`` ``[P, V]``; removed entries become -inf.

    ``top_k`` ``[P]`` long (0: off for that row; None: off for every row) keeps the k largest logits and any tied with
    the k-th; ``top_p`` ``[P]`` (1: off; None: off for every row) then keeps the smallest set of the largest tokens
    whose probability under the top-k distribution reaches ``top_p`` (the first token always stays), and any tied
    with the last one kept. Each filter is a cut-off logit per row, so rows differ only in the values they carry.
    """
    if top_k is None and top_p is None:
        return logits
    width = logits.shape[-1]
    ordered = logits.sort(dim=-1, descending=True).values
    # the index of the last token kept, in descending order: the k-th, or the last one
    last = torch.full((logits.shape[0], 1), width - 1, dtype=torch.long, device=logits.device)
    if top_k is not None:
        last = (torch.where(top_k > 0, top_k, torch.full_like(top_k, width)).clamp(max=width) - 1)[:, None]
    if top_p is not None:
        probs = (
            ordered.masked_fill(ordered < ordered.gather(-1, last), float("-inf")).softmax(-1) if top_k is not None else ordered.softmax(-1)
        )
        # the first token whose cumulative mass reaches top_p is the last one kept (the tokens before it hold less);
        # a row with top_p 1 keeps all its top-k, whatever the rounding of the sum
        reach = torch.searchsorted(probs.cumsum(-1), top_p[:, None].to(probs.dtype))
        last = torch.where(top_p[:, None] >= 1.0, last, torch.minimum(reach, last))
    return logits.masked_fill(logits < ordered.gather(-1, last), float("-inf"))


def tempered_probs(logits: torch.Tensor, tau: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """``softmax(F(logits / tau))`` ``[P, V]`` float32 for logits ``[P, V]`` and per-position ``tau`` (> 0),
    ``top_k``, ``top_p`` ``[P]`` (None: that filter is off for every position)."""
    scaled = logits.float() / tau.float()[:, None]
    return filter_logits(scaled, top_k, top_p).softmax(-1)


#: A draw's target is scaled by this so that it stays below the total mass after rounding: the token drawn then always
#: has probability above 0 (the bias, 1e-12 of the last token's share, is far below anything measurable).
_BELOW_TOTAL = 1.0 - 1e-12


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[P, V]`` (non-negative, not necessarily normalised) from uniforms ``u`` ``[P]``
    in [0, 1), by inverting the cumulative distribution (float64): token x has probability ``probs[x] / sum``, and
    a token of probability 0 is never drawn. Returns ``[P]`` long."""
    cdf = probs.double().cumsum(-1)
    target = u.double() * cdf[:, -1] * _BELOW_TOTAL
    return torch.searchsorted(cdf, target[:, None], right=True)[:, 0]


def gate_set(log_t: torch.Tensor, log_b: torch.Tensor, gamma_eff: torch.Tensor) -> torch.Tensor:
    """``A`` ``[P, V]`` bool: the tokens the gate would accept, ``softmax(t)[x] > gamma_eff * softmax(b)[x]``, from
    the untempered log-probabilities ``log_t``, ``log_b`` ``[P, V]`` and ``gamma_eff`` ``[P]`` (Eq. 4 for every x)."""
    return log_t.exp() > gamma_eff[:, None] * log_b.exp()


@dataclass
class SampledDecision:
    """The sampled rule at P positions (all ``[P]``, on the device): ``accepted`` (the draft is kept),
    ``accept_prob`` (``alpha``), ``residual`` (the token emitted if the position is the first rejection, a draw of
    ``r``) and ``gate_excess`` (``E``)."""

    accepted: torch.Tensor
    accept_prob: torch.Tensor
    residual: torch.Tensor
    gate_excess: torch.Tensor


def sampled_gate(
    q: torch.Tensor,
    f: torch.Tensor,
    in_gate: torch.Tensor | None,
    drafts: torch.Tensor,
    u_accept: torch.Tensor,
    u_residual: torch.Tensor,
) -> SampledDecision:
    """The module's rule at P positions: proposal ``q`` and target ``f`` ``[P, V]`` (probabilities), the gate's set
    ``in_gate`` ``[P, V]`` bool (None: empty, plain speculative sampling), the drafts ``[P]`` (drawn from q) and two
    uniforms per position, ``u_accept`` and ``u_residual`` ``[P]``."""
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    # q(d) > 0: d was drawn from q (a greedy row's argmax survives every filter)
    ratio = (f[rows, drafts] / q[rows, drafts]).clamp(max=1.0)
    if in_gate is None:
        alpha, excess = ratio, torch.zeros_like(ratio)
    else:
        alpha = ratio.masked_fill(in_gate[rows, drafts], 1.0)
        excess = ((q - f).clamp_min(0.0) * in_gate).sum(-1)
    residual = (f - q).clamp_min(0.0)
    # where q == f nothing is ever rejected; f keeps the draw defined
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, f)
    return SampledDecision(u_accept.to(alpha.dtype) < alpha, alpha, sample_from(residual, u_residual), excess)


def emitted_distribution(q: torch.Tensor, f: torch.Tensor, in_gate: torch.Tensor | None) -> torch.Tensor:
    """The closed form of what the rule emits at one position, ``P = f + 1_A (q - f)+ - E r`` ``[..., V]``, from the
    probabilities ``q``, ``f`` and the gate's set ``in_gate`` (None: empty) ``[..., V]``."""
    over = (q - f).clamp_min(0.0)
    under = (f - q).clamp_min(0.0)
    gate = torch.zeros_like(q, dtype=torch.bool) if in_gate is None else in_gate
    excess = torch.where(gate, over, torch.zeros_like(over)).sum(-1, keepdim=True)
    z = under.sum(-1, keepdim=True)
    r = torch.where(z > 0, under / z.clamp_min(torch.finfo(q.dtype).tiny), f)
    return f + torch.where(gate, over, torch.zeros_like(over)) - excess * r


#: Fresh seeds lie below 2**53: exact as a float64 and as a JavaScript number, so one read off a page or a JSON
#: response and sent back repeats the request.
FRESH_SEED_LIMIT = 2**53


def new_seed() -> int:
    """A fresh random seed in [0, :data:`FRESH_SEED_LIMIT`) for a request that gave none (reported back, so the
    request can be repeated)."""
    return secrets.randbelow(FRESH_SEED_LIMIT)


def row_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A row's own random generator on ``device``, seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def draw_uniforms(generators: list[torch.Generator | None], n: int, device: torch.device | str) -> torch.Tensor:
    """``[R, n]`` float64 uniforms in [0, 1): row ``j`` draws ``n`` from ``generators[j]`` (a greedy row, None,
    gets zeros and draws nothing), so what a row draws never depends on the other rows."""
    out = torch.zeros(len(generators), n, dtype=torch.float64, device=device)
    for j, gen in enumerate(generators):
        if gen is not None:
            out[j] = torch.rand(n, generator=gen, dtype=torch.float64, device=device)
    return out
