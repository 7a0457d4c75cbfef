"""A request's outcome is in the server's metrics before its answer reaches the event loop that sends it: a client
that has its answer (or its stream's last chunk) and then reads ``/metrics`` finds it counted. The count moved after
the hand-over, so a client quick enough (or a scheduler thread slow enough, on a loaded machine) read the count
without it. Real forwards of the tiny pair; the loop is a real asyncio loop, run by the test so that what it was
handed can be read at the moment the count moves."""

from __future__ import annotations

import asyncio

from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.serve.metrics import Metrics
from asymspec_mm.serve.transport import Reader


def test_the_outcome_is_counted_before_the_loop_is_handed_the_answer(tiny_pipe):
    loop = asyncio.new_event_loop()  # not running: what the reader hands it waits until the test runs it
    metrics = Metrics()
    readers: list[Reader] = []
    at_count: list[tuple[int, int, int]] = []  # when the count moved: requests ok, in flight, items the loop had

    def counted() -> None:  # the reader's on_end, called as it counts the outcome
        loop.run_until_complete(asyncio.sleep(0))  # what the loop was handed so far reaches the reader's queue
        at_count.append((metrics.requests["ok"], metrics.in_flight, readers[0].queue.qsize()))

    try:
        with tiny_pipe.scheduler(max_batch_size=1) as sched:
            handle = sched.submit(**make_case(7), config=AsymSpecConfig(max_new_tokens=3), method="floor")
            metrics.started()  # as the server does when the scheduler takes a request
            readers.append(Reader(handle, loop, metrics, counted))
            handle.result(timeout=120)
        # closed: every update was handed over; the rest of what the loop was handed reaches the queue
        loop.run_until_complete(asyncio.sleep(0))
        items = [readers[0].queue.get_nowait() for _ in range(readers[0].queue.qsize())]
    finally:
        loop.close()
    assert [kind for kind, _ in items] == ["events"] * (len(items) - 1) + ["result"]
    assert at_count == [(1, 0, len(items) - 1)]  # counted, not in flight, and the answer not yet handed over
