"""Batched engines (issue #19): every row of a BatchEngine equals its own single-row engine and a no-cache forward,
whatever the other rows do (lengths, joins, leaves, rollbacks, ragged extends, compaction)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import make_case
from reference import Reference
from row_checks import assert_logits_close, stream_model

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchEngine, RowView
from asymspec_mm.engines import TextEngine, VLEngine

STREAMS = ("drafter_full", "drafter_comp", "verifier")
CFG = AsymSpecConfig(k=3, max_new_tokens=8)


def _session(pipe, seed: int):
    case = make_case(seed)
    return pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=CFG, prefill=True)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(20, 480) for _ in range(n)]


class Mirror:
    """One BatchEngine and, per row, the single-row engine it joined from, fed the same tokens."""

    def __init__(self, pipe, name: str, compact_at: float = 0.5):
        self.name = name
        self.batch = BatchEngine(stream_model(pipe, name), name, compact_at=compact_at)
        self.single: dict[int, object] = {}

    def join(self, row: int, engine) -> None:
        self.batch.join(row, engine)
        self.single[row] = engine
        assert self.batch.length(row) == engine.length

    def leave(self, row: int) -> None:
        self.batch.leave(row)
        del self.single[row]

    def extend(self, ids: dict[int, list[int]]) -> None:
        got = self.batch.extend({r: torch.tensor(t) for r, t in ids.items()})
        assert list(got) == list(ids)
        for r, t in ids.items():
            assert_logits_close(got[r], self.single[r].extend(torch.tensor(t)), (self.name, r))
            assert self.batch.length(r) == self.single[r].length

    def truncate(self, row: int, length: int) -> None:
        self.batch.truncate(row, length)
        self.single[row].truncate(length)
        assert self.batch.length(row) == self.single[row].length == length


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rows_equal_single_row_engines_over_random_rounds(request, attn):
    """5 rows per stream (image prompts, text-only VL, text verifier), 40 rounds of ragged extends on random subsets,
    random rollbacks, leaves and joins mid-way; every row's logits equal its single-row engine's."""
    pipe = request.getfixturevalue("tiny_pipe" if attn == "sdpa" else "eager_pipe")
    rng = random.Random(7)
    sessions = [_session(pipe, seed) for seed in range(5)]
    # the longest prompt joins last, so a join both pads a shorter row with holes and grows the time dimension
    sessions.sort(key=lambda s: s.streams["drafter_full"].length)
    assert len({s.streams["drafter_full"].length for s in sessions}) > 1
    assert len({s.streams["verifier"].length for s in sessions}) > 1
    mirrors = {name: Mirror(pipe, name, compact_at=0.25) for name in STREAMS}
    assert mirrors["drafter_full"].batch.vision and mirrors["drafter_comp"].batch.vision
    assert not mirrors["verifier"].batch.vision
    for row, s in enumerate(sessions):
        for name in STREAMS:
            mirrors[name].join(row, s.streams[name])
    assert any(s.streams["drafter_full"].rope_delta != 0 for s in sessions)  # the image rows' 3D positions matter
    next_row, ragged = len(sessions), 0
    for rnd in range(40):
        if rnd in (8, 19, 30):  # a random row leaves
            gone = rng.choice(mirrors["verifier"].batch.rows)
            for m in mirrors.values():
                m.leave(gone)
        if rnd in (12, 24, 33):  # a new request joins
            s = _session(pipe, 100 + rnd)
            for name in STREAMS:
                mirrors[name].join(next_row, s.streams[name])
            next_row += 1
        for m in mirrors.values():
            live = m.batch.rows
            subset = rng.sample(live, rng.randint(1, len(live)))
            ids = {r: _tokens(rng, rng.randint(1, 5)) for r in subset}
            ragged += len({len(t) for t in ids.values()}) > 1
            m.extend(ids)
            for r in live:
                if rng.random() < 0.5:
                    m.truncate(r, max(1, m.batch.length(r) - rng.randint(0, 6)))
            assert m.batch.rows == live
    assert ragged >= 20  # rows of one extend really took different numbers of tokens
    for m in mirrors.values():
        assert m.batch.compactions >= 1, m.name
        assert len(m.batch.rows) == 5


def test_rollback_of_one_row_leaves_the_others_equal_to_a_no_cache_forward(tiny_pipe):
    """Truncating row A (also right after a ragged extend, and across a compaction) leaves rows B..E's next logits
    equal to a full no-cache forward (image through the tower) of their whole sequence."""
    rng = random.Random(3)
    sessions = [_session(tiny_pipe, 20 + i) for i in range(5)]
    refs = [Reference(tiny_pipe, s.prompts) for s in sessions]
    full_forward = {
        "drafter_full": lambda i, t: refs[i].drafter_full(t),
        "drafter_comp": lambda i, t: refs[i].drafter_comp(t),
        "verifier": lambda i, t: refs[i].verifier(t),
    }
    for name in STREAMS:
        batch = BatchEngine(stream_model(tiny_pipe, name), name)
        for row, s in enumerate(sessions):
            batch.join(row, s.streams[name])
        # each stream caches prompt[:-1]; its first forward starts with the pending prompt token
        fed = {row: [int(s.pending[name])] + _tokens(rng, 1 + row % 3) for row, s in enumerate(sessions)}
        batch.extend({r: torch.tensor(t) for r, t in fed.items()})
        for step in range(6):
            a = step % 5
            drop = rng.randint(1, len(fed[a]) - 1) if len(fed[a]) > 1 else 0
            batch.truncate(a, batch.length(a) - drop)
            fed[a] = fed[a][: len(fed[a]) - drop]
            if step == 3:
                batch.compact()
            new = {r: _tokens(rng, rng.randint(1, 3)) for r in batch.rows}
            got = batch.extend({r: torch.tensor(t) for r, t in new.items()})
            for r, t in new.items():
                fed[r] += t
                want = full_forward[name](r, fed[r][1:])[-len(t) :]
                assert_logits_close(got[r], want, (name, step, r))
                assert batch.length(r) == sessions[r].streams[name].length + len(fed[r])
        assert batch.compactions >= 1


def test_kv_bytes(tiny_pipe):
    """Per row: layers x 2 x kv heads x head dim x dtype size x length; the whole cache (holes too) at least the sum."""
    sessions = [_session(tiny_pipe, 40 + i) for i in range(3)]
    for name in STREAMS:
        model = stream_model(tiny_pipe, name)
        cfg = model.config.get_text_config(decoder=True)
        size = torch.empty((), dtype=model.dtype).element_size()
        per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * size
        batch = BatchEngine(model, name, compact_at=1.0)
        assert batch.kv_bytes() == 0
        for row, s in enumerate(sessions):
            batch.join(row, s.streams[name])
        batch.extend({0: torch.tensor([30, 31, 32]), 2: torch.tensor([33])})
        batch.truncate(0, batch.length(0) - 2)
        for row in batch.rows:
            assert batch.kv_bytes(row) == per_token * batch.length(row)
        whole = batch.kv_bytes()
        assert whole == per_token * len(batch.rows) * batch.slots
        assert whole > sum(batch.kv_bytes(r) for r in batch.rows)  # ragged rows and the rollback left holes
        # a rollback of every row at the tail crops the time dimension (no copy, no compaction)
        before = batch.slots
        batch.extend({r: torch.tensor([34, 35]) for r in batch.rows})
        assert batch.slots == before + 2
        for r in batch.rows:
            batch.truncate(r, batch.length(r) - 2)
        assert batch.slots == before and batch.compactions == 0
        batch.compact()
        assert batch.slots == max(batch.length(r) for r in batch.rows)
        assert batch.kv_bytes() == per_token * len(batch.rows) * batch.slots >= sum(batch.kv_bytes(r) for r in batch.rows)
        batch.leave(1)
        assert batch.kv_bytes() == per_token * 2 * batch.slots


def test_counters_per_row_are_exact(tiny_pipe):
    """tokens_forwarded / forward_calls carry the joined engine's counts, then count each row's real tokens only
    (pads and rows left out not counted); RowView shows them with the single-row attribute names."""
    tiny_pipe.prefix_kv.clear()  # prompts an earlier test stored would be restored, not forwarded (counts of 0)
    sessions = [_session(tiny_pipe, 60 + i) for i in range(3)]
    for name in STREAMS:
        batch = BatchEngine(stream_model(tiny_pipe, name), name)
        want_tok, want_calls = {}, {}
        for row, s in enumerate(sessions):
            e = s.streams[name]
            batch.join(row, e)
            want_tok[row], want_calls[row] = e.tokens_forwarded, e.forward_calls
            assert want_tok[row] > 0 and want_calls[row] > 0
        views = {r: RowView(batch, r) for r in batch.rows}
        plan = [{0: 3, 1: 1}, {2: 5}, {0: 1, 1: 2, 2: 1}, {1: 4}]
        for step in plan:
            batch.extend({r: torch.arange(20, 20 + n) for r, n in step.items()})
            for r, n in step.items():
                want_tok[r] += n
                want_calls[r] += 1
            assert batch.tokens_forwarded == want_tok and batch.forward_calls == want_calls
        batch.truncate(2, batch.length(2) - 3)  # a rollback forwards nothing
        assert batch.tokens_forwarded == want_tok
        assert batch.batch_forwards == len(plan)
        for r, v in views.items():
            assert (v.name, v.length, v.tokens_forwarded, v.forward_calls, v.device) == (
                name,
                batch.length(r),
                want_tok[r],
                want_calls[r],
                batch.device,
            )
        got = views[1].extend(torch.tensor([44, 45]))  # a one-row forward through the view
        assert got.shape[0] == 2 and views[1].tokens_forwarded == want_tok[1] + 2 and views[1].forward_calls == want_calls[1] + 1
        views[1].truncate(views[1].length - 2)
        assert batch.length(1) == views[1].length


def test_empty_and_static_engines_join(tiny_pipe):
    """A row with an empty context starts at position 0; a static engine's cache joins up to its length; join copies
    (the engine decoding on afterwards does not change the row); a duplicate row id is refused."""
    from asymspec_mm.engines import StaticTextEngine

    ver = tiny_pipe.verifier
    empty, single_empty = TextEngine(ver), TextEngine(ver)
    empty.prefill(torch.tensor([], dtype=torch.long))
    single_empty.prefill(torch.tensor([], dtype=torch.long))
    static, single = StaticTextEngine(ver, headroom=16), TextEngine(ver)
    prompt = torch.tensor([40, 41, 42, 43, 44])
    static.prefill(prompt)
    single.prefill(prompt)
    batch = BatchEngine(ver, "verifier")
    batch.join(0, empty)
    batch.join(1, static)
    with pytest.raises(ValueError):
        batch.join(1, single)
    static.extend(torch.tensor([50, 51]))  # writes the static buffer in place past the joined length
    static.truncate(3)
    static.extend(torch.tensor([52, 53]))  # and over positions 3, 4 the row holds
    # the empty row left out: its slots of this forward are all pads (never a fully masked query); the cache stays finite
    assert_logits_close(batch.extend({1: torch.tensor([62])})[1], single.extend(torch.tensor([62])), "static row")
    got = batch.extend({0: torch.tensor([60, 61]), 1: torch.tensor([64])})
    assert_logits_close(got[0], single_empty.extend(torch.tensor([60, 61])), "empty row")
    assert_logits_close(got[1], single.extend(torch.tensor([64])), "static row")
    assert all(torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all() for layer in batch.cache.layers)
    batch.leave(0)
    batch.leave(1)
    assert batch.rows == [] and batch.kv_bytes() == 0
    batch.join(5, single)
    twin = TextEngine(ver)
    twin.prefill(torch.cat([prompt, torch.tensor([62, 64])]))
    batch.join(6, twin)  # two rows, same length: no holes, so no 2D mask is passed
    assert batch.holes() == 0
    got = batch.extend({5: torch.tensor([63]), 6: torch.tensor([65])})
    assert_logits_close(got[5], single.extend(torch.tensor([63])), "rejoined")
    assert_logits_close(got[6], twin.extend(torch.tensor([65])), "twin")
    got = batch.extend({5: torch.tensor([66, 67]), 6: torch.tensor([68])})  # ragged: holes from here on
    assert batch.holes() == 1
    assert_logits_close(got[5], single.extend(torch.tensor([66, 67])), "rejoined")
    assert_logits_close(got[6], twin.extend(torch.tensor([68])), "twin")


def test_vl_rows_keep_their_own_rope_delta(tiny_pipe):
    """Image rows of different sizes (different rope deltas) and a text-only VL row in one drafter batch."""
    sessions = [_session(tiny_pipe, 80 + i) for i in range(3)]
    deltas = {s.streams["drafter_full"].rope_delta for s in sessions}
    batch = BatchEngine(tiny_pipe.drafter, "drafter")
    singles = {}
    for row, s in enumerate(sessions):
        batch.join(row, s.streams["drafter_full"])
        singles[row] = s.streams["drafter_full"]
    comp = sessions[0].streams["drafter_comp"]
    assert isinstance(comp, VLEngine) and comp.rope_delta == 0
    batch.join(9, comp)
    singles[9] = comp
    assert len(deltas | {0}) >= 2
    for n in (2, 1, 4):
        ids = {r: torch.arange(30, 30 + n + (r % 2)) for r in batch.rows}
        got = batch.extend(ids)
        for r, t in ids.items():
            assert_logits_close(got[r], singles[r].extend(t), r)
