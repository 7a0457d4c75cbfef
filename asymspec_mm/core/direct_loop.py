"""The pipeline's engine when no scheduler runs: one engine core its callers drive, a turn at a time.

Every direct call of a pipeline (``pipe.generate`` / ``chat`` / ``stream`` / ``complete`` with no loop started, the
set-up's caption and tower calls, and every other model call made from a caller's thread: the single-row engines'
steps, the attribution's forwards) goes to one :class:`DirectLoop` per pipeline. Its requests are rows of one
:class:`~.engine_core.EngineCore`; its model calls are the core's set-up jobs. It has no thread: a caller waiting for
its request's next output (or its call's value) drives the core's next turn itself, unless another caller is driving
one, in which case it waits for that turn to end. A turn serves every request in the core, so callers on several
threads share each step's forwards (decoded as one batch, as the scheduler's loop does) instead of taking turns
with whole model calls; one thread at a time runs the models, by construction (the driving turn passes from caller
to caller). A single caller drives every turn of its own request, with no thread switch: the speed of the engine
core stepped on the caller's thread (BENCHMARKS.md).

The core lives while it has work: when a turn leaves it empty it goes, with its KV storages, and the next request
starts a fresh one. One loop runs a pipeline's models at a time, by construction: a turn runs on its caller's thread
only while no scheduler runs the pipeline's models (a scheduler starting waits for such a turn to end,
:func:`~.model_owner.claim`); while one does, every turn is one of its model calls (:meth:`~.loop_calls.LoopCalls.run`),
between two of its steps, on its decode thread. Each turn's outputs reach their queues as the turn ends, on
whichever thread ran it, so a request's steps arrive in order.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from ..base.errors import AsymSpecError
from ..base.gc_heap import frozen_heap
from ..engines import RowStorages
from .engine_core import EngineCore, EngineOutput
from .handle import SchedulerStoppedError
from .request_state import RequestKind, RequestState

if TYPE_CHECKING:
    from ..engines.model_calls import ModelLoop, TokenRequest, TokenResult
    from ..request.preparing import ServingPipeline
    from ..request.session import Session

T = TypeVar("T")

#: Rows a direct loop decodes together at most (callers beyond it wait in its line for a row).
DIRECT_ROWS = 16

#: Prompt tokens a direct turn prefills: a request alone has no decoding row to stall, so its prompt goes in one
#: forward per row storage, as a single-row engine prefills it.
DIRECT_TOKEN_BUDGET = 1 << 30


class DirectLoopError(AsymSpecError):
    """A direct request or call cannot go on: the turn decoding it stopped on an interrupt of another caller's
    thread, or it was made from within a turn and would wait for itself."""


class DirectHandle:
    """What the core reads of a direct request's caller: its id and whether it gave up (closed its stream)."""

    def __init__(self) -> None:
        self.id = -1
        self.cancelled = False
        self.cancel_error: BaseException | None = None

    def cancel(self) -> None:
        self.cancelled = True


