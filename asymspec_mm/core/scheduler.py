"""Continuous batching for concurrent callers: ``sched = pipe.scheduler(max_batch_size=16)``.

Callers on any thread :meth:`Scheduler.submit` requests and get a :class:`Handle`. ``setup_workers`` set-up threads
prepare waiting requests (image, vision features, caption, OCR, prompts: :meth:`AsymSpecPipeline.prepare` with
``prefill=False``, several at once: :mod:`.setup_pool`) while fewer than ``max_batch_size`` wait set up (they hold no
KV); their model calls (a caption's tokens, the vision tower) run in the decode loop, so a set-up never holds up the
rows being decoded. An output thread (:mod:`.output_processor`) detokenizes what the loop commits and hands it to the
handles. Every request has one record (:mod:`.request_state`: its status, its session, its handle); the lines hold
ids. One decode thread owns the batch: it steps the engine core (:class:`.engine_core.EngineCore`, which runs one
turn on the thread that calls it and starts no thread of its own). Each turn asks the pure policy for a plan
(:func:`.policy.schedule` over a snapshot of the records and the decoder's numbers: :mod:`.policy_view`) and executes it: it lets
preempted rows back and prepared requests in while what the next step would allocate fits ``max_kv_bytes``
(admission takes what a row needs now; rows grow as they decode), preempts rows (highest priority value, latest
arrival first: their KV is dropped and rebuilt from their prompt and committed tokens when there is room again,
the same output) while it would not, cuts the arriving prompts' pieces under one token budget a turn
(``token_budget``, vLLM's ``max_num_batched_tokens`` rule: the step's decode tokens first, the prompt pieces of all
streams share what is left, at least :data:`MIN_PREFILL_TOKENS`, each stream's at most ``prefill_chunk_tokens``; a
long prompt takes several turns, see :mod:`.prefill`; with ``max_stall`` the set-up model calls and the pieces
are bounded too, by what the loop measures: :mod:`.turn_costs`), steps the batch with the pieces riding in its forwards (an
arriving row is a row of its paged decode storages from admission), hands each row's committed events to its
handle and retires finished or cancelled rows at once. So a turn with arriving rows makes the forwards of a step
(plus one forward of pieces alone on a storage the step does not call), whatever arrives. Every request joins the one batch whatever
its method and settings: the decoder groups rows by step shape and the groups share each step's forwards (see
:class:`~asymspec_mm.decode.rows.RowDecoder`). A failing request fails only its own handle; a failing step fails
the rows of that step and the worker goes on. Should the worker itself stop on an error,
every waiting and live handle raises :class:`SchedulerStoppedError` at once (no caller waits forever),
:attr:`Scheduler.error` says why and :meth:`Scheduler.submit` refuses new requests with it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..base.checks import is_int, is_number
from ..base.config import AsymSpecConfig
from ..base.errors import AsymSpecError, UnknownOptionError
from ..base.gc_heap import frozen_heap
from ..request.request import Request, request_of
from .decoder import BatchEngineFactory
from .engine_core import EngineCore, EngineOutput
from .handle import Handle, QueueFullError, SchedulerStoppedError
from .loop_calls import LoopCalls
from .model_owner import claim, release, turn_host
from .output_processor import OutputProcessor
from .policy import DEFAULT_TOKEN_BUDGET, MIN_PREFILL_TOKENS, TurnPlan
from .prefill import DEFAULT_CHUNK_TOKENS
from .request_state import RequestState, RequestStatus
from .setup_pool import DEFAULT_SETUP_WORKERS, SetupPool, cancelled_error

__all__ = ["DEFAULT_TOKEN_BUDGET", "MIN_PREFILL_TOKENS", "Scheduler"]

if TYPE_CHECKING:
    from ..request.preparing import ServingPipeline
    from ..request.session import Session


def _core_attr(name: str, doc: str, settable: bool = False) -> property:
    """A property of the scheduler that reads (and, ``settable``, writes) its engine core's attribute ``name``."""

    def get(self: Scheduler) -> Any:
        return getattr(self._core, name)

    def put(self: Scheduler, value: Any) -> None:
        setattr(self._core, name, value)

    return property(get, put if settable else None, doc=doc)


