"""The one decoder (Algorithm 1 and the baselines, over rows) and what it emits and counts.

``config`` the settings, :mod:`.rows` the decoder (:class:`RowDecoder`, the :class:`RowEngine` protocol,
:class:`SoloEngine`), :mod:`.loops` one request's step iterator on it, :mod:`.events` the per-token
provenance, :mod:`.step_events` the events a step emits, :mod:`.stats` the step statistics,
:mod:`.streams` the pending-token and commit helpers, :mod:`.transfer` the one host transfer a step.
"""

from ..base.config import BONUS_RULES, METHODS, AsymSpecConfig
from .events import SOURCES, TokenEvent
from .loops import Timer, asymspec_steps, greedy_steps, sd_steps, steps_for
from .rows import RowDecoder, RowEngine, SoloEngine
from .stats import Counters
from .streams import Emitter, StopFn, Stream, draft_greedy

__all__ = [
    "AsymSpecConfig",
    "BONUS_RULES",
    "Counters",
    "Emitter",
    "METHODS",
    "RowDecoder",
    "RowEngine",
    "SOURCES",
    "SoloEngine",
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
