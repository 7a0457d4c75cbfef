"""One loop runs a pipeline's models at a time, by construction (issue #51, item 6: the models' lock goes): a
scheduler claims the pipeline when it starts and releases it when its decode thread ends, a second one's turns run on
the first one's thread meanwhile (``generate_batch`` beside a running scheduler too), the parts called outside every
loop (the captioner, the preparer) run in the pipeline's loop, and ``paused`` holds every turn before it starts. Real forwards
of the tiny pair; which thread ran each forward is read with forward hooks on the real modules."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import make_case
from test_loop_setup import _threads_running

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import Scheduler
from asymspec_mm.core.loop_client import direct_loop, serving_loop
from asymspec_mm.core.model_owner import paused, running_loop
from asymspec_mm.request.captioner import DrafterCaptioner

DECODE_THREAD = "asymspec-scheduler"
METHODS = ("asymspec", "floor", "sd")


@pytest.fixture
def pipe(tiny_pipe):
    """``tiny_pipe`` with no scheduler of another test still running on it."""
    while (loop := running_loop(tiny_pipe)) is not None:
        loop.close()
    return tiny_pipe


def _models(pipe):
    return [pipe.drafter, pipe.verifier, pipe.drafter.model.visual]


def _forwards_by_thread(pipe):
    """The identities of the threads that run a forward of ``pipe``'s models (every scheduler's decode thread has the
    same name), filled as they run, and the hooks."""
    ran: set[int] = set()
    return ran, [m.register_forward_pre_hook(lambda *_: ran.add(threading.get_ident())) for m in _models(pipe)]


def test_a_second_scheduler_runs_its_turns_on_the_first_ones_thread_and_takes_over_when_it_ends(pipe):
    """Two schedulers on one pipeline (two servers, the demo beside the API): the first owns the models, the
    second's turns are model calls of its loop (every forward on the first one's decode thread); once the first has
    ended, the second takes the pipeline over on its own thread. Each answer equals alone."""
    cases = [make_case(8100 + i) for i in range(3)]
    kw = [dict(caption=c["caption"], ocr=False, config=AsymSpecConfig(k=3, max_new_tokens=12), method=m) for c, m in zip(cases, METHODS)]
    alone = [pipe.generate(c["image"], c["question"], **k) for c, k in zip(cases, kw)]
    first = pipe.scheduler(max_batch_size=2)
    second = Scheduler(pipe, max_batch_size=2)
    ran, hooks = _forwards_by_thread(pipe)
    try:
        assert running_loop(pipe) is first and serving_loop(pipe) is first  # the first serves the pipeline's calls
        got = [second.submit(c["image"], c["question"], **k) for c, k in zip(cases[:2], kw[:2])]
        assert [h.result(timeout=120).token_ids for h in got] == [a.token_ids for a in alone[:2]]
        assert ran == {first._worker.ident}, ran
        first.close()
        assert running_loop(pipe) is None  # its decode thread ended; nothing else ran a turn yet
        ran.clear()
        late = second.submit(cases[2]["image"], cases[2]["question"], **kw[2])
        assert late.result(timeout=120).token_ids == alone[2].token_ids
        assert ran == {second._worker.ident} and running_loop(pipe) is second, ran
    finally:
        for h in hooks:
            h.remove()
        first.close()
        second.close()
    assert running_loop(pipe) is None


def test_generate_batch_beside_a_running_scheduler_runs_on_its_thread(pipe):
    cases = [make_case(8200 + i) for i in range(3)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=10)
    reqs = [{"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": False} for c in cases]
    with pipe.prefix_kv.paused():
        alone = [pipe.generate(r["image"], r["question"], caption=r["caption"], ocr=False, config=cfg) for r in reqs]
        ran, hooks = _forwards_by_thread(pipe)
        try:
            with pipe.scheduler(max_batch_size=4) as sched:
                results = pipe.generate_batch(reqs, config=cfg, batch_size=2)
                assert running_loop(pipe) is sched and ran == {sched._worker.ident}, ran
        finally:
            for h in hooks:
                h.remove()
    assert [r.token_ids for r in results] == [a.token_ids for a in alone]


def test_the_captioner_and_the_preparer_called_alone_run_in_the_pipelines_loop(pipe):
    """``pipe.captioner.caption(image)`` and ``pipe.preparer.set_up(...)`` called directly, outside every loop's
    scope: the caption is a row of the direct loop (of the scheduler while one runs, on its decode thread), the same
    caption a captioner of the same model with no pipeline writes on a single-row engine."""
    c = make_case(8300)
    alone = DrafterCaptioner(pipe.drafter, pipe.processor, pipe.encoder).caption(c["image"])  # no pipeline: here
    loop = direct_loop(pipe)
    pipe.captioner.cache.clear()
    captions = loop.added["caption"]
    assert pipe.captioner.caption(c["image"]) == alone
    assert loop.added["caption"] == captions + 1
    pipe.captioner.cache.clear()
    session = pipe.preparer.set_up(_request(c), prefill=True)  # the caption a row, the prefills calls of the loop
    assert session.view.caption == alone and loop.added["caption"] == captions + 2
    pipe.captioner.cache.clear()
    seen, hooks = _threads_running(_models(pipe))
    try:
        with pipe.scheduler(max_batch_size=2):
            assert pipe.captioner.caption(c["image"]) == alone
    finally:
        for h in hooks:
            h.remove()
    assert seen == {DECODE_THREAD}, seen
    assert loop.added["caption"] == captions + 2


def _request(c):
    from asymspec_mm.request.request import request_of

    return request_of(None, image=c["image"], question=c["question"], caption=None, ocr=False, max_new_tokens=4)


def test_a_paused_pipeline_starts_no_turn_and_its_requests_then_share_the_first(pipe):
    """While paused, a scheduler's decode thread steps no turn (the requests are set up and wait), and direct callers
    run none either; once resumed, each answer equals alone."""
    cases = [make_case(8400 + i) for i in range(2)]
    kw = [
        dict(caption=c["caption"], ocr=False, config=AsymSpecConfig(k=3, max_new_tokens=8), method=m)
        for c, m in zip(cases, ("asymspec", "floor"))
    ]
    alone = [pipe.generate(c["image"], c["question"], **k) for c, k in zip(cases, kw)]
    steps: list[int] = []
    with pipe.scheduler(max_batch_size=2, on_step=lambda n, *_: steps.append(n)) as sched:
        with paused(pipe):
            handles = [sched.submit(c["image"], c["question"], **k) for c, k in zip(cases, kw)]
            deadline = time.monotonic() + 60
            while sched.waiting + sched.live_rows < 2 or any(h.stage == "queued" for h in handles):
                assert time.monotonic() < deadline, "the requests were not set up"
                time.sleep(0.01)
            time.sleep(0.2)
            assert steps == [] and not any(h.done() for h in handles)
        assert [h.result(timeout=120).token_ids for h in handles] == [a.token_ids for a in alone]
    assert steps[0] == 2  # both rows in the first step
    got: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda i=i: got.__setitem__(i, pipe.generate(cases[i]["image"], cases[i]["question"], **kw[i])))
        for i in range(2)
    ]
    loop = direct_loop(pipe)
    turns = loop.turns
    with paused(pipe):
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while loop.core is None or len(loop.core.table) < 2:
            assert time.monotonic() < deadline, "the direct requests did not reach the core"
            time.sleep(0.01)
        time.sleep(0.2)
        assert loop.turns == turns
    for t in threads:
        t.join(120)
    assert [got[0].token_ids, got[1].token_ids] == [a.token_ids for a in alone]


class _Inside:
    """How many threads are inside a forward of ``pipe``'s drafter or verifier at once, at most (pre and post hooks
    on the real modules; ``linger`` widens each forward so that an overlap would show)."""

    def __init__(self, pipe, linger: float = 0.0):
        self.lock, self.now, self.most, self.linger = threading.Lock(), 0, 0, linger
        self.hooks = [
            h for m in (pipe.drafter, pipe.verifier) for h in (m.register_forward_pre_hook(self.pre), m.register_forward_hook(self.post))
        ]

    def pre(self, *_) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.linger)

    def post(self, *_) -> None:
        with self.lock:
            self.now -= 1

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def _kw(seed: int, n: int = 8, method: str = "asymspec"):
    c = make_case(seed)
    return (c["image"], c["question"]), dict(caption=c["caption"], ocr=False, config=AsymSpecConfig(k=3, max_new_tokens=n), method=method)


def test_a_call_handed_to_a_closed_scheduler_never_runs_beside_a_direct_turn(pipe):
    """A set-up that kept a scheduler which closed since hands it its calls: they run where the models are run now,
    one thread at a time with the direct loop's turns."""
    import torch

    sched = pipe.scheduler(max_batch_size=2)
    sched.close()
    inside, stop = _Inside(pipe, linger=0.01), threading.Event()

    def late_calls() -> None:
        while not stop.is_set():
            sched.run(lambda: pipe.verifier(input_ids=torch.tensor([[1, 2, 3, 4]])))

    caller = threading.Thread(target=late_calls)
    caller.start()
    try:
        args, kw = _kw(8500, n=16)
        for _ in range(3):
            pipe.generate(*args, **kw)
    finally:
        stop.set()
        caller.join(60)
        inside.remove()
    assert inside.most == 1


