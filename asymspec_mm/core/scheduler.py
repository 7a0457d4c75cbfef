"""Continuous batching for concurrent callers: ``sched = pipe.scheduler(max_batch_size=16)``.

Callers on any thread :meth:`Scheduler.submit` requests and get a :class:`Handle`. ``setup_workers`` set-up threads
prepare waiting requests (image, vision features, caption, OCR, prompts: :meth:`AsymSpecPipeline.prepare` with
``prefill=False``, several at once: :mod:`.setup_pool`) while fewer than ``max_batch_size`` wait set up (they hold no
KV); their model calls (a caption's tokens, the vision tower) run in the decode loop, so a set-up never holds up the
rows being decoded. An output thread (:mod:`.output_processor`) detokenizes what the loop commits and hands it to the
handles. Every request has one record (:mod:`.request_state`: its status, its session, its
handle); the lines hold ids. One decode thread owns the batch. Each turn it asks the pure policy for a plan
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

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..base.config import AsymSpecConfig
from ..base.errors import AsymSpecError, UnknownOptionError
from ..request.request import Request, request_of
from .decoder import BatchDecoder, BatchEngineFactory
from .handle import Handle, KVBudgetError, QueueFullError, SchedulerStoppedError
from .loop_calls import LoopCalls
from .output_processor import OutputProcessor
from .policy import DEFAULT_TOKEN_BUDGET, MIN_PREFILL_TOKENS, TurnOutcome, TurnPlan, admitted, prefill_budget, prefilled
from .policy_view import PolicyView
from .prefill import DEFAULT_CHUNK_TOKENS, Rides
from .request_state import RequestState, RequestStatus, RequestTable, prompt_counts
from .setup_pool import DEFAULT_SETUP_WORKERS, SetupPool, cancelled_error
from .turn_costs import CostMeter

__all__ = ["DEFAULT_TOKEN_BUDGET", "MIN_PREFILL_TOKENS", "Scheduler"]

if TYPE_CHECKING:
    from ..request.preparing import ServingPipeline
    from ..request.session import Session


class Scheduler(LoopCalls, SetupPool, PolicyView):
    """Thread-safe front of batched decoding for one pipeline (see the module docstring)."""

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
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise UnknownOptionError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
        self.pipe, self.max_batch_size, self.max_queue, self.max_kv_bytes = pipe, max_batch_size, max_queue, max_kv_bytes
        self.batch_engines = batch_engines
        rows_cap = getattr(batch_engines, "max_rows", None)  # a storage of fixed rows (static slots) holds no more
        if rows_cap is not None and rows_cap < max_batch_size:
            raise UnknownOptionError(
                f"max_batch_size={max_batch_size} exceeds the row storage's max_rows={rows_cap}: lower max_batch_size or raise max_rows"
            )
        if isinstance(prefill_chunk_tokens, bool) or not isinstance(prefill_chunk_tokens, int) or prefill_chunk_tokens < 1:
            raise UnknownOptionError(f"prefill_chunk_tokens={prefill_chunk_tokens!r} must be an integer >= 1")
        self.prefill_chunk_tokens = prefill_chunk_tokens
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise UnknownOptionError(f"token_budget={token_budget!r} must be an integer >= 1 (tokens a turn's forwards carry)")
        self.token_budget = token_budget
        if isinstance(setup_workers, bool) or not isinstance(setup_workers, int) or setup_workers < 1:
            raise UnknownOptionError(f"setup_workers={setup_workers!r} must be an integer >= 1 (requests set up at once)")
        if max_stall is not None and (isinstance(max_stall, bool) or not isinstance(max_stall, (int, float)) or not max_stall >= 1):
            raise UnknownOptionError(f"max_stall={max_stall!r} must be a number >= 1 (a turn's cost over its step's) or None")
        self.max_stall = max_stall  # the policy's rule 6: a turn's set-up calls and prompt pieces within it
        self._costs = CostMeter()  # what the loop's work costs, measured (read by the stall bound)
        self.on_step = on_step
        #: why the worker stopped (a :class:`SchedulerStoppedError`), or ``None`` while it runs
        self.error: SchedulerStoppedError | None = None
        self._table = RequestTable()  # every request not finished, by id (its status says where it stands)
        self._waiting: deque[int] = deque()  # ids not set up yet, in arrival order
        self._setting_up: set[int] = set()  # the ids being set up on the set-up threads
        self._ready: deque[int] = deque()  # ids set up, waiting for a row (the head first, for KV room)
        self._jobs: deque[tuple[Callable[[], Any], Future]] = deque()  # set-up model calls the loop runs (the tower)
        self._decoder = BatchDecoder(pipe, engines=batch_engines, prefill_chunk_tokens=prefill_chunk_tokens, texts=False)
        self._output = OutputProcessor(pipe.tokenizer)  # texts and answers made off the decode thread
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self.steps = 0
        self.preemptions = 0  # rows preempted to keep within max_kv_bytes
        self.peak_kv_bytes = 0  # the most KV bytes measured at once: the row storages' and staging engines' peaks summed each turn
        self.rows_stepped = 0  # sum over steps of the rows in the step (occupancy = rows_stepped / steps)
        self.kv_bytes = 0  # KV bytes the row storages and staging engines held after the last step
        self.live_tokens = 0  # context tokens the live rows held after the last step (BatchDecoder.held_tokens)
        #: times each kind of worker thread woke from waiting for work (a row decoding wakes no set-up thread)
        self.wakeups = {"decode": 0, "setup": 0}
        self._worker = threading.Thread(target=self._run, name="asymspec-scheduler", daemon=True)
        self._worker.start()
        self._setups = self._start_setup(setup_workers)

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
        d = self._decoder
        return len(d.rows) + len(d.arriving) + len(d.parked)

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
        return self._closing and not self._waiting and not self._setting_up and not self._ready and not self.live_rows and not self._jobs

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._ready and not self._jobs and not self.live_rows and not self._finished() and self.error is None:
                        self._cond.wait()
                        self.wakeups["decode"] += 1
                    if self._finished() or self.error is not None:
                        return
                bounded = self.max_stall is not None  # the plan says how many set-up calls run (rule 6)
                if not bounded:
                    self._run_jobs()
                self._retire_cancelled()
                plan = self._plan()
                ran = self._run_jobs(plan.jobs) if bounded else 0
                decided = TurnOutcome(failed=[], computed={}, prompt_tokens={}, rows={})  # the row decisions' results
                self._admit(plan, decided)
                self._make_room(plan, decided)
                admitted(self._table, plan, decided)
                self._decoder.reset_peaks()
                t0 = time.perf_counter()
                outcome, rides = self._prefill(plan)
                prefill_s = time.perf_counter() - t0
                prefilled(self._table, plan, outcome)
                # a set-up waiting on the tower goes on before the step, not a turn later
                self._run_jobs(None if plan.jobs is None else max(0, plan.jobs - ran))
                decode, t0 = self._decoder.step_tokens() if self._decoder.rows else 0, time.perf_counter()
                prefilled(self._table, plan, self._step_one(rides))
                held = plan.jobs is not None and plan.prefill_budget == 0 and bool(self._decoder.arriving)
                self._costs.turn(prefill_s + time.perf_counter() - t0, plan.tokens(), decode, held)
                self.peak_kv_bytes = max(self.peak_kv_bytes, self._decoder.peak())
                self.kv_bytes, self.live_tokens = self._decoder.allocated(), self._decoder.held_tokens()
                # no wake-up here: a set-up thread waits for room in the ready line, which only admission
                # (_leave_line) and retiring (_retire_cancelled) make; waking every set-up thread after each step
                # only made them contend with this thread for the interpreter's lock
        except BaseException as exc:  # noqa: BLE001 - a dead worker must not leave callers waiting forever
            self._stop_on(exc)

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
        for state in states:
            state.move(RequestStatus.FAILED)
            self._output.finish(state.handle, error=error)
        for _, future in jobs:
            future.set_exception(error)

    # ---------------------------------------------------------------- one turn: execute the plan (_plan: .policy_view)
    def _counts(self, decided: TurnOutcome, rid: int, prompts: dict[str, Any]) -> None:
        """Row ``rid``'s ``prompts`` to prefill now (their lengths and what is in the KV already) go to ``decided``."""
        decided.prompt_tokens[rid], decided.computed[rid] = prompt_counts(prompts)  # type: ignore[index]

    def _admit(self, plan: TurnPlan, decided: TurnOutcome) -> None:
        """The plan's preempted rows come back (their prompts to the batched prefill), requests that can never fit
        are refused with the numbers, and its set-up requests take rows. Each fails alone: only its own handle errors.
        ``decided`` gets the ids that failed, the admitted rows' prompts and the rows that decode at once."""
        decoder, failed = self._decoder, decided.failed
        assert isinstance(failed, list)
        for rid in plan.resume:
            try:
                decoder.resume(rid)
                self._counts(decided, rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001 - that row fails alone
                decoder.remove(rid)
                self._end(rid, error=exc)
                failed.append(rid)
        for rid in plan.refuse:
            alone = self._table[rid].alone_kv
            self._leave_line(rid)
            self._end(
                rid,
                error=KVBudgetError(
                    f"request {rid} needs up to {alone:,} bytes of KV cache (its prompts plus max_new_tokens, "
                    f"with the storage's padding and compaction slack) but max_kv_bytes is {self.max_kv_bytes:,}: "
                    "lower max_new_tokens, shorten the prompt or raise max_kv_bytes"
                ),
            )
        for rid in plan.admit:
            state = self._table[rid]
            with self._cond:
                state.left_line_at = time.monotonic()
            try:
                row = decoder.add(rid, state.work)
                if row is not None:  # its prompts were all prefilled elsewhere: it decodes from this turn
                    decided.rows[rid] = row  # type: ignore[index]
                self._counts(decided, rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001
                self._end(rid, error=exc)
                failed.append(rid)
            finally:  # out of the ready line only once it is a row: the set-up thread never sees a free row between
                self._leave_line(rid)

    def _make_room(self, plan: TurnPlan, decided: TurnOutcome) -> None:
        """The plan's victims give their KV back: a decoding row is preempted (dropped and rebuilt from its tokens
        later, the same output), a row being prefilled is taken back out (a new request to the head of the line, its
        prompts by stream again; a resumed row parked again). ``decided`` gets the ids that failed and each victim's
        prompts to prefill now."""
        decoder, failed = self._decoder, decided.failed
        assert isinstance(failed, list)
        for rid in plan.preempt:
            try:
                if rid in decoder.arriving.rows:
                    session = decoder.unstage(rid)
                    if session is not None:  # a new request: back to the front of the line
                        with self._cond:
                            self._ready.appendleft(rid)
                        self._counts(decided, rid, session.to_prefill)
                        continue
                elif rid in decoder.rows:
                    decoder.preempt(rid)
                    self.preemptions += 1
                else:
                    continue
                self._counts(decided, rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001 - that row fails alone
                with contextlib.suppress(Exception):
                    decoder.remove(rid)
                self._end(rid, error=exc)
                failed.append(rid)

    def kv_bound(self, session: Session | None = None) -> int:
        """The most KV bytes the batch can allocate at once, with ``session`` joining (:meth:`BatchDecoder.kv_bound`):
        what ``max_kv_bytes`` bounds."""
        return self._decoder.kv_bound(session)

    def _leave_line(self, rid: int) -> None:
        """Take ``rid`` out of the ready line."""
        with self._cond:
            with contextlib.suppress(ValueError):
                self._ready.remove(rid)
            self._cond.notify_all()

    def _prefill(self, plan: TurnPlan) -> tuple[TurnOutcome, Rides]:
        """The turn's prompt pieces, together within the plan's prompt tokens (cut from the prompts as they are once
        the admitted rows found their stored prefixes): one staging forward per stream whose storage takes no pieces
        in its own forwards (its rows whose prompts are in decode from this turn's step on; a failing forward fails
        the rows being prefilled), and the pieces that ride in the step's forwards (:meth:`BatchDecoder.stage`).
        Returns the rows that joined with each arriving row's computed prompt tokens, and the rides."""
        decoder = self._decoder
        if not decoder.arriving:
            return TurnOutcome(joined=(), computed={}), {}
        if plan.jobs is not None and not plan.prefill_budget:  # the stall bound holds the pieces: the turn measures its step
            return self._joined(), {}
        budget = plan.prefill_budget or prefill_budget(self.token_budget, decoder.step_tokens())
        rides: Rides = {}
        try:
            rides = decoder.stage(budget)
        except Exception as exc:  # noqa: BLE001 - those rows fail, the others go on (parked rows took no part)
            for rid in list(decoder.arriving.rows):
                decoder.remove(rid)
                self._end(rid, error=exc)
        return self._joined(), rides

    def _joined(self) -> TurnOutcome:
        """The arriving rows whose prompts are in join (one whose join fails fails alone); the rows that joined and
        each arriving row's computed prompt tokens."""
        decoder = self._decoder
        if not decoder.arriving:  # no row arriving: none joins
            return TurnOutcome(joined=(), computed={})
        prompts = {rid: decoder.arriving.prompts(rid) for rid in decoder.arriving.rows}
        failed: list[tuple[int, BaseException]] = []
        joined = decoder.join_ready(failed)
        for rid, exc in failed:
            self._end(rid, error=exc)
        computed = {rid: prompt_counts(per)[1] for rid, per in prompts.items()}
        return TurnOutcome(joined=tuple(row.id for row in joined), computed=computed, rows={row.id: row for row in joined})

    def _step_one(self, rides: Rides) -> TurnOutcome:
        """Step every live row once (all methods and settings in one step), its forwards carrying ``rides``; the rows
        whose prompts are in after it join (they decode from the next step)."""
        decoder = self._decoder
        if not decoder.rows and not rides:
            return TurnOutcome(joined=(), computed={})
        n, calls, t0 = len(decoder.rows), decoder.engine_calls, time.perf_counter()
        stepping = list(decoder.rows.values())
        try:
            out = decoder.step(rides=rides)
        except Exception as exc:  # noqa: BLE001 - fail the step's rows and the rows riding in it, keep serving
            riding = {rid for pieces in rides.values() for rid in pieces if rid in decoder.arriving.rows}
            for rid in riding:
                decoder.remove(rid)
                self._end(rid, error=exc)
            for row in stepping:
                if row.result is not None:  # it finished in this step before the failure: its answer stands
                    self._end(row.id, result=row.result)
                    continue
                if row.id in decoder.rows:
                    decoder.remove(row.id)
                self._end(row.id, error=exc)
            return TurnOutcome(joined=(), computed={})
        if not n:
            return self._joined()
        if self.on_step is not None:
            self.on_step(n, decoder.engine_calls - calls, time.perf_counter() - t0)
        self.steps += 1
        self.rows_stepped += n
        for row, events in out:
            state = self._table.get(row.id)
            if events and state is not None:
                self._output.events(state.handle, events)  # token ids: their texts are made on the output thread
            if row.result is not None:
                self._end(row.id, result=row.result)
        return self._joined()

    def _retire_cancelled(self) -> None:
        with self._cond:
            for child in self._table.abandoned():  # a cancelled request's captions go with it
                child.handle.cancel()
            gone = [rid for rid in (*self._waiting, *self._ready) if self._table[rid].handle.cancelled]
            if gone:  # out of the lines; room in the ready line: a set-up thread may go on
                self._waiting = deque(rid for rid in self._waiting if rid not in gone)
                self._ready = deque(rid for rid in self._ready if rid not in gone)
                self._cond.notify_all()
        for rid in gone:
            self._end(rid, error=cancelled_error(self._table[rid].handle))
        decoder = self._decoder
        for rid in [r for r in [*decoder.rows, *decoder.waiting_rows] if self._table[r].handle.cancelled]:
            decoder.remove(rid)
            self._end(rid, error=cancelled_error(self._table[rid].handle))

    def _end(self, rid: int, result: Any = None, error: BaseException | None = None) -> None:
        """Request ``rid`` leaves the table: finished with ``result`` (FINISHED_LENGTH when its token budget cut it,
        else FINISHED_STOPPED), cancelled (ABORTED) or failed on ``error`` (FAILED); its handle gets the answer."""
        with self._cond:
            state = self._table.pop(rid)
        if state is None:
            return
        handle = state.handle
        state.left_line_at = state.left_line_at or time.monotonic()
        if error is None:
            status = RequestStatus.FINISHED_LENGTH if getattr(result, "cut_by_budget", False) else RequestStatus.FINISHED_STOPPED
        else:
            status = RequestStatus.ABORTED if handle.cancelled else RequestStatus.FAILED
        state.move(status)
        self._output.finish(handle, result, error)
