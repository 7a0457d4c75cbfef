"""Static-slot row storage (issue 28): every row of a StaticBatchEngine equals the same row of the dynamic
BatchEngine, token for token, whatever the rows do (ragged extends, rollbacks, leaves and joins, compaction); the
decoder gives the same tokens on either storage; full slots or columns are refused in one line naming the fix.
Real forwards on the tiny random pair (fp32, CPU)."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
from conftest import make_case
from row_checks import assert_logits_close, stream_model

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchDecoder, BatchEngine
from asymspec_mm.engines.static_rows import StaticBatchEngine, StaticRowsFullError, static_batch_engines

STREAMS = ("drafter_full", "drafter_comp", "verifier")
CFG = AsymSpecConfig(k=3, max_new_tokens=8)


def _session(pipe, seed: int, method: str = "asymspec", cfg: AsymSpecConfig = CFG):
    case = make_case(seed)
    return pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method=method, config=cfg, prefill=True)


class Pair:
    """A dynamic BatchEngine and a StaticBatchEngine over the same rows, fed the same calls."""

    def __init__(self, pipe, name: str, max_rows: int, max_len: int, **kw):
        self.name = name
        self.dyn = BatchEngine(stream_model(pipe, name), name)
        self.static = StaticBatchEngine(stream_model(pipe, name), name, max_rows=max_rows, max_len=max_len, **kw)

    def join(self, row: int, engine) -> None:
        self.dyn.join(row, engine)
        self.static.join(row, engine)
        assert self.static.length(row) == self.dyn.length(row) == engine.length

    def leave(self, row: int) -> None:
        self.dyn.leave(row)
        self.static.leave(row)

    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        want = self.dyn.extend(ids)
        got = self.static.extend(ids)
        assert list(got) == list(ids)
        for r in ids:
            assert_logits_close(got[r], want[r], (self.name, r))
            assert self.static.length(r) == self.dyn.length(r)
        return got

    def truncate(self, row: int, length: int) -> None:
        self.dyn.truncate(row, length)
        self.static.truncate(row, length)
        assert self.static.length(row) == self.dyn.length(row) == length


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_static_rows_equal_dynamic_rows(tiny_pipe, rows):
    """R rows per stream (image prompts, text-only VL, text verifier) over 24 rounds: ragged extends of random
    subsets, greedy continuations, random rollbacks, a leave and a join mid-way; the static storage's logits equal the
    dynamic storage's and its greedy tokens are the same; a short column axis forces compactions."""
    rng = random.Random(rows)
    sessions = [_session(tiny_pipe, 200 + i) for i in range(rows)]
    longest = {name: max(s.streams[name].length for s in sessions) for name in STREAMS}
    # room for the longest prompt plus ~30 tokens: the holes of ragged extends and rollbacks must be compacted away
    pairs = {name: Pair(tiny_pipe, name, max_rows=rows, max_len=longest[name] + 80) for name in STREAMS}
    for row, s in enumerate(sessions):
        for name in STREAMS:
            pairs[name].join(row, s.streams[name])
    greedy = {name: {r: torch.tensor([int(sessions[r].pending[name])]) for r in range(rows)} for name in STREAMS}
    next_row, ragged = rows, 0
    for rnd in range(24):
        if rnd == 10:  # a row leaves (its slot is freed), then a new request joins into it
            gone = rng.choice(pairs["verifier"].static.rows)
            new = _session(tiny_pipe, 300 + rows)
            for name, p in pairs.items():
                p.leave(gone)
                p.join(next_row, new.streams[name])
                del greedy[name][gone]
                greedy[name][next_row] = torch.tensor([int(new.pending[name])])
            next_row += 1
        for name, p in pairs.items():
            live = p.static.rows
            if rnd == 17:  # one row alone never leaves holes (rollbacks at the tail move the cursor back)
                p.static.compact()
            if rnd % 3 == 0:  # one greedy token for every row: the argmax sequences of both storages stay the same
                out = p.extend(greedy[name])
                greedy[name] = {r: out[r][-1:].argmax(-1) for r in out}
                continue
            subset = rng.sample(live, rng.randint(1, len(live)))
            ids = {r: torch.tensor([rng.randint(20, 480) for _ in range(rng.randint(1, 5))]) for r in subset}
            ragged += len({int(t.numel()) for t in ids.values()}) > 1
            p.extend(ids)
            for r in live:
                if rng.random() < 0.5:
                    p.truncate(r, max(1, p.static.length(r) - rng.randint(0, 6)))
    if rows > 1:
        assert ragged >= 10
    for name, p in pairs.items():
        assert p.static.compactions >= 1, name
        assert len(p.static.rows) == rows
        assert all(torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all() for layer in p.static.cache.layers)


