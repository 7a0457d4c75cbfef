"""Paged row storage (issue #51): every row of a PagedBatchEngine equals its own single-row engine and the padded
BatchEngine fed the same tokens (ragged joins and extends, rollbacks, leaves and rejoins, image rows with M-RoPE,
chunked prefill, prefix sharing by reference), and its blocks are exactly what its rows hold."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import make_case
from row_checks import assert_logits_close, stream_model

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchEngine
from asymspec_mm.core.prefill import ChunkedPrefill
from asymspec_mm.engines import TextEngine, VLEngine
from asymspec_mm.engines.block_pool import blocks_for
from asymspec_mm.engines.paged_kv import PagedRowContext
from asymspec_mm.engines.paged_rows import PagedBatchEngine, PagedStorages

STREAMS = ("drafter_full", "drafter_comp", "verifier")
CFG = AsymSpecConfig(k=3, max_new_tokens=8)


def _session(pipe, seed: int, prefill: bool = True):
    """Case ``seed`` set up: prefilled on single-row engines (the reference rows are checked against), or not."""
    case = make_case(seed)
    return pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=CFG, prefill=prefill)


def _single(pipe, name: str, context) -> TextEngine | VLEngine:
    """A single-row engine holding a copy of ``context`` (a prefilled engine or a RowContext)."""
    from asymspec_mm.engines.prefix_kv import cache_layers, new_cache

    engine = TextEngine(pipe.verifier, name) if name == "verifier" else VLEngine(pipe.drafter, name)
    engine.cache = new_cache(None, [(k.clone(), v.clone()) for k, v in cache_layers(context.cache)]) if context.length else None
    if name != "verifier":
        engine.rope_delta = context.rope_delta
    return engine


class Trio:
    """One PagedBatchEngine, one BatchEngine and, per row, a single-row engine, fed the same tokens."""

    def __init__(self, pipe, name: str, block_size: int, layout: str | None = None):
        self.pipe, self.name = pipe, name
        self.paged = PagedBatchEngine(stream_model(pipe, name), name, block_size=block_size, layout=layout)
        self.batch = BatchEngine(stream_model(pipe, name), name, compact_at=0.25)
        self.single: dict[int, object] = {}

    def join(self, row: int, engine) -> None:
        self.paged.join(row, engine)
        self.batch.join(row, engine)
        self.single[row] = _single(self.pipe, self.name, engine)
        assert self.paged.length(row) == self.batch.length(row) == engine.length

    def leave(self, row: int) -> None:
        self.paged.leave(row)
        self.batch.leave(row)
        del self.single[row]

    def extend(self, ids: dict[int, list[int]]) -> int:
        """Extend every engine; returns the token positions the paged forward's model computed (its embedding's
        input, counted by a forward hook)."""
        ids = {r: torch.tensor(t) for r, t in ids.items()}
        computed: list[int] = []
        hook = (
            stream_model(self.pipe, self.name)
            .get_input_embeddings()
            .register_forward_hook(lambda m, args, out: computed.append(args[0].numel()))
        )
        try:
            got = self.paged.extend(ids)
        finally:
            hook.remove()
        padded = self.batch.extend(ids)
        assert list(got) == list(ids)
        for r, t in ids.items():
            assert_logits_close(got[r], self.single[r].extend(t), (self.name, r, "single"))
            assert_logits_close(got[r], padded[r], (self.name, r, "batch"))
            assert self.paged.length(r) == self.single[r].length
        return sum(computed)

    def truncate(self, row: int, length: int) -> None:
        for e in (self.paged, self.batch):
            e.truncate(row, length)
        self.single[row].truncate(length)

    def check_blocks(self) -> None:
        """Each row holds exactly the blocks its tokens fill; the pool's used blocks are those rows' blocks."""
        pool, held = self.paged.pool, set()
        for r in self.paged.rows:
            blocks = self.paged.blocks(r)
            assert len(blocks) == blocks_for(self.paged.length(r), pool.block_size), (self.name, r)
            held.update(blocks)
        assert pool.used_blocks == len(held)


@pytest.mark.parametrize(("attn", "layout"), [("sdpa", "segments"), ("eager", "segments"), ("sdpa", "contiguous")])
def test_paged_rows_equal_single_row_engines_and_the_padded_batch(request, attn, layout):
    """5 rows per stream (image prompts, text-only VL, text verifier), 30 rounds of ragged extends on random subsets,
    random rollbacks, leaves and joins (and a row that leaves and joins again on its own context); every row's
    logits equal its single-row engine's and the BatchEngine's, and the blocks are exactly the rows' tokens. In
    both pool layouts: segments (the tiny pair's default: 4 layers) and contiguous (one tensor per layer,
    reallocated as the pool grows and shrinks, which this test does many times)."""
    pipe = request.getfixturevalue("tiny_pipe" if attn == "sdpa" else "eager_pipe")
    rng = random.Random(11)
    sessions = sorted((_session(pipe, seed) for seed in range(5)), key=lambda s: s.streams["drafter_full"].length)
    assert len({s.streams["verifier"].length for s in sessions}) > 1
    trios = {name: Trio(pipe, name, block_size=4, layout=layout) for name in STREAMS}
    assert {t.paged.kv.layout for t in trios.values()} == {layout}
    for row, s in enumerate(sessions):
        for name in STREAMS:
            trios[name].join(row, s.streams[name])
    assert any(s.streams["drafter_full"].rope_delta != 0 for s in sessions)
    next_row, ragged = len(sessions), 0
    for rnd in range(30):
        if rnd in (6, 17):  # a random row leaves
            gone = rng.choice(trios["verifier"].paged.rows)
            for t in trios.values():
                t.leave(gone)
        if rnd in (9, 21):  # a new request joins
            s = _session(pipe, 100 + rnd)
            for name in STREAMS:
                trios[name].join(next_row, s.streams[name])
            next_row += 1
        if rnd == 25:  # a row leaves and comes back on its own context (what preemption and resume do)
            back = trios["verifier"].paged.rows[0]
            for t in trios.values():
                context = t.paged.detach(back)
                t.paged.leave(back)
                t.batch.leave(back)
                t.paged.join(back, context)
                context.release()
                t.batch.join(back, t.single[back])
        for t in trios.values():
            live = t.paged.rows
            subset = rng.sample(live, rng.randint(1, len(live)))
            ids = {r: [rng.randint(20, 480) for _ in range(rng.randint(1, 6))] for r in subset}
            ragged += len({len(x) for x in ids.values()}) > 1
            t.extend(ids)
            for r in live:
                if rng.random() < 0.5:
                    t.truncate(r, max(1, t.paged.length(r) - rng.randint(0, 7)))
            t.check_blocks()
    assert ragged >= 15


def test_chunked_prefill_on_the_decode_pool_joins_without_a_copy(tiny_pipe):
    """Image prompts prefilled in pieces of 5 tokens on a staging storage of the decode storage's pool: the rows
    join the decode storages by reference (the same blocks, no block allocated or copied), their next logits equal
    single-row prefill, and the staging storage reports no bytes of its own (the pool counts once)."""
    seeds = [31, 32, 33]
    alone = [_session(tiny_pipe, s) for s in seeds]
    staged = [_session(tiny_pipe, s, prefill=False) for s in seeds]
    storages = PagedStorages(block_size=8)
    models = tiny_pipe.stream_models("asymspec")
    decode = {name: storages(model, name) for name, model in models.items()}
    stage = ChunkedPrefill(models, chunk_tokens=5, staging=storages.staging)
    for i, s in enumerate(staged):
        stage.add(i, s.to_prefill)
    while len(stage.step()) < len(seeds):
        pass
    assert stage.forwards > 3  # the prompts went in pieces
    assert decode["drafter_full"].kv is decode["drafter_comp"].kv  # one pool per model
    for name, engine in stage._staging.items():
        assert engine.kv is decode[name].kv and engine.kv_bytes() == 0 and engine.kv_bound([100], 4) == 0
    for i in range(len(seeds)):
        before = {name: (d.pool.used_blocks, d.pool.capacity) for name, d in decode.items()}
        contexts, _ = stage.take(i)
        for name, context in contexts.items():
            assert isinstance(context, PagedRowContext)
            decode[name].join(i, context)
            context.release()
            assert decode[name].blocks(i) and decode[name].length(i) == alone[i].streams[name].length
        assert {name: (d.pool.used_blocks, d.pool.capacity) for name, d in decode.items()} == before
    for name, engine in decode.items():
        pending = {i: alone[i].pending[name].reshape(-1) for i in range(len(seeds))}
        got = engine.extend(pending)
        for i in range(len(seeds)):
            assert_logits_close(got[i], alone[i].streams[name].extend(pending[i]), (name, i))


def test_a_shared_prefix_is_one_set_of_blocks_with_copy_on_write(tiny_pipe):
    """Three rows join from one prefilled context: they hold the same blocks (no copy); the first write of each into
    the shared, partly filled last block copies that block alone; every row decodes equal to its own single-row
    engine; when all leave, every block is free and the pool's segments are given back."""
    s = _session(tiny_pipe, 51)
    for name in STREAMS:
        bs = next(b for b in (7, 9, 11) if s.streams[name].length % b)  # the prompt ends inside a block
        source = PagedBatchEngine(stream_model(tiny_pipe, name), name, block_size=bs)
        source.join(0, s.streams[name])
        used = source.pool.used_blocks
        context = source.detach(0)
        source.leave(0)
        for row in (1, 2, 3):
            source.join(row, context)
        context.release()
        assert source.blocks(1) == source.blocks(2) == source.blocks(3) and source.pool.used_blocks == used
        singles = {row: _single(tiny_pipe, name, s.streams[name]) for row in (1, 2, 3)}
        got = source.extend({1: torch.tensor([40]), 2: torch.tensor([41, 42]), 3: torch.tensor([43])})
        length = s.streams[name].length
        grown = sum(blocks_for(length + n, bs) - blocks_for(length, bs) for n in (1, 2, 1))
        assert source.pool.used_blocks == used + 2 + grown  # two rows copied the last block; the third writes in place
        full = length // bs  # the prompt's full blocks stay shared; its last, partly filled one is each row's own
        assert source.blocks(1)[:full] == source.blocks(2)[:full] == source.blocks(3)[:full]
        assert len({source.blocks(r)[full] for r in (1, 2, 3)}) == 3
        for row, ids in ((1, [40]), (2, [41, 42]), (3, [43])):
            assert_logits_close(got[row], singles[row].extend(torch.tensor(ids)), (name, row))
        got = source.extend({r: torch.arange(50, 50 + 9) for r in (1, 2, 3)})
        for row in (1, 2, 3):
            assert_logits_close(got[row], singles[row].extend(torch.arange(50, 50 + 9)), (name, row))
        for row in (1, 2, 3):
            source.leave(row)
        assert source.pool.used_blocks == 0 and source.pool.capacity == 0 and source.kv_bytes() == 0


