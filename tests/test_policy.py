"""The scheduling policy alone: hand-written request states and fake KV numbers, no threads, no models."""

from __future__ import annotations

import random

import pytest

from asymspec_mm.core.policy import (
    MIN_PREFILL_TOKENS,
    RowInfo,
    TurnCosts,
    TurnOutcome,
    TurnPlan,
    TurnView,
    decoding_only,
    prompt_chunks,
    schedule,
    stall_bounded,
    update,
)
from asymspec_mm.core.request_state import RequestState, RequestStatus, TransitionError

S = RequestStatus


def meter(costs: dict[int, int], base: int = 0):
    """An additive KV meter: ``base`` plus each member's bytes (a paged storage's blocks are additive)."""
    return lambda members: base + sum(costs[m] for m in members)


def row(rid, status, priority=0, left=None, step=1, alone=None, preemptible=True):
    return RowInfo(rid, status, priority, left if left is not None else {}, step, alone, preemptible)


def view(rows, costs=None, budget=None, batch=8, tokens=2048, chunk=512):
    return TurnView(tuple(rows), batch, tokens, chunk, budget, meter(costs) if costs is not None else None)


def test_admits_in_line_order_until_rows_run_out():
    rows = [row(0, S.RUNNING)] + [row(i, S.READY, left={"v": 10}) for i in (3, 1, 2)]
    plan = schedule(view(rows, batch=3))
    assert plan.admit == (3, 1)  # line order (the scheduler keeps the line), two free rows
    assert plan.resume == plan.preempt == plan.refuse == ()


def test_resume_goes_first_by_priority_then_arrival_and_blocks_the_line():
    rows = [row(0, S.RUNNING), row(5, S.PREEMPTED, 1), row(4, S.PREEMPTED, 0), row(7, S.PREEMPTED, 0), row(9, S.READY)]
    costs = {0: 10, 5: 10, 4: 10, 7: 10, 9: 1}
    plan = schedule(view(rows, costs, budget=30))
    assert plan.resume == (4, 7)  # priority 0 first, earlier first; 5 would pass the budget
    assert plan.admit == ()  # a preempted row that does not fit yet blocks new requests behind it
    plan = schedule(view(rows, costs, budget=100))
    assert plan.resume == (4, 7, 5) and plan.admit == (9,)


def test_one_always_fits_when_nothing_holds_kv_but_one_that_never_fits_is_refused():
    rows = [row(1, S.READY, alone=50, left={"v": 4}), row(2, S.READY, alone=90, left={"v": 4}), row(3, S.READY, alone=10)]
    plan = schedule(view(rows, {1: 70, 2: 70, 3: 10}, budget=60))
    # 1 fits alone by its bound (its step need counts padding it may not reach), 2 can never fit: refused; 3 waits
    assert plan.admit == (1,) and plan.refuse == (2,)
    assert plan.preempt == ()  # the last row holding KV is never preempted


def test_preemption_takes_highest_priority_value_latest_arrival_and_spares_the_last_row():
    rows = [row(0, S.RUNNING, 0), row(1, S.RUNNING, 2), row(2, S.RUNNING, 2), row(3, S.RUNNING, 1), row(4, S.RUNNING, 5, preemptible=False)]
    costs = dict.fromkeys(range(5), 10)
    plan = schedule(view(rows, costs, budget=25))
    assert plan.preempt == (2, 1, 3)  # 4 cannot be preempted; then priority 2 latest first, then 1
    assert plan.kv_need == 20 and set(plan.step) == {0, 4}
    plan = schedule(view(rows[:2], {0: 100, 1: 100}, budget=10))
    assert plan.preempt == (1,) and plan.step == (0,)  # over budget alone: the last row stays