def test_eager_attention_and_views(tiny_dirs):
    """With eager attention (the 2D mask becomes an additive float mask) the storages agree too; a row's view does
    one-row forwards and rollbacks; kv_bytes and slot_bytes follow the preallocated shapes."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    pipe.drafter.set_attn_implementation("eager")
    pipe.verifier.set_attn_implementation("eager")
    sessions = [_session(pipe, 400 + i) for i in range(3)]
    for name in STREAMS:
        p = Pair(pipe, name, max_rows=4, max_len=160)
        for row, s in enumerate(sessions):
            p.join(row, s.streams[name])
        p.extend({0: torch.tensor([30, 31, 32]), 2: torch.tensor([33])})
        p.truncate(0, p.static.length(0) - 2)
        p.extend({r: torch.arange(40, 40 + 1 + r) for r in p.static.rows})
        view = p.static.view(1)
        assert_logits_close(view.extend(torch.tensor([50, 51])), p.dyn.view(1).extend(torch.tensor([50, 51])), (name, "view"))
        view.truncate(view.length - 1)
        p.dyn.truncate(1, view.length)
        p.extend({1: torch.tensor([52])})
        assert (view.name, view.device, view.length) == (name, p.static.device, p.dyn.length(1))
        assert p.static.tokens_forwarded == p.dyn.tokens_forwarded and p.static.forward_calls == p.dyn.forward_calls
        assert p.static.slot_bytes() == p.dyn.slot_bytes()
        assert p.static.kv_bytes(1) == p.dyn.kv_bytes(1)
        assert p.static.kv_bytes() == 4 * 160 * p.static.slot_bytes()
        assert p.static.engine_calls == 4


def _decode(pipe, method: str, cfg: AsymSpecConfig, seeds: list[int], engines=None, batch: int = 3) -> dict[int, list[int]]:
    """The requests through one BatchDecoder, refilled up to ``batch`` live rows."""
    decoder = BatchDecoder(pipe, engines=engines)
    todo, out = list(seeds), {}
    while todo or decoder.rows:
        while todo and len(decoder.rows) < batch:
            i = todo.pop(0)
            decoder.add(i, _session(pipe, i, method, cfg.with_(max_new_tokens=6 + i % 7)))
        for row, _ in decoder.step():
            if row.result is not None:
                out[row.id] = list(row.result.token_ids)
    return out


@pytest.mark.parametrize("method", ["asymspec", "floor"])
def test_decoder_on_static_rows_gives_the_same_tokens(tiny_pipe, method):
    """BatchDecoder with the static factory: the tokens of the default (dynamic) engines, rows joining as others
    finish (different budgets), AsymSpec's rollbacks compacted away on a short column axis."""
    cfg = AsymSpecConfig(k=3)
    seeds = [500 + i for i in range(5)]
    want = _decode(tiny_pipe, method, cfg, seeds)
    made = []
    factory = static_batch_engines(max_rows=3, max_len=100)

    def engines(model, name):
        made.append(factory(model, name))
        return made[-1]

    got = _decode(tiny_pipe, method, cfg, seeds, engines=engines)
    assert got == want
    assert all(isinstance(e, StaticBatchEngine) and e.max_rows == 3 for e in made) and made
    if method == "asymspec":  # rollbacks leave holes: 100 columns are too few without compaction
        assert sum(e.compactions for e in made) >= 1
    assert all(len(t) > 0 for t in got.values())


