"""The pipeline's own calls through a running engine loop: while a scheduler started with ``pipe.scheduler(...)``
runs (the server and the demo run one), ``pipe.generate`` / ``chat`` / ``stream`` hand their request to it and read
its :class:`~.handle.Handle`, ``pipe.complete`` is a verifier row of its batch, and every other model call the
pipeline makes from a caller's thread (``prepare``'s set-up, ``run``'s steps, ``compressed_view``'s caption) runs in
the loop between two of its steps. So one thread, the loop's, runs every forward while it runs. With no loop
running the calls go to the pipeline's direct loop (:mod:`.direct_loop`): one engine core its callers drive, a turn
at a time, on their own threads.

One loop runs a pipeline's models at a time, by construction, so no lock orders model calls
(:mod:`.model_owner`): the scheduler that owns the pipeline serves its calls, and while one does every direct turn
is one of its model calls. The registries are per pipeline and hold it weakly.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..base.errors import AsymSpecError, UnknownOptionError
from ..engines.model_calls import ModelLoop, TokenRequest, current_loop, greedy_request, using_loop
from ..request.request import request_of
from ..request.session import GenerationStream
from .direct_loop import DIRECT_ROWS, DirectLoop, direct_core
from .model_owner import models_here, running_loop

if TYPE_CHECKING:
    from ..decode import TokenEvent
    from ..request.session import MMResult
    from .handle import Handle
    from .scheduler import Scheduler

T = TypeVar("T")


def serving_loop(pipe: Any) -> Scheduler | None:
    """The loop that serves a call of ``pipe`` made on this thread, or ``None`` (the direct path): the scheduler
    running ``pipe``'s models, while it takes calls. ``None`` on that loop's own decode thread (a listener calling the
    pipeline) and inside a set-up a loop already serves (its model calls go to that loop), which must not wait for
    the loop they run in."""
    if current_loop() is not None:
        return None
    loop = running_loop(pipe)
    return loop if loop is not None and loop.takes_calls else None


def home_loop(pipe: Any) -> ModelLoop:
    """The loop a model call of ``pipe`` made outside any loop's scope runs in (the captioner or the preparer called
    alone, a summary outside a request's route): the scheduler serving ``pipe``, else its direct loop."""
    loop = serving_loop(pipe) if not _on_decode_thread(pipe) else None
    return loop if loop is not None else direct_loop(pipe)


def model_call(pipe: Any, fn: Callable[[], T]) -> T:
    """One model call of ``pipe`` (``fn``): in its serving loop between two steps when one runs; inside a set-up, in
    the loop serving it; on a loop's own decode thread, at once; else in a turn of the pipeline's direct loop
    (:mod:`.direct_loop`), which the caller drives unless another caller runs a turn."""
    loop = serving_loop(pipe)
    if loop is not None:
        return loop.run(fn)
    serving = current_loop()
    if serving is not None:
        return serving.run(fn)
    if _on_decode_thread(pipe):
        return fn()
    return direct_loop(pipe).run(fn)


def _on_decode_thread(pipe: Any) -> bool:
    """Whether this thread is the decode thread of the scheduler running ``pipe``'s models (a listener calling the
    pipeline)."""
    loop = running_loop(pipe)
    return loop is not None and loop.on_decode_thread


_DIRECT: weakref.WeakKeyDictionary[Any, DirectLoop] = weakref.WeakKeyDictionary()
_DIRECT_GUARD = threading.Lock()


def direct_loop(pipe: Any) -> DirectLoop:
    """``pipe``'s direct loop (:mod:`.direct_loop`; one per pipeline, made on first use): what serves its calls
    while no scheduler does."""
    with _DIRECT_GUARD:
        loop = _DIRECT.get(pipe)
        if loop is None:
            loop = _DIRECT[pipe] = DirectLoop(pipe, lambda p: direct_core(p, max_batch_size=DIRECT_ROWS), models_here, _on_decode_thread)
        return loop


