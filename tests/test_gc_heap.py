"""The loaded heap is out of the cyclic collector's scans while an engine decodes (``base.gc_heap``): a scheduler's
decode thread and a direct request freeze it (``gc.freeze``) for as long as they run, overlapping engines share one
freeze, and the last to end unfreezes it, so a dropped pipeline caught in a cycle is still collected. Real forwards
of the tiny pair; the collector's own counts (``gc.get_freeze_count``, ``gc.get_objects``) are read."""

from __future__ import annotations

import gc

import pytest

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.gc_heap import frozen_heap


@pytest.fixture
def unfrozen():
    gc.unfreeze()  # a clean start, whatever froze before this test
    yield
    gc.unfreeze()


def _frozen(obj) -> bool:
    """Whether ``obj`` (a tracked container) is in the permanent generation: out of every generation's list."""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def test_overlapping_blocks_share_one_freeze_and_the_last_unfreezes(unfrozen):
    before = object.__new__(type("Loaded", (), {}))
    with frozen_heap():
        assert gc.get_freeze_count() > 0 and _frozen(before)
        with frozen_heap():
            after = object.__new__(type("Made", (), {}))
            assert not _frozen(after)  # made while frozen: the collector still scans it
        assert _frozen(before)  # the inner block's end leaves the outer one's freeze
    assert gc.get_freeze_count() == 0 and not _frozen(before)


def test_a_scheduler_and_a_direct_request_decode_with_the_loaded_heap_frozen(tiny_pipe, unfrozen):
    model = tiny_pipe.verifier
    seen = []
    cfg = AsymSpecConfig(max_new_tokens=4)
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        handle = sched.submit(*_case(), caption="a chart", ocr=False, config=cfg)
        handle.listen(lambda *_: seen.append(_frozen(model)))
        handle.result(timeout=120)
    assert seen and all(seen)  # every step delivered while the decode thread's freeze held
    assert gc.get_freeze_count() == 0 and not _frozen(model)
    stream = tiny_pipe.stream(*_case(), caption="a chart", ocr=False, config=cfg)
    during = [_frozen(model) for _ in stream]
    assert during and all(during)  # the direct path: frozen between its steps too
    assert gc.get_freeze_count() == 0 and not _frozen(model)


def _case():
    from conftest import make_case

    case = make_case(1500)
    return case["image"], case["question"]
