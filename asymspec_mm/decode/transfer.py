"""The one device-to-host transfer of a step: the gate's decision and every token it may emit, as named rows.

The gate computes every position's quantities on the device (see :func:`asymspec_mm.base.gate.gate_step`);
packing them into one float64 tensor and reading it with one ``tolist()`` costs one sync a step instead
of one per value. Token ids are exact in float64.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..base.gate import GateOutput
from ..base.sampling import SampledDecision


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
    accept_prob: float | None = None  # sampled rows: the draft's acceptance probability alpha (1 inside the gate's set)
    gate_excess: float | None = None  # sampled rows: E, the emitted distribution's TV distance from the fused target
    p_fused_draft: float | None = None  # softmax(t + beta * delta)[draft]
    p_fused_fused: float | None = None  # softmax(t + beta * delta)[fused]
    alone: bool = False  # two vocabularies: the verifier's best token lay outside the map, it decided alone


class BonusRow(NamedTuple):
    """The verifier's own token at position K+1 (``bonus="verifier"``), with its two probabilities."""

    token: int
    p_verifier: float
    p_base: float
    argmax: int  # the verifier's own argmax there (the token itself unless it was sampled)
    alone: bool = False  # two vocabularies: the verifier's best token there lay outside the map


GATE_WIDTH = len(GateRow._fields)
BONUS_WIDTH = len(BonusRow._fields)
TopPairs = list[tuple[int, float]]


def pack_gate(g: GateOutput, drafts: torch.Tensor, sampled: SampledDecision | None = None) -> torch.Tensor:
    """``[P, 15]`` float64 in :class:`GateRow`'s column order; ``drafts`` ``[P]``. With ``sampled`` (a step with
    sampled rows) its decision and residual token replace the greedy gate's accepted flag and fused token."""
    rows = torch.arange(drafts.shape[0], device=g.log_fused.device)
    if sampled is None:
        accepted, fused, p_ver_fused, p_base_fused = g.accepted, g.fused, g.p_verifier_fused, g.p_base_fused
        alpha = excess = torch.full_like(g.gamma_eff, math.nan)
    else:
        accepted, fused, alpha, excess = sampled.accepted, sampled.residual, sampled.accept_prob, sampled.gate_excess
        p_ver_fused, p_base_fused = g.log_verifier[rows, fused].exp(), g.log_base[rows, fused].exp()
    p_fused = (g.log_fused[rows, drafts.to(rows.device)].exp(), g.log_fused[rows, fused].exp())
    cols = (accepted, g.gamma_eff, g.jsd, g.p_verifier, g.p_base, fused, g.verifier_argmax, p_ver_fused, p_base_fused, drafts)
    alone = torch.zeros_like(g.accepted) if g.alone is None else g.alone
    cols += (alpha, excess, *p_fused, alone)
    return torch.stack([c.double() for c in cols], dim=1)