class Scheduler(LoopCalls, SetupPool):
    """Thread-safe front of batched decoding for one pipeline (see the module docstring): the threads that drive
    one :class:`~.engine_core.EngineCore` (its turns on the decode thread, set-up on :class:`SetupPool`'s threads,
    outputs on the :class:`OutputProcessor`'s) and its callers' API."""

    # what the engine core measures and holds, read through the scheduler
    steps = _core_attr("steps", "Decode steps made.")
    preemptions = _core_attr("preemptions", "Rows preempted to keep within max_kv_bytes.")
    peak_kv_bytes = _core_attr("peak_kv_bytes", "The most KV bytes measured at once (the storages' peaks summed each turn).")
    rows_stepped = _core_attr("rows_stepped", "Sum over steps of the rows in the step (occupancy = rows_stepped / steps).")
    kv_bytes = _core_attr("kv_bytes", "KV bytes the row storages and staging engines held after the last step.")
    live_tokens = _core_attr("live_tokens", "Context tokens the live rows held after the last step.")
    on_step = _core_attr("on_step", "``on_step(rows, engine_calls, seconds)``, told of every decode step.", settable=True)
    max_batch_size = _core_attr("max_batch_size", "Rows decoded together at most.")
    max_kv_bytes = _core_attr("max_kv_bytes", "The KV bytes the rows may allocate (None: no bound).")
    prefill_chunk_tokens = _core_attr("prefill_chunk_tokens", "Prompt tokens a stream's piece carries at most.")
    token_budget = _core_attr("token_budget", "Tokens a turn's forwards carry, decode first.")
    max_stall = _core_attr("max_stall", "The stall bound (a turn's cost over its step's), or None.")
    _decoder = _core_attr("decoder", "The engine core's decoder.")
    _table = _core_attr("table", "The engine core's records.")
    _ready = _core_attr("ready", "The engine core's line of requests set up.", settable=True)
    _jobs = _core_attr("jobs", "The set-up model calls waiting for a turn.", settable=True)
    _costs = _core_attr("costs", "What the turns measured.")
    _ids = _core_attr("ids", "Request ids, in arrival order.")

    def __init__(
        self,
        pipe: ServingPipeline,
        max_batch_size: int = 16,
        max_queue: int | None = None,
        max_kv_bytes: int | None = None,
        *,
        batch_engines: BatchEngineFactory | None = None,
        prefill_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        on_step: Callable[[int, int, float], None] | None = None,
        setup_workers: int = DEFAULT_SETUP_WORKERS,
        max_stall: float | None = None,
    ):
        if not is_int(max_batch_size, minimum=1):
            raise UnknownOptionError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
        rows_cap = getattr(batch_engines, "max_rows", None)  # a storage of fixed rows (static slots) holds no more
        if rows_cap is not None and rows_cap < max_batch_size:
            raise UnknownOptionError(
                f"max_batch_size={max_batch_size} exceeds the row storage's max_rows={rows_cap}: lower max_batch_size or raise max_rows"
            )
        if not is_int(prefill_chunk_tokens, minimum=1):
            raise UnknownOptionError(f"prefill_chunk_tokens={prefill_chunk_tokens!r} must be an integer >= 1")
        if not is_int(token_budget, minimum=1):
            raise UnknownOptionError(f"token_budget={token_budget!r} must be an integer >= 1 (tokens a turn's forwards carry)")
        if not is_int(setup_workers, minimum=1):
            raise UnknownOptionError(f"setup_workers={setup_workers!r} must be an integer >= 1 (requests set up at once)")
        if max_stall is not None and not (is_number(max_stall) and max_stall >= 1):
            raise UnknownOptionError(f"max_stall={max_stall!r} must be a number >= 1 (a turn's cost over its step's) or None")
        self.pipe, self.max_queue, self.batch_engines = pipe, max_queue, batch_engines
        # the turns (the plan through _plan, so that a subclass sees each turn's records first)
        self._core = EngineCore(
            pipe,
            max_batch_size,
            max_kv_bytes,
            batch_engines=batch_engines,
            prefill_chunk_tokens=prefill_chunk_tokens,
            token_budget=token_budget,
            max_stall=max_stall,
            on_step=on_step,
            texts=False,
            planner=lambda: self._plan(),
        )
        #: why the worker stopped (a :class:`SchedulerStoppedError`), or ``None`` while it runs
        self.error: SchedulerStoppedError | None = None
        self._cond = self._core.cond  # one lock for the core's table and lines and the scheduler's
        self._waiting: deque[int] = deque()  # ids not set up yet, in arrival order
        self._setting_up: set[int] = set()  # the ids being set up on the set-up threads
        self._output = OutputProcessor(pipe.tokenizer)  # texts and answers made off the decode thread
        self._closing = False
        #: times each kind of worker thread woke from waiting for work (a row decoding wakes no set-up thread)
        self.wakeups = {"decode": 0, "setup": 0}
        self._worker = threading.Thread(target=self._run, name="asymspec-scheduler", daemon=True)
        claim(pipe, self)  # its decode thread runs the pipeline's models from now on (or, beside another loop, that one)
        try:
            self._worker.start()
            self._setups = self._start_setup(setup_workers)
        except BaseException:
            self._stop_on(AsymSpecError("the scheduler's threads could not start"))
            if not self._worker.is_alive():
                release(pipe, self)
            raise

    # ---------------------------------------------------------------- callers
    def submit(self, image, question: str, *, config: AsymSpecConfig | None = None, **options) -> Handle:
        """Queue one question about one image; ``options``: any :class:`~asymspec_mm.request.request.Request`
        field (``caption``, ``ocr``, ``method``, ``ignore_eos``, ``priority``, ...) or :class:`AsymSpecConfig` field
        (``k=2``). Bad options raise here, in the caller's thread. Returns its :class:`Handle`."""
        return self.add(request_of(config, image=image, question=question, **options))

    def submit_chat(self, messages, *, config: AsymSpecConfig | None = None, **options) -> Handle:
        """Queue a conversation (OpenAI-format ``messages``, as :meth:`AsymSpecPipeline.chat`); ``options`` as
        :meth:`submit`'s (``tools``, ``tool_choice``, ``response_format``, ``caption`` / ``ocr`` one per image, ...).
        Bad options raise here. Returns its :class:`Handle`."""
        return self.add(request_of(config, messages=messages, **options))

    def add(self, request: Request) -> Handle:
        """Queue a :class:`~asymspec_mm.request.request.Request` (checked here, in the caller's thread, unless it
        already is; it reaches its row unchanged). ``request.priority``: lower is preempted last and resumed first
        (vLLM's convention); set up, requests take rows in priority, then arrival order (set-ups run side by side and may
        end in another order). Tools the verifier cannot take and an output grammar that cannot be built raise here
        too (:meth:`~asymspec_mm.request.preparing.RequestPreparer.check_tools`), not at ``result()``. Returns its
        :class:`Handle`."""
        preparer = getattr(self.pipe, "preparer", None)  # a stand-in pipeline without one: checked at set-up
        request = request.checked() if preparer is None else preparer.check_tools(request)
        with self._cond:
            if self.error is not None:
                raise SchedulerStoppedError(str(self.error))
            if self._closing:
                raise AsymSpecError("the scheduler is closed: create a new one with pipe.scheduler()")
            if self.max_queue is not None and self.waiting >= self.max_queue:
                raise QueueFullError(
                    f"{self.waiting} requests are already waiting for a row (max_queue={self.max_queue}); retry later or raise max_queue"
                )
            handle = Handle(self, self._table.add(RequestState(next(self._ids), None, request, request.priority)))
            self._waiting.append(handle.id)
            self._cond.notify_all()
        return handle

    @property
    def live_rows(self) -> int:
        """Rows being prefilled, decoded or preempted (admitted and not finished)."""
        return self._core.live_rows

    @property
    def waiting(self) -> int:
        """Requests waiting for a row: not set up yet, being set up, or set up and waiting to join."""
        return len(self._waiting) + len(self._ready) + len(self._setting_up)

    def _position(self, handle: Handle) -> int | None:
        """``handle``'s place in the line: requests set up (in admission order) first, then those being set up, then
        the queue in order (cancelled requests, which leave at the next step boundary, count for nothing)."""
        if handle.cancelled:
            return None
        with self._cond:
            line = [*self._ready, *sorted(self._setting_up), *self._waiting]
            handles = [self._table[rid].handle for rid in line if rid in self._table]
        ahead = 0
        for other in handles:
            if other is handle:
                return ahead
            ahead += not other.cancelled
        return None

    def kv_bound(self, session: Session | None = None) -> int:
        """The most KV bytes the batch can allocate at once, with ``session`` joining (:meth:`BatchDecoder.kv_bound`):
        what ``max_kv_bytes`` bounds."""
        return self._core.kv_bound(session)

    def close(self, timeout: float | None = None) -> None:
        """Finish the rows being decoded and the waiting requests, then stop the worker threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._setups:
            thread.join(timeout)
        self._worker.join(timeout)
        if not self._worker.is_alive():
            self._output.close()  # every answer handed over

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the worker threads
    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _finished(self) -> bool:
        """Closing, and nothing is left to set up or decode (called with ``_cond`` held)."""
        return self._closing and not self._waiting and not self._setting_up and not self._core.has_work

    def _plan(self) -> TurnPlan:
        """The turn's plan (the engine core's :meth:`~.engine_core.EngineCore.plan`)."""
        return self._core.plan()

    def _run(self) -> None:
        """The decode thread: the engine core's turns while it has work, their outputs to the output thread (the
        loaded heap frozen meanwhile: :mod:`~asymspec_mm.base.gc_heap`); when it ends, the pipeline's models are no
        longer this loop's to run (:func:`~.model_owner.release`)."""
        try:
            with frozen_heap():
                self._turns()
        finally:
            release(self.pipe, self)

    def _turns(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._core.has_work and not self._finished() and self.error is None:
                        self._cond.wait()
                        self.wakeups["decode"] += 1
                    if self._finished() or self.error is not None:
                        return
                self._retire_waiting()
                for out in self._step():
                    self._deliver(out)
                # no wake-up here: a set-up thread waits for room in the ready line, which only admission
                # (leave_line) and retiring make; waking every set-up thread after each step only made them contend
                # with this thread for the interpreter's lock
        except BaseException as exc:  # noqa: BLE001 - a dead worker must not leave callers waiting forever
            self._stop_on(exc)

    def _step(self) -> list[EngineOutput]:
        """One turn of the core: on this thread when this loop owns the pipeline's models, else a model call of the
        loop that does (:func:`~.model_owner.turn_host`). An owner that stops before running the turn hands the
        pipeline over: the turn runs once it has gone (here, or in the next owner's loop)."""
        while True:
            with turn_host(self.pipe, self) as host:
                if host is None:
                    return self._core.step()
                try:
                    outs, error = host.run(self._guest_step)
                except SchedulerStoppedError:
                    if host.error is None:
                        raise
                    continue  # the owner stopped before this turn ran in it
            if error is not None:
                raise error  # on this loop's own thread, where its stop belongs
            return outs

    def _guest_step(self) -> tuple[list[EngineOutput] | None, BaseException | None]:
        """This loop's turn run on the owning loop's decode thread: its outputs, or what stopped it (an interrupt
        from one of this loop's callbacks stops this loop, not the owner)."""
        try:
            return self._core.step(), None
        except BaseException as exc:  # noqa: BLE001 - handed back to this loop's decode thread, which stops on it
            return None, exc

    def _deliver(self, out: EngineOutput) -> None:
        """One output of the core to its handle, through the output thread (texts are made there)."""
        if out.finished:
            self._output.finish(out.handle, out.result, out.error)
        else:
            self._output.events(out.handle, out.events)

    def _stop_on(self, exc: BaseException) -> None:
        """A worker thread stopped on ``exc``: every waiting, ready and live request fails with one
        :class:`SchedulerStoppedError`, and new requests are refused with it."""
        error = SchedulerStoppedError(
            f"the scheduler's worker stopped on {type(exc).__name__}: {exc}".rstrip(": ") + "; create a new scheduler"
        )
        error.__cause__ = exc
        with self._cond:
            if self.error is not None:  # the other thread stopped first
                return
            self.error, self._closing = error, True
            self._waiting.clear()
            self._ready.clear()
            jobs, self._jobs = list(self._jobs), deque()
            states = self._table.clear()
            self._cond.notify_all()
        if threading.current_thread() is self._worker:  # what the turn it stopped in had made: answers already decided
            for out in self._core.take_outputs():
                self._deliver(out)
        for state in states:
            state.move(RequestStatus.FAILED)
            self._output.finish(state.handle, error=error)
        for _, future in jobs:
            future.set_exception(error)

    def _retire_waiting(self) -> None:
        """Cancelled requests not set up yet leave their line (the core retires the others within its turn)."""
        with self._cond:
            gone = [rid for rid in self._waiting if self._table[rid].handle.cancelled]
            if gone:  # out of the line
                self._waiting = deque(rid for rid in self._waiting if rid not in gone)
                self._cond.notify_all()
        for rid in gone:
            self._end(rid, error=cancelled_error(self._table[rid].handle))

    def _end(self, rid: int, result: Any = None, error: BaseException | None = None) -> None:
        """Request ``rid`` leaves the table outside a turn (its set-up failed, it was cancelled before it): its
        handle gets the answer at once."""
        out = self._core.end(rid, result, error)
        if out is not None:
            self._deliver(out)