def test_a_request_that_joins_at_once_is_never_the_victim():
    rows = [row(0, S.RUNNING, 0), row(1, S.READY, 5), row(2, S.READY, 3, left={"v": 9})]
    plan = schedule(view(rows, {0: 10, 1: 10, 2: 10}, budget=100))
    assert plan.admit == (1, 2) and plan.join_now == (1,) and plan.step == (0, 1) and plan.joins == (2,)
    plan = schedule(view(rows, {0: 10, 1: 10, 2: 30}, budget=45))
    assert plan.admit == (1,)  # 2 would pass the budget: it waits
    plan = schedule(view([row(0, S.RUNNING, 0), row(1, S.RUNNING, 5, preemptible=False)], {0: 30, 1: 30}, budget=45))
    assert plan.preempt == (0,)  # the row that cannot be preempted stays, whatever its priority


def test_a_new_arriving_row_is_taken_back_before_a_decoding_row_of_lower_order():
    rows = [row(0, S.RUNNING, 1), row(8, S.PREFILLING, 0, left={"v": 30}), row(9, S.PREFILLING, 1, left={"v": 30})]
    plan = schedule(view(rows, {0: 10, 8: 10, 9: 10}, budget=20))
    assert plan.preempt == (9,)
    assert plan.chunks == {"v": ((8, 30),)} and plan.joins == (8,) and plan.step == (0,)  # 8 decodes from the next step


def test_decoding_rows_alone_without_a_budget_plan_what_decoding_only_says():
    """The engine loop's shortcut while only decoding rows are left: the same plan as the policy's, for any such rows
    (none, one, several of mixed priorities, step sizes and preemptibility)."""
    cases = [[], [row(0, S.RUNNING)], [row(3, S.RUNNING, 2, step=11), row(1, S.RUNNING), row(7, S.RUNNING, -1, preemptible=False)]]
    for rows in cases:
        assert schedule(view(rows)) == decoding_only(r.rid for r in rows)
    assert decoding_only([3, 1]).step == (3, 1)  # the rows' order is kept


def test_chunk_boundaries_under_the_token_budget():
    # decode tokens first: 3 rows of 5 tokens leave 40 - 15 = 25 for the prompts; two streams share them: 12 each
    rows = [row(i, S.RUNNING, step=5) for i in range(3)] + [
        row(10, S.PREFILLING, left={"v": 7, "d": 30}),
        row(11, S.PREFILLING, left={"v": 20, "d": 2}),
    ]
    plan = schedule(view(rows, tokens=40, chunk=512))
    assert plan.prefill_budget == 25
    assert plan.chunks == {"d": ((10, 12),), "v": ((10, 7), (11, 5))}
    assert plan.joins == () and plan.tokens() == 24
    # each stream's forward at most the chunk size, whatever the budget
    plan = schedule(view(rows, tokens=10_000, chunk=8))
    assert plan.chunks == {"d": ((10, 8),), "v": ((10, 7), (11, 1))}
    # a budget the decode tokens use up still prefills MIN_PREFILL_TOKENS
    plan = schedule(view(rows, tokens=4))
    assert plan.prefill_budget == MIN_PREFILL_TOKENS
    assert plan.chunks == {"d": ((10, 8),), "v": ((10, 7), (11, 1))}


def test_a_request_alone_is_prefilled_in_bounded_chunks_then_steps():
    left, turns, tokens = {"v": 1000, "d": 400}, 0, []
    while any(left.values()):
        plan = schedule(view([row(0, S.PREFILLING, left=left)], tokens=256, chunk=512))
        share = 256 // sum(n > 0 for n in left.values())  # the budget shared by the streams with tokens left
        assert all(n == min(share, left[k]) for k, pieces in plan.chunks.items() for _, n in pieces)
        tokens.append(plan.tokens())
        left = {k: n - dict(plan.chunks.get(k, ())).get(0, 0) for k, n in left.items()}
        turns += 1
        if plan.joins:
            assert plan.step == () and not any(left.values())  # it decodes from the next turn
    assert turns == 6 and tokens == [256, 256, 256, 144, 256, 232]  # 128 a stream while both have tokens left
    assert prompt_chunks([(0, {"v": 1000})], None, 512) == {"v": ((0, 512),)}


