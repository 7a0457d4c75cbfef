"""The loaded heap is out of the cyclic collector's scans while an engine decodes (``base.gc_heap``): a scheduler's
decode thread and a direct request freeze what is alive when they start (``gc.freeze``) for as long as they run,
overlapping engines share the freeze, and the last to end unfreezes it, so a dropped pipeline caught in a cycle is
still collected. Real forwards of the tiny pair; the collector's own lists (``gc.get_objects``) are read. Another
engine of this process may be running (``gc_heap._holders``): the claims after an end hold either way."""

from __future__ import annotations

import gc

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base import gc_heap
from asymspec_mm.base.gc_heap import frozen_heap


def _frozen(obj) -> bool:
    """Whether ``obj`` (a tracked container) is in the permanent generation: out of every generation's list."""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def _left_frozen() -> bool:
    """What the heap should be once this test's engines ended: frozen while another engine of the process runs."""
    return gc_heap._holders > 0


def test_overlapping_blocks_share_the_freeze_and_the_last_unfreezes():
    before = object.__new__(type("Loaded", (), {}))
    with frozen_heap():
        assert _frozen(before)
        made = object.__new__(type("Made", (), {}))
        assert not _frozen(made)  # made while frozen: the collector still scans it
        with frozen_heap():
            assert _frozen(made)  # a second engine freezes what is alive when it starts
        assert _frozen(before) and _frozen(made)  # the inner block's end leaves the outer one's freeze
    assert _frozen(before) == _left_frozen()


def test_a_scheduler_and_a_direct_request_decode_with_the_loaded_heap_frozen(tiny_pipe):
    from conftest import make_case

    case = make_case(1500)
    model = tiny_pipe.verifier
    seen = []
    cfg = AsymSpecConfig(max_new_tokens=4)
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        handle = sched.submit(case["image"], case["question"], caption="a chart", ocr=False, config=cfg)
        handle.listen(lambda *_: seen.append(_frozen(model)))
        handle.result(timeout=120)
    assert seen and all(seen)  # every step delivered while the decode thread's freeze held
    assert _frozen(model) == _left_frozen()
    stream = tiny_pipe.stream(case["image"], case["question"], caption="a chart", ocr=False, config=cfg)
    during = [_frozen(model) for _ in stream]
    assert during and all(during)  # the direct path: frozen between its steps too
    assert _frozen(model) == _left_frozen()
