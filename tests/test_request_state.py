"""One request state (issue #51, item 1): a caption is a child request of the request whose set-up asks for it, a
record of its own in the one table (its own id, kind, handle, statuses and timings, its parent's id) that enters
READY with its prompt known and goes when its parent is cancelled. The table's rules are tested on hand-written
records; the captions on real forwards of the tiny pair through a running scheduler."""

from __future__ import annotations

from concurrent.futures import CancelledError
from dataclasses import fields

import pytest
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.decoder import BatchDecoder
from asymspec_mm.core.handle import Handle
from asymspec_mm.core.request_state import FINISHED, RequestKind, RequestState, RequestStatus, RequestTable, TransitionError, prompt_counts
from asymspec_mm.core.scheduler import Scheduler
from asymspec_mm.engines.model_calls import TokenRequest, TokenResult
from asymspec_mm.request.session import MMResult, Session

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


class _Checked(Scheduler):
    """A scheduler that compares, at the start of every turn (after the last one), each record with the decoder: the
    record's prompt counts are what the decoder's prefill computed, its row is the decoder's row while it decodes."""

    def __init__(self, *args, **kwargs):
        self.records: dict[int, RequestState] = {}
        self.seen: dict[RequestStatus, int] = dict.fromkeys(S, 0)
        self.problems: list[str] = []
        self.partial = 0  # turns that began with a prompt part in
        super().__init__(*args, **kwargs)

    def _plan(self):
        d, table = self._decoder, self._table
        for rid, prompts in [*((r, d.arriving.prompts(r)) for r in d.arriving.rows), *((r, p) for r, (_, p) in d.parked.items())]:
            state, (tokens, computed) = table[rid], prompt_counts(prompts)
            if (state.prompt_tokens, state.computed, state.row) != (tokens, computed, None):
                self.problems.append(f"{rid} {state.status.name}: {state.prompt_tokens} {state.computed} vs {tokens} {computed}")
            self.seen[state.status] += 1
            self.partial += state.status is S.PREFILLING and 0 < sum(computed.values()) < sum(tokens.values())
        for rid, row in d.rows.items():
            if table[rid].status is not S.RUNNING or table[rid].row is not row:
                self.problems.append(f"{rid} decodes but its record says {table[rid].status.name}, {table[rid].row}")
            self.seen[S.RUNNING] += 1
        for state in table:
            self.records[state.rid] = state
            if state.status is not S.RUNNING and state.row is not None:
                self.problems.append(f"{state.rid} {state.status.name} has a row")
            if state.status is S.READY and state.prompt_left != {n: int(p.ids.numel()) for n, p in state.work.to_prefill.items()}:
                self.problems.append(f"{state.rid} READY: {state.prompt_left}")
        return super()._plan()


def test_the_record_counts_the_prompts_and_holds_the_row_the_decoder_has(tiny_pipe):
    """Three rows under a KV budget of about one and a half, prompts in pieces of 16 tokens: at every turn each
    record's prompt tokens and computed tokens equal the decoder's prefill (exact counts, being prefilled and
    preempted), its row is the decoder's row while it decodes and None otherwise; once finished, the set-up's prompts
    are as set up (the prefill counted on copies) and the answer's prefill statistics are its record's."""
    cases = [make_case(5830 + i) for i in range(3)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=48)
    kwargs = [dict(image=c["image"], question=c["question"], caption=c["caption"], ocr=c["ocr"]) for c in cases]
    probe = BatchDecoder(tiny_pipe)
    one = max(probe.kv_bound(tiny_pipe.prepare(**k, config=cfg, ignore_eos=True, prefill=False), alone=True) for k in kwargs)
    with tiny_pipe.prefix_kv.paused():
        sched = _Checked(tiny_pipe, max_batch_size=3, max_kv_bytes=int(1.5 * one), prefill_chunk_tokens=16)
        try:
            handles = [sched.submit(**k, config=cfg, ignore_eos=True, priority=p) for k, p in zip(kwargs, (5, 5, -1))]
            results = [h.result(timeout=600) for h in handles]
        finally:
            sched.close()
    assert sched.problems == []
    assert sched.preemptions > 0 and sched.seen[S.PREEMPTED] > 0 and sched.partial > 0 and sched.seen[S.RUNNING] > 0
    for h, res in zip(handles, results):
        record = sched.records[h.id]
        assert record.status is S.FINISHED_LENGTH and record.row is None
        assert all(p.done == p.cached == 0 for p in record.work.to_prefill.values())
        assert record.work.record is record and record.stats["prefill_s"] == res.stats["prefill_s"] > 0
        assert record.stats["cached_tokens"] == res.stats["cached_tokens"]


class _AsCompletion(Session):
    """A set-up request that declares itself a completion: the kind a row's work names decides its result."""

    kind = "completion"
    model = None  # the pipeline's model for its stream


def test_a_rows_result_follows_the_kind_its_work_declares(tiny_pipe):
    """The decoder asks a row's work what it is (its kind), not which class it is: the same set-up request, declared a
    completion, ends with a TokenResult of the tokens it answers with as an answer."""
    case = make_case(5840)
    kwargs = dict(image=case["image"], question=case["question"], caption=case["caption"], ocr=case["ocr"], method="floor")
    out = []
    with tiny_pipe.prefix_kv.paused():
        for declared in (Session, _AsCompletion):
            session = tiny_pipe.prepare(**kwargs, config=AsymSpecConfig(max_new_tokens=8), ignore_eos=True, prefill=False)
            decoder = BatchDecoder(tiny_pipe)
            decoder.add(0, declared(*(getattr(session, f.name) for f in fields(Session))))
            while decoder.arriving:
                decoder.prefill_step()
            while decoder.rows:
                out += [row.result for row, _ in decoder.step() if row.result is not None]
    answer, tokens = out
    assert isinstance(answer, MMResult) and isinstance(tokens, TokenResult) and not isinstance(tokens, MMResult)
    assert tokens.token_ids == answer.token_ids and len(tokens.token_ids) == 8
