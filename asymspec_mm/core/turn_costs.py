"""What the engine loop's work costs, measured as it runs: the numbers the policy's stall bound reads.

:class:`CostMeter` keeps moving averages of three costs (:class:`~.policy.TurnCosts`): a decode step of the rows
decoding (turns that carry no prompt pieces), one prompt token carried beside a step (a turn's seconds past the step's
average, per prompt token) and one set-up model call (a vision tower pass). Each is measured on the loop's own
clock, so a device, a busy machine or a larger batch changes the bound with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .policy import TurnCosts

#: Weight of the newest measure in each moving average: a few turns follow a change (a row joining, a busier machine).
COST_WEIGHT = 0.25


def _average(old: float | None, new: float, weight: float = COST_WEIGHT) -> float:
    return new if old is None else old + weight * (new - old)


@dataclass
class CostMeter:
    """Moving averages of the loop's costs in seconds (``None`` until first measured)."""

    step_s: float | None = None
    token_s: float | None = None
    job_s: float | None = None

    def turn(self, seconds: float, prompt_tokens: int, stepped: bool) -> None:
        """A turn's forwards took ``seconds``, carrying ``prompt_tokens`` prompt tokens beside a step (``stepped``:
        rows decoded in it). Without prompt tokens it measures the step; with them, a prompt token's share of what
        the turn took past the step (not below zero)."""
        if not stepped:
            return
        if prompt_tokens <= 0:
            self.step_s = _average(self.step_s, seconds)
        elif self.step_s is not None:
            self.token_s = _average(self.token_s, max(0.0, seconds - self.step_s) / prompt_tokens)

    def job(self, seconds: float) -> None:
        """One set-up model call took ``seconds``."""
        self.job_s = _average(self.job_s, seconds)

    def costs(self) -> TurnCosts:
        """The averages as the policy reads them."""
        return TurnCosts(self.step_s, self.token_s, self.job_s)
