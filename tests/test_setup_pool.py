"""Set-up that never waits in line, and texts made off the decode loop (issue #51, item 5).

Several requests are set up at once (``setup_workers``): their set-up windows, read from the request records'
status times, overlap, and every answer equals the request alone. A request set up joins the ready line in priority,
then arrival order, whatever order the set-ups end in. The decode thread hands token ids to the output thread, which
detokenizes: a profile of the scheduler's threads sees no tokenizer ``decode`` on the decode thread. Stop strings still
end a row at the token they end it alone. Real forwards of the tiny pair."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.request_state import RequestStatus
from asymspec_mm.core.setup_pool import ready_position

SETTING_UP, READY, PREFILLING = RequestStatus.SETTING_UP, RequestStatus.READY, RequestStatus.PREFILLING


def _windows(handles) -> list[tuple[float, float]]:
    """Each request's set-up window: when it entered SETTING_UP and READY (its record's times)."""
    return [(h.times[SETTING_UP], h.times[READY]) for h in handles]


def _most_at_once(windows: list[tuple[float, float]]) -> int:
    """The most windows open at one instant."""
    edges = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows], key=lambda e: (e[0], e[1]))
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def test_a_burst_of_new_images_is_set_up_at_once_and_each_answer_equals_it_alone(tiny_pipe):
    """Four new images, each with its caption written by the drafter (a row of the loop): with four set-up workers
    their set-ups overlap (one set-up thread set them up one after another: never two at once)."""
    cases = [make_case(1700 + i) for i in range(4)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=8)
    tiny_pipe.captioner.cache.clear()
    tiny_pipe.encoder.store.clear()
    with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=4, setup_workers=4) as sched:
        handles = [sched.submit(c["image"], c["question"], caption=None, ocr=False, config=cfg) for c in cases]
        got = [h.result(timeout=300) for h in handles]
    windows = _windows(handles)
    assert _most_at_once(windows) >= 2, windows  # two requests in SETTING_UP at the same instant
    assert all(h.times[SETTING_UP] < h.times[READY] <= h.times[PREFILLING] for h in handles)
    assert [res.stats["vision_calls"] for res in got] == [1, 1, 1, 1]  # each set-up counts its own tower call
    # alone, with the captions the loop wrote (cached; that a caption written in the loop equals the one written alone
    # is test_loop_setup's)
    for c, res in zip(cases, got):
        alone = tiny_pipe.generate(c["image"], c["question"], caption=None, ocr=False, config=cfg)
        assert res.view.caption == alone.view.caption and res.view.caption
        assert res.token_ids == alone.token_ids and res.text == alone.text


def test_ready_position_keeps_priority_then_arrival_whatever_order_set_ups_end_in():
    line: list[tuple[int, int]] = []
    for order in [(0, 7), (0, 3), (5, 1), (0, 5), (-1, 9)]:  # set-ups ending out of arrival order
        line.insert(ready_position(line, order), order)
    assert line == [(-1, 9), (0, 3), (0, 5), (0, 7), (5, 1)]
    # a request taken back out to the head of the line stays ahead of those that go after it
    assert ready_position([(5, 1), (5, 4)], (5, 2)) == 1 and ready_position([(5, 1)], (0, 6)) == 0


def test_requests_set_up_while_the_rows_are_full_take_rows_in_priority_then_arrival_order(tiny_pipe):
    """Both rows decode long answers while two requests are set up side by side; the later one, of the more urgent
    priority, takes the first row that frees, the other the next (one set-up thread admitted by arrival)."""
    cases = [make_case(1720 + i) for i in range(4)]
    with tiny_pipe.scheduler(max_batch_size=2, setup_workers=2) as sched:
        live = [
            sched.submit(**cases[i], config=AsymSpecConfig(k=2, max_new_tokens=n), ignore_eos=True, method="floor")
            for i, n in ((0, 90), (1, 130))
        ]
        deadline = time.monotonic() + 120
        while any(h.status is not RequestStatus.RUNNING for h in live) and time.monotonic() < deadline:
            time.sleep(0.01)
        cfg = AsymSpecConfig(k=2, max_new_tokens=4)
        late, urgent = (sched.submit(**c, config=cfg, priority=p) for c, p in zip(cases[2:], (5, 0)))
        results = [h.result(timeout=300) for h in (*live, late, urgent)]
    assert [len(r.token_ids) for r in results[:2]] == [90, 130]
    ready_by = max(late.times[READY], urgent.times[READY])
    assert ready_by < live[0].times[RequestStatus.FINISHED_LENGTH], "both set up while the rows were full"
    assert urgent.times[PREFILLING] < late.times[PREFILLING]  # priority first, though it arrived second
    assert late.times[PREFILLING] >= live[0].times[RequestStatus.FINISHED_LENGTH]


def _decode_threads() -> tuple[set[str], object]:
    """The names of the threads that call a tokenizer's ``decode`` (a profile of every thread started from now on)."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("decode", "_decode") and "tokenization" in frame.f_code.co_filename:
            seen.add(threading.current_thread().name)

    threading.setprofile(profile)
    return seen, profile