class DirectLoop:
    """One pipeline's caller-driven engine core (see the module docstring): :meth:`add_session` /
    :meth:`outputs` for a request, :meth:`decode_row` for a token request (a caption, a completion), :meth:`run` for
    any other model call (a :class:`~asymspec_mm.engines.model_calls.ModelLoop`).

    ``make_core(pipe)`` builds the core when a request or call arrives and none is live; ``models_here(pipe)``
    (a context manager, :func:`~.model_owner.models_here`) says who runs a turn: it yields the scheduler that runs
    the pipeline's models (the turn is one of its model calls), or ``None`` with this thread counted as running them
    for the block; ``runs_every_turn(pipe)``: whether the calling thread is that scheduler's decode thread. The loop holds its pipeline weakly (the
    registry is keyed by it); a live core holds it."""

    def __init__(
        self,
        pipe: ServingPipeline,
        make_core: Callable[[ServingPipeline], EngineCore],
        models_here: Callable[[ServingPipeline], contextlib.AbstractContextManager[ModelLoop | None]],
        runs_every_turn: Callable[[ServingPipeline], bool] = lambda pipe: False,
    ):
        self._pipe, self.make_core, self.models_here, self.runs_every_turn = weakref.ref(pipe), make_core, models_here, runs_every_turn
        self.cond = threading.Condition()  # the driver, the outputs and the core's life (the core's own table: core.cond)
        self.ids = itertools.count()  # request ids across the cores it makes
        self.core: EngineCore | None = None
        self.driver: int | None = None  # the caller driving a turn (here or as a scheduler's model call), if any
        self.stepping: int | None = None  # the thread running a step or a call of this loop now, if any
        self.outputs_by_id: dict[int, deque[EngineOutput]] = {}  # each live request's outputs not taken yet
        self.turns = 0  # turns run (for statistics and tests)
        self.most_rows = 0  # the most rows one turn stepped
        self.added: Counter[str] = Counter()  # requests entered, by kind (answer, caption, summary, completion)

    @property
    def pipe(self) -> ServingPipeline:
        pipe = self._pipe()
        if pipe is None:  # pragma: no cover - a caller holds its pipeline
            raise AsymSpecError("the pipeline of this direct loop is gone")
        return pipe

    # ---------------------------------------------------------------- requests and calls in
    def _live_core(self) -> EngineCore:
        """The core, made when none is live (called with ``cond`` held)."""
        if self.core is None:
            self.core = self.make_core(self.pipe)
            self.core.ids = self.ids
        return self.core

    def add_session(self, session: Session) -> DirectHandle:
        """Enter a request set up on the calling thread (``prefill=False``) at the end of the line; returns its handle
        (read its :meth:`outputs`)."""
        handle = DirectHandle()
        with self.cond:
            handle.id = self._live_core().add_session(session, session.request.priority, handle=handle)
            self.outputs_by_id[handle.id] = deque()
            self.added[RequestKind.ANSWER.value] += 1
        return handle

    def decode_row(self, request: TokenRequest) -> TokenResult:
        """Decode ``request`` as a row ahead of the requests waiting to join; returns once it is done."""
        handle = DirectHandle()
        with self.cond:
            core = self._live_core()
            handle.id = next(self.ids)
            self.outputs_by_id[handle.id] = deque()
            self.added[request.kind] += 1
            core.add(RequestState.of_token_request(handle.id, handle, request), first=True)
        with frozen_heap():  # the loaded heap out of the collector's scans while the row decodes
            for out in self.outputs(handle):
                if out.finished:
                    if out.error is not None:
                        raise out.error
                    return out.result
        raise AssertionError("a request's outputs end with its answer or error")  # pragma: no cover

    def run(self, fn: Callable[[], T]) -> T:
        """``fn`` (one model call) in a turn, between two steps of the requests in the core; at once on the thread
        running a turn (a call made from within it). With nothing in flight the call is the turn itself (no core is
        built for it)."""
        me = threading.get_ident()
        if self.stepping == me:
            return fn()
        with self.cond:
            alone = self.core is None and self.driver is None and not self.runs_every_turn(self.pipe)
            if alone:
                self.driver = me
        if alone:
            try:
                with self.models_here(self.pipe) as loop:
                    return loop.run(lambda: self._as_turn(fn)) if loop is not None else self._as_turn(fn)
            finally:
                with self.cond:
                    self.driver = None
                    self.cond.notify_all()
        future: Future = Future()
        context = contextvars.copy_context()  # the call counts as the caller's (its vision statistics)
        job = (lambda: context.run(fn), future)
        with self.cond:
            core = self._live_core()
            with core.cond:
                core.jobs.append(job)
        try:
            self._drive(future.done)
        except BaseException:  # interrupted while it waited: the call is not made, and nothing keeps the core
            with self.cond:
                with core.cond, contextlib.suppress(ValueError):
                    core.jobs.remove(job)
                self._settle()
            raise
        return future.result()

    # ---------------------------------------------------------------- outputs out
    def outputs(self, handle: DirectHandle) -> Iterator[EngineOutput]:
        """``handle``'s outputs in order, up to its end (an answer or an error), driving the turns that make them.
        Closing it early cancels the request: it leaves at the next turn (which this drives when nobody else does);
        interrupted while it waits, it is cancelled and nothing keeps it (the core goes when only such rows are left)."""
        queue = self.outputs_by_id[handle.id]
        ended = False
        try:
            while not ended:
                self._drive(lambda: bool(queue))
                with self.cond:
                    out = queue.popleft()
                ended = out.finished
                yield out
        except GeneratorExit:  # the caller stopped reading: out of the batch at the next turn, which this drives
            if not ended:
                handle.cancel()
                self._drive(lambda: bool(queue) and queue[-1].finished)
            raise
        except BaseException:  # interrupted while it waited (^C)
            handle.cancel()
            raise
        finally:
            with self.cond:
                self.outputs_by_id.pop(handle.id, None)
                self._settle()

    # ---------------------------------------------------------------- the turns
    def _drive(self, ready: Callable[[], bool]) -> None:
        """Run turns on this thread until ``ready()``, waiting instead while another caller runs one. On a
        scheduler's decode thread (a callback of its steps calling the pipeline) it never waits: that thread runs
        every turn, the driving caller's too (its turn waits in that loop's line), so its own run here at once, one
        after another on the one thread."""
        me = threading.get_ident()
        if self.stepping == me:
            raise DirectLoopError(
                "a request entered the direct loop from within one of its turns and would wait for itself: "
                "make the call outside the model call that runs in the turn"
            )
        at_once = self.runs_every_turn(self.pipe)
        while True:
            took = False
            try:
                with self.cond:
                    while not ready() and self.driver is not None and not at_once:
                        self.cond.wait()
                    if ready():
                        return
                    core = self.core
                    if core is None:  # pragma: no cover - a request or call waiting keeps its core live
                        raise AssertionError("a direct loop waits for a turn with no core")
                    if not at_once:
                        took = True
                        self.driver = me
                self._turn(core)
            finally:
                with self.cond:
                    if took:
                        self.driver = None
                    self._settle()
                    self.cond.notify_all()

    def _turn(self, core: EngineCore) -> None:
        """One turn of ``core``: a model call of the scheduler that runs the pipeline's models when one does (at once
        on its decode thread), else here, this thread then the one running them (a scheduler starting meanwhile
        waits for the turn to end)."""
        while True:
            with self.models_here(self.pipe) as loop:
                if loop is None:
                    self._step(core)
                    return
                try:
                    loop.run(lambda: self._step(core))
                    return
                except SchedulerStoppedError:
                    if getattr(loop, "error", None) is None:
                        raise
                    # that scheduler stopped before running this turn: it runs once the pipeline has passed on

    def _step(self, core: EngineCore) -> None:
        """``core.step()`` on this thread, its outputs delivered to their queues at once (in the order of the turns,
        wherever each runs); a step that stops on something other than a row's own error fails the core
        (:meth:`_fail_all`)."""
        rows = len(core.decoder.rows)
        try:
            outs = self._as_turn(core.step)
        except BaseException as exc:
            self._fail_all(core, exc)
            raise
        with self.cond:
            self._deliver(outs)
            self.turns += 1
            self.most_rows = max(self.most_rows, rows)
            self.cond.notify_all()

    def _as_turn(self, fn: Callable[[], T]) -> T:
        """``fn`` with this thread marked as the one running a turn (a model call made within it runs at once)."""
        outer, self.stepping = self.stepping, threading.get_ident()
        try:
            return fn()
        finally:
            self.stepping = outer

    def _deliver(self, outs: list[EngineOutput]) -> None:
        """Each output to its request's queue (called with ``cond`` held; a request nobody reads any more has none)."""
        for out in outs:
            queue = self.outputs_by_id.get(out.rid)
            if queue is not None:
                queue.append(out)

    def _settle(self) -> None:
        """With no turn running, the core goes (with its KV) once nobody waits on it: no work left, or only requests
        whose callers left (cancelled, or no longer reading) and no call waiting. Called with ``cond`` held."""
        core = self.core
        if core is None or self.driver is not None or self.stepping is not None:
            return
        with core.cond:
            orphaned = not core.jobs and all(
                state.handle is None or state.handle.cancelled or state.rid not in self.outputs_by_id for state in core.table
            )
        if not core.has_work or orphaned:
            self.core = None

    def _fail_all(self, core: EngineCore, exc: BaseException) -> None:
        """A step stopped on ``exc`` (outside the core's own per-row failures: an interrupt): the answers it made
        stand, every other request in the core fails (with ``exc`` itself where it is an error, else with a
        :class:`DirectLoopError` naming it), its waiting calls too, and the core goes."""
        error: BaseException = exc
        if not isinstance(exc, Exception):
            error = DirectLoopError(f"the turn decoding this request stopped on {type(exc).__name__} on another caller's thread; retry it")
            error.__cause__ = exc
        with self.cond:
            if self.core is core:
                self.core = None
            with core.cond:
                states = core.table.clear()
                jobs, core.jobs = list(core.jobs), deque()
            outs = core.take_outputs()
            done = {out.rid for out in outs if out.finished}
            self._deliver(outs + [EngineOutput(s.rid, s.handle, error=error) for s in states if s.rid not in done])
            self.cond.notify_all()
        for _, future in jobs:
            future.set_exception(error)


