"""Every model call through the loop when one runs (issue #51, item 6): while ``pipe.scheduler(...)`` runs,
``pipe.generate`` / ``chat`` / ``stream`` / ``complete`` from any thread are rows of its batch and ``pipe.prepare`` /
``run`` / ``compressed_view`` run their model calls in it, so every forward runs on the decode thread; the answers
equal the direct path's. Real forwards of the tiny pair; which thread ran each forward is read with forward hooks on
the real modules."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from conftest import make_case
from test_loop_setup import _threads_running

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.handle import Handle

DECODE_THREAD = "asymspec-scheduler"


@pytest.fixture
def no_other_loop(tiny_pipe):
    """``tiny_pipe`` with no scheduler of another test still serving its calls (a module-scoped demo server, say):
    the direct path these tests compare against needs none."""
    from asymspec_mm.core.loop_client import serving_loop

    while (loop := serving_loop(tiny_pipe)) is not None:
        loop.close()
    return tiny_pipe


def _watch(pipe):
    return _threads_running([pipe.drafter, pipe.verifier, pipe.drafter.model.visual])


def test_generate_from_three_threads_runs_every_forward_on_the_decode_thread(tiny_pipe):
    cases = [make_case(5100 + i) for i in range(3)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=12)
    kw = [dict(caption=c["caption"], ocr=False, config=cfg, method=m) for c, m in zip(cases, ("asymspec", "floor", "sd"))]
    with tiny_pipe.prefix_kv.paused():
        alone = [tiny_pipe.generate(c["image"], c["question"], **k) for c, k in zip(cases, kw)]
    got: dict[int, object] = {}
    errors: list[BaseException] = []
    seen, hooks = _watch(tiny_pipe)
    try:
        with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=4) as sched:

            def ask(i: int) -> None:
                try:
                    got[i] = tiny_pipe.generate(cases[i]["image"], cases[i]["question"], **kw[i])
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=ask, args=(i,), name=f"caller-{i}") for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert sched.steps > 0  # the loop decoded them
    finally:
        for h in hooks:
            h.remove()
    assert not errors, errors
    assert seen == {DECODE_THREAD}, seen  # no forward on a caller's thread
    for res, ref in zip((got[i] for i in range(3)), alone):
        assert res.token_ids == ref.token_ids and res.text == ref.text
        assert [ev.token_id for ev in res.trace] == [ev.token_id for ev in ref.trace]
        assert [ev.text for ev in res.trace] == [ev.text for ev in ref.trace]
        assert res.stats["accepted_per_position"] == ref.stats["accepted_per_position"] and res.stats["steps"] == ref.stats["steps"]


def test_chat_complete_stream_and_prepare_run_in_the_loop(tiny_pipe):
    """The other entry points: a conversation, the verifier's completion (a floor row of the batch), a stream read
    step by step and ``prepare`` + ``run`` (their model calls as the loop's jobs) give the direct path's answers with
    every forward on the decode thread."""
    c = make_case(5200)
    cfg = AsymSpecConfig(k=2, max_new_tokens=10)
    messages = [{"role": "user", "content": [{"type": "image", "image": c["image"]}, {"type": "text", "text": c["question"]}]}]
    with tiny_pipe.prefix_kv.paused():
        ref_chat = tiny_pipe.chat(messages, caption=c["caption"], ocr=False, config=cfg)
        ref_complete = tiny_pipe.complete("What is two plus two?", max_new_tokens=8)
        ref_stream = tiny_pipe.generate(c["image"], c["question"], caption="", ocr=False, config=cfg)
    tiny_pipe.encoder.store.clear()
    seen, hooks = _watch(tiny_pipe)
    try:
        with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=2):
            chat = tiny_pipe.chat(messages, caption=c["caption"], ocr=False, config=cfg)
            completion = tiny_pipe.complete("What is two plus two?", max_new_tokens=8)
            pieces = list(tiny_pipe.stream(c["image"], c["question"], caption="", ocr=False, config=cfg).texts())
            session = tiny_pipe.prepare(c["image"], c["question"], caption="", ocr=False, config=cfg, prefill=True)
            prepared = tiny_pipe.run(session).result
    finally:
        for h in hooks:
            h.remove()
    assert seen == {DECODE_THREAD}, seen
    assert chat.token_ids == ref_chat.token_ids
    assert completion == ref_complete
    assert "".join(pieces) == "".join(ev.text for ev in ref_stream.trace)
    assert prepared.token_ids == ref_stream.token_ids


def test_only_the_loops_thread_runs_the_models_while_a_loop_runs(tiny_pipe, no_other_loop):
    """While a scheduler runs, every forward of the pipeline's calls (an answer with its caption, a completion, a
    compressed view, an attribution) runs on its decode thread; with no loop, on the caller's thread (the direct
    loop's turns it drives)."""
    c = make_case(5300)
    cfg = AsymSpecConfig(max_new_tokens=6)
    seen, hooks = _watch(tiny_pipe)
    try:
        with tiny_pipe.scheduler(max_batch_size=2):
            res = tiny_pipe.generate(c["image"], c["question"], caption="", ocr=False, config=cfg)
            tiny_pipe.complete("Say yes.", max_new_tokens=4)
            tiny_pipe.compressed_view(c["image"], ocr=False)
            tiny_pipe.attribute(res, 0, grid=2)  # its occlusion forwards too
        assert seen == {DECODE_THREAD}, seen
        seen.clear()
        tiny_pipe.generate(make_case(5301)["image"], c["question"], caption="", ocr=False, config=cfg)
        assert seen == {threading.current_thread().name}, seen
    finally:
        for h in hooks:
            h.remove()


