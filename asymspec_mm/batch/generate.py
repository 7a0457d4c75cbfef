"""``pipe.generate_batch``: many requests through one :class:`BatchDecoder`, continuously refilled.

Requests are set up in input order on a set-up thread, up to ``batch_size`` ahead, while the decoder steps the
rows already joined (the pipeline takes the models' lock per model call, so set-up and decoding take turns).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import AsymSpecConfig, check_method, resolve_config
from ..errors import UnknownOptionError
from .decoder import BatchDecoder

if TYPE_CHECKING:
    from ..pipeline import AsymSpecPipeline
    from ..session import MMResult

DEFAULT_BATCH_SIZE = 8


@dataclass(frozen=True)
class Request:
    """One question about one image; ``caption`` / ``ocr`` as in :meth:`AsymSpecPipeline.prepare`."""

    image: Any
    question: str
    caption: str | None = None
    ocr: str | bool | None = None


def as_request(item: Request | Mapping[str, Any], index: int) -> Request:
    """A :class:`Request` from a request or a dict with ``image``, ``question`` and optional ``caption``, ``ocr``."""
    if isinstance(item, Request):
        return item
    if not isinstance(item, Mapping) or "image" not in item or "question" not in item:
        raise UnknownOptionError(f"request {index}: expected a Request or a dict with 'image' and 'question'")
    unknown = sorted(set(item) - {"image", "question", "caption", "ocr"})
    if unknown:
        raise UnknownOptionError(f"request {index}: unknown field(s) {', '.join(unknown)}; use image, question, caption, ocr")
    return Request(item["image"], item["question"], item.get("caption"), item.get("ocr"))


class _SetUp:
    """Prepares requests in input order on its own thread, at most ``ahead`` waiting; :meth:`next` hands them over
    in order: ``(index, session)``, ``None`` at the end, or raises the error a request's set-up raised."""

    _END = object()

    def __init__(self, pipe: AsymSpecPipeline, requests: list[Request], method: str, cfg: AsymSpecConfig, ahead: int):
        self._out: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pipe, requests, method, cfg), name="asymspec-batch-setup", daemon=True)
        self._thread.start()

    def _run(self, pipe, requests: list[Request], method: str, cfg: AsymSpecConfig) -> None:
        for i, req in enumerate(requests):
            if self._stop.is_set():
                return
            try:
                item: Any = (i, pipe.prepare(req.image, req.question, caption=req.caption, ocr=req.ocr, method=method, config=cfg))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread, at this request's turn
                item = exc
            if not self._put(item) or isinstance(item, BaseException):
                return
        self._put(self._END)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> tuple[int, Any] | None:
        item = self._out.get()
        if item is self._END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def generate_batch(
    pipe: AsymSpecPipeline,
    requests: Iterable[Request | Mapping[str, Any]],
    method: str = "asymspec",
    config: AsymSpecConfig | None = None,
    batch_size: int | None = None,
    *,
    kv_budget_bytes: int | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    **overrides,
) -> list[MMResult]:
    """Answer every request; results in input order, each equal to ``pipe.generate`` of that request alone.

    Up to ``batch_size`` rows decode together; a finished row's place goes to the next request at once.
    ``kv_budget_bytes`` bounds the rows further: a request joins only while the live rows' reserved KV
    (:meth:`BatchDecoder.kv_need`: prompt + token budget, every stream) fits, and always when no row is live.
    ``on_step(rows, engine_calls, seconds)`` is told of every step (benchmarks read the step time from it).
    Each result's ``stats["batch_size"]`` is the most rows that shared a step with it, ``stats["kv_bytes"]``
    the KV bytes it held per stream when it finished.
    """
    check_method(method)
    cfg = resolve_config(config, overrides)
    size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UnknownOptionError(f"batch_size={batch_size!r} must be an integer >= 1")
    todo = [as_request(r, i) for i, r in enumerate(requests)]
    results: list[MMResult | None] = [None] * len(todo)
    decoder = BatchDecoder(pipe, method, cfg)
    setup = _SetUp(pipe, todo, method, cfg, ahead=size)
    waiting: list = []  # a prepared request that did not fit the KV budget yet
    exhausted = False

    def refill() -> None:
        nonlocal exhausted
        while len(decoder.rows) < size:
            if not waiting:
                nxt = None if exhausted else setup.next()
                if nxt is None:
                    exhausted = True
                    return
                waiting.append(nxt)
            i, session = waiting[0]
            if decoder.rows and kv_budget_bytes is not None and decoder.kv_reserved + decoder.kv_need(session) > kv_budget_bytes:
                return
            waiting.pop(0)
            decoder.add(i, session)

    try:
        refill()
        while decoder.rows:
            rows, calls, t0 = len(decoder.rows), decoder.engine_calls, time.perf_counter()
            out = decoder.step()
            if on_step is not None:
                on_step(rows, decoder.engine_calls - calls, time.perf_counter() - t0)
            for row, _ in out:
                if row.result is not None:
                    results[row.id] = row.result
            refill()
    finally:
        setup.close()
    return [r for r in results if r is not None]
