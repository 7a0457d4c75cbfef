"""The one device-to-host transfer of a step: the gate's decision and every token it may emit, as named rows.

The gate computes every position's quantities on the device (see :func:`asymspec_mm.gate.gate_step`);
packing them into one float64 tensor and reading it with one ``tolist()`` costs one sync a step instead
of one per value. Token ids are exact in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..gate import GateOutput


class GateRow(NamedTuple):
    """One gated position on the host."""

    accepted: bool
    gamma_eff: float
    jsd: float
    p_verifier: float  # softmax(t)[draft]
    p_base: float  # softmax(b)[draft]
    fused: int  # argmax(t + beta * delta)
    verifier_argmax: int
    p_verifier_fused: float  # softmax(t)[fused]
    p_base_fused: float  # softmax(b)[fused]
    draft: int


class BonusRow(NamedTuple):
    """The verifier's own token at position K+1 (``bonus="verifier"``), with its two probabilities."""

    token: int
    p_verifier: float
    p_base: float


GATE_WIDTH = len(GateRow._fields)
BONUS_WIDTH = len(BonusRow._fields)
TopPairs = list[tuple[int, float]]


def pack_gate(g: GateOutput, drafts: torch.Tensor) -> torch.Tensor:
    """``[P, 10]`` float64 in :class:`GateRow`'s column order; ``drafts`` ``[P]``."""
    cols = (g.accepted, g.gamma_eff, g.jsd, g.p_verifier, g.p_base, g.fused, g.verifier_argmax,
            g.p_verifier_fused, g.p_base_fused, drafts)
    return torch.stack([c.double() for c in cols], dim=1)


def pack_bonus(t_bonus: torch.Tensor, b_bonus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verifier's bonus token from logits ``t_bonus`` / ``b_bonus`` ``[1, V]``: (token ``[1]`` on the device,
    log_softmax(t_bonus) ``[1, V]``, the packed :class:`BonusRow` ``[3]`` float64)."""
    log_t = t_bonus.float().log_softmax(-1)
    token = log_t[0].argmax()
    p_base = b_bonus[0].float().log_softmax(-1)[token].exp()
    return token.view(1), log_t, torch.stack([token.double(), log_t[0, token].exp().double(), p_base.double()])


def topk_probs(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[P, 2k]``: the top-k token ids then their probabilities under softmax(logits ``[P, V]``), float64."""
    probs, ids = logits.float().softmax(-1).topk(k, dim=-1)
    return torch.cat([ids.double(), probs.double()], dim=-1)


def topk_logprobs(log_probs: torch.Tensor, k: int) -> torch.Tensor:
    """As :func:`topk_probs` for rows that are already log-probabilities (no second softmax)."""
    logp, ids = log_probs.topk(k, dim=-1)
    return torch.cat([ids.double(), logp.exp().double()], dim=-1)


def trace_tops(g: GateOutput, log_t_bonus: torch.Tensor, top: int) -> torch.Tensor:
    """``[K+1, 4*top]``: per position the verifier's then the fused distribution's top tokens, read from the
    rows the gate already computed. At the bonus position delta is 0, so its fused row *is* the verifier's
    (``log_t_bonus`` ``[1, V]``)."""
    top_ver = topk_logprobs(torch.cat([g.log_verifier, log_t_bonus]), top)
    return torch.cat([top_ver, torch.cat([topk_probs(g.fused_logits, top), top_ver[-1:]])], dim=1)


def gated_tops(g: GateOutput, top: int) -> torch.Tensor:
    """``[1, 4*top]``: the gated bonus position's verifier and fused top tokens."""
    return torch.cat([topk_logprobs(g.log_verifier, top), topk_probs(g.fused_logits, top)], dim=1)


def _gate_row(r: list[float]) -> GateRow:
    return GateRow(r[0] > 0.5, r[1], r[2], r[3], r[4], int(r[5]), int(r[6]), r[7], r[8], int(r[9]))


def _pairs(row: list[float], top: int) -> TopPairs:
    return [(int(row[j]), float(row[top + j])) for j in range(top)]


class StepOnHost(NamedTuple):
    """A step's decision on the host: gate rows ``[P]``, the bonus row (if packed) and per-position tops."""

    rows: list[GateRow]
    bonus: BonusRow | None
    tops: list[tuple[TopPairs, TopPairs]] | None  # (top_verifier, top_fused) per position

    def accepted_prefix(self) -> int:
        """Leading accepted positions: the index of the first rejection, or P."""
        n = 0
        while n < len(self.rows) and self.rows[n].accepted:
            n += 1
        return n


def to_host(gate: torch.Tensor, bonus: torch.Tensor | None = None, tops: torch.Tensor | None = None,
            top: int = 0) -> StepOnHost:
    """One transfer of packed ``gate`` ``[P, 10]``, ``bonus`` ``[3]`` and ``tops`` ``[P', 4*top]``."""
    parts = [gate.flatten()] + ([bonus] if bonus is not None else []) + ([tops.flatten()] if tops is not None else [])
    flat = torch.cat(parts).tolist()
    n = gate.shape[0]
    rows = [_gate_row(flat[i * GATE_WIDTH:(i + 1) * GATE_WIDTH]) for i in range(n)]
    o = n * GATE_WIDTH
    bonus_row = None
    if bonus is not None:
        bonus_row = BonusRow(int(flat[o]), flat[o + 1], flat[o + 2])
        o += BONUS_WIDTH
    host_tops = None
    if tops is not None:
        w = 4 * top
        host_tops = [(_pairs(flat[o + w * i:o + w * i + 2 * top], top), _pairs(flat[o + w * i + 2 * top:o + w * (i + 1)], top))
                     for i in range(tops.shape[0])]
    return StepOnHost(rows, bonus_row, host_tops)
