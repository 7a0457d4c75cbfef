"""Step statistics of one request, kept by the caller of a loop (as vLLM's ``SpecDecodingStats``).

Terms, per request (K = ``k``, a *step* = one verification round):

* ``drafted``: draft tokens put to the gate, K per step.
* ``accepted``: drafts the gate accepted; ``accepted_per_position[i]``: steps whose draft at position
  i+1 was accepted (so the list is non-increasing and sums to ``accepted``).
* ``acceptance_rate = accepted / drafted``; ``accepted_per_position_rate[i] = accepted_per_position[i] / steps``.
* ``mean_accepted_length = new_tokens / steps``: tokens emitted per step (accepted drafts + the fused,
  corrected or bonus token).
* The gated bonus (``bonus="gated"``) is not one of the K drafts: it is put to the gate only after K
  acceptances, and counted apart as ``bonus_drafted`` / ``bonus_accepted`` (``bonus_acceptance_rate``),
  so the K-position rates mean the same under both bonus rules.
* ``prefill_tokens`` / ``prefill_calls``: per stream, the tokens forwarded and the forward calls made before decoding
  began (its prompt's prefill; 0 where a stored prefix held the whole prompt); ``tokens_forwarded`` and
  ``forward_calls`` count them too.
* Sampled rows (temperature > 0): ``seed``, the seed the row's generator started from (None when greedy), and
  ``mean_gate_excess``, the mean over the gated tokens emitted of E (:mod:`asymspec_mm.base.sampling`): how far the
  emitted distribution is from the fused target in total variation (0: the fused target exactly; None when greedy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..engines import Engine

STOP_REASONS = ("max_new_tokens", "eos", "stop_string")


@dataclass
class Counters:
    """The counts above; each event of a loop has one mutator."""

    k: int
    streams: dict[str, Engine]
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    bonus_drafted: int = 0
    bonus_accepted: int = 0
    deferred_draft: int = 0
    new_tokens: int = 0
    stopped_by: str = "max_new_tokens"
    prefill_tokens: dict[str, int] = field(default_factory=dict)
    prefill_calls: dict[str, int] = field(default_factory=dict)
    seed: int | None = None
    gate_excess_sum: float = 0.0
    gate_excess_n: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.k
        self.prefill_tokens = {name: e.tokens_forwarded for name, e in self.streams.items()}
        self.prefill_calls = {name: e.forward_calls for name, e in self.streams.items()}

    def record_step(self, drafted: int, n_accepted: int) -> None:
        """One step: ``drafted`` drafts gated, the first ``n_accepted`` of them accepted (0 and 0: a greedy step)."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += n_accepted
        for i in range(n_accepted):
            self.accepted_per_position[i] += 1

    def record_bonus(self, accepted: bool) -> None:
        """A gated bonus draft a_{K+1} put to the gate after K acceptances."""
        self.bonus_drafted += 1
        self.bonus_accepted += int(accepted)

    def record_deferred(self, deferred: bool) -> None:
        """Whether this step's d_K waits, unforwarded, for the next step's first drafting forward."""
        self.deferred_draft = int(deferred)

    def record_gate_excess(self, values: list[float]) -> None:
        """The gate excess E of each gated token a sampled row committed in a step."""
        self.gate_excess_sum += sum(values)
        self.gate_excess_n += len(values)

    def record_commit(self, new_tokens: int, stopped_by: str | None) -> None:
        """The committed length after a step, and why decoding stops (None: it goes on)."""
        self.new_tokens = new_tokens
        if stopped_by is not None:
            self.stopped_by = stopped_by

    def as_dict(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": self.new_tokens / self.steps if self.steps else 0.0,
            "accepted_per_position": list(self.accepted_per_position),
            "accepted_per_position_rate": [n / self.steps for n in self.accepted_per_position] if self.steps else [],
            "bonus_drafted": self.bonus_drafted,
            "bonus_accepted": self.bonus_accepted,
            "bonus_acceptance_rate": self.bonus_accepted / self.bonus_drafted if self.bonus_drafted else 0.0,
            # 1: the last step's d_K was never forwarded (no next step carried it); forwarded counts are one lower
            "deferred_draft_at_end": self.deferred_draft,
            "tokens_forwarded": {n: e.tokens_forwarded for n, e in self.streams.items()},
            "prefill_tokens": dict(self.prefill_tokens),
            "prefill_calls": dict(self.prefill_calls),
            "forward_calls": {n: e.forward_calls for n, e in self.streams.items()},
            "new_tokens": self.new_tokens,
            "stopped_by": self.stopped_by,
            "seed": self.seed,
            "mean_gate_excess": self.gate_excess_sum / self.gate_excess_n if self.gate_excess_n else None,
            "decode_wall_s": wall,
            "tokens_per_s": self.new_tokens / wall if wall > 0 else 0.0,
        }
