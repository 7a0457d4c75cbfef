"""What the scheduling policy decides a turn from: :class:`PolicyView`, the engine loop's side of :func:`.policy.schedule`.

Each turn the decode thread takes a snapshot of its requests (:class:`~.policy.TurnView`): every request holding a
row, in the batch's order (decoding, being prefilled, preempted), then the ready line in its order, each read from
its record (:class:`~.request_state.RequestState`: status, priority, the prompt tokens each stream has left, its
admission bound), with the limits, the loop's measured costs and a KV meter over the decoder
(:meth:`~.decoder.BatchDecoder.step_need`). The policy itself reads nothing else: the records own the prompt counts
the decoder's prefill advances (the loop writes them back after each turn, as vLLM's scheduler keeps
``num_computed_tokens`` on its ``Request`` while the model runner keeps its own copy), so the policy's tests build
the same view from hand-written records. A mixin of :class:`~.scheduler.Scheduler`, which provides the state it reads.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .decoder import STEP_TOKENS
from .policy import RowInfo, TurnPlan, TurnView, decoding_only, schedule
from .request_state import RequestState, RequestStatus

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


class PolicyView:
    """The scheduler's turn plan (:meth:`_plan`) from a view of its records (:meth:`_view`)."""

    _cond: threading.Condition
    _table: RequestTable
    _ready: deque[int]
    _jobs: deque
    _decoder: BatchDecoder
    _costs: CostMeter
    max_batch_size: int
    token_budget: int
    prefill_chunk_tokens: int
    max_kv_bytes: int | None
    max_stall: float | None
    _leave_line: Callable[[int], None]
    _end: Callable[..., None]

    def _plan(self) -> TurnPlan:
        """The turn's plan: :func:`schedule` of :meth:`_view`; while only decoding rows are left and no KV budget
        applies, what it would decide (:func:`decoding_only`: every row steps) without building the view."""
        d = self._decoder
        if self.max_kv_bytes is None and self.max_stall is None and not self._ready and not d.arriving and not d.parked:
            return decoding_only(d.rows)
        return schedule(self._view())

    def _view(self) -> TurnView:
        """What the policy decides from: the records of the rows (decoding, being prefilled, preempted: in the batch's
        order), of the ready line in order (each measured once against ``max_kv_bytes`` alone; one whose measure
        fails fails alone), the limits and a KV meter over the decoder (:meth:`BatchDecoder.step_need`)."""
        d, table = self._decoder, self._table
        rows = [row_info(table[rid], RequestStatus.RUNNING, preemptible=d.preemptible(rid)) for rid in d.rows]
        rows += [row_info(table[rid], RequestStatus.PREFILLING) for rid in d.arriving.rows]
        rows += [row_info(table[rid], RequestStatus.PREEMPTED) for rid in d.parked]
        with self._cond:
            line = [table[rid] for rid in self._ready if not table[rid].handle.cancelled]
        joining = {}
        for state in line:
            if self.max_kv_bytes is not None and state.alone_kv is None:
                try:
                    state.alone_kv = d.kv_bound(state.work, alone=True)
                except Exception as exc:  # noqa: BLE001 - it can never be admitted: its own handle fails
                    self._leave_line(state.rid)
                    self._end(state.rid, error=exc)
                    continue
            # its prompts by stream: its storages are chosen on joining
            rows.append(row_info(state, RequestStatus.READY, alone_kv=state.alone_kv))
            joining[state.rid] = state.work
        meter = functools.partial(d.step_need, joining=joining) if self.max_kv_bytes is not None else None
        with self._cond:
            jobs = len(self._jobs)
        return TurnView(
            tuple(rows),
            self.max_batch_size,
            self.token_budget,
            self.prefill_chunk_tokens,
            self.max_kv_bytes,
            meter,
            jobs,
            self.max_stall,
            self._costs.costs(),
        )