def test_a_scheduler_started_within_a_direct_turn_takes_over_at_its_first_turn(pipe):
    """Made from a callback inside a direct turn (the ``timer`` of ``pipe.run``), its start does not wait for the
    turn it is in; the request finishes, and the scheduler then owns the pipeline once it runs a turn."""
    import contextlib

    args, kw = _kw(8510, n=6)
    kw.pop("method")
    session = pipe.prepare(*args, **kw)
    made: list = []

    def timer(name):
        if not made:
            made.append(pipe.scheduler(max_batch_size=2))
        return contextlib.nullcontext()

    done = threading.Event()
    worker = threading.Thread(target=lambda: (list(pipe.run(session, timer=timer)), done.set()), daemon=True)
    worker.start()
    try:
        assert done.wait(60), "the request did not finish"
        assert made and running_loop(pipe) is None  # no turn of it ran yet
        assert made[0].submit(*args, **kw).result(timeout=60).token_ids
        assert running_loop(pipe) is made[0]
    finally:
        for sched in made:
            sched.close()


def test_a_guests_stop_is_its_own_and_an_owners_stop_hands_the_pipeline_over(pipe):
    """A guest's callback that raises ``KeyboardInterrupt`` (run on the owner's thread) stops the guest, not the
    owner; an owner that stops while a guest's turn waits in its line leaves the guest to take the pipeline over."""
    owner = pipe.scheduler(max_batch_size=2)
    guest = Scheduler(pipe, max_batch_size=2, on_step=lambda *_: (_ for _ in ()).throw(KeyboardInterrupt("guest callback")))
    try:
        args, kw = _kw(8520, n=20)
        mine = owner.submit(*args, **kw)
        with pytest.raises(Exception, match="KeyboardInterrupt"):
            guest.submit(*args, **kw).result(timeout=120)
        assert mine.result(timeout=120).token_ids and owner.error is None and guest.error is not None
    finally:
        owner.close()
        guest.close()
    steps = [0]

    def fail_third(*_) -> None:
        steps[0] += 1
        if steps[0] == 3:
            time.sleep(0.5)  # the guest's next turn waits in the owner's line meanwhile
            raise RuntimeError("the owner's callback failed")

    long = [_kw(8521, n=40), _kw(8522, n=40)]  # EOS ignored: their turns still wait in the owner's line when it stops
    alone = [pipe.generate(*a, **k, ignore_eos=True).token_ids for a, k in long]
    owner = pipe.scheduler(max_batch_size=2, on_step=fail_third)
    guest = Scheduler(pipe, max_batch_size=2)
    try:
        handles = [guest.submit(*a, **k, ignore_eos=True) for a, k in long]
        with pytest.raises(Exception, match="the owner's callback failed"):
            owner.submit(*args, **kw, ignore_eos=True).result(timeout=120)
        assert [h.result(timeout=120).token_ids for h in handles] == alone
        assert guest.error is None and running_loop(pipe) is guest
    finally:
        owner.close()
        guest.close()


