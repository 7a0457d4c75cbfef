"""A request submitted to the :class:`~.scheduler.Scheduler`: its :class:`Handle` (its stage, its place in the line,
its updates, its result, cancellation) and the scheduler's errors."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..base.errors import AsymSpecError
from .request_state import RequestKind, RequestStatus

if TYPE_CHECKING:
    from ..decode import TokenEvent
    from ..engines.model_calls import TokenRequest
    from ..request.request import Request
    from ..request.session import MMResult
    from .request_state import RequestState

log = logging.getLogger(__name__)


class Line(Protocol):
    """What a handle asks of the scheduler that issued it: its place in the line, and a wake-up after a cancel."""

    def _position(self, handle: Handle) -> int | None: ...

    def _wake(self) -> None: ...


_END = object()


#: A request's stages, in order (:attr:`Handle.stage`: the word for its :class:`~.request_state.RequestStatus`).
STAGES = ("queued", "setting_up", "set_up", "prefill", "decoding", "preempted", "done")


class QueueFullError(AsymSpecError):
    """The scheduler's queue of waiting requests is full."""


class KVBudgetError(AsymSpecError):
    """A request needs more KV cache than the scheduler's whole ``max_kv_bytes``: it could never be admitted."""


class SchedulerStoppedError(AsymSpecError):
    """The scheduler's worker stopped on an error: its requests cannot finish (create a new scheduler)."""


#: What a handle's listener receives: ``("events", [TokenEvent])`` per step, then ``("result", MMResult)`` or
#: ``("error", exception)`` once.
Listener = Callable[[str, Any], None]