def test_blocks_follow_the_rows_exactly(tiny_pipe):
    """A rollback frees exactly the blocks past the new length, a leave all of a row's; kv_bytes(row) is its tokens,
    kv_bytes() the pool's segments; row_kv gathers what the single-row engine holds."""
    s = _session(tiny_pipe, 61)
    engine = PagedBatchEngine(tiny_pipe.verifier, "verifier", block_size=4)
    single = s.streams["verifier"]
    engine.join(0, single)
    n = single.length
    assert len(engine.blocks(0)) == blocks_for(n, 4)
    engine.extend({0: torch.arange(30, 42)})  # 12 more tokens: 3 blocks
    assert len(engine.blocks(0)) == blocks_for(n + 12, 4)
    engine.truncate(0, n + 1)
    assert len(engine.blocks(0)) == blocks_for(n + 1, 4) and engine.pool.used_blocks == blocks_for(n + 1, 4)
    assert engine.kv_bytes(0) == (n + 1) * engine.slot_bytes()
    assert engine.kv_bytes() == engine.pool.capacity * 4 * engine.slot_bytes()
    engine.truncate(0, n)
    for (k, v), (sk, sv) in zip(engine.row_kv(0, 0, n), [(layer.keys, layer.values) for layer in single.cache.layers]):
        assert torch.equal(k, sk[..., :n, :]) and torch.equal(v, sv[..., :n, :])
    with pytest.raises(ValueError, match="already live"):
        engine.join(0, single)
    engine.leave(0)
    assert engine.rows == [] and engine.pool.used_blocks == 0 and engine.kv_bytes() == 0
    with pytest.raises(KeyError, match="no live row 0"):
        engine.extend({0: torch.tensor([1])})


