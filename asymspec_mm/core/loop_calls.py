"""A set-up's model calls, run by the scheduler's decode loop: ``run(fn)`` (the vision tower's pass on a cache miss,
between two steps, in the caller's context), ``decode_row(request)`` (a caption, a child request of the one being set up, decoded as a row of the batch
ahead of the waiting requests: together the :class:`~asymspec_mm.engines.model_calls.ModelLoop`) and the loop's ``_run_jobs``. A
mixin of :class:`~asymspec_mm.core.scheduler.Scheduler`, which provides the state it reads."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..engines.model_calls import TokenRequest, TokenResult
from .handle import Handle, SchedulerStoppedError
from .request_state import RequestState, RequestStatus, RequestTable
from .setup_pool import setting_up

if TYPE_CHECKING:
    from collections import deque


class LoopCalls:
    """``run`` and ``decode_row`` for callers on other threads, ``_run_jobs`` for the loop."""

    _cond: threading.Condition
    _jobs: deque
    _worker: threading.Thread
    error: SchedulerStoppedError | None
    pipe: Any
    _ids: Any
    _table: RequestTable
    _ready: deque

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run one set-up model call (``fn``: the vision tower's) in the decode loop between two steps, and return its
        value (:class:`~asymspec_mm.engines.model_calls.ModelLoop`); on the loop's own thread it runs at once."""
        if threading.current_thread() is self._worker:
            with self.pipe.models_lock:
                return fn()
        future: Future = Future()
        context = contextvars.copy_context()  # the call counts as the caller's (its vision statistics)
        with self._cond:
            if self.error is not None:
                raise SchedulerStoppedError(str(self.error))
            self._jobs.append((lambda: context.run(fn), future))
            self._cond.notify_all()
        return future.result()

    def _run_jobs(self) -> None:
        """The set-up model calls waiting, each under the models' lock; a failing one fails its caller alone."""
        while True:
            with self._cond:
                if not self._jobs:
                    return
                fn, future = self._jobs.popleft()
            try:
                with self.pipe.models_lock:
                    future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - the caller's error, whatever it is (it must not wait forever)
                future.set_exception(exc)

    def decode_row(self, request: TokenRequest) -> TokenResult:
        """Decode ``request`` (a caption) as a row of the batch, ahead of the requests waiting to join; returns its
        tokens once it is done (:class:`~asymspec_mm.engines.model_calls.ModelLoop`)."""
        with self._cond:
            if self.error is not None:
                raise SchedulerStoppedError(str(self.error))
            handle = Handle(self, next(self._ids), priority=-1)
            # a child of the request being set up (when a set-up thread asks): it needs no set-up of its own
            parent = setting_up()
            state = RequestState(handle.id, handle, None, priority=-1, work=request, parent=parent)
            state.move(RequestStatus.SETTING_UP)
            state.move(RequestStatus.READY)
            self._table.add(state)
            self._ready.appendleft(handle.id)
            self._cond.notify_all()
        return handle.result()
