"""The pipeline's direct loop (issue #51, item 6): with no scheduler running, direct callers on several threads are
rows of one engine core that they drive themselves, a turn at a time. Their requests share each turn's forwards and
every answer equals the same request decoded alone; a caller that stops reading leaves the batch; an interrupted
turn fails the others' requests with a clear error and the loop serves the next request. Real forwards of the tiny
pair; which thread ran each forward is read with forward hooks on the real modules. The turns are held still by
pausing the pipeline (``model_owner.paused``: no turn starts meanwhile), so that every request is in the core before
the first turn, or by holding the models' forwards (``held_forwards``: a turn stands still in its first forward)."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import held_forwards, make_case
from test_loop_setup import _threads_running

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.direct_loop import DirectLoopError
from asymspec_mm.core.loop_client import direct_loop
from asymspec_mm.core.model_owner import paused

METHODS = ("asymspec", "floor", "drafter", "sd")


@pytest.fixture
def pipe(tiny_pipe):
    """``tiny_pipe`` with no scheduler of another test serving its calls, and its prefix store paused (a request
    decoded twice reuses nothing, so its turns are counted alike)."""
    from asymspec_mm.core.loop_client import serving_loop

    while (loop := serving_loop(tiny_pipe)) is not None:
        loop.close()
    with tiny_pipe.prefix_kv.paused():
        yield tiny_pipe


def _sessions(pipe, cases, configs, methods):
    """Each case set up on this thread (``prefill=False``: its prompts are the core's to prefill)."""
    return [
        pipe.prepare(c["image"], c["question"], caption=c["caption"], ocr=False, config=cfg, method=m, ignore_eos=True, prefill=False)
        for c, cfg, m in zip(cases, configs, methods)
    ]


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    """Wait until ``condition()`` holds (``what``: the failure's words)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _in_core(loop, n: int) -> None:
    """Wait until ``n`` requests are in the loop's core."""
    _wait_for(lambda: loop.core is not None and len(loop.core.table) >= n, "the callers' requests did not reach the core")


def _driving(loop, n: int) -> None:
    """Wait until ``n`` requests are in the loop's core and a caller drives its turn."""
    _in_core(loop, n)
    _wait_for(lambda: loop.driver is not None, "no caller drives the turn")


def _together(pipe, sessions, read):
    """``read(stream)`` of each session's stream on a thread of its own, the first turn held until every request is
    in the core. Returns (the values in order, the names of the threads that ran a forward, the turns run)."""
    loop = direct_loop(pipe)
    got: dict[int, object] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            got[i] = read(pipe.run(sessions[i]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    seen, hooks = _threads_running([pipe.drafter, pipe.verifier])
    threads = [threading.Thread(target=ask, args=(i,), name=f"caller-{i}") for i in range(len(sessions))]
    turns0 = loop.turns
    try:
        with paused(pipe):  # no turn starts meanwhile: the requests join before any turn
            for t in threads:
                t.start()
            _in_core(loop, len(sessions))
        for t in threads:
            t.join(120)
    finally:
        for h in hooks:
            h.remove()
    assert not errors, errors
    return [got[i] for i in range(len(sessions))], seen, loop.turns - turns0


def test_callers_on_four_threads_share_every_turn_and_each_answer_equals_alone(pipe):
    cases = [make_case(7100 + i) for i in range(4)]
    greedy = [AsymSpecConfig(k=3, max_new_tokens=n) for n in (24, 16, 20, 12)]
    seeded = [cfg.with_(temperature=0.8, top_p=0.9, seed=11 + i) for i, cfg in enumerate(greedy)]
    loop = direct_loop(pipe)
    for configs in (greedy, seeded):
        alone, turns_alone = [], []
        for s in _sessions(pipe, cases, configs, METHODS):
            t0 = loop.turns
            alone.append(pipe.run(s).result)
            turns_alone.append(loop.turns - t0)
        loop.most_rows = 0
        together, seen, turns = _together(pipe, _sessions(pipe, cases, configs, METHODS), lambda s: s.result)
        for m, a, b in zip(METHODS, alone, together):
            assert b.token_ids == a.token_ids, m
            assert b.text == a.text, m
            assert b.stats["accepted"] == a.stats["accepted"], m
        # one after another would take the sum of their turns; together, the longest one's: every turn served all
        assert turns == max(turns_alone), (turns, turns_alone)
        assert loop.most_rows == 4
        assert seen and seen <= {f"caller-{i}" for i in range(4)}, seen  # the callers ran every forward, nobody else
    assert loop.core is None  # nothing left: the core went with its KV


def test_a_caller_that_stops_reading_leaves_the_batch_and_the_others_go_on(pipe):
    cases = [make_case(7200 + i) for i in range(3)]
    configs = [AsymSpecConfig(k=3, max_new_tokens=30)] * 3
    alone = [pipe.run(s).result for s in _sessions(pipe, cases, configs, METHODS[:3])]

    def first_step_then_close(stream):
        events = next(stream)
        stream.close()
        return events

    readers = {"caller-0": first_step_then_close, "caller-1": lambda s: s.result, "caller-2": lambda s: s.result}
    got, _, _ = _together(pipe, _sessions(pipe, cases, configs, METHODS[:3]), lambda s: readers[threading.current_thread().name](s))
    assert [ev.token_id for ev in got[0]] == alone[0].token_ids[: len(got[0])]
    assert got[1].token_ids == alone[1].token_ids and got[2].token_ids == alone[2].token_ids
    loop = direct_loop(pipe)
    assert loop.core is None and not loop.outputs_by_id  # the closed one left; nothing is kept for it


def test_an_interrupted_turn_fails_the_other_callers_with_a_clear_error_and_the_loop_serves_on(pipe):
    cases = [make_case(7300 + i) for i in range(2)]
    configs = [AsymSpecConfig(k=3, max_new_tokens=20)] * 2
    alone = pipe.run(_sessions(pipe, cases[:1], configs, ("asymspec",))[0]).result
    loop = direct_loop(pipe)
    forwards = []

    def interrupt(*_):
        forwards.append(threading.current_thread().name)
        if len(forwards) == 3:  # a forward of the second turn, on whichever caller drives it
            raise KeyboardInterrupt

    hook = pipe.verifier.register_forward_pre_hook(interrupt)
    outcome: dict[str, BaseException] = {}

    def ask(i: int, session) -> None:
        try:
            _ = pipe.run(session).result
        except BaseException as exc:  # noqa: BLE001 - what each caller got
            outcome[f"caller-{i}"] = exc

    sessions = _sessions(pipe, cases, configs, ("asymspec", "floor"))
    threads = [threading.Thread(target=ask, args=(i, s), name=f"caller-{i}") for i, s in enumerate(sessions)]
    try:
        with paused(pipe):
            for t in threads:
                t.start()
            _in_core(loop, 2)
        for t in threads:
            t.join(120)
    finally:
        hook.remove()
    driver = forwards[2]
    other = ({"caller-0", "caller-1"} - {driver}).pop()
    assert isinstance(outcome[driver], KeyboardInterrupt)
    assert isinstance(outcome[other], DirectLoopError)
    assert str(outcome[other]) == "the turn decoding this request stopped on KeyboardInterrupt on another caller's thread; retry it"
    assert loop.core is None and loop.driver is None
    # the next request gets a fresh core and its usual answer
    again = pipe.run(_sessions(pipe, cases[:1], configs, ("asymspec",))[0]).result
    assert again.token_ids == alone.token_ids


def test_model_calls_from_other_threads_run_in_the_turns_of_a_request_decoding(pipe):
    """While a long request decodes on one thread, ``pipe.complete`` (a row) and the steps of a session on the
    single-row engines (``prepare``'s default: each step one model call) run in the loop's turns from two other
    threads; each gives what it gives alone, and the completion's row shares the long request's turns."""
    c, other = make_case(7400), make_case(7401)
    cfg = AsymSpecConfig(k=3, max_new_tokens=64)
    long_alone = pipe.run(_sessions(pipe, [c], [cfg], ("floor",))[0]).result
    completion_alone = pipe.complete("Say yes.", max_new_tokens=6)
    single_row = dict(caption=other["caption"], ocr=False, config=cfg.with_(max_new_tokens=12), ignore_eos=True)
    single_alone = pipe.run(pipe.prepare(other["image"], other["question"], **single_row, prefill=True)).result
    prepared = pipe.prepare(other["image"], other["question"], **single_row, prefill=True)  # its prefill a call of the loop
    loop = direct_loop(pipe)
    got: dict[str, object] = {}
    calls = {
        "long": lambda: pipe.run(_sessions(pipe, [c], [cfg], ("floor",))[0]).result,
        "completion": lambda: pipe.complete("Say yes.", max_new_tokens=6),
        "single-row": lambda: pipe.run(prepared).result,
    }
    threads = [threading.Thread(target=lambda n=n: got.__setitem__(n, calls[n]()), name=n) for n in calls]
    seen, hooks = _threads_running([pipe.drafter, pipe.verifier])
    loop.most_rows = 0
    try:
        with paused(pipe):  # the long request and the completion's row enter before the first turn
            threads[0].start()
            _in_core(loop, 1)
            threads[1].start()
            _in_core(loop, 2)
            threads[2].start()
            _wait_for(lambda: bool(loop.core.jobs), "the call did not reach the core")
        for t in threads:
            t.join(120)
    finally:
        for h in hooks:
            h.remove()
    assert got["long"].token_ids == long_alone.token_ids
    assert got["completion"] == completion_alone
    assert got["single-row"].token_ids == single_alone.token_ids
    assert loop.most_rows == 2
    assert seen and seen <= set(calls), seen


def test_a_scheduler_started_while_direct_requests_decode_takes_their_turns_over(pipe):
    """Two direct requests in the core, one turn running on its caller's thread, then a scheduler starts: its start
    waits for that turn to end (one loop runs the models at a time), the turn ends where it began, and every later
    one is a model call of the scheduler's loop (on its decode thread), however eager the direct callers are to run
    the next; both answers equal alone."""
    from asymspec_mm.core.model_owner import running_loop

    cases = [make_case(7500 + i) for i in range(2)]
    configs = [AsymSpecConfig(k=3, max_new_tokens=24)] * 2
    alone = [pipe.run(s).result for s in _sessions(pipe, cases, configs, ("asymspec", "floor"))]
    loop = direct_loop(pipe)
    got: dict[int, object] = {}
    sessions = _sessions(pipe, cases, configs, ("asymspec", "floor"))
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, pipe.run(sessions[i]).result), name=f"caller-{i}") for i in range(2)]
    seen, hooks = _threads_running([pipe.drafter, pipe.verifier])
    started: list = []
    starter = threading.Thread(target=lambda: started.append(pipe.scheduler(max_batch_size=2)), name="starter")
    try:
        with held_forwards(pipe) as waiting:  # a caller's turn stands still in its first forward
            for t in threads:
                t.start()
            _driving(loop, 2)
            assert waiting.wait(60)
            starter.start()
            time.sleep(0.3)
            assert starter.is_alive() and running_loop(pipe) is None  # the start waits for the turn on a caller's thread
        starter.join(120)
        for t in threads:
            t.join(120)
    finally:
        for h in hooks:
            h.remove()
        for sched in started:
            sched.close()
    assert [got[0].token_ids, got[1].token_ids] == [a.token_ids for a in alone]
    assert "asymspec-scheduler" in seen and len(seen) == 2, seen  # the first turn's driver, then the loop
    assert loop.core is None


