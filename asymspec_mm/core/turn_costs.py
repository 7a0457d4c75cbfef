"""What the engine loop's work costs, measured as it runs: the numbers the policy's stall bound reads.

:class:`CostMeter` keeps moving averages of three costs (:class:`~.policy.TurnCosts`): a decode step by its decode
tokens (turns that carry no prompt pieces), one prompt token carried beside a step (a turn's seconds past its step's
average, per prompt token) and one set-up model call (a vision tower pass). Each is measured on the loop's own
clock, so a device, a busy machine or a larger batch changes the bound with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .policy import TurnCosts

#: Weight of the newest measure in each moving average: a few turns follow a change (a row joining, a busier machine).
COST_WEIGHT = 0.25
#: Step sizes (decode tokens) remembered; the oldest measured goes first.
MAX_STEP_SIZES = 64


def _average(old: float | None, new: float, weight: float = COST_WEIGHT) -> float:
    return new if old is None else old + weight * (new - old)


@dataclass
class CostMeter:
    """Moving averages of the loop's costs in seconds (``None`` until first measured); ``steps`` by decode tokens."""

    steps: dict[int, float] = field(default_factory=dict)
    token_s: float | None = None
    job_s: float | None = None
    held: bool = False  # the last turn held its prompt pieces back (to measure its step)

    def turn(self, seconds: float, prompt_tokens: int, decode_tokens: int, held: bool = False) -> None:
        """A turn's forwards took ``seconds``, carrying ``prompt_tokens`` prompt tokens beside a step of
        ``decode_tokens`` (0: no row decoded); ``held``: it held its prompt pieces back. Without prompt tokens it
        measures the step; with them, a prompt token's share of what the turn took past its step (not below zero)."""
        self.held = held
        if decode_tokens <= 0:
            return
        if prompt_tokens <= 0:
            self.steps[decode_tokens] = _average(self.steps.pop(decode_tokens, None), seconds)  # the newest last
            while len(self.steps) > MAX_STEP_SIZES:
                del self.steps[next(iter(self.steps))]
            return
        step_s = TurnCosts(self.steps, may_hold=False).step_s(decode_tokens)
        if step_s is not None:
            self.token_s = _average(self.token_s, max(0.0, seconds - step_s) / prompt_tokens)

    def job(self, seconds: float) -> None:
        """One set-up model call took ``seconds``."""
        self.job_s = _average(self.job_s, seconds)

    def costs(self) -> TurnCosts:
        """The averages as the policy reads them."""
        return TurnCosts(dict(self.steps), self.token_s, self.job_s, may_hold=not self.held)
