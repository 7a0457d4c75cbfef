"""``pipe.generate_batch``: many requests through the serving path (a :class:`~asymspec_mm.core.Scheduler`),
results in input order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..base.checks import is_int
from ..base.config import AsymSpecConfig, check_method, resolve_config
from ..base.errors import UnknownOptionError
from ..request.request import Request

if TYPE_CHECKING:
    from ..request.preparing import ServingPipeline
    from ..request.session import MMResult

DEFAULT_BATCH_SIZE = 8


def as_request(item: Request | Mapping[str, Any], index: int, method: str, config: AsymSpecConfig) -> Request:
    """The checked :class:`Request` of a request or a dict with ``image`` and ``question`` (or ``messages``) and
    optional ``caption``, ``ocr`` and ``seed`` (a conversation: and ``compression``); the batch's ``method`` and ``config`` where the request leaves them
    unset. An error names ``requests[index]`` (and the field, e.g. ``requests[3].question``)."""
    request = item if isinstance(item, Request) else _from_mapping(item, index)
    if not request.is_checked:
        request = dataclasses.replace(request, method=request.method or method, config=request.config or config)
    return request.checked(where=f"requests[{index}]")


def _from_mapping(item: Any, index: int) -> Request:
    """The :class:`Request` of a dict (``image`` and ``question``, or ``messages``); a bad shape names its index."""
    if not isinstance(item, Mapping) or not ({"image", "question"} <= set(item) or "messages" in item):
        raise UnknownOptionError(f"request {index}: expected a Request or a dict with 'image' and 'question', or 'messages'")
    allowed = (
        {"messages", "caption", "ocr", "seed", "compression"} if "messages" in item else {"image", "question", "caption", "ocr", "seed"}
    )
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise UnknownOptionError(f"request {index}: unknown field(s) {', '.join(unknown)}; use {', '.join(sorted(allowed))}")
    return Request(**item)


def generate_batch(
    pipe: ServingPipeline,
    requests: Iterable[Request | Mapping[str, Any]],
    method: str = "asymspec",
    config: AsymSpecConfig | None = None,
    batch_size: int | None = None,
    *,
    kv_budget_bytes: int | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    prefill_chunk_tokens: int | None = None,
    batch_engines: Callable[[Any, str], Any] | None = None,
    **overrides,
) -> list[MMResult]:
    """Answer every request; results in input order, each equal to ``pipe.generate`` (a conversation: ``pipe.chat``)
    of that request alone.

    The requests go through a :class:`~asymspec_mm.core.Scheduler` of ``batch_size`` rows (the serving path: set-up
    on its own thread, batched chunked prefill between decode steps, a finished row's place to the next request at
    once). ``kv_budget_bytes`` bounds the KV the rows allocate (padding, holes and transients included): a request
    joins while what the next step needs with it fits (:meth:`BatchDecoder.step_need`), rows are preempted (their
    KV dropped and rebuilt from their tokens later, the same output) when they cannot grow, and one whose whole
    need alone (:meth:`BatchDecoder.kv_bound`) exceeds the budget raises :class:`~asymspec_mm.core.KVBudgetError`. ``on_step(rows, engine_calls, seconds)`` is told of every
    decode step (benchmarks read the step time from it); ``batch_engines(model, stream_name)`` builds the row storage
    (as :meth:`AsymSpecPipeline.scheduler`'s, e.g. :func:`~asymspec_mm.core.static_batch_engines`). A request that fails raises its error here, the first in
    input order, once the requests before it have finished; the rest are cancelled. Each result's
    ``stats["batch_size"]`` is the most rows that shared a step with it, ``stats["kv_bytes"]`` the KV bytes it held
    per stream when it finished. While it runs, the scheduler serves the pipeline's own calls made on other threads
    (``pipe.generate``, ``chat``, ...: rows of its batch, as under :meth:`AsymSpecPipeline.scheduler`); beside a
    scheduler already running on the pipeline, that one keeps serving them and runs this one's turns as its model
    calls (one loop runs a pipeline's models: :mod:`~asymspec_mm.core.model_owner`).
    """
    from .scheduler import Scheduler

    check_method(method)
    cfg = resolve_config(config, overrides)
    size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if not is_int(size, minimum=1):
        raise UnknownOptionError(f"batch_size={batch_size!r} must be an integer >= 1")
    todo = [as_request(r, i, method, cfg) for i, r in enumerate(requests)]
    chunk = {} if prefill_chunk_tokens is None else {"prefill_chunk_tokens": prefill_chunk_tokens}
    sched = Scheduler(pipe, max_batch_size=size, max_kv_bytes=kv_budget_bytes, on_step=on_step, batch_engines=batch_engines, **chunk)
    handles = []
    try:
        handles = [sched.add(r) for r in todo]
        return [h.result() for h in handles]
    finally:
        for h in handles:
            if not h.done():
                h.cancel()
        sched.close()
