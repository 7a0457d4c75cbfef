"""The engine loop owns the models (issue #42): a request set up for the scheduler runs no model on the set-up thread.
Its automatic caption is a drafter row decoded beside the other rows, the vision tower's call runs in the decode loop,
and every answer (caption, tokens, vision statistics) equals the request run alone. Real forwards of the tiny pair;
which thread ran each forward is read with forward hooks on the real modules."""

from __future__ import annotations

import threading

from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.engines.model_calls import using_loop


def _threads_running(modules) -> tuple[set[str], list]:
    """The names of the threads that run a forward of any of ``modules`` (filled as they run), and the hooks."""
    seen: set[str] = set()
    hooks = [m.register_forward_pre_hook(lambda *_: seen.add(threading.current_thread().name)) for m in modules]
    return seen, hooks


def test_captions_are_rows_of_the_loop_and_the_set_up_thread_runs_no_model(tiny_pipe):
    cases = [make_case(1200 + i) for i in range(4)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=16)
    tiny_pipe.captioner.cache.clear()
    tiny_pipe.encoder.store.clear()
    models = [tiny_pipe.drafter, tiny_pipe.verifier, tiny_pipe.drafter.model.visual]
    seen, hooks = _threads_running(models)
    steps: list[int] = []
    try:
        with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=4, on_step=lambda n, *_: steps.append(n)) as sched:
            # the first request decodes long enough that the others' captions are written beside it
            first = sched.submit(
                cases[0]["image"], cases[0]["question"], caption="given", ocr=False, config=cfg.with_(max_new_tokens=60), ignore_eos=True
            )
            handles = [sched.submit(c["image"], c["question"], caption=None, ocr=False, config=cfg) for c in cases[1:]]
            got = [h.result(timeout=300) for h in handles]
            first.result(timeout=300)
    finally:
        for h in hooks:
            h.remove()
    assert seen == {"asymspec-scheduler"}, seen  # every forward, tower included, ran on the decode thread
    assert max(steps) >= 2  # caption rows stepped beside the live row
    tiny_pipe.captioner.cache.clear()
    tiny_pipe.encoder.store.clear()
    for c, res in zip(cases[1:], got):
        alone = tiny_pipe.generate(c["image"], c["question"], caption=None, ocr=False, config=cfg)
        assert res.view.caption == alone.view.caption and res.view.caption
        assert res.token_ids == alone.token_ids
        assert res.stats["vision_calls"] == alone.stats["vision_calls"] == 1  # the tower's call is counted as the request's


def test_a_failing_model_call_in_the_loop_fails_its_caller_and_the_loop_goes_on(tiny_pipe):
    c = make_case(1300)
    cfg = AsymSpecConfig(max_new_tokens=6)
    with tiny_pipe.scheduler(max_batch_size=2) as sched:

        def broken():
            raise RuntimeError("tower broke")

        try:
            sched.run(broken)
        except RuntimeError as exc:
            assert "tower broke" in str(exc)
        else:
            raise AssertionError("the job's error must reach its caller")
        assert sched.run(lambda: 41 + 1) == 42
        res = sched.submit(c["image"], c["question"], caption="a chart", ocr=False, config=cfg).result(timeout=120)
    assert res.token_ids == tiny_pipe.generate(c["image"], c["question"], caption="a chart", ocr=False, config=cfg).token_ids


def test_a_token_request_through_using_loop_equals_the_caption_written_here(tiny_pipe):
    """The captioner under :func:`using_loop` (the scheduler as the loop) writes the caption it writes alone."""
    image = make_case(1400)["image"]
    tiny_pipe.captioner.cache.clear()
    here = tiny_pipe.captioner.caption(image)
    tiny_pipe.captioner.cache.clear()
    with tiny_pipe.scheduler(max_batch_size=2) as sched, using_loop(sched):
        in_loop = tiny_pipe.captioner.caption(image)
    assert in_loop == here and here


def test_the_direct_paths_caption_is_a_row_of_an_engine_core_equal_to_the_one_written_here(tiny_pipe, monkeypatch):
    """With no loop running, the automatic caption of ``pipe.generate`` (and of ``pipe.prepare``, the single-row
    set-up) takes the route of its request: a token request, a row of the pipeline's direct loop, never the
    captioner's single-row engine, and it is the caption that engine writes."""
    from asymspec_mm.core.loop_client import direct_loop, serving_loop
    from asymspec_mm.request.captioner import DrafterCaptioner

    while (loop := serving_loop(tiny_pipe)) is not None:  # another file's scheduler left serving: the direct path needs none
        loop.close()
    case = make_case(1401)
    tiny_pipe.captioner.cache.clear()
    here = tiny_pipe.captioner.caption(case["image"])
    tiny_pipe.captioner.cache.clear()

    def single_row(*_):
        raise AssertionError("the direct path wrote its caption on the captioner's single-row engine")

    monkeypatch.setattr(DrafterCaptioner, "_here", single_row)
    loop = direct_loop(tiny_pipe)
    captions = loop.added["caption"]
    res = tiny_pipe.generate(case["image"], case["question"], caption=None, ocr=False, config=AsymSpecConfig(max_new_tokens=4))
    assert res.view.caption == here and here
    tiny_pipe.captioner.cache.clear()
    session = tiny_pipe.prepare(
        case["image"], case["question"], caption=None, ocr=False, config=AsymSpecConfig(max_new_tokens=4), prefill=True
    )
    assert session.view.caption == here
    assert loop.added["caption"] == captions + 2  # each a row of the direct loop
    tiny_pipe.captioner.cache.clear()
