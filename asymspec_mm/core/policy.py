"""The scheduling policy: what one turn of the engine loop does, decided from numbers alone.

:func:`schedule` takes a :class:`TurnView` (each request's status, priority, arrival, prompt tokens left per stream,
decode tokens per step; the KV budget and a meter of what a batch needs; the token budget; the batch size) and
returns a :class:`TurnPlan`: which preempted rows resume, which set-up requests take a row, which can never fit,
which rows are preempted, the prompt chunks the turn's prefill forwards carry and the rows that step. It owns no
thread, lock, model or storage (vLLM v1's ``Scheduler.schedule`` returning a ``SchedulerOutput``, without the
allocation): the :class:`~asymspec_mm.core.scheduler.Scheduler`'s decode thread executes the plan, and
:func:`update` applies it and the turn's outcome to the :class:`~asymspec_mm.core.request_state.RequestState` table.

The rules (one turn):

1. **Resume** preempted rows, lowest priority value then earliest arrival first, while the batch with each fits the
   KV budget (one always fits when nothing else holds a row); the first that does not blocks the line.
2. **Admit** set-up requests in line order while rows are free and the batch with each fits; one that would not fit
   even alone is refused (it could never run); the first that does not fit now waits at the head of the line.
3. **Preempt** while the batch needs more than the budget and more than one row holds KV: the victim is the
   preemptible row with the highest priority value, latest arrival first (a row still being prefilled is taken back
   out: a new request to the head of the line, a resumed row preempted again; a request that joined at once, its
   prompts prefilled elsewhere, is not preemptible).
4. **Prompt chunks** under one token budget (vLLM's ``max_num_batched_tokens``): the step's decode tokens first,
   the prompts share what is left, at least :data:`MIN_PREFILL_TOKENS`; every stream storage with prompt tokens
   left gets at most ``prefill_chunk_tokens`` and its equal share, rows first come first served. The pieces ride in
   the first forward the step makes on that storage (one forward of them alone where the step makes none).
5. **Step** the running rows; those whose prompts are all in after the chunks join and decode from the next step.
6. **Stall bound** (``max_stall``, off by default): a turn's work beside its step costs at most ``max_stall - 1``
   times the step the decoding rows make now, by the loop's measured :class:`TurnCosts` (Sarathi-Serve's stall-free
   batching, its token budget derived from a time-between-tokens target): the set-up model calls waiting (the vision
   tower's passes) first, at least one a turn so that none starves; then the prompt tokens, at least
   :data:`MIN_PREFILL_TOKENS`, never more than the token budget leaves. Steps are measured by their decode tokens;
   a turn whose step is not measured yet carries no prompt pieces (it measures the step: one call at most), unless
   the turn before held its pieces too (then the nearest smaller step measured stands in, so that prompts move at
   least every other turn). Until measured, one call runs a turn and a prompt token is taken to cost what a decode
   token does. A turn with no row decoding stalls nobody: it is not bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .request_state import RequestStatus

#: The fewest prompt tokens a turn prefills, however many the step decodes (arriving rows always make progress).
MIN_PREFILL_TOKENS = 16
#: Tokens a turn's forwards carry, decode and prefill together, unless a scheduler says otherwise (vLLM's default
#: ``max_num_batched_tokens`` for chunked prefill); a smaller budget shortens the longest gap a decoding row sees
#: while prompts arrive, a larger one lets them in sooner.
DEFAULT_TOKEN_BUDGET = 2048

#: KV bytes the next prefill forward and decode step allocate with these rows holding KV (running and prefilling,
#: ids in the order they would be in the batch). A pure function of the ids for one turn.
KVMeter = Callable[[tuple[int, ...]], int]


@dataclass(frozen=True)
class RowInfo:
    """One request as the policy sees it.

    ``status``: READY (set up, waiting for a row: in line order in the view), PREFILLING (in prefill order), RUNNING
    or PREEMPTED. ``prompt_left``: prompt tokens each stream storage still has to prefill (for a READY or PREEMPTED
    row, all it will have to prefill once it takes a row; empty: it joins the decoding rows at once).
    ``step_tokens``: tokens one decode step forwards for it. ``alone_kv``: the most KV bytes it can need by itself
    (READY rows; ``None``: not bounded)."""

    rid: int
    status: RequestStatus
    priority: int = 0
    prompt_left: Mapping[str, int] = field(default_factory=dict)
    step_tokens: int = 1
    alone_kv: int | None = None
    preemptible: bool = True

    @property
    def order(self) -> tuple[int, int]:
        """Who goes first: lower priority value, then earlier arrival (ids grow with arrival)."""
        return (self.priority, self.rid)


@dataclass(frozen=True)
class TurnCosts:
    """Seconds the engine loop measured (moving averages; ``None``: not measured yet): ``steps``, a decode step by its
    decode tokens; ``token_s``, one prompt token the turn's forwards carry beside the step; ``job_s``, one set-up model
    call (a vision tower pass). ``may_hold``: the last turn did not hold its prompt pieces back (this one may, to
    measure a step)."""

    steps: Mapping[int, float] = field(default_factory=dict)
    token_s: float | None = None
    job_s: float | None = None
    may_hold: bool = True

    def step_s(self, decode_tokens: int) -> float | None:
        """The step of ``decode_tokens`` decode tokens: measured, or ``None`` (hold the pieces and measure it) where
        the turn may hold, else the nearest smaller step measured (the smallest, where none is smaller)."""
        if decode_tokens in self.steps:
            return self.steps[decode_tokens]
        if self.may_hold or not self.steps:
            return None
        below = [d for d in self.steps if d <= decode_tokens]
        return self.steps[max(below) if below else min(self.steps)]


@dataclass(frozen=True)
class TurnView:
    """A snapshot of the engine for one turn: its requests (see :class:`RowInfo`) and limits. ``kv_need`` is required
    when ``max_kv_bytes`` is set. ``jobs``: set-up model calls waiting for the loop; ``max_stall`` and ``costs``: rule
    6 (``None``: every waiting call runs and the token budget alone bounds the prompts)."""

    rows: tuple[RowInfo, ...]
    max_batch_size: int
    token_budget: int = DEFAULT_TOKEN_BUDGET
    prefill_chunk_tokens: int = 512
    max_kv_bytes: int | None = None
    kv_need: KVMeter | None = None
    jobs: int = 0
    max_stall: float | None = None
    costs: TurnCosts = TurnCosts()

    def need(self, members: Iterable[int]) -> int:
        assert self.kv_need is not None, "a KV budget needs a meter"
        return self.kv_need(tuple(members))


@dataclass(frozen=True)
class TurnPlan:
    """What one turn does, in this order (see the module docstring): ``resume``, ``admit`` (to PREFILLING, or RUNNING
    for ``join_now``), ``refuse`` (never fits: KVBudgetError), ``preempt`` (victims in the order taken: a running
    row or a resumed one is parked, a new one goes back to the head of the line), ``chunks`` (stream ->
    ``(rid, tokens)`` pieces, within ``prefill_budget`` tokens) riding in ``step``'s forwards (the rows that decode),
    and ``joins`` (their prompts all in after the chunks: they decode from the next step on; a storage that cannot
    carry pieces in its forwards prefills them in a staging forward first, and its rows step at once).
    ``kv_need``: the meter's bytes for the rows holding KV after the plan (``None`` without a budget). ``jobs``: how
    many of the waiting set-up model calls the turn runs (``None``: all, as they come)."""

    resume: tuple[int, ...] = ()
    admit: tuple[int, ...] = ()
    join_now: tuple[int, ...] = ()
    refuse: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()
    prefill_budget: int = 0
    chunks: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    joins: tuple[int, ...] = ()
    step: tuple[int, ...] = ()
    kv_need: int | None = None
    jobs: int | None = None

    def tokens(self) -> int:
        """Prompt tokens the chunks carry, all streams together."""
        return sum(n for pieces in self.chunks.values() for _, n in pieces)


def prompt_chunks(
    left: Iterable[tuple[int, Mapping[str, int]]], budget: int | None, chunk_tokens: int
) -> dict[str, tuple[tuple[int, int], ...]]:
    """The pieces of one prefill turn: ``left`` is each arriving row's prompt tokens left per stream, first come
    first; every stream with tokens left gets one forward of at most ``chunk_tokens`` tokens and its equal share of
    ``budget`` (all streams' forwards together; at least one token each; ``None``: ``chunk_tokens`` each), taken
    from the rows in order. Returns stream -> ``((rid, tokens), ...)``."""
    rows = [(rid, dict(per_stream)) for rid, per_stream in left]
    names = sorted({name for _, per_stream in rows for name, n in per_stream.items() if n > 0})
    share = chunk_tokens if budget is None else max(1, budget // max(1, len(names)))
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    for name in names:
        room, pieces = min(share, chunk_tokens), []
        for rid, per_stream in rows:
            n = per_stream.get(name, 0)
            if n <= 0:
                continue
            if room <= 0:
                break
            pieces.append((rid, min(room, n)))
            room -= pieces[-1][1]
        out[name] = tuple(pieces)
    return out


def prefill_budget(token_budget: int, decode_tokens: int) -> int:
    """Prompt tokens a turn may prefill: what the token budget leaves after the step's decode tokens, at least
    :data:`MIN_PREFILL_TOKENS`."""
    return max(MIN_PREFILL_TOKENS, token_budget - decode_tokens)


def stall_bounded(max_stall: float, costs: TurnCosts, jobs: int, tokens: int, decode_tokens: int) -> tuple[int, int]:
    """Rule 6: ``(calls, prompt tokens)`` a turn takes on beside a step of ``decode_tokens`` so that it costs at most
    ``max_stall`` times the step (:meth:`TurnCosts.step_s`): of the ``jobs`` waiting calls as many as fit, at least
    one (one until a call is measured); then of the ``tokens`` the token budget allows as many as the rest of the time
    fits at ``costs.token_s`` each (a decode token's share of the step until measured), at least
    :data:`MIN_PREFILL_TOKENS`. A step to measure: one call at most and no prompt tokens."""
    step_s = costs.step_s(decode_tokens)
    if step_s is None:
        return min(jobs, 1), 0
    spare = max(0.0, max_stall - 1.0) * step_s
    if jobs and costs.job_s is None:
        jobs = 1  # one call measures what a call costs
    elif jobs and costs.job_s is not None:
        jobs = max(1, min(jobs, int(spare / costs.job_s + 1e-9)))  # 1e-9: what float division loses
        spare -= jobs * costs.job_s
    token_s = costs.token_s if costs.token_s else step_s / max(1, decode_tokens)  # 0: not measured either
    if token_s > 0:
        tokens = min(tokens, max(MIN_PREFILL_TOKENS, int(max(0.0, spare) / token_s + 1e-9)))
    return jobs, tokens


def decoding_only(running: Iterable[int]) -> TurnPlan:
    """The plan of a turn whose only requests are the ``running`` rows, with no KV budget: nothing to resume, admit,
    refuse, preempt or prefill, every row steps. What :func:`schedule` decides for such a view, without one: the
    engine loop's turns while rows decode and nothing else waits cost no view and no policy pass."""
    return TurnPlan(step=tuple(running))


def schedule(view: TurnView) -> TurnPlan:
    """Decide one turn from ``view`` (see the module docstring); pure: ``view`` is not changed."""
    by_id = {r.rid: r for r in view.rows}
    running = [r.rid for r in view.rows if r.status is RequestStatus.RUNNING]
    members = running + [r.rid for r in view.rows if r.status is RequestStatus.PREFILLING]  # rows holding KV, in order
    resumed, admitted, refused = _admissions(view, members)
    join_now = [rid for rid in admitted if not any(n > 0 for n in by_id[rid].prompt_left.values())]
    running_now = set(running) | set(join_now)
    # a row that joined at once holds KV prefilled elsewhere: no prompt of its own to rebuild it from
    preemptible = {rid for rid in members if rid not in running_now or (rid in running and by_id[rid].preemptible)}
    victims = _victims(view, members, preemptible)  # takes them out of members
    arriving = [rid for rid in members if rid not in running_now]
    stepping = [rid for rid in members if rid in running_now]
    left = [(rid, by_id[rid].prompt_left) for rid in arriving]
    decode = sum(by_id[rid].step_tokens for rid in stepping)
    tokens = prefill_budget(view.token_budget, decode) if arriving else 0
    jobs: int | None = None
    if view.max_stall is not None and stepping:  # no row decoding: nobody waits on the turn
        jobs, tokens = stall_bounded(view.max_stall, view.costs, view.jobs, tokens, decode)
        tokens = tokens if arriving else 0
    chunks = prompt_chunks(left, tokens, view.prefill_chunk_tokens) if arriving and tokens else {}  # 0: held (rule 6)
    taken = {(rid, name): n for name, pieces in chunks.items() for rid, n in pieces}
    joins = [rid for rid, per_stream in left if all(n <= taken.get((rid, name), 0) for name, n in per_stream.items())]
    return TurnPlan(
        resume=tuple(resumed),
        admit=tuple(admitted),
        join_now=tuple(join_now),
        refuse=tuple(refused),
        preempt=tuple(victims),
        prefill_budget=tokens,
        chunks=chunks,
        joins=tuple(joins),
        step=tuple(stepping),
        kv_need=view.need(members) if view.max_kv_bytes is not None else None,
        jobs=jobs,
    )


def _admissions(view: TurnView, members: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Rules 1 and 2: the preempted rows that resume and the ready requests that take a row (appended to
    ``members``), and those refused; returns ``(resumed, admitted, refused)``."""
    budget = view.max_kv_bytes
    parked = sorted((r for r in view.rows if r.status is RequestStatus.PREEMPTED), key=lambda r: r.order)
    rows = len(members) + len(parked)
    resumed: list[int] = []
    for r in parked:
        if budget is not None and members and view.need([*members, r.rid]) > budget:
            return resumed, [], []  # first in line until its KV fits; new requests wait behind it
        resumed.append(r.rid)
        members.append(r.rid)
    admitted: list[int] = []
    refused: list[int] = []
    for r in (r for r in view.rows if r.status is RequestStatus.READY):
        if rows >= view.max_batch_size:
            break
        if budget is not None and r.alone_kv is not None and r.alone_kv > budget:
            refused.append(r.rid)
            continue
        if budget is not None and members and view.need([*members, r.rid]) > budget:
            break  # first in line until its KV fits
        admitted.append(r.rid)
        members.append(r.rid)
        rows += 1
    return resumed, admitted, refused


def _victims(view: TurnView, members: list[int], preemptible: set[int]) -> list[int]:
    """Rule 3: the rows preempted, in the order taken (removed from ``members``), while the batch needs more than
    the budget and more than one row holds KV."""
    if view.max_kv_bytes is None:
        return []
    order = {r.rid: r.order for r in view.rows}
    victims: list[int] = []
    while len(members) > 1 and view.need(members) > view.max_kv_bytes:
        candidates = [rid for rid in members if rid in preemptible]
        if not candidates:
            break
        victims.append(max(candidates, key=order.__getitem__))
        members.remove(victims[-1])
    return victims


@dataclass
class TurnOutcome:
    """What happened when a plan ran: rows that finished (rid -> FINISHED_STOPPED or FINISHED_LENGTH), rows that
    failed on their own error or were cancelled; ``joined`` (the rows whose prompts are all in) and ``computed``
    (rid -> stream -> prompt tokens in its KV) as they came out, where they differ from the plan's (a stored prefix
    found on joining shortens a prompt); ``None``: as planned. ``prompt_tokens``: rid -> stream -> the prompt tokens
    it now has to prefill, for the rows whose prompts changed (admitted: by storage; preempted: its prompt and the
    tokens it had cached; taken back to the line: by stream again); ``rows``: rid -> the decoder's row of each request
    that began decoding (joined, or admitted with its prompts prefilled elsewhere)."""

    finished: Mapping[int, RequestStatus] = field(default_factory=dict)
    failed: Iterable[int] = ()
    aborted: Iterable[int] = ()
    joined: Iterable[int] | None = None
    computed: Mapping[int, Mapping[str, int]] | None = None
    prompt_tokens: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    rows: Mapping[int, Any] = field(default_factory=dict)


def update(states: Mapping[int, Any], plan: TurnPlan, outcome: TurnOutcome | None = None) -> None:
    """Apply ``plan`` and the turn's ``outcome`` to ``states`` (rid -> :class:`RequestState`): :func:`admitted`,
    then :func:`prefilled`. Rows already gone are skipped."""
    outcome = outcome or TurnOutcome()
    admitted(states, plan, outcome)
    prefilled(states, plan, outcome)


def _mover(states: Mapping[int, Any], gone: set[int]) -> Callable[[int, RequestStatus], None]:
    def move(rid: int, status: RequestStatus) -> None:
        state = states.get(rid)
        if state is not None and rid not in gone and not state.status.finished:
            state.move(status)

    return move


def admitted(states: Mapping[int, Any], plan: TurnPlan, outcome: TurnOutcome | None = None) -> None:
    """The plan's row decisions, once carried out (the engine loop applies them before the turn's prefill, so that
    a request's status says at once that it has a row): resumed and admitted rows to PREFILLING (RUNNING when they
    join at once, with ``outcome.rows``' row), refused ones to FAILED, a preempted new request back to READY, a
    preempted decoding or resumed row to PREEMPTED. ``outcome.failed``: ids that failed on their own error meanwhile
    (skipped); ``outcome.prompt_tokens`` and ``computed``: the prompts the moved rows have to prefill now (without
    them an admitted or preempted row's computed tokens start again from none)."""
    outcome = outcome or TurnOutcome()
    failed = set(outcome.failed)
    move = _mover(states, failed)
    for rid in plan.resume:
        move(rid, RequestStatus.PREFILLING)
    for rid in plan.admit:
        move(rid, RequestStatus.RUNNING if rid in plan.join_now else RequestStatus.PREFILLING)
        if rid in states:
            states[rid].computed = {}
    for rid in plan.refuse:
        move(rid, RequestStatus.FAILED)
    for rid in plan.preempt:
        state = states.get(rid)
        if state is None or state.status.finished or rid in failed:
            continue
        if state.status is RequestStatus.PREFILLING and not state.preemptions:
            move(rid, RequestStatus.READY)  # a new request taken back out: to the head of the line
        else:
            state.preemptions += state.status is RequestStatus.RUNNING
            move(rid, RequestStatus.PREEMPTED)
        state.computed = {}
    _counted(states, outcome, failed)


def _counted(states: Mapping[int, Any], outcome: TurnOutcome, gone: set[int]) -> None:
    """``outcome``'s prompts and rows onto the live records it names."""
    for rid, tokens in outcome.prompt_tokens.items():
        state = states.get(rid)
        if state is not None and rid not in gone and not state.status.finished:
            state.set_prompts(tokens, (outcome.computed or {}).get(rid))
    for rid, row in outcome.rows.items():
        state = states.get(rid)
        if state is not None and state.status is RequestStatus.RUNNING:
            state.row = row


def prefilled(states: Mapping[int, Any], plan: TurnPlan, outcome: TurnOutcome) -> None:
    """The turn's prefill and step: each stream's ``computed`` tokens grow by its chunks (or are ``outcome``'s),
    the rows whose prompts are in to RUNNING (with ``outcome.rows``' row), finished, failed and cancelled rows end."""
    gone = set(outcome.failed) | set(outcome.aborted)
    move = _mover(states, gone)
    if outcome.computed is None:
        for name, pieces in plan.chunks.items():
            for rid, n in pieces:
                state = states.get(rid)
                if state is not None and state.status is RequestStatus.PREFILLING:
                    state.computed[name] = state.computed.get(name, 0) + n
    else:
        for rid, per_stream in outcome.computed.items():
            if rid in states:
                states[rid].computed = dict(per_stream)
    for rid in plan.joins if outcome.joined is None else outcome.joined:
        move(rid, RequestStatus.RUNNING)
    for rid, status in outcome.finished.items():
        move(rid, status)
    for rid, status in [(r, RequestStatus.FAILED) for r in outcome.failed] + [(r, RequestStatus.ABORTED) for r in outcome.aborted]:
        state = states.get(rid)
        if state is not None and not state.status.finished:
            state.move(status)
    _counted(states, outcome, gone)