def test_generate_in_the_loop_wakes_its_caller_for_the_answer_not_at_every_step(tiny_pipe, no_other_loop):
    """``pipe.generate`` through the loop waits for the answer alone: its thread never takes the handle's step events
    (it was woken at each step to take events it dropped); a stream still gets every step, and both equal the direct
    path. Which frames run on the caller's thread is read with a profile of that thread."""
    c = make_case(5320)
    kw = dict(caption=c["caption"], ocr=False, config=AsymSpecConfig(max_new_tokens=12), method="floor", ignore_eos=True)
    alone = tiny_pipe.generate(c["image"], c["question"], **kw)
    resumed: list[str] = []  # each time the handle's event iterator ran on this thread

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is Handle.__iter__.__code__:
            resumed.append(threading.current_thread().name)

    with tiny_pipe.scheduler(max_batch_size=1) as sched:
        sys.setprofile(profile)
        try:
            got = tiny_pipe.generate(c["image"], c["question"], **kw)
        finally:
            sys.setprofile(None)
        steps = sched.steps
        streamed = list(tiny_pipe.stream(c["image"], c["question"], **kw))
    assert steps == len(alone.token_ids) == 12  # the loop decoded it, a step a token
    assert resumed == [], resumed
    assert got.token_ids == alone.token_ids and got.text == alone.text
    assert [ev.token_id for events in streamed for ev in events] == alone.token_ids


def test_a_request_alone_takes_the_loops_route_on_its_callers_thread(tiny_pipe, no_other_loop):
    """With no loop running, ``pipe.generate`` and ``complete`` decode on the engine core, stepped on the caller's
    thread: every forward runs there, the answer is a row of the paged storages (its statistics carry each stream's
    ``kv_bytes`` and ``batch_size`` 1, as a row of the loop; the single-row engines report neither), and tokens,
    texts and gate statistics equal the single-row engines' (``prefill=True`` keeps them), greedy and sampled."""
    from asymspec_mm.decode.rows import STREAMS_OF
    from asymspec_mm.pipeline.completion import _greedy_here, prompt_ids

    c = make_case(5340)
    kw = dict(caption=c["caption"], ocr=False, ignore_eos=True)
    arms = {"asymspec": AsymSpecConfig(k=3, max_new_tokens=10), "floor": AsymSpecConfig(max_new_tokens=10, temperature=0.8, seed=3)}
    seen, hooks = _watch(tiny_pipe)
    try:
        with tiny_pipe.prefix_kv.paused():
            got = {m: tiny_pipe.generate(c["image"], c["question"], method=m, config=cfg, **kw) for m, cfg in arms.items()}
            completion = tiny_pipe.complete("What is two plus two?", max_new_tokens=6)
    finally:
        for h in hooks:
            h.remove()
    assert seen == {threading.current_thread().name}, seen
    with tiny_pipe.prefix_kv.paused():
        solo = {m: tiny_pipe.generate(c["image"], c["question"], method=m, config=cfg, prefill=True, **kw) for m, cfg in arms.items()}
        ids = prompt_ids(tiny_pipe, "What is two plus two?", 6)
        assert completion == tiny_pipe.verifier_tokenizer.decode(_greedy_here(tiny_pipe, ids, 6), skip_special_tokens=True).strip()
    for method, res in got.items():
        ref = solo[method]
        assert res.stats["batch_size"] == 1 and sorted(res.stats["kv_bytes"]) == sorted(STREAMS_OF[method])
        assert "kv_bytes" not in ref.stats
        assert res.token_ids == ref.token_ids and len(res.token_ids) == 10 and res.text == ref.text
        assert [(ev.token_id, ev.text, ev.source) for ev in res.trace] == [(ev.token_id, ev.text, ev.source) for ev in ref.trace]
        assert res.stats["accepted_per_position"] == ref.stats["accepted_per_position"] and res.stats["steps"] == ref.stats["steps"]


def test_the_demos_describe_runs_no_forward_on_the_handlers_thread(state, tmp_path):
    """The demo's Describe image handler (called as Gradio calls it, on its own thread): the caption is a row of the
    app's scheduler and the tower's call runs in its loop, so no forward runs on the handler's thread."""
    path = tmp_path / "describe.png"
    make_case(5400)["image"].save(path)
    state.pipe.captioner.cache.clear()
    state.pipe.encoder.store.clear()
    seen, hooks = _watch(state.pipe)
    try:
        caption, _ = state.describe({"path": str(path)}, "", "", session="s1")
    finally:
        for h in hooks:
            h.remove()
    assert caption
    assert seen == {DECODE_THREAD}, seen


