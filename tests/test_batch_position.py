"""A request's place in the scheduler's line (:attr:`Handle.position`) and its waiting time (:meth:`Handle.waited`)."""

from __future__ import annotations

import time

from conftest import held_forwards, make_case


def test_handle_position_counts_the_requests_ahead_then_none(tiny_pipe):
    case = make_case(3)
    sched = tiny_pipe.scheduler(max_batch_size=1)
    try:
        # The worker's forwards wait while the models are held: the line stands still.
        with held_forwards(tiny_pipe):
            handles = [
                sched.submit(case["image"], case["question"], caption=case["caption"], ocr=False, method="floor", max_new_tokens=4)
                for _ in range(4)
            ]
            deadline = time.monotonic() + 120
            while handles[0].position is not None and time.monotonic() < deadline:  # the worker took the first
                time.sleep(0.01)
            assert [h.position for h in handles] == [None, 0, 1, 2]
            assert sched.waiting == 3
            # the first has its row (its prompt waits in the batched prefill's forward); the second is set up
            # ahead (no KV yet), keeping its place; the others wait for their set-up
            wait = time.monotonic() + 120
            while handles[1].stage != "set_up" and time.monotonic() < wait:
                time.sleep(0.01)
            assert [h.stage for h in handles] == ["prefill", "set_up", "queued", "queued"]
            time.sleep(0.2)
            assert all(h.waited() >= 0.2 for h in handles[1:])
            handles[2].cancel()  # a cancelled request leaves the line; the ones behind it move up
            deadline = time.monotonic() + 120
            while handles[3].position != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [h.position for h in handles[1:]] == [0, None, 1]
        for h in (handles[0], handles[1], handles[3]):
            h.result(timeout=120)
        assert [h.position for h in handles] == [None] * 4
        assert [h.stage for h in handles] == ["done"] * 4
        waited = [h.waited() for h in handles]
        time.sleep(0.05)
        assert [h.waited() for h in handles] == waited  # the clock stops when a request leaves the line
        assert waited[3] > waited[0]
    finally:
        sched.close()
