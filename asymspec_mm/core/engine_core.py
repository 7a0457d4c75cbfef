"""The engine core: one turn of the engine, with no thread of its own (vLLM v1's ``EngineCore.step``).

:class:`EngineCore` holds the requests' records (:class:`~.request_state.RequestTable`), the line of requests set up
and waiting for a row, the set-up model calls waiting to run, the decoder over the paged row storages
(:class:`~.decoder.BatchDecoder`) and what the turns measured. :meth:`EngineCore.step` runs one turn on the calling
thread: the set-up model calls waiting, cancelled requests out, the policy's plan (:func:`.policy.schedule` of a view
of the records, :mod:`.policy_view`), the plan's row decisions (resume, refuse, admit, preempt), the prompt pieces,
one decode step of every running row with the pieces riding in its forwards, the plan and its outcome applied to the
records (:func:`.policy.admitted`, :func:`.policy.prefilled`); it returns what the turn produced for each request
(:class:`EngineOutput`: a step's committed events, an answer, an error), in order.

Who drives it decides the threads. The :class:`~.scheduler.Scheduler` steps it on its decode thread while set-up
threads fill the line and an output thread hands the outputs to the handles. A caller may as well step it on its
own thread, as ``LLM.generate`` steps vLLM's core in-process: :meth:`EngineCore.add_session` a request set up on that
thread (no handle; ``texts=True`` makes the answers' texts), then :meth:`EngineCore.step` until it has no work left:
one record, the same policy, the paged storages, no thread started. The core shares one condition (``cond``) with
the threads that drive it: every change to the table and the lines happens under it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base.errors import AsymSpecError
from .decoder import BatchDecoder, BatchEngineFactory
from .handle import KVBudgetError
from .policy import DEFAULT_TOKEN_BUDGET, TurnOutcome, TurnPlan, admitted, prefill_budget, prefilled
from .policy_view import plan_turn
from .prefill import DEFAULT_CHUNK_TOKENS, Rides
from .request_state import RequestState, RequestStatus, RequestTable, is_cancelled, prompt_counts
from .setup_pool import cancelled_error
from .turn_costs import CostMeter

if TYPE_CHECKING:
    from ..decode import TokenEvent
    from ..request.preparing import ServingPipeline
    from ..request.session import Session


@dataclass
class EngineOutput:
    """What one turn produced for request ``rid`` (its record's ``handle`` with it): one step's committed ``events``
    (token ids, and texts when the core makes them), or its end: ``result`` (an
    :class:`~asymspec_mm.request.session.MMResult` or a token request's tokens) or ``error``."""

    rid: int
    handle: Any
    events: list[TokenEvent] | None = None
    result: Any = None
    error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Whether the request ended (its answer or error), rather than stepped."""
        return self.events is None


@dataclass
class RowDecisions:
    """What the plan's row decisions did, as they are carried out: the ids that failed alone, the prompts each moved
    row has to prefill now (their lengths and what is in its KV already) and the rows that decode at once."""

    failed: list[int] = field(default_factory=list)
    prompt_tokens: dict[int, dict[str, int]] = field(default_factory=dict)
    computed: dict[int, dict[str, int]] = field(default_factory=dict)
    rows: dict[int, Any] = field(default_factory=dict)

    def count(self, rid: int, prompts: dict[str, Any]) -> None:
        """Row ``rid``'s ``prompts`` to prefill now (by storage or by stream)."""
        self.prompt_tokens[rid], self.computed[rid] = prompt_counts(prompts)

    def outcome(self) -> TurnOutcome:
        """The decisions as the policy's :class:`TurnOutcome` (:func:`.policy.admitted` applies it)."""
        return TurnOutcome(failed=self.failed, computed=self.computed, prompt_tokens=self.prompt_tokens, rows=self.rows)


class EngineCore:
    """One turn of the engine on the calling thread (see the module docstring): :meth:`add` a request set up,
    :meth:`step` while :attr:`has_work`. ``planner``: the turn's plan (default :meth:`plan`; a driver may wrap it).
    ``texts``: the core fills the events' and answers' texts (no output side to do it). ``measures``: each turn
    measures the KV the storages hold and peak at (``kv_bytes``, ``peak_kv_bytes``, ``live_tokens``: a server's
    metrics) and what it cost (the stall bound's); off for a request alone, which has no reader for them."""

    def __init__(
        self,
        pipe: ServingPipeline,
        max_batch_size: int = 16,
        max_kv_bytes: int | None = None,
        *,
        batch_engines: BatchEngineFactory | None = None,
        prefill_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
        max_stall: float | None = None,
        on_step: Callable[[int, int, float], None] | None = None,
        texts: bool = False,
        planner: Callable[[], TurnPlan] | None = None,
        measures: bool = True,
    ):
        self.pipe, self.max_batch_size, self.max_kv_bytes = pipe, max_batch_size, max_kv_bytes
        self.prefill_chunk_tokens, self.token_budget, self.max_stall = prefill_chunk_tokens, token_budget, max_stall
        self.on_step = on_step
        self.planner = planner or self.plan
        self.measures = measures
        self.cond = threading.Condition()  # the table's and the lines' lock, shared with the threads that drive the core
        self.ids = itertools.count()
        self.table = RequestTable()  # every request not finished, by id (its status says where it stands)
        self.ready: deque[int] = deque()  # ids set up, waiting for a row (the head first, for KV room)
        self.jobs: deque[tuple[Callable[[], Any], Future]] = deque()  # set-up model calls the turns run (the tower)
        self.decoder = BatchDecoder(pipe, engines=batch_engines, prefill_chunk_tokens=prefill_chunk_tokens, texts=texts)
        self.costs = CostMeter()  # what the turns' work costs, measured (read by the stall bound)
        self.timer: Any = None  # timer(name) around the gate and the trace of each step (a caller's profile)
        self.steps = 0
        self.preemptions = 0  # rows preempted to keep within max_kv_bytes
        self.peak_kv_bytes = 0  # the most KV bytes measured at once: the row storages' and staging engines' peaks summed each turn
        self.rows_stepped = 0  # sum over steps of the rows in the step (occupancy = rows_stepped / steps)
        self.kv_bytes = 0  # KV bytes the row storages and staging engines held after the last step
        self.live_tokens = 0  # context tokens the live rows held after the last step (BatchDecoder.held_tokens)
        self._outputs: list[EngineOutput] = []  # what this turn produced so far

    # ---------------------------------------------------------------- requests in, outputs out
    def add(self, state: RequestState, *, first: bool = False) -> None:
        """Enter ``state`` (a token request's, READY with its prompts) at the end of the ready line (``first``: at its
        head, ahead of the requests waiting to join)."""
        with self.cond:
            self.table.add(state)
            if first:
                self.ready.appendleft(state.rid)
            else:
                self.ready.append(state.rid)
            self.cond.notify_all()

    def add_session(self, session: Session, priority: int = 0, *, handle: Any = None) -> int:
        """Enter a request set up on the calling thread (``session``: ``pipe.set_up(request, prefill=False)``'s) at the
        end of the ready line; returns its id. ``handle``: what the outputs carry and cancelling reads (``None``: a
        request only its caller steps, never cancelled)."""
        state = RequestState(next(self.ids), handle, session.request, priority)
        with self.cond:
            self.table.add(state)
            state.move(RequestStatus.SETTING_UP)  # set up on the calling thread already
            state.work = session
            state.set_prompts(*prompt_counts(session.to_prefill))
            state.move(RequestStatus.READY)
            self.ready.append(state.rid)
        return state.rid

    @property
    def live_rows(self) -> int:
        """Rows being prefilled, decoded or preempted (admitted and not finished)."""
        d = self.decoder
        return len(d.rows) + len(d.arriving) + len(d.parked)

    @property
    def has_work(self) -> bool:
        """Whether a turn would do anything: requests in line, set-up model calls waiting or rows live."""
        return bool(self.ready or self.jobs or self.live_rows)

    def take_outputs(self) -> list[EngineOutput]:
        """What the turns produced and nobody took yet, in order."""
        out, self._outputs = self._outputs, []
        return out

    def end(self, rid: int, result: Any = None, error: BaseException | None = None) -> EngineOutput | None:
        """Request ``rid`` leaves the table: finished with ``result`` (FINISHED_LENGTH when its token budget cut it,
        else FINISHED_STOPPED), cancelled (ABORTED) or failed on ``error`` (FAILED). Returns its output (``None``:
        it had left already); the caller hands it on."""
        with self.cond:
            state = self.table.pop(rid)
        if state is None:
            return None
        state.left_line_at = state.left_line_at or time.monotonic()
        if error is None:
            status = RequestStatus.FINISHED_LENGTH if getattr(result, "cut_by_budget", False) else RequestStatus.FINISHED_STOPPED
        else:
            status = RequestStatus.ABORTED if is_cancelled(state) else RequestStatus.FAILED
        state.move(status)
        return EngineOutput(rid, state.handle, result=result, error=error)

    def _end(self, rid: int, result: Any = None, error: BaseException | None = None) -> None:
        """:meth:`end` within a turn: its output goes with the turn's."""
        out = self.end(rid, result, error)
        if out is not None:
            self._outputs.append(out)

    def leave_line(self, rid: int) -> None:
        """Take ``rid`` out of the ready line (a set-up thread waiting for room in it may go on)."""
        with self.cond:
            with contextlib.suppress(ValueError):
                self.ready.remove(rid)
            self.cond.notify_all()

    def kv_bound(self, session: Session | None = None) -> int:
        """The most KV bytes the batch can allocate at once, with ``session`` joining (:meth:`BatchDecoder.kv_bound`):
        what ``max_kv_bytes`` bounds."""
        return self.decoder.kv_bound(session)

    # ---------------------------------------------------------------- one turn
    def plan(self) -> TurnPlan:
        """The turn's plan: the policy over a view of the records (:func:`.policy_view.plan_turn`)."""
        return plan_turn(self)

    def step(self) -> list[EngineOutput]:
        """One turn (see the module docstring); returns its outputs in order."""
        bounded = self.max_stall is not None  # the plan says how many set-up calls run (rule 6)
        if not bounded:
            self.run_jobs()
        self.retire_cancelled()
        plan = self.planner()
        ran = self.run_jobs(plan.jobs) if bounded else 0
        decided = RowDecisions()
        self._admit(plan, decided)
        self._make_room(plan, decided)
        admitted(self.table, plan, decided.outcome())
        decoder = self.decoder
        if self.measures:
            decoder.reset_peaks()
        t0 = time.perf_counter()
        outcome, rides = self._prefill(plan)
        prefill_s = time.perf_counter() - t0
        prefilled(self.table, plan, outcome)
        # a set-up waiting on the tower goes on before the step, not a turn later
        self.run_jobs(None if plan.jobs is None else max(0, plan.jobs - ran))
        decode, t0 = decoder.step_tokens() if decoder.rows else 0, time.perf_counter()
        prefilled(self.table, plan, self._step_one(rides))
        if self.measures:
            held = plan.jobs is not None and plan.prefill_budget == 0 and bool(decoder.arriving)
            self.costs.turn(prefill_s + time.perf_counter() - t0, plan.tokens(), decode, held)
            self.peak_kv_bytes = max(self.peak_kv_bytes, decoder.peak())
            self.kv_bytes, self.live_tokens = decoder.allocated(), decoder.held_tokens()
        return self.take_outputs()

    def run_jobs(self, limit: int | None = None) -> int:
        """The set-up model calls waiting (at most ``limit``; ``None``: all, those that come meanwhile too), each timed
        for the policy's costs; a failing one fails its caller alone. Returns how many ran."""
        ran = 0
        while limit is None or ran < limit:
            with self.cond:
                if not self.jobs:
                    return ran
                fn, future = self.jobs.popleft()
            ran += 1
            t0 = time.perf_counter()
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - the caller's error, whatever it is (it must not wait forever)
                future.set_exception(exc)
            except BaseException as exc:  # an interrupt of the thread running the turn: its own, not the caller's
                future.set_exception(AsymSpecError(f"the turn running this model call stopped on {type(exc).__name__}; retry it"))
                raise
            self.costs.job(time.perf_counter() - t0)
        return ran

    def retire_cancelled(self) -> None:
        """Cancelled requests leave: a cancelled request's captions with it, those in line and those holding a row."""
        with self.cond:
            for child in self.table.abandoned():  # a cancelled request's captions go with it
                child.handle.cancel()
            gone = [rid for rid in self.ready if is_cancelled(self.table[rid])]
            if gone:  # out of the line; room in it: a set-up thread may go on
                self.ready = deque(rid for rid in self.ready if rid not in gone)
                self.cond.notify_all()
        for rid in gone:
            self._end(rid, error=cancelled_error(self.table[rid].handle))
        decoder = self.decoder
        for rid in [r for r in [*decoder.rows, *decoder.waiting_rows] if is_cancelled(self.table[r])]:
            decoder.remove(rid)
            self._end(rid, error=cancelled_error(self.table[rid].handle))

    def _admit(self, plan: TurnPlan, decided: RowDecisions) -> None:
        """The plan's preempted rows come back (their prompts to the batched prefill), requests that can never fit
        are refused with the numbers, and its set-up requests take rows. Each fails alone: only its own request errors.
        ``decided`` gets the ids that failed, the admitted rows' prompts and the rows that decode at once."""
        decoder = self.decoder
        for rid in plan.resume:
            try:
                decoder.resume(rid)
                decided.count(rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001 - that row fails alone
                decoder.remove(rid)
                self._end(rid, error=exc)
                decided.failed.append(rid)
        for rid in plan.refuse:
            alone = self.table[rid].alone_kv
            self.leave_line(rid)
            self._end(
                rid,
                error=KVBudgetError(
                    f"request {rid} needs up to {alone:,} bytes of KV cache (its prompts plus max_new_tokens, "
                    f"with the storage's padding and compaction slack) but max_kv_bytes is {self.max_kv_bytes:,}: "
                    "lower max_new_tokens, shorten the prompt or raise max_kv_bytes"
                ),
            )
        for rid in plan.admit:
            state = self.table[rid]
            with self.cond:
                state.left_line_at = time.monotonic()
            try:
                row = decoder.add(rid, state.work)
                if row is not None:  # its prompts were all prefilled elsewhere: it decodes from this turn
                    decided.rows[rid] = row
                decided.count(rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001
                self._end(rid, error=exc)
                decided.failed.append(rid)
            finally:  # out of the ready line only once it is a row: a set-up thread never sees a free row between
                self.leave_line(rid)

    def _make_room(self, plan: TurnPlan, decided: RowDecisions) -> None:
        """The plan's victims give their KV back: a decoding row is preempted (dropped and rebuilt from its tokens
        later, the same output), a row being prefilled is taken back out (a new request to the head of the line, its
        prompts by stream again; a resumed row parked again). ``decided`` gets the ids that failed and each victim's
        prompts to prefill now."""
        decoder = self.decoder
        for rid in plan.preempt:
            try:
                if rid in decoder.arriving.rows:
                    session = decoder.unstage(rid)
                    if session is not None:  # a new request: back to the front of the line
                        with self.cond:
                            self.ready.appendleft(rid)
                        decided.count(rid, session.to_prefill)
                        continue
                elif rid in decoder.rows:
                    decoder.preempt(rid)
                    self.preemptions += 1
                else:
                    continue
                decided.count(rid, decoder.prompts_of(rid))
            except Exception as exc:  # noqa: BLE001 - that row fails alone
                with contextlib.suppress(Exception):
                    decoder.remove(rid)
                self._end(rid, error=exc)
                decided.failed.append(rid)

    def _prefill(self, plan: TurnPlan) -> tuple[TurnOutcome, Rides]:
        """The turn's prompt pieces, together within the plan's prompt tokens (cut from the prompts as they are once
        the admitted rows found their stored prefixes): one staging forward per stream whose storage takes no pieces
        in its own forwards (its rows whose prompts are in decode from this turn's step on; a failing forward fails
        the rows being prefilled), and the pieces that ride in the step's forwards (:meth:`BatchDecoder.stage`).
        Returns the rows that joined with each arriving row's computed prompt tokens, and the rides."""
        decoder = self.decoder
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
        decoder = self.decoder
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
        decoder = self.decoder
        if not decoder.rows and not rides:
            return TurnOutcome(joined=(), computed={})
        n, calls, t0 = len(decoder.rows), decoder.engine_calls, time.perf_counter()
        stepping = list(decoder.rows.values())
        try:
            out = decoder.step(self.timer, rides=rides)
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
            state = self.table.get(row.id)
            if events and state is not None:
                self._outputs.append(EngineOutput(row.id, state.handle, events=events))
            if row.result is not None:
                self._end(row.id, result=row.result)
        return self._joined()