def add_request(loop: Scheduler, request: Any) -> Handle | None:
    """``request``'s handle in ``loop``, or ``None`` when the loop turns it away (full, closing, stopped): the caller
    then decodes it on the direct path. A request the loop refuses for its own options (tools the verifier cannot
    take, an output grammar that cannot be built: an :class:`~asymspec_mm.base.errors.UnknownOptionError`) raises
    here, once: the direct path would only refuse it again, after starting its set-up."""
    try:
        return loop.add(request)
    except UnknownOptionError:
        raise
    except AsymSpecError:
        return None


#: Options of the single-row set-up a request in the loop cannot take: calls with them keep the direct path.
LOOP_OPTIONS = frozenset({"engines", "on_phase", "prefill"})
#: Options of the single-row set-up a request on the direct path cannot take (its set-up runs on the caller's
#: thread, so ``on_phase`` is told of its phases there).
DIRECT_OPTIONS = frozenset({"engines", "prefill"})


def loop_handle(pipe: Any, kwargs: dict[str, Any], **fields: Any) -> Handle | None:
    """The handle of the request ``fields`` + ``kwargs`` (``pipe.stream``'s or ``chat_stream``'s keywords) in the
    loop serving ``pipe``, or ``None``: no loop runs, the loop turns it away (full, closing), or ``kwargs`` ask for
    :data:`LOOP_OPTIONS`. Bad options raise here, as on the direct path."""
    loop = serving_loop(pipe)
    if loop is None or not LOOP_OPTIONS.isdisjoint(kwargs):
        return None
    opts = dict(kwargs)
    return add_request(loop, request_of(opts.pop("config", None), **fields, **opts).checked())


def loop_scope(pipe: Any) -> AbstractContextManager:
    """Within it, set-up model calls (caption, tower, prefills) go to the loop serving ``pipe``: a running
    scheduler's, else the pipeline's direct loop (a caption a row of it, every other call a job of its turns). Inside
    a set-up a loop already serves, that loop keeps serving; on a loop's own decode thread (a callback) the calls run
    at once, as that thread runs every turn (a turn of the direct loop may be waiting for it)."""
    if current_loop() is not None or _on_decode_thread(pipe):
        return nullcontext()
    loop = serving_loop(pipe)
    return using_loop(loop if loop is not None else direct_loop(pipe))


class HandleStream(GenerationStream):
    """The :class:`GenerationStream` of a request decoded by the loop: each step's committed events as its handle
    gives them (their text filled in by the loop), then its result. Closing the stream early cancels the request.

    Reading :attr:`result` before iterating (``pipe.generate``, ``pipe.chat``) waits for the answer alone: the
    caller's thread sleeps until the request ends instead of waking at every step to take events it drops (on a
    busy machine each such wake-up also took the interpreter's lock from the decode thread)."""

    def __init__(self, handle: Handle):
        super().__init__(self._events(handle), handle.result)
        self._handle = handle
        self._iterated = False

    @staticmethod
    def _events(handle: Handle) -> Iterator[list[TokenEvent]]:
        try:
            yield from handle
        finally:
            if not handle.done():
                handle.cancel()

    def __next__(self) -> list[TokenEvent]:
        self._iterated = True
        return super().__next__()

    @property
    def result(self) -> MMResult:
        """The answer (raises the request's error); waits for it alone unless the steps are being read."""
        if self._iterated:
            return super().result
        try:
            return self._handle.result()
        except BaseException:  # interrupted while it waits (^C): the request stops, as when a stream is left
            if not self._handle.done():
                self._handle.cancel()
            raise


def handle_stream(handle: Handle) -> GenerationStream:
    """The :class:`HandleStream` of ``handle``."""
    return HandleStream(handle)


def completion_request(ids: torch.Tensor, max_new_tokens: int, eos_ids: set[int]) -> TokenRequest:
    """The verifier's greedy completion of the prompt ``ids`` ``[L]`` as a token request (the ``floor`` method's one
    stream: the verifier alone)."""
    return greedy_request("floor", "verifier", ids, max_new_tokens, eos_ids, kind="completion")


def completion_tokens(loop: Scheduler, ids: torch.Tensor, max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """:func:`completion_request` as a row of ``loop``'s batch, ahead of the requests waiting to join."""
    return loop.decode_row(completion_request(ids, max_new_tokens, eos_ids)).token_ids