def test_a_served_streams_prefill_in_a_schedulers_set_up_runs_in_the_loop(tiny_pipe, tiny_dirs):
    """A stream served outside transformers (the vLLM backend; here its transformers stand-in from the vLLM tests)
    is not filled by the batched chunked prefill, so set-up prefills it: under the scheduler's ``using_loop`` that
    prefill is a model call of the loop, run on the decode thread, and the stream holds the prompt it prefilled."""
    from test_vllm_engine import _ServedByTransformers

    from asymspec_mm import AsymSpecPipeline, Request
    from asymspec_mm.engines.model_calls import using_loop

    served = _ServedByTransformers(tiny_dirs[1], torch.float32)
    pipe = AsymSpecPipeline(tiny_pipe.drafter, tiny_pipe.processor, served, tiny_pipe.verifier_tokenizer, ocr="none")
    c = make_case(5700)
    request = Request(c["image"], c["question"], caption=c["caption"], ocr=False, method="floor").checked()
    seen, hooks = _threads_running([served.model])
    try:
        with pipe.scheduler(max_batch_size=1) as sched, using_loop(sched):  # as the scheduler's set-up thread runs it
            session = pipe.set_up(request, prefill=False)
    finally:
        for h in hooks:
            h.remove()
    assert seen == {DECODE_THREAD}, seen
    assert "verifier" in session.streams and not session.to_prefill  # prefilled in set-up, not by the batched prefill
    assert session.streams["verifier"].length == session.prompts.verifier_ids.shape[1] - 1


def test_a_call_from_another_thread_during_generate_batch_joins_its_loop(tiny_pipe, no_other_loop):
    """``generate_batch`` registers its scheduler while it runs: ``pipe.generate`` from a second thread, made while
    the batch decodes, is a row of that loop (the models' lock taken by the decode thread alone, every forward on
    it, a step shared with the batch's rows) and gives the tokens it gives alone. Before, it decoded on the caller's
    thread beside the batch, taking turns with it under the lock."""
    from asymspec_mm.request.request import request_of

    cases = [make_case(5400 + i) for i in range(4)]
    cfg = AsymSpecConfig(k=2, max_new_tokens=24)
    batch = [request_of(cfg, image=c["image"], question=c["question"], caption=c["caption"], ocr=False, ignore_eos=True) for c in cases[:3]]
    side = cases[3]
    kw = dict(caption=side["caption"], ocr=False, config=cfg.with_(max_new_tokens=8), ignore_eos=True)
    with tiny_pipe.prefix_kv.paused():
        alone = tiny_pipe.generate(side["image"], side["question"], **kw)
    got: dict[str, object] = {}
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            got["side"] = tiny_pipe.generate(side["image"], side["question"], **kw)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    caller = threading.Thread(target=ask, name="caller")

    def on_step(rows: int, calls: int, seconds: float) -> None:
        if not caller.is_alive() and caller.ident is None:  # the batch decodes: the second caller comes now
            caller.start()

    seen, hooks = _watch(tiny_pipe)
    try:
        with tiny_pipe.prefix_kv.paused():
            results = tiny_pipe.generate_batch(batch, batch_size=2, on_step=on_step)
            caller.join(120)
    finally:
        for h in hooks:
            h.remove()
    assert not errors, errors
    assert len(results) == 3 and caller.ident is not None
    assert seen == {DECODE_THREAD}, seen
    res = got["side"]
    assert res.token_ids == alone.token_ids and [ev.token_id for ev in res.trace] == [ev.token_id for ev in alone.trace]
    assert res.stats["batch_size"] >= 2  # it shared steps with the batch's rows


def test_a_request_refused_at_submission_raises_once_without_the_direct_path(no_other_loop, grammar_builds):
    """``pipe.chat`` while a loop runs, with a response format whose grammar cannot be built: the loop's refusal
    at submission is raised as it is, the same one-line error as the direct path's; the direct path (its set-up)
    never runs, so the grammar is built (and refused) once. It used to fall back to the direct path, which refused
    it a second time from its set-up."""
    import traceback

    from asymspec_mm.request.tools import ToolError

    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}
    messages = [{"role": "user", "content": [{"type": "image", "image": make_case(5300)["image"]}, "What is it?"]}]
    with pytest.raises(ToolError) as direct:  # no loop: the direct path's set-up refuses it
        no_other_loop.chat(messages, caption="c", ocr=False, response_format=bad)
    grammar_builds.clear()
    with no_other_loop.scheduler(max_batch_size=1) as sched:
        with pytest.raises(ToolError) as looped:
            no_other_loop.chat(messages, caption="c", ocr=False, response_format=bad)
        assert sched.waiting == 0 and sched.steps == 0
    frames = [frame.name for frame in traceback.extract_tb(looped.tb)]
    assert "add_request" in frames and "set_up" not in frames and "prepare_chat" not in frames, frames
    assert len(grammar_builds) == 1
    assert str(looped.value) == str(direct.value) and "\n" not in str(looped.value)
    assert str(looped.value).startswith("response_format.json_schema.schema: the JSON schema cannot be compiled")