def _random_view(rng: random.Random) -> tuple[TurnView, dict[int, int]]:
    rows, costs, rid = [], {}, 0
    for status, count in (
        (S.RUNNING, rng.randint(0, 6)),
        (S.PREFILLING, rng.randint(0, 3)),
        (S.PREEMPTED, rng.randint(0, 3)),
        (S.READY, rng.randint(0, 6)),
    ):
        for _ in range(count):
            rid += rng.randint(1, 3)
            left = {n: rng.randint(0, 300) for n in rng.sample(["v", "d", "c"], rng.randint(1, 3))} if status is not S.RUNNING else {}
            if status is S.PREFILLING and not any(left.values()):
                left["v"] = 1
            costs[rid] = rng.randint(1, 40)
            rows.append(
                row(rid, status, rng.randint(0, 2), left, rng.randint(1, 11), rng.choice([None, rng.randint(1, 120)]), rng.random() < 0.8)
            )
    rng.shuffle(rows)
    budget = rng.choice([None, rng.randint(20, 200)])
    return TurnView(tuple(rows), rng.randint(1, 12), rng.randint(1, 600), rng.randint(1, 300), budget, meter(costs)), costs


def test_random_views_never_pass_a_budget():
    rng = random.Random(51)
    for _ in range(3000):
        v, costs = _random_view(rng)
        plan = schedule(v)
        by_id = {r.rid: r for r in v.rows}
        holding = [r.rid for r in v.rows if r.status in (S.RUNNING, S.PREFILLING)] + list(plan.resume) + list(plan.admit)
        after = [rid for rid in holding if rid not in plan.preempt]
        rows_after = (
            len(after)
            + sum(r.status is S.PREEMPTED for r in v.rows)
            - len(plan.resume)
            + sum(by_id[rid].status is S.PREEMPTED or rid in plan.resume for rid in plan.preempt)
        )
        # the batch size: admission never takes a row past it (rows already live stay)
        live_before = sum(r.status in (S.RUNNING, S.PREFILLING, S.PREEMPTED) for r in v.rows)
        assert rows_after <= max(v.max_batch_size, live_before)
        if v.max_kv_bytes is not None:
            # the KV budget: within it, or only the last row left (it was admitted alone, or nothing can be preempted)
            assert plan.kv_need == sum(costs[r] for r in after)
            preemptible_left = [r for r in after if by_id[r].status is not S.RUNNING or by_id[r].preemptible]
            assert plan.kv_need <= v.max_kv_bytes or len(after) <= 1 or not preemptible_left
            assert all(by_id[r].alone_kv > v.max_kv_bytes for r in plan.refuse)
        # the token budget: prompt chunks within what the decode tokens leave (at least the minimum), each forward
        # within the chunk size, never more than a row has left
        decode = sum(by_id[r].step_tokens for r in after if by_id[r].status is S.RUNNING or r in plan.join_now)
        if plan.chunks:
            assert plan.prefill_budget == max(MIN_PREFILL_TOKENS, v.token_budget - decode)
            for name, pieces in plan.chunks.items():
                assert sum(n for _, n in pieces) <= min(v.prefill_chunk_tokens, max(1, plan.prefill_budget // len(plan.chunks)))
                assert all(0 < n <= by_id[r].prompt_left[name] for r, n in pieces)
            assert plan.tokens() <= max(plan.prefill_budget, len(plan.chunks))
        assert set(plan.step) <= set(after) and not set(plan.preempt) & set(plan.step)


def test_a_waiting_request_is_admitted_within_bounded_turns_once_room_exists():
    """No starvation: rows finish one per turn; a request at the back of a line of 20 gets a row within 21 turns
    (the first has no free row), however many requests of better priority keep arriving behind it (admission is in line order)."""
    running = [row(i, S.RUNNING) for i in range(4)]
    line = [row(100 + i, S.READY, priority=1, left={"v": 5}) for i in range(20)]
    target, turns, next_id = line[-1].rid, 0, 1000
    while True:
        turns += 1
        newcomers = [row(next_id, S.READY, priority=0, left={"v": 5})]
        next_id += 1
        plan = schedule(view(running + line + newcomers, {r.rid: 10 for r in running + line + newcomers}, budget=1000, batch=4))
        if target in plan.admit:
            break
        assert turns <= 21
        done = running[0]  # the oldest row finishes; what was admitted takes its place
        running = running[1:] + [row(rid, S.RUNNING) for rid in plan.admit]
        line = [r for r in line if r.rid not in plan.admit] + [r for r in newcomers if r.rid not in plan.admit]
        assert done.rid not in [r.rid for r in running]
    assert turns == 21  # the first turn has no free row; then one row frees a turn and the line moves by one


def test_preempted_rows_resume_in_order_as_room_frees():
    rows = {i: row(i, S.RUNNING, priority=i % 2) for i in range(4)}
    costs = dict.fromkeys(range(4), 10)
    plan = schedule(view(rows.values(), costs, budget=20))
    assert plan.preempt == (3, 1)  # priority 1 first, latest first
    parked = [row(r, S.PREEMPTED, priority=r % 2) for r in plan.preempt]
    plan = schedule(view([rows[0], *parked], costs, budget=25))
    assert plan.resume == (1,)  # the earlier of the two, once one row's room frees
    plan = schedule(view(parked, costs, budget=5))
    assert plan.resume == (1,)  # nothing holds KV: the first always resumes


def _states(plan_rows):
    return {r.rid: RequestState(r.rid, handle=None, priority=r.priority, status=r.status) for r in plan_rows}


def test_update_applies_the_plan_to_the_request_states():
    rows = [
        row(0, S.RUNNING),
        row(1, S.PREEMPTED, left={"d": 40}),
        row(2, S.READY, left={"v": 10}),
        row(3, S.READY),
        row(4, S.READY, alone=99),
    ]
    states = _states(rows)
    states[1].preemptions = 1
    plan = schedule(view(rows, {i: 1 for i in range(5)}, budget=50, tokens=16 + 2))
    assert plan.resume == (1,) and plan.admit == (2, 3) and plan.join_now == (3,) and plan.refuse == (4,)
    update(states, plan, TurnOutcome(finished={0: S.FINISHED_LENGTH}))
    # 16 prompt tokens (the minimum): 8 a stream
    assert plan.chunks == {"d": ((1, 8),), "v": ((2, 8),)}
    assert [states[i].status for i in range(5)] == [S.FINISHED_LENGTH, S.PREFILLING, S.PREFILLING, S.RUNNING, S.FAILED]
    assert states[1].computed == {"d": 8} and states[2].computed == {"v": 8}


def test_update_takes_a_new_row_back_to_the_line_and_a_resumed_one_to_preempted():
    rows = [row(0, S.RUNNING), row(1, S.PREFILLING, 1, left={"v": 50}), row(2, S.PREFILLING, 1, left={"v": 50})]
    states = _states(rows)
    states[1].preemptions = 1
    plan = schedule(view(rows, {0: 10, 1: 10, 2: 10}, budget=10))
    assert plan.preempt == (2, 1)
    update(states, plan)
    assert states[1].status is S.PREEMPTED and states[2].status is S.READY and states[1].preemptions == 1


def _session_like(method: str = "asymspec", k: int = 2):
    """What the view reads of set-up's product: its method and settings (a hand-written record's ``work``)."""
    from types import SimpleNamespace

    from asymspec_mm import AsymSpecConfig

    return SimpleNamespace(method=method, config=AsymSpecConfig(k=k))


def test_the_view_reads_each_requests_prompts_from_its_record():
    """The record owns each stream's prompt tokens and how many are in (issue #51 item 1): the policy's row of a
    request is made from its record alone, its prompt tokens left being the record's ``prompt_tokens`` less
    ``computed``; a decoding row has none left."""
    from asymspec_mm.core.policy_view import row_info

    state = RequestState(3, priority=2, status=S.PREFILLING, work=_session_like(k=3))
    state.set_prompts({"verifier": 90, "drafter_full": 120}, {"verifier": 40})
    assert state.prompt_left == {"verifier": 50, "drafter_full": 120}
    info = row_info(state, S.PREFILLING)
    assert (info.rid, info.status, info.priority, dict(info.prompt_left), info.step_tokens) == (3, S.PREFILLING, 2, state.prompt_left, 11)
    assert dict(row_info(state, S.RUNNING, preemptible=False).prompt_left) == {}
    assert row_info(RequestState(4, work=_session_like("floor")), S.READY, alone_kv=7).step_tokens == 1


def test_update_writes_the_moved_rows_prompts_and_decoder_rows_onto_their_records():
    """What the row decisions changed goes on the records: an admitted row's prompts by storage with the stored
    prefix it found, a preempted row's prompt and the tokens it had cached (nothing in), the decoder's row of a
    request that decodes at once or joins; a record has a row only while it is RUNNING."""
    running = [row(0, S.RUNNING), row(5, S.RUNNING)]
    states = _states(running)
    states[0].row, states[5].row = "row 0", "row 5"
    plan = schedule(view(running, {0: 20, 5: 20}, budget=25))
    assert plan.preempt == (5,)
    update(states, plan, TurnOutcome(prompt_tokens={5: {"verifier": 44}}, computed={5: {"verifier": 0}}))
    assert states[5].status is S.PREEMPTED and states[5].row is None and states[5].prompt_left == {"verifier": 44}
    assert states[0].row == "row 0"
    line = [row(1, S.READY, left={"v": 30}), row(2, S.READY)]
    states.update(_states(line))
    plan = schedule(view(line))
    assert plan.admit == (1, 2) and plan.join_now == (2,)
    decided = TurnOutcome(joined=(), prompt_tokens={1: {"verifier": 30}}, computed={1: {"verifier": 12}}, rows={2: "row 2"})
    update(states, plan, decided)
    assert states[1].status is S.PREFILLING and states[1].row is None and states[1].prompt_left == {"verifier": 18}
    assert states[2].status is S.RUNNING and states[2].row == "row 2"
    # the prefill's counts as they came out, and the row that joined
    update(states, TurnPlan(), TurnOutcome(joined=(1,), computed={1: {"verifier": 30}}, rows={1: "row 1"}))
    assert states[1].status is S.RUNNING and states[1].row == "row 1" and states[1].prompt_left == {"verifier": 0}
    update(states, TurnPlan(), TurnOutcome(finished={1: S.FINISHED_STOPPED}))
    assert states[1].row is None


def test_a_status_changes_only_along_its_transitions():
    state = RequestState(0, handle=None)
    with pytest.raises(TransitionError, match="WAITING -> RUNNING"):
        state.move(S.RUNNING)
    for status in (S.SETTING_UP, S.READY, S.PREFILLING, S.RUNNING, S.PREEMPTED, S.PREFILLING, S.RUNNING, S.FINISHED_STOPPED):
        state.move(status)
    assert state.status.stage == "done" and state.finished_at is not None
    with pytest.raises(TransitionError, match="FINISHED_STOPPED"):
        state.move(S.ABORTED)


def test_the_architecture_page_lists_exactly_the_transitions():
    """docs/architecture.md's transition list is the state machine's (:data:`TRANSITIONS`), no more, no less."""
    import re
    from pathlib import Path

    from asymspec_mm.core.request_state import TRANSITIONS

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set()
    for source, targets in re.findall(r"^([A-Z_]+) +-> ([A-Z_ |]+?)(?: {2,}| \(|$)", page, flags=re.MULTILINE):
        listed |= {(source, t.strip()) for t in targets.split("|") if t.strip()}
    assert listed == {(s.name, t.name) for s, targets in TRANSITIONS.items() for t in targets}


def test_the_stall_bound_takes_the_waiting_calls_then_the_prompt_tokens_that_fit():
    # a 10 ms step of 20 decode tokens, max 2x: 10 ms spare; four 4 ms calls: two fit; 2 ms left: 200 tokens of 0.01 ms
    costs = TurnCosts({20: 0.010}, token_s=0.00001, job_s=0.004)
    assert stall_bounded(2.0, costs, jobs=4, tokens=2000, decode_tokens=20) == (2, 200)
    assert stall_bounded(2.0, costs, jobs=0, tokens=2000, decode_tokens=20) == (0, 1000)
    assert stall_bounded(2.0, costs, jobs=0, tokens=300, decode_tokens=20) == (0, 300)  # never past the token budget
    # one call always runs (nothing starves), however long; the prompts still get MIN_PREFILL_TOKENS
    assert stall_bounded(1.5, TurnCosts({20: 0.010}, 0.00001, 0.050), jobs=3, tokens=2000, decode_tokens=20) == (1, MIN_PREFILL_TOKENS)
    # a prompt token not measured yet costs a decode token's share of the step: 5 ms spare / (10 ms / 20) = 10 -> 16;
    # a call not measured yet runs alone
    assert stall_bounded(1.5, TurnCosts({20: 0.010}), jobs=2, tokens=2000, decode_tokens=20) == (1, MIN_PREFILL_TOKENS)
    assert stall_bounded(3.0, TurnCosts({20: 0.010}), jobs=2, tokens=2000, decode_tokens=20) == (1, 40)


def test_a_step_not_measured_holds_the_pieces_once_then_the_nearest_smaller_step_stands_in():
    costs = TurnCosts({5: 0.004, 30: 0.020}, token_s=0.00001, job_s=0.001)
    assert costs.step_s(30) == 0.020 and costs.step_s(20) is None  # not measured: this turn measures it
    assert stall_bounded(2.0, costs, jobs=3, tokens=2000, decode_tokens=20) == (1, 0)
    after_a_hold = TurnCosts(costs.steps, costs.token_s, costs.job_s, may_hold=False)
    assert after_a_hold.step_s(20) == 0.004 and after_a_hold.step_s(2) == 0.004  # the nearest smaller, else the smallest
    assert stall_bounded(2.0, after_a_hold, jobs=3, tokens=2000, decode_tokens=20) == (3, 100)
    assert TurnCosts().step_s(1) is None and TurnCosts(may_hold=False).step_s(1) is None  # nothing measured: measure


def test_schedule_bounds_a_turn_only_while_rows_decode_and_only_when_asked():
    rows = [row(0, S.RUNNING, step=11), row(7, S.PREFILLING, left={"v": 900, "d": 900})]
    costs = TurnCosts({11: 0.010}, token_s=0.00001, job_s=0.004)
    plain = schedule(TurnView(tuple(rows), 4, jobs=3, costs=costs))
    assert plain.jobs is None and plain.prefill_budget == 2048 - 11 and plain.tokens() == 1024  # today's turn: 512 a stream
    bounded = schedule(TurnView(tuple(rows), 4, jobs=3, max_stall=2.0, costs=costs))
    assert bounded.jobs == 2 and bounded.prefill_budget == 200
    assert bounded.chunks == {"d": ((7, 100),), "v": ((7, 100),)} and bounded.step == (0,)
    held = schedule(TurnView(tuple(rows), 4, jobs=3, max_stall=2.0, costs=TurnCosts({5: 0.010})))
    assert held.jobs == 1 and held.prefill_budget == 0 and held.chunks == {} and held.joins == () and held.step == (0,)
    # no row decoding: nobody waits on the turn, every call runs and the token budget alone bounds the prompts
    alone = schedule(TurnView((rows[1],), 4, jobs=3, max_stall=2.0, costs=costs))
    assert alone.jobs is None and alone.tokens() == 1024


def test_random_views_under_a_stall_bound_cost_at_most_the_bound_past_the_floors():
    rng = random.Random(6)
    for _ in range(2000):
        v, _ = _random_view(rng)
        steps = {d: rng.uniform(0.001, 0.05) for d in rng.sample(range(0, 60), rng.randint(0, 30))}
        costs = TurnCosts(
            steps, rng.choice([None, rng.uniform(1e-6, 1e-3)]), rng.choice([None, rng.uniform(1e-4, 0.02)]), rng.random() < 0.5
        )
        stall = rng.uniform(1.0, 3.0)
        v = TurnView(
            v.rows, v.max_batch_size, v.token_budget, v.prefill_chunk_tokens, v.max_kv_bytes, v.kv_need, rng.randint(0, 5), stall, costs
        )
        plan = schedule(v)
        unbounded = schedule(TurnView(v.rows, v.max_batch_size, v.token_budget, v.prefill_chunk_tokens, v.max_kv_bytes, v.kv_need, v.jobs))
        # the bound only ever takes work away, and leaves the rows' decisions alone
        assert (plan.admit, plan.resume, plan.preempt, plan.step) == (unbounded.admit, unbounded.resume, unbounded.preempt, unbounded.step)
        assert plan.prefill_budget <= unbounded.prefill_budget
        if not plan.step:
            assert plan.jobs is None and plan.chunks == unbounded.chunks
            continue
        assert (plan.jobs >= 1 if v.jobs else plan.jobs == 0) and plan.jobs <= v.jobs
        decode = sum(r.step_tokens for r in v.rows if r.rid in plan.step)
        step_s = costs.step_s(decode)
        if step_s is None:  # held: the turn measures its step
            assert plan.jobs <= 1 and plan.chunks == {} and plan.prefill_budget == 0
            continue
        jobs_s = plan.jobs * (costs.job_s or 0.0)
        token_s = costs.token_s if costs.token_s else step_s / max(1, decode)
        spare = (stall - 1) * step_s
        # within the bound, unless at a floor: one call, MIN_PREFILL_TOKENS
        assert plan.jobs <= 1 or jobs_s <= spare + 1e-12
        if plan.chunks:
            assert plan.prefill_budget == MIN_PREFILL_TOKENS or jobs_s + plan.prefill_budget * token_s <= spare + 1e-9


def test_the_cost_meter_takes_medians_by_step_size_and_passes_a_hold_on():
    from asymspec_mm.core.turn_costs import CostMeter

    meter = CostMeter()
    assert meter.costs() == TurnCosts(may_hold=True)
    for seconds in (0.010, 0.011, 0.500, 0.009):  # one turn descheduled for half a second moves nothing
        meter.turn(seconds, 0, 11)
    meter.turn(0.100, 0, 0)  # no row decoded: nothing to measure
    meter.turn(0.020, 100, 11)  # 10 ms past the step's median (10.5 ms): 0.095 ms a token
    meter.turn(0.008, 100, 11)  # quicker than its step: no measure of the pieces (a median of zeros bounds nothing)
    meter.turn(0.030, 100, 50, held=True)  # a step of 50 not measured: measured against the nearest smaller one
    meter.job(0.004)
    costs = meter.costs()
    assert costs.steps == {11: pytest.approx(0.0105)} and costs.job_s == 0.004 and not costs.may_hold
    assert costs.token_s == pytest.approx((0.0095 / 100 + 0.0195 / 100) / 2)
