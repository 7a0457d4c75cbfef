"""The random part of one decoding step: which rows sample, their settings per position and the step's uniforms.

A row samples when its config's temperature is above 0 (:mod:`asymspec_mm.base.sampling` states the rule); the other
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

from ..base.gate import GateOutput
from ..base.sampling import SampledDecision, draw_uniforms, gate_set, sample_from, sampled_gate, tempered_probs


class RowSettings:
    """The sampling settings of a step's rows on the device, made once for a set of rows and reused while the same rows
    step (no host-to-device copy a step): ``sampled`` ``[R]`` bool, ``tau`` ``[R]`` (greedy rows: 1, unused), and
    ``top_k`` / ``top_p`` ``[R]``, or None where no row uses that filter; :meth:`per_position` repeats them for n
    positions a row."""

    def __init__(self, configs: Sequence[Any], sampled: Sequence[bool], device: torch.device):
        self.sampled_host = tuple(bool(x) for x in sampled)
        self.sampled = torch.tensor(list(sampled), device=device)
        self.all_sampled = all(sampled)  # then no greedy row's argmax needs computing
        self.tau = torch.tensor([c.temperature if on else 1.0 for c, on in zip(configs, sampled)], device=device)
        self.top_k = torch.tensor([c.top_k for c in configs], dtype=torch.long, device=device) if any(c.top_k for c in configs) else None
        use_p = any(c.top_p < 1.0 for c in configs)
        self.top_p = torch.tensor([c.top_p for c in configs], dtype=torch.float32, device=device) if use_p else None
        self._repeated: dict[int, tuple] = {}

    def per_position(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """``(tau, top_k, top_p, sampled)``, each repeated for n positions a row (``[R * n]``)."""
        if n not in self._repeated:
            rep = lambda x: None if x is None else x.repeat_interleave(n)  # noqa: E731
            self._repeated[n] = (rep(self.tau), rep(self.top_k), rep(self.top_p), rep(self.sampled))
        return self._repeated[n]


class StepDraws:
    """The draws of one step's R rows: their :class:`RowSettings` and uniforms ``u`` ``[R, 3, n]`` float64;
    :attr:`proposals` collects the drafter's ``q`` ``[R, V]`` of each draft drawn with :meth:`draw`."""

    def __init__(self, settings: RowSettings, generators: Sequence[torch.Generator | None], n: int, device: torch.device):
        self.settings = settings
        self.sampled = settings.sampled
        self.u = draw_uniforms(list(generators), 3 * n, device).view(len(generators), 3, n)
        self.proposals: list[torch.Tensor] = []

    @classmethod
    def of(cls, rows: Sequence[Any], n: int, device: torch.device, cache: dict | None = None) -> StepDraws | None:
        """The draws of ``rows`` (each with ``id``, ``config`` and ``rng``) for a step of ``n`` positions; None when
        every row is greedy (the greedy step then runs unchanged). ``cache`` (a dict the caller keeps) holds the rows'
        :class:`RowSettings` while the same rows step."""
        if all(row.rng is None for row in rows):
            return None
        key = (str(device), tuple((row.id, row.config, row.rng is not None) for row in rows))
        settings = None if cache is None else cache.get(key)
        if settings is None:
            settings = RowSettings([row.config for row in rows], [row.rng is not None for row in rows], device)
            if cache is not None:
                cache.clear()
                cache[key] = settings
        return cls(settings, [row.rng for row in rows], n, device)

    def subset(self, index: list[int]) -> StepDraws:
        """The same draws for the rows ``index`` only (no new uniforms are drawn)."""
        out = object.__new__(StepDraws)
        idx = torch.tensor(index, dtype=torch.long, device=self.u.device)
        settings = object.__new__(RowSettings)
        s = self.settings
        settings.sampled, settings.tau = s.sampled[idx], s.tau[idx]
        settings.top_k = None if s.top_k is None else s.top_k[idx]
        settings.top_p = None if s.top_p is None else s.top_p[idx]
        settings._repeated = {}
        settings.sampled_host = tuple(s.sampled_host[i] for i in index)
        settings.all_sampled = all(settings.sampled_host)  # from the host copy: no device sync
        out.settings, out.sampled, out.u = settings, settings.sampled, self.u[idx]
        out.proposals = [p[idx.to(p.device)] for p in self.proposals]
        return out

    def probs(self, logits: torch.Tensor, n: int = 1) -> torch.Tensor:
        """The sampled distribution ``softmax(F(logits / tau))`` of logits ``[R * n, V]`` (n positions a row)."""
        tau, top_k, top_p, _ = (None if x is None else x.to(logits.device) for x in self.settings.per_position(n))
        return tempered_probs(logits, tau, top_k, top_p)

    def draw(self, logits: torch.Tensor, col: int) -> torch.Tensor:
        """Tokens ``[R]`` from logits ``[R, V]``: sampled rows draw from the tempered, filtered distribution with
        their uniform ``u[:, 0, col]`` (its ``q`` is kept in :attr:`proposals`), greedy rows take the argmax."""
        q = self.probs(logits)
        self.proposals.append(q)
        drawn = sample_from(q, self.u[:, 0, col].to(logits.device))
        return drawn if self.settings.all_sampled else torch.where(self.sampled.to(logits.device), drawn, logits.argmax(-1))

    def draw_residual(self, logits: torch.Tensor, col: int) -> torch.Tensor:
        """Tokens ``[R]`` from a target's logits ``[R, V]`` with the uniforms ``u[:, 2, col]`` (greedy rows: argmax):
        the bonus token, or a plain method's token."""
        drawn = sample_from(self.probs(logits), self.u[:, 2, col].to(logits.device))
        return drawn if self.settings.all_sampled else torch.where(self.sampled.to(logits.device), drawn, logits.argmax(-1))

    def decide(
        self,
        q: torch.Tensor,
        target_logits: torch.Tensor,
        drafts: torch.Tensor,
        col: int,
        g: GateOutput | None = None,
        greedy: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SampledDecision:
        """The sampled rule at n positions a row, from column ``col`` on: proposals ``q`` ``[R, n, V]``, the
        target's logits ``[R * n, V]`` (AsymSpec: ``t + beta * delta``; SD: ``t``), drafts ``[R, n]``; ``g`` the
        greedy gate of these positions (its set ``A``; None: ``A`` empty, as SD). Greedy rows keep ``greedy`` =
        (accepted, token) ``[R * n]``, with NaN ``accept_prob`` and ``gate_excess``."""
        r, n = drafts.shape
        f = self.probs(target_logits, n)
        in_gate = None if g is None else gate_set(g.log_verifier, g.log_base, g.gamma_eff)
        if in_gate is not None and g.alone is not None:  # where the verifier decides alone the gate's set is empty
            in_gate = in_gate & ~g.alone[:, None].to(in_gate.device)
        dev = f.device  # the verifier may live on another device than the drafter
        u = self.u[:, :, col : col + n].to(dev)
        s = sampled_gate(q.flatten(0, 1).to(dev), f, in_gate, drafts.flatten().to(dev), u[:, 1].flatten(), u[:, 2].flatten())
        if greedy is None or self.settings.all_sampled:
            return s
        on = self.settings.per_position(n)[3].to(dev)
        nan = torch.full_like(s.accept_prob, float("nan"))
        return SampledDecision(
            torch.where(on, s.accepted, greedy[0]),
            torch.where(on, s.accept_prob, nan),
            torch.where(on, s.residual, greedy[1]),
            torch.where(on, s.gate_excess, nan),
        )
