"""What the scheduling policy decides a turn from: :func:`turn_view`, the engine core's side of :func:`.policy.schedule`.

Each turn the decode thread takes a snapshot of its requests (:class:`~.policy.TurnView`): every request holding a
row, in the batch's order (decoding, being prefilled, preempted), then the ready line in its order, each read from
its record (:class:`~.request_state.RequestState`: status, priority, the prompt tokens each stream has left, its
admission bound), with the limits, the loop's measured costs and a KV meter over the decoder
(:meth:`~.decoder.BatchDecoder.step_need`). The policy itself reads nothing else: the records own the prompt counts
the decoder's prefill advances (the loop writes them back after each turn, as vLLM's scheduler keeps
``num_computed_tokens`` on its ``Request`` while the model runner keeps its own copy), so the policy's tests build
the same view from hand-written records. :func:`plan_turn` reads an :class:`~.engine_core.EngineCore` (any object with its :class:`CoreState`).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Protocol

from .decoder import STEP_TOKENS
from .policy import RowInfo, TurnPlan, TurnView, decoding_only, schedule
from .request_state import RequestState, RequestStatus, is_cancelled

if TYPE_CHECKING:
    from collections import deque

    from .decoder import BatchDecoder
    from .request_state import RequestTable
    from .turn_costs import CostMeter


def step_tokens(state: RequestState) -> int:
    """Tokens one decode step forwards for ``state``'s request (:data:`~.decoder.STEP_TOKENS` of its method and K)."""
    work = state.work
    return STEP_TOKENS[work.method](work.config.k)


def row_info(state: RequestState, status: RequestStatus, **extra: Any) -> RowInfo:
    """``state`` as the policy sees it, in ``status`` (the place it holds in the view)."""
    left = {} if status is RequestStatus.RUNNING else state.prompt_left
    return RowInfo(state.rid, status, state.priority, left, step_tokens(state), **extra)


class CoreState(Protocol):
    """What the view reads of the engine core (:class:`~.engine_core.EngineCore`)."""

    cond: threading.Condition
    table: RequestTable
    ready: deque[int]
    jobs: deque
    decoder: BatchDecoder
    costs: CostMeter
    max_batch_size: int
    token_budget: int
    prefill_chunk_tokens: int
    max_kv_bytes: int | None
    max_stall: float | None

    def leave_line(self, rid: int) -> None: ...

    def _end(self, rid: int, result: Any = None, error: BaseException | None = None) -> None: ...


def plan_turn(core: CoreState) -> TurnPlan:
    """The turn's plan: :func:`schedule` of :func:`turn_view`; while only decoding rows are left and no KV budget
    applies, what it would decide (:func:`decoding_only`: every row steps) without building the view."""
    d = core.decoder
    if core.max_kv_bytes is None and core.max_stall is None and not core.ready and not d.arriving and not d.parked:
        return decoding_only(d.rows)
    return schedule(turn_view(core))


def turn_view(core: CoreState) -> TurnView:
    """What the policy decides from: the records of the rows (decoding, being prefilled, preempted: in the batch's
    order), of the ready line in order (each measured once against ``max_kv_bytes`` alone; one whose measure
    fails fails alone), the limits and a KV meter over the decoder (:meth:`BatchDecoder.step_need`)."""
    d, table = core.decoder, core.table
    rows = [row_info(table[rid], RequestStatus.RUNNING, preemptible=d.preemptible(rid)) for rid in d.rows]
    rows += [row_info(table[rid], RequestStatus.PREFILLING) for rid in d.arriving.rows]
    rows += [row_info(table[rid], RequestStatus.PREEMPTED) for rid in d.parked]
    with core.cond:
        line = [table[rid] for rid in core.ready if not is_cancelled(table[rid])]
    joining = {}
    for state in line:
        if core.max_kv_bytes is not None and state.alone_kv is None:
            try:
                state.alone_kv = d.kv_bound(state.work, alone=True)
            except Exception as exc:  # noqa: BLE001 - it can never be admitted: its own request fails
                core.leave_line(state.rid)
                core._end(state.rid, error=exc)  # noqa: SLF001 - within the core's turn
                continue
        # its prompts by stream: its storages are chosen on joining
        rows.append(row_info(state, RequestStatus.READY, alone_kv=state.alone_kv))
        joining[state.rid] = state.work
    meter = functools.partial(d.step_need, joining=joining) if core.max_kv_bytes is not None else None
    with core.cond:
        jobs = len(core.jobs)
    return TurnView(
        tuple(rows),
        core.max_batch_size,
        core.token_budget,
        core.prefill_chunk_tokens,
        core.max_kv_bytes,
        meter,
        jobs,
        core.max_stall,
        core.costs.costs(),
    )