def test_empty_context_and_rows_left_out_of_a_forward(tiny_pipe):
    """A row with an empty context starts at position 0; rows not given to a forward are not in it at all (their
    blocks untouched), and two rows of one length run without a mask."""
    ver = tiny_pipe.verifier
    empty, single_empty = TextEngine(ver), TextEngine(ver)
    empty.prefill(torch.tensor([], dtype=torch.long))
    single_empty.prefill(torch.tensor([], dtype=torch.long))
    prompt = torch.tensor([40, 41, 42, 43, 44])
    single = TextEngine(ver)
    single.prefill(prompt)
    engine = PagedBatchEngine(ver, "verifier", block_size=4)
    engine.join(0, empty)
    engine.join(1, single)
    twin = _single(tiny_pipe, "verifier", single)
    blocks = engine.blocks(0)
    assert_logits_close(engine.extend({1: torch.tensor([62])})[1], twin.extend(torch.tensor([62])), "alone")
    assert engine.blocks(0) == blocks and engine.batch_forwards == 1
    got = engine.extend({0: torch.tensor([60, 61]), 1: torch.tensor([64])})
    assert_logits_close(got[0], single_empty.extend(torch.tensor([60, 61])), "empty row")
    assert_logits_close(got[1], twin.extend(torch.tensor([64])), "prompt row")
    assert engine.tokens_forwarded == {0: 2 + empty.tokens_forwarded, 1: 2 + single.tokens_forwarded}


