"""What is measured of one request while it is served: :class:`RequestRecord`.

A request's state lives in its record, not in what set-up made of it (the
:class:`~asymspec_mm.request.session.Session`: prompts, compressed view, streams, grammar, the model-side objects).
The engine loop's record (:class:`~asymspec_mm.core.request_state.RequestState`: status, computed tokens, row,
handle) is a :class:`RequestRecord`; a request set up without a loop (``pipe.prepare`` then ``pipe.run``, a batch of
``generate_batch``) gets a bare one from its set-up. Set-up writes when it began and what it measured; the prefill
adds what it measured; the answer's statistics (``MMResult.stats``) are made from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, eq=False)
class RequestRecord:
    """When a request's set-up began and what set-up and prefill measured of it.

    ``t_start``: ``time.perf_counter()`` as its set-up began (the answer's ``wall_s`` counts from it). ``stats``: the
    statistics its answer reports from set-up and prefill, in the order they were measured: vision calls and cache
    hits, ``prefix_cache_hit``, ``cached_tokens`` (stream -> prompt tokens its stored prefix gave), caption, OCR and
    ``prefill_s`` seconds, compression figures."""

    t_start: float = field(default_factory=time.perf_counter)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def prefill_s(self) -> float:
        """Seconds its prompts took to prefill (set-up's prefill, plus the batched prefill's from admission to join)."""
        return float(self.stats.get("prefill_s", 0.0))