def test_a_scheduler_started_on_the_owners_decode_thread_is_refused_in_one_line(pipe):
    """Its turns would wait for the very thread that starts it: a clear error instead of a hang."""
    refused: list[BaseException] = []

    def start_one(*_) -> None:
        if not refused:
            try:
                Scheduler(pipe, max_batch_size=1)
            except Exception as exc:  # noqa: BLE001 - what the callback got
                refused.append(exc)

    with pipe.scheduler(max_batch_size=2, on_step=start_one) as owner:
        args, kw = _kw(8530, n=4)
        assert owner.submit(*args, **kw).result(timeout=60).token_ids
    assert [str(e) for e in refused] == [
        "a scheduler was started from within a step of the scheduler that runs this pipeline's models (a callback on its "
        "decode thread): its turns would wait for that thread; start it from another thread"
    ]


def test_pausing_lets_a_running_turn_finish_even_when_it_calls_the_pipeline(pipe):
    """A turn already running when the pause begins finishes, also when a callback in it calls the pipeline."""
    args, kw = _kw(8540, n=4)
    in_turn, turn_done = threading.Event(), threading.Event()

    def on_step(*_) -> None:
        if not in_turn.is_set():
            in_turn.set()
            time.sleep(0.3)  # the pause begins meanwhile
            pipe.generate(*args, **kw)
            turn_done.set()

    with pipe.scheduler(max_batch_size=2, on_step=on_step) as sched:
        handle = sched.submit(*_kw(8541, n=8)[0], **_kw(8541, n=8)[1])
        assert in_turn.wait(60)
        with paused(pipe):
            assert turn_done.wait(30)
        assert handle.result(timeout=60).token_ids