def direct_core(
    pipe: ServingPipeline,
    *,
    max_batch_size: int = 1,
    texts: bool = True,
    timer: Any = None,
    wrap_storage: Callable[[Any], Any] | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
) -> EngineCore:
    """An engine core for requests with no loop running (its prompts in one forward per storage; ``texts``: the
    events' and the answer's texts made here, there is no output side; ``timer``: see :attr:`EngineCore.timer`;
    ``wrap_storage``: each row storage through it, see :class:`~asymspec_mm.engines.RowStorages`; ``on_step``: told
    of every decode step, see :class:`EngineCore`).

    Each stream's KV is in a pool of its own, one tensor per layer: a row alone then has consecutive blocks that every
    layer reads where they lie, as the single-row cache it replaces did, with no copy. (One pool shared by the
    drafter's two views hands their blocks out alternately, and a pool of segments spreads a growing row over
    several; either way each layer would copy the row's runs of slots per forward.) Growing a contiguous pool holds
    one layer's old tensor beside it while it copies, counted in the peak and the bounds: the transient a single-row
    cache's concatenation has too."""
    storages = RowStorages(layout="contiguous", per_stream=True, wrap=wrap_storage)
    core = EngineCore(
        pipe,
        max_batch_size,
        batch_engines=storages,
        prefill_chunk_tokens=DIRECT_TOKEN_BUDGET,
        token_budget=DIRECT_TOKEN_BUDGET,
        texts=texts,
        measures=False,
        on_step=on_step,
    )
    core.timer = timer
    return core