class Handle:
    """One submitted request. Iterate it for each step's committed :class:`TokenEvent` list; :meth:`result`
    waits for the :class:`MMResult`; :meth:`cancel` frees its row. :attr:`position` and :meth:`waited` say
    where it stands in the line for a row while it waits. :meth:`listen` hands the same updates to a
    callback instead (an event loop needs no thread per request to follow one).

    A handle is its caller's view of the scheduler's record of the request (``state``, a
    :class:`~.request_state.RequestState`): its status, times, priority and request are read from the record, never
    kept here; what the handle holds is the caller's side (the updates not read yet, the answer, the cancel)."""

    def __init__(self, scheduler: Line, state: RequestState):
        #: Its id in the scheduler's table.
        self.id = state.rid
        self._state = state  # the scheduler's record of the request: where its status, times and request are read
        state.handle = self
        self._scheduler = scheduler
        self._events: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._result: MMResult | None = None
        self._error: BaseException | None = None
        self._listener: Listener | None = None
        self._deliver = threading.Lock()  # keeps a listener's updates in order with the backlog
        # steps nobody reads yet (no listener, no iteration: a caller waiting for the answer alone) stay here, token
        # ids only, until the answer or a reader comes: the output side then detokenizes them in one hand-off instead
        # of being woken at every step (:meth:`_hold_step`, :meth:`_read_steps`)
        self._held: list[list[TokenEvent]] = []
        self._reads_steps = False
        self._holder: Any = None  # the output side the held steps go back to
        self._hold = threading.Lock()
        self.cancelled = False
        #: what the request fails with once cancelled (``None``: a :class:`CancelledError`), see :meth:`cancel`
        self.cancel_error: BaseException | None = None

    @property
    def request(self) -> Request | TokenRequest | None:
        """The checked :class:`~asymspec_mm.request.request.Request` it answers (its result's ``request`` is this same
        object); a caption's or completion's :class:`~asymspec_mm.engines.model_calls.TokenRequest`."""
        return self._state.request

    @property
    def kind(self) -> RequestKind:
        """What it is for (:class:`~.request_state.RequestKind`): a caption's or completion's steps carry token ids
        alone (nobody reads their texts) and it ends with a :class:`~asymspec_mm.engines.model_calls.TokenResult`."""
        return self._state.kind

    @property
    def priority(self) -> int:
        """Its priority (vLLM's convention: lower is served first; preemption takes the highest value, latest first)."""
        return self._state.priority

    @property
    def status(self) -> RequestStatus:
        """Where it stands: its record's :class:`~.request_state.RequestStatus`."""
        return self._state.status

    @property
    def times(self) -> dict[RequestStatus, float]:
        """When it entered each status it went through (``time.monotonic()``, its record's): set-up's window is
        ``times[SETTING_UP]`` to ``times[READY]``."""
        return self._state.times

    @property
    def submitted_at(self) -> float:
        """When it was submitted (``time.monotonic()``)."""
        return self._state.submitted_at

    @property
    def left_line_at(self) -> float | None:
        """When it left the line (admitted, or dropped), else None."""
        return self._state.left_line_at

    @property
    def stage(self) -> str:
        """Where it stands, in a word (:data:`STAGES`): ``queued`` -> ``setting_up`` -> ``set_up`` (waiting for a
        row) -> ``prefill`` (its prompts in the batched prefill) -> ``decoding`` -> ``done``; ``preempted`` while its
        KV is dropped to make room (then ``prefill`` again, and it decodes on where it stopped)."""
        return "done" if self._done.is_set() else self.status.stage

    def __iter__(self):
        self._read_steps()
        while True:
            item = self._events.get()
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield item

    def result(self, timeout: float | None = None) -> MMResult:
        """The answer, once decoded; raises the request's error, :class:`CancelledError`, or ``TimeoutError``."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def done(self) -> bool:
        return self._done.is_set()

    @property
    def position(self) -> int | None:
        """Requests ahead of this one in the line for a row: 0 = next to get one; None once it has a row
        (its prompts being prefilled, or decoding) or has finished. Requests set up ahead keep their place."""
        return self._scheduler._position(self)

    def waited(self) -> float:
        """Seconds it has waited in the line for a row (up to now while it still waits)."""
        return (self.left_line_at or time.monotonic()) - self.submitted_at

    def cancel(self, error: BaseException | None = None) -> None:
        """Stop decoding this request; its row leaves at the next step boundary. ``error``: what its result and
        listener get instead of a :class:`CancelledError` (a server ending a request on shutdown says why)."""
        if error is not None and not self.cancelled:
            self.cancel_error = error
        self.cancelled = True
        self._scheduler._wake()

    def listen(self, listener: Listener) -> None:
        """Call ``listener(kind, value)`` with every update from now on, on the scheduler's threads, after the
        updates already waiting (which iteration then no longer sees): ``("events", [TokenEvent])`` per step,
        then ``("result", MMResult)`` or ``("error", exception)``. It must return quickly (hand the update on)."""
        self._read_steps()
        with self._deliver:
            backlog = []
            while not self._events.empty():
                backlog.append(self._events.get_nowait())
            self._listener = listener
            for item in backlog:
                self._tell(item)

    def _tell(self, item: Any) -> None:
        """Hand one queued item to the listener (called with ``_deliver`` held); a listener that raises is logged and
        never stops the scheduler's thread it runs on."""
        try:
            if item is _END:
                self._listener(*(("error", self._error) if self._error is not None else ("result", self._result)))
            else:
                self._listener("events", item)
        except Exception:  # noqa: BLE001 - the caller's callback; the scheduler goes on
            log.exception("request %s: its listener raised", self.id)

    def _put(self, item: Any) -> None:
        with self._deliver:
            if self._listener is not None:
                self._tell(item)
            else:
                self._events.put(item)

    def _step(self, events: list[TokenEvent]) -> None:
        self._put(events)

    def _hold_step(self, holder: Any, events: list[TokenEvent]) -> bool:
        """Keep one step's ``events`` (token ids, no text yet) while nobody reads this handle's steps; ``False`` once
        someone does (the caller hands them on at once). ``holder``: the output side that takes them back
        (:meth:`held_steps` at the end, or its ``held(handle, steps)`` when a reader comes)."""
        with self._hold:
            if self._reads_steps:
                return False
            self._holder = holder
            self._held.append(events)
            return True

    def _read_steps(self) -> None:
        """Someone reads this handle's steps from now on (iteration, a listener): the steps held so far go to the
        output side first, ahead of any later step (handed over under the same lock the decode thread holds them
        with, so none overtakes them)."""
        with self._hold:
            if self._reads_steps:
                return
            self._reads_steps = True
            held, self._held = self._held, []
            if held:
                self._holder.held(self, held)

    def held_steps(self) -> list[list[TokenEvent]]:
        """The steps held so far, taken (the output side, before it hands over the answer)."""
        with self._hold:
            held, self._held = self._held, []
        return held

    def _finish(self, result: MMResult | None = None, error: BaseException | None = None) -> None:
        if self._done.is_set():
            return
        self._result, self._error = result, error
        self._done.set()
        self._put(_END)
