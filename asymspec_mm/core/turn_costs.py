"""What the engine loop's work costs, measured as it runs: the numbers the policy's stall bound reads.

:class:`CostMeter` keeps running medians of three costs (:class:`~.policy.TurnCosts`): a decode step by its decode
tokens (turns that carry no prompt pieces), one prompt token carried beside a step (a turn's seconds past its step's
median, per prompt token) and one set-up model call (a vision tower pass). Each is measured on the loop's own clock,
so a device, a busy machine or a larger batch changes the bound with them; a median of the last few rather than an
average, because a turn descheduled on a busy machine takes many times its work and must not move the bound.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from .policy import TurnCosts

#: Measures each median is taken over: a few turns follow a change (a row joining, a busier machine).
COST_WINDOW = 9
#: Step sizes (decode tokens) remembered; the one measured longest ago goes first.
MAX_STEP_SIZES = 64


def _window() -> deque[float]:
    return deque(maxlen=COST_WINDOW)


def _median(values: deque[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class CostMeter:
    """Running medians of the loop's costs in seconds (``None`` until first measured); steps by decode tokens."""

    steps: dict[int, deque[float]] = field(default_factory=dict)
    tokens: deque[float] = field(default_factory=_window)
    jobs: deque[float] = field(default_factory=_window)
    held: bool = False  # the last turn held its prompt pieces back (to measure its step)

    def turn(self, seconds: float, prompt_tokens: int, decode_tokens: int, held: bool = False) -> None:
        """A turn's forwards took ``seconds``, carrying ``prompt_tokens`` prompt tokens beside a step of
        ``decode_tokens`` (0: no row decoded); ``held``: it held its prompt pieces back. Without prompt tokens it
        measures the step; with them, a prompt token's share of what the turn took past its step (none where it took
        no longer: a median of zeros would bound nothing)."""
        self.held = held
        if decode_tokens <= 0:
            return
        if prompt_tokens <= 0:
            measures = self.steps.pop(decode_tokens, None) or _window()
            measures.append(seconds)
            self.steps[decode_tokens] = measures  # the newest last
            while len(self.steps) > MAX_STEP_SIZES:
                del self.steps[next(iter(self.steps))]
            return
        step_s = TurnCosts(self._step_medians(), may_hold=False).step_s(decode_tokens)
        if step_s is not None and seconds > step_s:  # a turn quicker than its step's median says nothing of the pieces
            self.tokens.append((seconds - step_s) / prompt_tokens)

    def job(self, seconds: float) -> None:
        """One set-up model call took ``seconds``."""
        self.jobs.append(seconds)

    def _step_medians(self) -> dict[int, float]:
        return {d: statistics.median(m) for d, m in self.steps.items()}

    def costs(self) -> TurnCosts:
        """The medians as the policy reads them."""
        return TurnCosts(self._step_medians(), _median(self.tokens), _median(self.jobs), may_hold=not self.held)