def test_a_call_from_the_schedulers_own_thread_runs_at_once_beside_direct_turns_it_runs(pipe):
    """An ``on_step`` callback (the scheduler's decode thread) asks for a compressed view with an automatic caption,
    then for an answer, while a direct request's turns are model calls of that loop: both run at once on that thread
    (it runs every turn; waiting for the direct request's turn would wait for itself), the answer a row of the direct
    loop, and each equals what it is alone."""
    c, other = make_case(7600), make_case(7601)
    cfg = AsymSpecConfig(k=3, max_new_tokens=40)
    alone = pipe.run(_sessions(pipe, [c], [cfg], ("floor",))[0]).result
    pipe.captioner.cache.clear()
    here = pipe.captioner.caption(other["image"])
    pipe.captioner.cache.clear()
    kw = dict(caption=other["caption"], ocr=False, config=cfg.with_(max_new_tokens=8), method="asymspec")
    answer_alone = pipe.generate(other["image"], other["question"], **kw)
    views: list = []
    got: dict[str, object] = {}

    def on_step(*_):
        if not views and direct_loop(pipe).core is not None:  # a direct request is in flight
            views.append(pipe.compressed_view(other["image"], ocr=False))
            got["on_step"] = pipe.generate(other["image"], other["question"], **kw)

    session = _sessions(pipe, [c], [cfg], ("floor",))[0]
    with pipe.scheduler(max_batch_size=2, on_step=on_step) as sched:
        t = threading.Thread(target=lambda: got.__setitem__("direct", pipe.run(session).result), name="direct")
        t.start()
        _in_core(direct_loop(pipe), 1)
        sched.submit(c["image"], c["question"], caption=c["caption"], ocr=False, config=cfg, ignore_eos=True).result(timeout=120)
        t.join(120)
    assert not t.is_alive()
    assert got["direct"].token_ids == alone.token_ids
    assert [v.caption for v in views] == [here]
    assert got["on_step"].token_ids == answer_alone.token_ids
    pipe.captioner.cache.clear()


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` (at its next Python instruction: a ^C delivered to that thread)."""
    import ctypes

    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
    assert done == 1


def _calling(target, name: str, outcome: dict) -> threading.Thread:
    def go() -> None:
        try:
            outcome[name] = target()
        except BaseException as exc:  # noqa: BLE001 - what the caller got
            outcome[name] = exc

    return threading.Thread(target=go, name=name)


def test_a_caller_interrupted_while_it_waits_leaves_nothing_behind(pipe):
    """A caller waiting for another caller's turn is interrupted; the driver's own request (a one-token completion)
    ends in that turn and nobody drives again: the interrupted request is cancelled and the core goes with its KV
    (it used to stay, holding the pipeline)."""
    c = make_case(7700)
    loop = direct_loop(pipe)
    completion_alone = pipe.complete("Say yes.", max_new_tokens=1)
    session = _sessions(pipe, [c], [AsymSpecConfig(k=3, max_new_tokens=40)], ("floor",))[0]
    outcome: dict[str, object] = {}
    driver = _calling(lambda: pipe.complete("Say yes.", max_new_tokens=1), "driver", outcome)
    waiter = _calling(lambda: pipe.run(session).result, "waiter", outcome)
    with paused(pipe):
        driver.start()
        _driving(loop, 1)
        waiter.start()
        _in_core(loop, 2)
        _interrupt(waiter)  # it waits on the loop's condition: the interrupt lands when the turn wakes it
    driver.join(60)
    waiter.join(60)
    assert outcome["driver"] == completion_alone
    assert isinstance(outcome["waiter"], KeyboardInterrupt)
    assert loop.core is None and not loop.outputs_by_id and loop.driver is None


def test_an_interrupt_during_another_callers_model_call_stays_with_the_driver(pipe):
    """The driving thread is interrupted while it runs another caller's model call in its turn: the interrupt is
    the driver's (raised there), the other caller's call fails with a clear error instead of receiving it."""
    c = make_case(7800)
    loop = direct_loop(pipe)
    session = _sessions(pipe, [c], [AsymSpecConfig(k=3, max_new_tokens=40)], ("floor",))[0]
    outcome: dict[str, object] = {}
    started = threading.Event()

    def slow_call() -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # Python instructions: where an interrupt lands
            time.sleep(0.001)
        return "not interrupted"

    driver = _calling(lambda: pipe.run(session).result, "driver", outcome)
    caller = _calling(lambda: loop.run(slow_call), "caller", outcome)
    with paused(pipe):  # the driver's first turn waits to start: the call then runs in it
        driver.start()
        _driving(loop, 1)
        caller.start()
        _wait_for(lambda: bool(loop.core.jobs), "the call did not reach the core")
    assert started.wait(60)
    _interrupt(driver)
    driver.join(60)
    caller.join(60)
    assert isinstance(outcome["driver"], KeyboardInterrupt)
    assert str(outcome["caller"]) == "the turn running this model call stopped on KeyboardInterrupt; retry it"
    assert loop.core is None and loop.driver is None


@pytest.mark.parametrize("method", METHODS)
def test_prepare_then_run_decodes_on_the_core_by_default_and_equals_the_single_row_route(pipe, method):
    """``pipe.prepare``'s default leaves the prompts to the engine core (nothing prefilled at set-up) and ``pipe.run``
    decodes the session as a row of the direct loop; ``prefill=True`` and ``engines=`` keep the single-row engines,
    the independent reference it equals token for token."""
    from asymspec_mm.engines import TransformersEngines

    case, cfg, loop = make_case(1207), AsymSpecConfig(k=3, max_new_tokens=10), direct_loop(pipe)
    args = (case["image"], case["question"])
    kw = dict(caption=case["caption"], ocr=False, method=method, config=cfg)
    session = pipe.prepare(*args, **kw)
    assert session.to_prefill and not session.streams  # every stream's prompt is the core's to prefill
    answers = loop.added["answer"]
    on_core = pipe.run(session).result
    assert loop.added["answer"] == answers + 1 and on_core.stats["batch_size"] == 1
    for single_row in (pipe.prepare(*args, **kw, prefill=True), pipe.prepare(*args, **kw, engines=TransformersEngines())):
        assert not single_row.to_prefill and set(single_row.streams) == set(session.pending)
        alone = pipe.run(single_row).result
        assert alone.token_ids == on_core.token_ids and alone.stats["accepted"] == on_core.stats["accepted"]
        assert "batch_size" not in alone.stats  # decoded on the single-row engines, not as a row
    assert loop.added["answer"] == answers + 1
