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