@pytest.mark.parametrize(("seed", "layout"), [(0, "segments"), (1, "segments"), (0, "contiguous")])
def test_the_pool_stays_within_its_bounds(tiny_pipe, seed, layout):
    """Rows join with ragged prompts, decode ragged extends of up to ``step`` tokens and roll back: after every
    operation the pool's bytes, and its peak (a contiguous pool's reallocation copy included), are within
    ``kv_bound`` of the rows' final lengths and within the ``step_bytes`` the storage promised before the step; the
    bound is tight (within 1.25x of the most seen once the rows are long, the reallocation share aside)."""
    rng = random.Random(seed)
    model, step = tiny_pipe.verifier, 5
    engine = PagedBatchEngine(model, "verifier", block_size=8, layout=layout)
    finals, live, seen = {}, {}, 0
    for rid in range(6):
        prompt = rng.randint(3, 40)
        finals[rid] = prompt + rng.randint(40, 90)
        single = TextEngine(model, "verifier")
        single.prefill(torch.tensor([rng.randint(20, 480) for _ in range(prompt)]))
        engine.join(rid, single)
        live[rid] = prompt
    bound = engine.kv_bound(list(finals.values()), step)
    for _ in range(200):
        rows = [r for r in live if live[r] < finals[r] - step]
        if not rows:
            break
        promised = engine.step_bytes(step)
        engine.peak_kv_bytes = engine.kv_bytes()
        ids = {r: torch.tensor([rng.randint(20, 480) for _ in range(rng.randint(1, step))]) for r in rows}
        engine.extend(ids)
        assert engine.kv_bytes() <= engine.peak_kv_bytes <= promised
        for r, t in ids.items():
            keep = engine.length(r) - rng.randint(0, t.numel() - 1)  # a rejection keeps a prefix of the new tokens
            engine.truncate(r, keep)
            live[r] = keep
        seen = max(seen, engine.kv_bytes())
        assert engine.kv_bytes() <= engine.peak_kv_bytes <= bound
    share = engine.kv.realloc_share
    assert share == (1 / engine.kv.n_layers if layout == "contiguous" else 0.0)
    assert sum(live.values()) * engine.slot_bytes() <= seen <= bound <= 1.25 * (1 + share) * seen


def test_a_request_alone_is_bounded_by_its_own_blocks(tiny_pipe):
    """Admission's bound of a request alone (prompt + 100 new tokens, K=4) on paged storage is within 1.15x of the
    tokens it will hold over its three streams; the padded storage's is more than twice that (its padding,
    compaction slack, a layer copied beside and the staging copy at join), which the paged one has none of."""
    from asymspec_mm.core.decoder import BatchDecoder
    from asymspec_mm.engines import RowStorages

    cfg = AsymSpecConfig(k=4, max_new_tokens=100)
    case = make_case(71)
    session = tiny_pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=cfg, prefill=False)
    held = 0
    for name, prompt in session.to_prefill.items():
        engine = PagedBatchEngine(stream_model(tiny_pipe, name), name)
        held += (prompt.ids.numel() + 1 + cfg.max_new_tokens) * engine.slot_bytes()
    paged = BatchDecoder(tiny_pipe, engines=RowStorages("paged")).kv_bound(session, alone=True)
    padded = BatchDecoder(tiny_pipe, engines=RowStorages("padded")).kv_bound(session, alone=True)
    assert held < paged <= 1.15 * held
    assert padded > 2 * held