def _handed_over(counts: dict[int, int]):
    """A profile counting the output thread's hand-overs (``OutputProcessor._deliver`` calls) by handle id."""

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "_deliver" and frame.f_code.co_filename.endswith("output_processor.py"):
            handle = frame.f_locals["item"][1]
            counts[handle.id] = counts.get(handle.id, 0) + 1

    return profile


def test_the_decode_thread_hands_token_ids_and_the_output_thread_detokenizes(tiny_pipe):
    """Two requests read step by step get each token's text from the output thread; a third read for its answer
    alone wakes the output thread once, at its end (its steps wait as token ids, then are detokenized together),
    and still gets every step, with its text, when read afterwards."""
    cases = [make_case(1740 + i) for i in range(2)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=10)
    alone = [tiny_pipe.generate(**c, config=cfg) for c in cases]
    cases.append(cases[0])  # the third: the first's request again, read for its answer alone
    alone.append(alone[0])
    seen, watch = _decode_threads()
    handed: dict[int, int] = {}
    count = _handed_over(handed)

    def both(frame, event, arg):
        watch(frame, event, arg)
        count(frame, event, arg)

    threading.setprofile(both)
    try:
        with tiny_pipe.scheduler(max_batch_size=3) as sched:
            handles = [sched.submit(**c, config=cfg) for c in cases]
            streamed = [[ev for events in h for ev in events] for h in handles[:2]]
            got = [h.result(timeout=120) for h in handles]
            streamed.append([ev for events in handles[2] for ev in events])  # read once it has ended
    finally:
        threading.setprofile(None)
    assert "asymspec-output" in seen  # the watch sees the output thread's decodes
    assert "asymspec-scheduler" not in seen, seen  # and none on the decode thread
    for ref, res, events in zip(alone, got, streamed):
        assert res.token_ids == ref.token_ids and res.text == ref.text
        assert [ev.text for ev in events] == [ev.text for ev in ref.trace]  # each token's text, as alone
        assert [ev.text for ev in res.trace] == [ev.text for ev in ref.trace]
    steps = got[2].stats["steps"]
    assert steps > 1 and handed[handles[2].id] == 1, (handed, steps)  # its answer alone: one hand-over, not one a step


