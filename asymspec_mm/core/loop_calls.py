"""A set-up's model calls, run by the scheduler's decode loop: ``run(fn)`` (the vision tower's pass on a cache miss,
between two steps, in the caller's context), ``decode_row(request)`` (a caption, a child request of the one being set up, decoded as a row of the batch
ahead of the waiting requests; or a completion: together the :class:`~asymspec_mm.engines.model_calls.ModelLoop`), for
callers on other threads; the engine core's turns run the calls (:meth:`~.engine_core.EngineCore.run_jobs`). A mixin of
:class:`~asymspec_mm.core.scheduler.Scheduler` (these are its public methods), which provides the state it reads."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..base.errors import AsymSpecError
from ..engines.model_calls import TokenRequest, TokenResult
from .handle import Handle, SchedulerStoppedError
from .model_owner import call_here_or_in_owner
from .request_state import RequestKind, RequestState
from .setup_pool import setting_up

if TYPE_CHECKING:
    from collections import deque

    from .engine_core import EngineCore


class LoopClosedError(AsymSpecError):
    """A row was handed to a scheduler that has closed and finished its work (it would never be decoded)."""


class LoopCalls:
    """``run`` and ``decode_row`` for callers on other threads."""

    _cond: threading.Condition
    _jobs: deque
    _worker: threading.Thread
    error: SchedulerStoppedError | None
    pipe: Any
    _ids: Any
    _core: EngineCore
    _closing: bool
    _finished: Callable[[], bool]

    @property
    def on_decode_thread(self) -> bool:
        """Whether the calling thread is this loop's decode thread (the one that runs the pipeline's models)."""
        return threading.current_thread() is self._worker

    @property
    def takes_jobs(self) -> bool:
        """Whether :meth:`run` hands a model call to the decode thread now: it runs and has not finished its work
        (on the decode thread itself, a call runs at once)."""
        with self._cond:
            return self.error is None and (self.on_decode_thread or not self._finished())

    @property
    def takes_calls(self) -> bool:
        """Whether a caller on another thread may hand it requests and model calls now (:mod:`.loop_client`): it
        runs, is not closing, and the caller is not its own decode thread (which would wait for itself)."""
        return self.error is None and not self._closing and not self.on_decode_thread

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run one set-up model call (``fn``: the vision tower's) in the decode loop between two steps, and return its
        value (:class:`~asymspec_mm.engines.model_calls.ModelLoop`); on the loop's own thread it runs at once."""
        future: Future = Future()
        context = contextvars.copy_context()  # the call counts as the caller's (its vision statistics)
        with self._cond:
            if self.error is not None:
                raise SchedulerStoppedError(str(self.error))
            at_once = self.on_decode_thread
            # a loop that has finished its work takes no more jobs: the call runs where the pipeline's models are
            # run once this loop's decode thread has ended
            gone = not at_once and self._finished()
            if not (at_once or gone):
                self._jobs.append((lambda: context.run(fn), future))
            self._cond.notify_all()
        if at_once:
            return fn()
        if gone:
            return call_here_or_in_owner(self.pipe, fn)
        return future.result()

    def decode_row(self, request: TokenRequest) -> TokenResult:
        """Decode ``request`` (a caption) as a row of the batch, ahead of the requests waiting to join; returns its
        tokens once it is done (:class:`~asymspec_mm.engines.model_calls.ModelLoop`)."""
        with self._cond:
            if self.error is not None:
                raise SchedulerStoppedError(str(self.error))
            if self._finished():  # closed, and its worker leaves: it would never decode the row
                raise LoopClosedError("the scheduler is closed: decode on the calling thread or start a new scheduler")
            # a caption or summary a set-up thread asks for is a child of the request it sets up (it goes when that
            # one is cancelled); its prompt is known, so it enters READY (RequestKind.entry), its own set-up being its parent's
            parent = setting_up() if RequestKind(request.kind).is_child else None
            state = RequestState.of_token_request(next(self._ids), None, request, parent)
            handle = Handle(self, state)
            self._core.add(state, first=True)  # ahead of the requests waiting to join
        return handle.result()
