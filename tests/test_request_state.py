"""One request state (issue #51, item 1): a caption is a child request of the request whose set-up asks for it, a
record of its own in the one table (its own id, kind, handle, statuses and timings, its parent's id) that enters
READY with its prompt known and goes when its parent is cancelled. The table's rules are tested on hand-written
records; the captions on real forwards of the tiny pair through a running scheduler."""

from __future__ import annotations

from concurrent.futures import CancelledError

import pytest
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.handle import Handle
from asymspec_mm.core.request_state import FINISHED, RequestKind, RequestState, RequestStatus, RequestTable, TransitionError
from asymspec_mm.engines.model_calls import TokenRequest

S = RequestStatus


class _Line:
    """What a handle asks of its scheduler (its place in line, a wake-up after a cancel): nothing here."""

    def _position(self, handle: Handle) -> None:
        return None

    def _wake(self) -> None:
        pass


def _record(rid: int, kind: RequestKind = RequestKind.ANSWER, parent: int | None = None) -> RequestState:
    state = RequestState(rid, status=kind.entry, kind=kind, parent=parent)
    Handle(_Line(), state)
    return state


def test_each_kind_enters_at_its_own_status_and_a_child_needs_its_parent():
    table = RequestTable()
    parent = table.add(_record(0))
    child = table.add(_record(1, RequestKind.CAPTION, parent=0))
    completion = table.add(_record(2, RequestKind.COMPLETION))
    assert (parent.status, child.status, completion.status) == (S.WAITING, S.READY, S.READY)
    assert list(child.times) == [S.READY] and child.handle.status is S.READY and child.handle.stage == "set_up"
    with pytest.raises(TransitionError, match="enters READY, not WAITING"):
        table.add(RequestState(3, None, kind=RequestKind.CAPTION, parent=0))
    with pytest.raises(ValueError, match="parent 9 is not in the table"):
        table.add(_record(4, RequestKind.CAPTION, parent=9))
    assert table.children(0) == [child] and table.children(1) == []
    # a child goes on along the transitions every request takes
    for status in (S.PREFILLING, S.RUNNING, S.FINISHED_STOPPED):
        child.move(status)
    assert list(child.times) == [S.READY, S.PREFILLING, S.RUNNING, S.FINISHED_STOPPED]


def test_a_child_is_abandoned_once_its_parent_is_cancelled_or_gone():
    table = RequestTable()
    for rid in (0, 1):
        table.add(_record(rid))
    a, b = (table.add(_record(rid, RequestKind.CAPTION, parent=p)) for rid, p in ((2, 0), (3, 1)))
    table.add(_record(4, RequestKind.COMPLETION))
    assert table.abandoned() == []
    table[0].handle.cancel()
    assert table.abandoned() == [a]
    table.pop(1)
    assert table.abandoned() == [a, b]
    a.handle.cancel()  # already going: not listed again
    b.move(S.ABORTED)
    assert table.abandoned() == []


def _run_with_snapshots(tiny_pipe, submit, on_running=None):
    """Run a scheduler with ``submit(sched) -> handles``; after every step, the records in the table then and, for each
    caption decoding, its parent's status at that step. ``on_running(child, handles)``: called once per caption the
    first time it is seen decoding."""
    seen: dict[int, RequestState] = {}
    parent_status: list[RequestStatus] = []
    called: set[int] = set()
    box: list = []

    def on_step(*_):
        if not box:
            return
        sched, handles = box[0], box[1] if len(box) > 1 else []
        for state in sched._table:
            seen.setdefault(state.rid, state)
            if state.kind is RequestKind.CAPTION and state.status is S.RUNNING:
                parent = sched._table.get(state.parent)
                parent_status.append(parent.status if parent is not None else None)
                if on_running is not None and state.rid not in called:
                    called.add(state.rid)
                    on_running(state, handles)

    with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=4, setup_workers=2, on_step=on_step) as sched:
        box.append(sched)
        box.append(submit(sched))
        handles = box[1]
        for h in handles:
            try:
                h.result(timeout=300)
            except CancelledError:
                pass
    return seen, parent_status, handles


def test_a_caption_is_a_child_request_with_its_own_record_statuses_and_timings(tiny_pipe):
    """Two new images, each captioned by the drafter: each caption is a record of its own (kind CAPTION, its parent the
    request whose set-up asked for it, its request the TokenRequest it decodes), enters READY, goes through PREFILLING
    and RUNNING to a finished status, and decodes within its parent's set-up window while the parent is SETTING_UP."""
    cases = [make_case(5800 + i) for i in range(2)]
    cfg = AsymSpecConfig(k=2, max_new_tokens=4)
    tiny_pipe.captioner.cache.clear()
    tiny_pipe.encoder.store.clear()

    def submit(sched):
        return [sched.submit(c["image"], c["question"], caption=None, ocr=False, config=cfg) for c in cases]

    seen, parent_status, handles = _run_with_snapshots(tiny_pipe, submit)
    captions = [s for s in seen.values() if s.kind is RequestKind.CAPTION]
    by_id = {h.id: h for h in handles}
    assert sorted(c.parent for c in captions) == sorted(by_id) and not {c.rid for c in captions} & set(by_id)
    for child in captions:
        parent = by_id[child.parent]
        assert isinstance(child.request, TokenRequest) and child.request.kind == "caption"
        assert child.handle.request is child.request and child.handle.kind is RequestKind.CAPTION
        path = list(child.times)
        assert path[:3] == [S.READY, S.PREFILLING, S.RUNNING] and path[3] in FINISHED and child.status is path[3]
        assert child.handle.times is child.times and child.handle.result().token_ids  # its tokens, its handle
        assert parent.times[S.SETTING_UP] <= child.times[S.READY] and child.times[path[3]] <= parent.times[S.READY]
        assert seen[parent.id].kind is RequestKind.ANSWER and seen[parent.id].parent is None
    assert parent_status and set(parent_status) == {S.SETTING_UP}
    assert all(h.result().view.caption for h in handles)


def test_cancelling_a_request_while_its_caption_decodes_takes_the_caption_with_it(tiny_pipe):
    """The parent is cancelled the first step its caption decodes: the caption leaves at the next step boundary
    (ABORTED, not decoded to its end), the parent ends cancelled without finishing its set-up, and a scheduler
    answers the next request about the image (its caption written anew)."""
    case = make_case(5810)
    cfg = AsymSpecConfig(k=2, max_new_tokens=4)
    tiny_pipe.captioner.cache.clear()
    tiny_pipe.encoder.store.clear()
    cancels: list[int] = []

    def cancel_parent(child, handles):
        cancels.append(0)
        next(h for h in handles if h.id == child.parent).cancel()

    def submit(sched):
        return [sched.submit(case["image"], case["question"], caption=None, ocr=False, config=cfg)]

    seen, _, handles = _run_with_snapshots(tiny_pipe, submit, on_running=cancel_parent)
    (child,) = [s for s in seen.values() if s.kind is RequestKind.CAPTION]
    assert cancels == [0] and child.status is S.ABORTED
    assert child.handle.cancelled and child.parent == handles[0].id
    with pytest.raises(CancelledError):
        handles[0].result()
    assert handles[0].status is S.ABORTED and S.READY not in handles[0].times  # it never finished its set-up
    with tiny_pipe.prefix_kv.paused(), tiny_pipe.scheduler(max_batch_size=2) as sched:
        again = sched.submit(case["image"], case["question"], caption=None, ocr=False, config=cfg).result(timeout=300)
    assert again.view.caption
