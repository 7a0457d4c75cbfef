"""The decoding loops (Algorithm 1 and the baselines) and what they emit and count.

``config`` the settings, :mod:`.events` the per-token provenance, :mod:`.stats` the step statistics,
:mod:`.streams` the pending-token and commit helpers, :mod:`.transfer` the one host transfer a step,
:mod:`.loops` the loops themselves.
"""

from ..config import BONUS_RULES, METHODS, AsymSpecConfig
from .events import SOURCES, TokenEvent
from .loops import Timer, asymspec_steps, greedy_steps, sd_steps, steps_for
from .stats import Counters
from .streams import Emitter, StopFn, Stream, draft_greedy

__all__ = [
    "AsymSpecConfig",
    "BONUS_RULES",
    "Counters",
    "Emitter",
    "METHODS",
    "SOURCES",
    "StopFn",
    "Stream",
    "Timer",
    "TokenEvent",
    "asymspec_steps",
    "draft_greedy",
    "greedy_steps",
    "sd_steps",
    "steps_for",
]