def pack_bonus(
    t_bonus: torch.Tensor, b_bonus: torch.Tensor, token: torch.Tensor | None = None, alone: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verifier's bonus token of R rows from logits ``t_bonus`` / ``b_bonus`` ``[R, V]``: (tokens ``[R]`` on the
    device, log_softmax(t_bonus) ``[R, V]``, the packed :class:`BonusRow` ``[R, 5]`` float64). ``token`` ``[R]``: the
    tokens already chosen (sampled rows' draws); default the argmax. ``alone`` ``[R]`` bool: :attr:`BonusRow.alone`."""
    log_t = t_bonus.float().log_softmax(-1)
    token = log_t.argmax(-1) if token is None else token.to(log_t.device)
    p_ver = log_t.gather(-1, token[:, None])[:, 0].exp()
    p_base = b_bonus.float().log_softmax(-1).gather(-1, token[:, None])[:, 0].exp()
    alone = torch.zeros_like(p_ver) if alone is None else alone.to(p_ver.device)
    cols = (token, p_ver, p_base, log_t.argmax(-1), alone)
    return token, log_t, torch.stack([c.double() for c in cols], dim=1)


def topk_logprobs(log_probs: torch.Tensor, k: int) -> torch.Tensor:
    """``[P, 2k]``: the top-k token ids then their probabilities, from rows ``[P, V]`` of log-probabilities, float64."""
    logp, ids = log_probs.topk(k, dim=-1)
    return torch.cat([ids.double(), logp.exp().double()], dim=-1)


def trace_tops(g: GateOutput, log_t_bonus: torch.Tensor, top: int) -> torch.Tensor:
    """``[R*(K+1), 4*top]``: per row and position the verifier's then the fused distribution's top tokens, read from
    the rows the gate already computed (``g`` over R*K positions, row-major). At the bonus position delta is 0,
    so its fused row *is* the verifier's (``log_t_bonus`` ``[R, V]``)."""
    r = log_t_bonus.shape[0]
    k = g.log_verifier.shape[0] // r
    ver = torch.cat([g.log_verifier.view(r, k, -1), log_t_bonus[:, None]], dim=1).flatten(0, 1)
    top_ver = topk_logprobs(ver, top)  # [R*(K+1), 2*top]
    fused = topk_logprobs(g.log_fused, top).view(r, k, -1)
    top_fused = torch.cat([fused, top_ver.view(r, k + 1, -1)[:, -1:]], dim=1).flatten(0, 1)
    return torch.cat([top_ver, top_fused], dim=1)


def gated_tops(g: GateOutput, top: int) -> torch.Tensor:
    """``[1, 4*top]``: the gated bonus position's verifier and fused top tokens."""
    return torch.cat([topk_logprobs(g.log_verifier, top), topk_logprobs(g.log_fused, top)], dim=1)


def _gate_row(r: list[float]) -> GateRow:
    alpha, excess = (None if math.isnan(x) else x for x in r[10:12])
    return GateRow(
        r[0] > 0.5, r[1], r[2], r[3], r[4], int(r[5]), int(r[6]), r[7], r[8], int(r[9]), alpha, excess, r[12], r[13], r[14] > 0.5
    )


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


def pack_host(gate: torch.Tensor, bonus: torch.Tensor | None = None, tops: torch.Tensor | None = None) -> torch.Tensor:
    """Packed ``gate`` ``[R*P, 15]``, ``bonus`` ``[R, 5]`` and ``tops`` ``[R*P', 4*top]`` as one flat float64 tensor
    (what a step moves to the host; :func:`read_host` reads it back)."""
    parts = [gate.flatten()] + ([bonus.flatten()] if bonus is not None else []) + ([tops.flatten()] if tops is not None else [])
    return torch.cat(parts)


def read_host(flat: list[float], positions: int, rows: int, bonus: bool = False, tops_per_row: int = 0, top: int = 0) -> list[StepOnHost]:
    """Each of ``rows`` rows' decision from ``flat`` (:func:`pack_host`'s values): ``positions`` gated positions a row,
    a bonus row each when ``bonus``, ``tops_per_row`` positions of top tokens each."""
    n = positions
    bonus_at = rows * n * GATE_WIDTH
    tops_at = bonus_at + (rows * BONUS_WIDTH if bonus else 0)
    w = 4 * top
    out = []
    for r in range(rows):
        gate_rows = [_gate_row(flat[(r * n + i) * GATE_WIDTH : (r * n + i + 1) * GATE_WIDTH]) for i in range(n)]
        bonus_row = None
        if bonus:
            o = bonus_at + r * BONUS_WIDTH
            bonus_row = BonusRow(int(flat[o]), flat[o + 1], flat[o + 2], int(flat[o + 3]), flat[o + 4] > 0.5)
        host_tops = None
        if tops_per_row:
            o = tops_at + r * tops_per_row * w
            host_tops = [
                (_pairs(flat[o + w * i : o + w * i + 2 * top], top), _pairs(flat[o + w * i + 2 * top : o + w * (i + 1)], top))
                for i in range(tops_per_row)
            ]
        out.append(StepOnHost(gate_rows, bonus_row, host_tops))
    return out
