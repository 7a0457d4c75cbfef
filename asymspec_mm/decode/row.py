"""One request being decoded: :class:`Row`, what the row decoder and the baselines' steps read and update."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..base.config import AsymSpecConfig
from .constraints import Constraint
from .events import TokenEvent
from .stats import Counters
from .streams import Emitter, Stream


@dataclass
class Row:
    """One request being decoded: its method, settings, streams (pending tokens), statistics and trace.
    ``storage`` names the row storage of each of its streams (by default the stream's own name)."""

    id: int
    method: str
    config: AsymSpecConfig
    streams: dict[str, Stream]
    storage: dict[str, str]
    counters: Counters
    emitter: Emitter
    trace: list[TokenEvent] = field(default_factory=list)
    session: Any = None  # the pipeline's Session, for rows that came from one
    final_lengths: dict[str, int] = field(default_factory=dict)  # each storage's most tokens for this row (a KV bound)
    engine_calls: int = 0
    step: int = 0
    max_batch: int = 0
    result: Any = None
    constraint: Constraint | None = None  # the grammar its output follows (forced tool calls, JSON), if any
    rng: torch.Generator | None = None  # a sampled row's own generator (None: greedy)
    preemptions: int = 0  # times its KV was dropped and re-prefilled from its tokens
    vocab: Any = None  # a cross-family row's VocabBridge (its ids are the verifier's; None: one vocabulary)