def test_rows_of_1_5_37_and_256_new_tokens_run_as_one_packed_forward(tiny_pipe):
    """Rows with 1, 5, 37 and 256 new tokens (a long prompt chunk beside decode rows; image rows with M-RoPE on the
    drafter), one of them sharing another's prompt by reference (a fork) and diverging: ONE forward whose model
    computes exactly the sum of the new tokens (nothing padded), every row equal to itself alone and to the padded
    storage; then rollbacks (one into the shared prompt) and another packed forward, equal again."""
    rng = random.Random(5)
    sessions = [_session(tiny_pipe, seed) for seed in (81, 82, 83)]
    for name in ("drafter_full", "verifier"):
        trio = Trio(tiny_pipe, name, block_size=16)
        for row, s in enumerate(sessions):
            trio.join(row, s.streams[name])
        context = trio.paged.detach(2)  # row 3: row 2's prompt, by reference
        trio.paged.join(3, context)
        context.release()
        trio.batch.join(3, sessions[2].streams[name])
        trio.single[3] = _single(tiny_pipe, name, sessions[2].streams[name])
        assert trio.paged.blocks(3) == trio.paged.blocks(2)
        forwards = trio.paged.batch_forwards
        counts = {0: 1, 1: 5, 2: 37, 3: 256}
        computed = trio.extend({r: [rng.randint(20, 480) for _ in range(n)] for r, n in counts.items()})
        assert computed == sum(counts.values()) and trio.paged.batch_forwards == forwards + 1, (name, computed)
        full = sessions[2].streams[name].length // 16
        assert trio.paged.blocks(3)[:full] == trio.paged.blocks(2)[:full] and trio.paged.blocks(3)[full] != trio.paged.blocks(2)[full]
        trio.check_blocks()
        for row, keep in ((0, trio.paged.length(0) - 1), (1, trio.paged.length(1) - 3), (2, trio.paged.length(2) - 20), (3, full * 16 - 5)):
            trio.truncate(row, keep)  # row 3 rolls back into the prompt it shares with row 2
        counts = {0: 3, 1: 1, 2: 7, 3: 2}
        assert trio.extend({r: [rng.randint(20, 480) for _ in range(n)] for r, n in counts.items()}) == sum(counts.values())
        trio.check_blocks()


def test_paged_attention_is_chosen_through_the_config_and_calls_without_a_plan_keep_the_models_own(tiny_pipe):
    """A paged storage selects its attention through the text config (the drafter's vision tower keeps its own);
    a single-row engine on the same model gives bit-identical logits before and after (its calls carry no plan and
    run the model's own sdpa), and a model whose attention is reset afterwards is switched back at the next forward."""
    from asymspec_mm.engines.paged_attention import implementation_name

    ids = torch.arange(20, 44)
    for name in ("verifier", "drafter_full"):
        model = stream_model(tiny_pipe, name)
        text = model.config.get_text_config(decoder=True)
        _set_sdpa(model)
        before = _prefilled(model, name, ids[:20]).extend(ids[20:])
        paged = PagedBatchEngine(model, name)
        assert text._attn_implementation == implementation_name("sdpa")
        if name != "verifier":
            assert model.config.vision_config._attn_implementation == "sdpa"
        assert torch.equal(_prefilled(model, name, ids[:20]).extend(ids[20:]), before)
        _set_sdpa(model)
        paged.join(0, _prefilled(model, name, ids[:20]))
        got = paged.extend({0: ids[20:]})[0]
        assert text._attn_implementation == implementation_name("sdpa")
        assert_logits_close(got, before, name)


def _set_sdpa(model) -> None:
    """Select plain sdpa for ``model``'s text layers."""
    model.set_attn_implementation({"text_config": "sdpa"} if model.config.get_text_config(decoder=True) is not model.config else "sdpa")


def _prefilled(model, name: str, ids: torch.Tensor) -> TextEngine:
    engine = TextEngine(model, name) if name == "verifier" else VLEngine(model, name)
    engine.prefill(ids)
    return engine
