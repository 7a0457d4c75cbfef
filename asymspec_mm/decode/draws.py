"""The random part of one decoding step: which rows sample, their settings per position and the step's uniforms.

A row samples when its config's temperature is above 0 (:mod:`asymspec_mm.sampling` states the rule); the other
rows of the same step keep the greedy rule bit for bit (their decisions are taken from the greedy gate). Every
sampled row draws the same number of uniforms a step from its own generator, ``3 * n`` for a step of ``n``
positions (K drafts and the bonus position): row ``j``'s ``u[j, 0]`` draw the drafts, ``u[j, 1]`` decide
acceptance, ``u[j, 2]`` draw the residual (or the bonus) token. What a row draws therefore never depends on the
rows beside it: a seeded request repeats its tokens alone or in any batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..gate import GateOutput
from ..sampling import SampledDecision, draw_uniforms, gate_set, sample_from, sampled_gate, tempered_log_probs


class StepDraws:
    """The sampled rows among R rows of one step (``sampled`` ``[R]`` bool), their ``tau`` / ``top_k`` / ``top_p``
    ``[R]`` (greedy rows: 1, 0, 1, unused) and uniforms ``u`` ``[R, 3, n]`` float64; :attr:`proposals` collects the
    drafter's ``log q`` ``[R, V]`` of each draft drawn with :meth:`draw`."""

    def __init__(self, configs: Sequence[Any], generators: Sequence[torch.Generator | None], n: int, device: torch.device):
        self.device = device
        self.sampled = torch.tensor([g is not None for g in generators], device=device)
        self.tau = torch.tensor([c.temperature if g is not None else 1.0 for c, g in zip(configs, generators)], device=device)
        self.top_k = torch.tensor([c.top_k for c in configs], dtype=torch.long, device=device)
        self.top_p = torch.tensor([c.top_p for c in configs], dtype=torch.float32, device=device)
        self.u = draw_uniforms(list(generators), 3 * n, device).view(len(configs), 3, n)
        self.proposals: list[torch.Tensor] = []

    @classmethod
    def of(cls, rows: Sequence[Any], n: int, device: torch.device) -> StepDraws | None:
        """The draws of ``rows`` (each with ``config`` and ``rng``) for a step of ``n`` positions; None when every
        row is greedy (the greedy step then runs unchanged)."""
        if all(row.rng is None for row in rows):
            return None
        return cls([row.config for row in rows], [row.rng for row in rows], n, device)

    def subset(self, index: list[int]) -> StepDraws:
        """The same draws for the rows ``index`` only (no new uniforms are drawn)."""
        out = object.__new__(StepDraws)
        out.device = self.device
        idx = torch.tensor(index, dtype=torch.long, device=self.device)
        for name in ("sampled", "tau", "top_k", "top_p", "u"):
            setattr(out, name, getattr(self, name)[idx])
        out.proposals = [p[idx.to(p.device)] for p in self.proposals]
        return out

    def per_position(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """A per-row tensor ``[R]`` repeated for each of ``n`` positions a row: ``[R * n]``."""
        return x.repeat_interleave(n)

    def log_probs(self, logits: torch.Tensor, n: int = 1) -> torch.Tensor:
        """The sampled distribution ``log softmax(F(logits / tau))`` of logits ``[R * n, V]`` (n positions a row)."""
        p = lambda x: self.per_position(x, n).to(logits.device)  # noqa: E731
        return tempered_log_probs(logits, p(self.tau), p(self.top_k), p(self.top_p))

    def draw(self, logits: torch.Tensor, col: int) -> torch.Tensor:
        """Tokens ``[R]`` from logits ``[R, V]``: sampled rows draw from the tempered, filtered distribution with
        their uniform ``u[:, 0, col]`` (its ``log q`` is kept in :attr:`proposals`), greedy rows take the argmax."""
        log_q = self.log_probs(logits)
        self.proposals.append(log_q)
        drawn = sample_from(log_q.exp(), self.u[:, 0, col].to(logits.device))
        return torch.where(self.sampled.to(logits.device), drawn, logits.argmax(-1))

    def draw_residual(self, logits: torch.Tensor, col: int) -> torch.Tensor:
        """Tokens ``[R]`` from a target's logits ``[R, V]`` with the uniforms ``u[:, 2, col]`` (greedy rows: argmax):
        the bonus token, or a plain method's token."""
        drawn = sample_from(self.log_probs(logits).exp(), self.u[:, 2, col].to(logits.device))
        return torch.where(self.sampled.to(logits.device), drawn, logits.argmax(-1))

    def decide(
        self,
        log_q: torch.Tensor,
        target_logits: torch.Tensor,
        drafts: torch.Tensor,
        col: int,
        g: GateOutput | None = None,
        greedy: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SampledDecision:
        """The sampled rule at n positions a row, from column ``col`` on: proposals ``log_q`` ``[R, n, V]``, the
        target's logits ``[R * n, V]`` (AsymSpec: ``t + beta * delta``; SD: ``t``), drafts ``[R, n]``; ``g`` the
        greedy gate of these positions (its set ``A``; None: ``A`` empty, as SD). Greedy rows keep ``greedy`` =
        (accepted, token) ``[R * n]``, with NaN ``accept_prob`` and ``gate_excess``."""
        r, n = drafts.shape
        log_f = self.log_probs(target_logits, n)
        in_gate = None if g is None else gate_set(g.log_verifier, g.log_base, g.gamma_eff)
        u = self.u[:, :, col : col + n].to(log_f.device)
        s = sampled_gate(
            log_q.flatten(0, 1).to(log_f.device), log_f, in_gate, drafts.flatten().to(log_f.device), u[:, 1].flatten(), u[:, 2].flatten()
        )
        if greedy is None:
            return s
        on = self.per_position(self.sampled, n).to(log_f.device)
        nan = torch.full_like(s.accept_prob, float("nan"))
        return SampledDecision(
            torch.where(on, s.accepted, greedy[0]),
            torch.where(on, s.accept_prob, nan),
            torch.where(on, s.residual, greedy[1]),
            torch.where(on, s.gate_excess, nan),
        )
