"""One request's decoding as a step iterator: a batch of one on the one decoder (:class:`.rows.RowDecoder`).

These are thin wrappers for callers that hold prefilled single-row engines (the pipeline's ``run``, its
captioner and ``complete``, the benchmark's probes, the vLLM checks): each puts the engines in a
:class:`.rows.SoloEngine` (the engine itself is the row's storage) and yields the :class:`TokenEvent` lists
committed at each step. The caller keeps the statistics (``counters``) and may time the gate and the trace
through ``timer(name)`` (names ``"gate"`` and ``"trace"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..base.config import AsymSpecConfig, check_method
from ..engines import Engine
from .events import TokenEvent
from .rows import STREAMS_OF, RowDecoder, SoloEngine
from .stats import Counters
from .step_events import Timer, bonus_event, gate_event, make_event, no_timer, sd_events, tops_at  # noqa: F401 - re-exported
from .streams import StopFn


def steps_for(
    method: str,
    streams: dict[str, Engine],
    pending: dict[str, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    timer: Timer | None = None,
    constraint: Any = None,
    vocab: Any = None,
) -> Iterator[list[TokenEvent]]:
    """The step iterator of ``method`` over prefilled ``streams`` (keyed drafter_full / drafter_comp / verifier;
    ``pending`` each one's last prompt token ``[1]``; ``constraint``: the grammar the output follows; ``vocab``: a
    cross-family pair's :class:`~asymspec_mm.base.vocab_bridge.VocabBridge`)."""
    check_method(method)
    names = STREAMS_OF[method]
    decoder = RowDecoder({name: SoloEngine(name) for name in names})
    counters = counters or Counters(cfg.k, {name: streams[name] for name in names})
    decoder.join(0, method, streams, pending, cfg, eos_ids, stop_fn, counters, constraint, vocab=vocab)
    return _steps(decoder, timer)


def _steps(decoder: RowDecoder, timer: Timer | None) -> Iterator[list[TokenEvent]]:
    while decoder.rows:
        ((_, committed),) = decoder.step(timer)
        yield committed


def asymspec_steps(
    drafter_full: Engine,
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    timer: Timer | None = None,
) -> Iterator[list[TokenEvent]]:
    """Algorithm 1, greedy, on three prefilled streams; ``pending`` each one's last prompt token ``[1]``."""
    streams = {"drafter_full": drafter_full, "drafter_comp": drafter_comp, "verifier": verifier}
    return steps_for("asymspec", streams, dict(zip(streams, pending)), cfg, eos_ids, stop_fn, counters, timer)


def sd_steps(
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
) -> Iterator[list[TokenEvent]]:
    """Symmetric greedy speculative decoding (lossless: equals Floor) on two prefilled streams."""
    streams = {"drafter_comp": drafter_comp, "verifier": verifier}
    return steps_for("sd", streams, dict(zip(streams, pending)), cfg, eos_ids, stop_fn, counters)


def greedy_steps(
    engine: Engine,
    pending: torch.Tensor,
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    is_verifier: bool = True,
) -> Iterator[list[TokenEvent]]:
    """Plain greedy decoding of one prefilled stream (Floor when it is the verifier; else the drafter alone)."""
    method, name = ("floor", "verifier") if is_verifier else ("drafter", "drafter_full")
    counters = counters or Counters(1, {engine.name: engine})
    return steps_for(method, {name: engine}, {name: pending}, cfg, eos_ids, stop_fn, counters)