def test_a_stop_string_ends_the_row_at_the_token_it_ends_it_alone(tiny_pipe):
    """The stop check stays on the decode thread (its verdict decides the row's next step): the row stops at the
    same step and token as the request alone, and its text is cut at the stop string."""
    c = make_case(1760)
    cfg = AsymSpecConfig(k=3, max_new_tokens=24)
    full = tiny_pipe.generate(**c, config=cfg, ignore_eos=True)
    words = full.text.split()
    assert len(words) >= 4, full.text
    stop = words[len(words) // 2]
    stopped_cfg = cfg.with_(stop_strings=(stop,))
    ref = tiny_pipe.generate(**c, config=stopped_cfg, ignore_eos=True)
    assert ref.stats["stopped_by"] == "stop_string" and len(ref.token_ids) < len(full.token_ids)
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        other = sched.submit(**make_case(1761), config=cfg, ignore_eos=True)  # a row beside it, without stop strings
        got = sched.submit(**c, config=stopped_cfg, ignore_eos=True).result(timeout=120)
        beside = other.result(timeout=120)
    assert got.token_ids == ref.token_ids and got.stats["steps"] == ref.stats["steps"]
    assert got.text == ref.text and stop not in got.text and got.stats["stopped_by"] == "stop_string"
    assert len(beside.token_ids) == cfg.max_new_tokens


@pytest.mark.parametrize("workers", [0, True, "2"])
def test_setup_workers_must_be_a_positive_integer(tiny_pipe, workers):
    with pytest.raises(Exception, match="setup_workers"):
        tiny_pipe.scheduler(setup_workers=workers)


def test_two_questions_about_one_new_image_set_up_at_once_share_one_caption(tiny_pipe):
    """Set up side by side, both ask for the caption of the same new image: it is written once (the second set-up
    waits for the first's caption row instead of decoding its own)."""
    c = make_case(1780)
    cfg = AsymSpecConfig(k=3, max_new_tokens=6)
    tiny_pipe.captioner.cache.clear()
    with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=4, setup_workers=2) as sched:
        a, b = (sched.submit(c["image"], q, caption=None, ocr=False, config=cfg) for q in (c["question"], "What is shown?"))
        got = [h.result(timeout=300) for h in (a, b)]
        after = sched.submit(c["image"], c["question"], caption="given", ocr=False, config=cfg)
        after.result(timeout=120)
    assert a.times[SETTING_UP] < b.times[READY] and b.times[SETTING_UP] < a.times[READY]  # set up side by side
    assert after.id == b.id + 2  # one caption row was given an id between them (two captions: + 3)
    assert got[0].view.caption == got[1].view.caption != ""


def _asleep(sched, threads: int, timeout: float = 30.0) -> None:
    """Wait until ``threads`` threads wait on the scheduler's condition: every wake-up already notified is counted (a
    notified thread leaves the condition's waiters and counts its wake-up before it waits again)."""
    end = time.monotonic() + timeout
    while len(sched._cond._waiters) < threads:  # noqa: SLF001 - CPython's Condition keeps one lock a waiting thread
        assert time.monotonic() < end, f"{len(sched._cond._waiters)} of {threads} threads asleep after {timeout} s"
        time.sleep(0.001)


def test_a_decoding_row_wakes_no_set_up_thread(tiny_pipe):
    """While a row decodes and nothing waits to be set up, the set-up threads sleep: no step wakes them (each step
    woke all four, to find no work, and each took the interpreter's lock from the decode thread on the way). Each step
    reads the count once the four are asleep again, so a wake-up notified before a step (the request's own set-up
    ending) is never counted after it, however late its thread runs on a loaded machine."""
    cfg = AsymSpecConfig(max_new_tokens=24)
    held: list = []
    seen: list[int] = []  # the set-up threads' wake-ups so far, read after each step

    def after_step(*_) -> None:
        _asleep(held[0], threads=4)
        seen.append(held[0].wakeups["setup"])

    with tiny_pipe.scheduler(max_batch_size=1, setup_workers=4, on_step=after_step) as sched:
        held.append(sched)
        res = sched.submit(**make_case(1790), config=cfg, method="floor", ignore_eos=True).result(timeout=120)
    assert len(seen) == res.stats["steps"] == 24
    assert seen[-1] == seen[0], seen