def test_scheduler_takes_the_static_factory(tiny_pipe):
    """``pipe.scheduler(batch_engines=static_batch_engines(...))``: concurrent requests give the tokens of each
    request alone."""
    cfg = AsymSpecConfig(k=3, max_new_tokens=8)
    cases = [make_case(800 + i) for i in range(4)]
    alone = [tiny_pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg).token_ids for c in cases]
    sched = tiny_pipe.scheduler(max_batch_size=3, batch_engines=static_batch_engines(max_rows=3, max_len=160))
    try:
        handles = [sched.submit(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg) for c in cases]
        assert [h.result(timeout=300).token_ids for h in handles] == alone
    finally:
        sched.close(timeout=60)


def test_full_slots_and_columns_are_refused_in_one_line(tiny_pipe):
    """A fourth row in three slots, a prompt longer than max_len, and an extend past max_len even after compaction:
    one-line errors naming the setting to raise; the engine stays usable after each."""
    sessions = [_session(tiny_pipe, 600 + i) for i in range(4)]
    eng = StaticBatchEngine(tiny_pipe.verifier, "verifier", max_rows=3, max_len=100)
    for row in range(3):
        eng.join(row, sessions[row].streams["verifier"])
    with pytest.raises(StaticRowsFullError) as e:
        eng.join(3, sessions[3].streams["verifier"])
    assert "\n" not in str(e.value) and "raise max_rows" in str(e.value) and "3 static slots" in str(e.value)
    assert eng.rows == [0, 1, 2]
    short = StaticBatchEngine(tiny_pipe.verifier, "verifier", max_rows=2, max_len=sessions[0].streams["verifier"].length)
    with pytest.raises(StaticRowsFullError) as e:
        short.join(0, sessions[0].streams["verifier"])
    assert "\n" not in str(e.value) and "raise max_len" in str(e.value)
    room = 100 - max(eng.length(r) for r in eng.rows)
    with pytest.raises(StaticRowsFullError) as e:
        eng.extend({0: torch.arange(20, 20 + room + 1)})
    assert "\n" not in str(e.value) and "raise max_len" in str(e.value)
    assert eng.extend({r: torch.tensor([21]) for r in eng.rows})  # still decodes
    eng.leave(1)
    eng.join(3, sessions[3].streams["verifier"])  # the freed slot takes the new row
    assert eng._slot[3] == 1


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="torch.compile's inductor needs a C compiler")
def test_compiled_decode_equals_eager(tiny_pipe):
    """compile_decode: 1- and 2-token forwards at the fixed batch max_rows (one graph each, no recompiles as the
    cursor, the rows and their lengths change) give the eager storage's logits; longer forwards run eager."""
    import warnings

    torch._dynamo.reset()
    sessions = [_session(tiny_pipe, 700 + i) for i in range(3)]
    model = tiny_pipe.verifier
    eager = StaticBatchEngine(model, "verifier", max_rows=4, max_len=128)
    compiled = StaticBatchEngine(model, "verifier", max_rows=4, max_len=128, compile_decode=True, compile_tokens=2)
    for row, s in enumerate(sessions):
        eager.join(row, s.streams["verifier"])
        compiled.join(row, s.streams["verifier"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fallback to eager would warn
        for rnd in range(8):
            n = 1 + rnd % 2 if rnd != 5 else 4
            ids = {r: torch.arange(30 + rnd, 30 + rnd + n) for r in eager.rows}
            want, got = eager.extend(ids), compiled.extend(ids)
            for r in ids:
                assert_logits_close(got[r], want[r], (rnd, r))
            eager.truncate(rnd % 3, eager.length(rnd % 3) - 1)
            compiled.truncate(rnd % 3, compiled.length(rnd % 3) - 1)
    assert compiled.compile_decode and compiled._compiled is not None


def test_bench_batch_sweep_on_static_rows(tiny_pipe):
    """``run_bench(batch_engine="static")``: generate_batch and the stepped decoder on static slots decode the sequential loop's tokens;
    the Markdown names the row storage."""
    from asymspec_mm.bench import run_bench
    from asymspec_mm.bench.report import batch_markdown

    fast = dict(reps=1, warmup=0, cases=1, max_new_tokens=5, prompt_lengths=(), k_values=(), probe_batching=False, progress=False)
    res = run_bench("random-tiny", pipeline=tiny_pipe, variants="", batch_sizes=(1, 3), batch_cases=4, batch_engine="static", **fast)
    bt = res["batching"]
    assert bt["batch_engine"] == "static" and bt["checks"]["same_tokens_as_sequential"]
    for name in ("floor", "asymspec"):
        per = bt["by_variant"][name]
        assert per["3"]["tokens_per_s"] > 0 and per["3"]["decode_tokens_per_s"] > 0 and per["3"]["full_rows"] == 3
    one = bt["by_variant"]["asymspec"]["1"]["storage_b1"]  # static slots at one row beside the sequential loop
    assert one["same_tokens"] and one["decode_tokens_per_s"] > 0 and one["ratio_to_sequential_decode"] > 0
    md = "\n".join(batch_markdown(bt))
    assert "Row storage: static" in md and "asymspec at B=1 on static rows (one slot)" in md


def test_a_compile_failure_falls_back_to_eager_once(tiny_pipe):
    """A compile that fails (here an unknown mode) warns once and the forward runs eager, with the eager logits."""
    s = _session(tiny_pipe, 900)
    eager = StaticBatchEngine(tiny_pipe.verifier, "verifier", max_rows=2, max_len=128)
    broken = StaticBatchEngine(tiny_pipe.verifier, "verifier", max_rows=2, max_len=128, compile_decode=True, compile_mode="no-such-mode")
    eager.join(0, s.streams["verifier"])
    broken.join(0, s.streams["verifier"])
    with pytest.warns(UserWarning, match="compiled decode failed"):
        got = broken.extend({0: torch.tensor([30])})
    assert_logits_close(got[0], eager.extend({0: torch.tensor([30])})[0], "fallback")
    assert not broken.compile_decode and broken.length(0) == eager.length(0)
    assert_logits_close(broken.extend({0: torch.tensor([31, 32])})[0], eager.extend({0: torch.tensor([31, 32])})[0], "after")


def test_generate_batch_on_static_rows_with_batched_prefill(tiny_pipe):
    """generate_batch takes the static factory too: the rows arrive through the batched, chunked prefill (RowContext
    joins) and each equals its request alone; a batch size above the storage's rows is refused in one line."""
    from asymspec_mm.base.errors import UnknownOptionError

    cases = [make_case(470 + i) for i in range(4)]
    reqs = [{k: c[k] for k in ("image", "question", "caption", "ocr")} for c in cases]
    factory = static_batch_engines(max_rows=4, max_len=1024)
    got = tiny_pipe.generate_batch(reqs, config=CFG, batch_size=4, batch_engines=factory, prefill_chunk_tokens=32)
    assert [g.token_ids for g in got] == [tiny_pipe.generate(**r, config=CFG).token_ids for r in reqs]
    assert max(g.stats["batch_size"] for g in got) > 1
    with pytest.raises(UnknownOptionError, match="max_rows=4: lower max_batch_size or raise max_rows"):
        tiny_pipe.generate_batch(reqs, config=CFG, batch_size=8, batch_engines=factory)
