"""``pipe.generate_batch``: many requests through the serving path (a :class:`~asymspec_mm.batch.Scheduler`),
results in input order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import AsymSpecConfig, check_method, resolve_config
from ..errors import UnknownOptionError
from ..unicode_check import check_text_fields

if TYPE_CHECKING:
    from ..preparing import ServingPipeline
    from ..session import MMResult

DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True)
class Request:
    """One question about one image, or a conversation (``messages``, as :meth:`AsymSpecPipeline.chat` takes them;
    ``image`` and ``question`` unused); ``caption`` / ``ocr`` as in :meth:`AsymSpecPipeline.prepare` (a conversation:
    one per image); ``seed`` (optional) replaces the config's seed for this request alone (sampling)."""

    image: Any = None
    question: str = ""
    caption: Any = None
    ocr: Any = None
    messages: Any = None
    seed: int | None = None


def as_request(item: Request | Mapping[str, Any], index: int) -> Request:
    """A :class:`Request` from a request or a dict with ``image`` and ``question`` (or ``messages``) and optional
    ``caption``, ``ocr`` and ``seed``; text that is not valid Unicode is refused naming ``requests[index]``'s field."""
    request = item if isinstance(item, Request) else _from_mapping(item, index)
    texts = {"messages": request.messages} if request.messages is not None else {"question": request.question}
    check_text_fields({**texts, "caption": request.caption, "ocr": request.ocr}, prefix=f"requests[{index}]")
    return request


def _from_mapping(item: Any, index: int) -> Request:
    """The :class:`Request` of a dict (``image`` and ``question``, or ``messages``); a bad shape names its index."""
    if not isinstance(item, Mapping) or not ({"image", "question"} <= set(item) or "messages" in item):
        raise UnknownOptionError(f"request {index}: expected a Request or a dict with 'image' and 'question', or 'messages'")
    allowed = {"messages", "caption", "ocr", "seed"} if "messages" in item else {"image", "question", "caption", "ocr", "seed"}
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise UnknownOptionError(f"request {index}: unknown field(s) {', '.join(unknown)}; use {', '.join(sorted(allowed))}")
    if "messages" in item:
        return Request(caption=item.get("caption"), ocr=item.get("ocr"), messages=item["messages"], seed=item.get("seed"))
    return Request(item["image"], item["question"], item.get("caption"), item.get("ocr"), seed=item.get("seed"))


def _submit(sched: Any, r: Request, method: str, cfg: AsymSpecConfig) -> Any:
    if r.seed is not None:
        cfg = cfg.with_(seed=r.seed).validated()
    if r.messages is not None:
        return sched.submit_chat(r.messages, caption=r.caption, ocr=r.ocr, method=method, config=cfg)
    return sched.submit(r.image, r.question, caption=r.caption, ocr=r.ocr, method=method, config=cfg)


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

    The requests go through a :class:`~asymspec_mm.batch.Scheduler` of ``batch_size`` rows (the serving path: set-up
    on its own thread, batched chunked prefill between decode steps, a finished row's place to the next request at
    once). ``kv_budget_bytes`` bounds the KV the rows allocate (padding, holes and transients included): a request
    joins while what the next step needs with it fits (:meth:`BatchDecoder.step_need`), rows are preempted (their
    KV dropped and rebuilt from their tokens later, the same output) when they cannot grow, and one whose whole
    need alone (:meth:`BatchDecoder.kv_bound`) exceeds the budget raises :class:`~asymspec_mm.batch.KVBudgetError`. ``on_step(rows, engine_calls, seconds)`` is told of every
    decode step (benchmarks read the step time from it); ``batch_engines(model, stream_name)`` builds the row storage
    (as :meth:`AsymSpecPipeline.scheduler`'s, e.g. :func:`~asymspec_mm.batch.static_batch_engines`). A request that fails raises its error here, the first in
    input order, once the requests before it have finished; the rest are cancelled. Each result's
    ``stats["batch_size"]`` is the most rows that shared a step with it, ``stats["kv_bytes"]`` the KV bytes it held
    per stream when it finished.
    """
    from .scheduler import Scheduler

    check_method(method)
    cfg = resolve_config(config, overrides)
    size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UnknownOptionError(f"batch_size={batch_size!r} must be an integer >= 1")
    todo = [as_request(r, i) for i, r in enumerate(requests)]
    chunk = {} if prefill_chunk_tokens is None else {"prefill_chunk_tokens": prefill_chunk_tokens}
    sched = Scheduler(pipe, max_batch_size=size, max_kv_bytes=kv_budget_bytes, on_step=on_step, batch_engines=batch_engines, **chunk)
    handles = []
    try:
        handles = [_submit(sched, r, method, cfg) for r in todo]
        return [h.result() for h in handles]
    finally:
        for h in handles:
            if not h.done():
                h.cancel()
        sched.close()
