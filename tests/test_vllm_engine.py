"""The vLLM backend: :class:`asymspec_mm.engines.vllm.VLLMEngine` against the transformers engines.

The vLLM tests need vLLM, which lives in its own venv (vLLM's CPU build pins a CPU torch):

    bash scripts/vllm_venv.sh && .venv-vllm/bin/python -m pytest tests/test_vllm_engine.py -q

Elsewhere they are skipped with that reason (shown by ``-ra``); the error-path tests run everywhere.
Models: a tiny random Qwen3 verifier (head_dim 32, as CPU attention needs) and a correlated tiny Qwen3
text drafter, built here with the project's tokenizer and configs, fp32, so logits agree to 1e-4; and
for the drafter's streams a tiny random Qwen3-VL drafter with its correlated Qwen3 verifier
(``asymspec_mm.checkpoints.small.build_tiny_checkpoints``), loaded by ``AsymSpecPipeline.from_pretrained`` with
every stream on vLLM.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import types

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if HAVE_VLLM:
    # vLLM's CPU build: a small KV cache, the engine in this process, one OpenMP thread (set before vLLM loads).
    for _k, _v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("OMP_NUM_THREADS", "1")):
        os.environ.setdefault(_k, _v)

import torch  # noqa: E402

from asymspec_mm.base.errors import AsymSpecError  # noqa: E402
from asymspec_mm.checkpoints.small import build_text_pair  # noqa: E402
from asymspec_mm.engines.vllm import SUPPORTED_VLLM, VLLMUnavailableError, check_vllm, vllm_llm  # noqa: E402

_SKIP_REASON = ""
if not HAVE_VLLM:
    _SKIP_REASON = (
        "vLLM is not installed in this environment: run `bash scripts/vllm_venv.sh && "
        ".venv-vllm/bin/python -m pytest tests/test_vllm_engine.py` (CI does)"
    )
else:
    try:
        check_vllm()
    except VLLMUnavailableError as exc:  # installed but unusable: say why
        _SKIP_REASON = str(exc)

if _SKIP_REASON and os.environ.get("ASYMSPEC_REQUIRE_VLLM", "") not in ("", "0"):
    # CI runs this file in the vLLM venv with ASYMSPEC_REQUIRE_VLLM=1: a broken venv fails, never skips.
    raise RuntimeError(f"ASYMSPEC_REQUIRE_VLLM is set but vLLM is unusable: {_SKIP_REASON}")


def needs_vllm(test):
    return pytest.mark.vllm(pytest.mark.skipif(bool(_SKIP_REASON), reason=_SKIP_REASON or "vLLM available")(test))


BLOCK = 32
LLM_KW = dict(dtype="float32", enforce_eager=True, block_size=BLOCK, max_model_len=1024, seed=0)
ATOL = RTOL = 1e-4
CHUNK = 64  # the verifier LLM's max_num_batched_tokens
GAMMA = 1.0  # with these correlated models the gate then both accepts and rejects


# ------------------------------------------------------------------ error paths (no vLLM needed)
def test_missing_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(VLLMUnavailableError, match="vllm_venv.sh"):
        check_vllm()


@pytest.mark.parametrize("version", ["0.10.2", "0.30.0", "1.0.0"])
def test_unsupported_version_is_a_clear_error(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))
    monkeypatch.delenv("ASYMSPEC_VLLM_ALLOW_UNSUPPORTED", raising=False)
    with pytest.raises(VLLMUnavailableError, match=f"vLLM {version} is installed"):
        check_vllm()
    assert check_vllm(allow_unsupported=True) == version
    monkeypatch.setenv("ASYMSPEC_VLLM_ALLOW_UNSUPPORTED", "1")
    assert check_vllm() == version


def test_supported_version_passes(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.0"))
    assert check_vllm() == "0.32.0"
    assert SUPPORTED_VLLM == (">=0.31", "<0.33")


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"enable_prefix_caching": False}, "prefix caching"),
        ({"worker_extension_cls": "my.Ext"}, "worker_extension_cls"),
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size"),
    ],
)
def test_options_that_break_the_engine_are_refused(kw, match):
    with pytest.raises(AsymSpecError, match=match):
        vllm_llm("unused", **kw)


# ------------------------------------------------------------------ the worker hook, on fake runners (no vLLM needed)
def _fake_step(reqs, layout, hidden_size=4):
    """A scheduler output and hidden states for one step. ``reqs``: new requests
    ``(req_id, num_computed, extra or None)``; ``layout``: ``[(req_id, n_scheduled)]`` in row order."""
    new = [
        types.SimpleNamespace(
            req_id=r, num_computed_tokens=c, sampling_params=types.SimpleNamespace(extra_args={"asymspec": e} if e else None)
        )
        for r, c, e in reqs
    ]
    sched = types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new, num_scheduled_tokens={r: n for r, n in layout})
    total = sum(n for _, n in layout)
    hidden = torch.arange(total * hidden_size, dtype=torch.float32).view(total, hidden_size)
    return sched, hidden


class _FakeRunner:
    """The parts of vLLM's V1 / V2 model runners the hook reads."""

    def __init__(self, v2: bool):
        self.v2 = v2
        self.model = types.SimpleNamespace(compute_logits=lambda h: torch.cat([h, -h], dim=-1))  # [m, 2H]
        self.steps = []
        self.execute_model_state = None

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        if dummy_run:
            return None
        order, hidden = self.steps.pop(0)
        batch = types.SimpleNamespace(req_ids=order + [None], num_reqs=len(order))
        if self.v2:  # V2: the batch travels in the state
            self.execute_model_state = types.SimpleNamespace(hidden_states=hidden, input_batch=batch)
        else:  # V1: a NamedTuple without the batch; the runner's persistent input_batch has the order
            self.execute_model_state = types.SimpleNamespace(hidden_states=hidden)
            self.input_batch = batch
        return None


@pytest.mark.parametrize("v2", [False, True], ids=["v1-runner", "v2-runner"])
def test_hook_maps_rows_to_positions(v2):
    from asymspec_mm.engines.vllm import AsymSpecWorkerExtension

    worker = AsymSpecWorkerExtension()
    worker.model_runner = runner = _FakeRunner(v2)
    assert worker.asymspec_install()["installed"] and worker.asymspec_install()["installed"]  # idempotent
    # step 1: an untracked request (3 rows) before ours; ours starts at position 64 (cache hit), wants >= 66,
    # and is chunked: 5 rows now (64..68), 3 in the next step (69..71)
    sched, hidden = _fake_step([("other", 0, None), ("ours", 64, {"key": "k1", "from": 66})], [("other", 3), ("ours", 5)])
    runner.steps.append((["other", "ours"], hidden))
    runner.execute_model(sched)
    runner.execute_model(None, dummy_run=True)  # ignored
    sched2, hidden2 = _fake_step([], [("ours", 3)])
    if v2:  # the scheduler's own count for a continuing request (V1-shaped runs rely on the hook's count)
        sched2.scheduled_cached_reqs = types.SimpleNamespace(req_ids=["ours"], num_computed_tokens=[69])
    runner.steps.append((["ours"], hidden2))
    runner.execute_model(sched2)
    first, positions, logits = worker.asymspec_take("k1")
    assert first == 64 and positions == list(range(66, 72))
    expect_hidden = torch.cat([hidden[3 + 2 : 3 + 5], hidden2])  # rows of positions 66..68, then 69..71
    torch.testing.assert_close(logits, torch.cat([expect_hidden, -expect_hidden], dim=-1))
    assert worker.asymspec_take("k1") is None and worker.asymspec_pending() == 0
    # a finished request is forgotten; a fully cached request leaves an entry with no rows
    sched3, hidden3 = _fake_step([("late", 40, {"key": "k2", "from": 30})], [("late", 1)])
    sched3.finished_req_ids = {"ours"}
    runner.steps.append((["late"], hidden3))
    runner.execute_model(sched3)
    assert "ours" not in runner._asymspec_tracked
    first, positions, logits = worker.asymspec_take("k2")
    assert first == 40 and positions == [40] and logits.shape == (1, 8)
    # a failure inside the hook does not break vLLM's step; the engine's take raises with its message
    sched4, hidden4 = _fake_step([("bad", 0, {"key": "k3", "from": 0})], [("bad", 2)])
    runner.steps.append((["bad"], hidden4))
    runner.model.compute_logits = lambda h: 1 / 0
    runner.execute_model(sched4)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        worker.asymspec_take("k3")


# ------------------------------------------------------------------ fixtures (vLLM)
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if _SKIP_REASON:
        pytest.skip(_SKIP_REASON)
    drafter, verifier, (d_dir, v_dir) = build_text_pair(tmp_path_factory.mktemp("vllm_pair"))
    from asymspec_mm.engines.vllm import VLLMModel

    # What the pipeline creates for verifier_backend="vllm"; a small per-step token budget, so that long
    # prefills and extends are split over several vLLM steps (chunked prefill) in every test below.
    # One LLM per model for the whole module: in-process LLMs share vLLM's global distributed state,
    # and shutting one down (garbage collection) tears it down for the others.
    served = VLLMModel.from_pretrained(v_dir, **LLM_KW, max_num_batched_tokens=CHUNK)
    llm_d = vllm_llm(d_dir, **LLM_KW)  # a second LLM in the same process: the drafter's compressed stream
    return types.SimpleNamespace(
        drafter=drafter, verifier=verifier, served=served, llm_v=served.llm, llm_d=llm_d, vocab=verifier.config.vocab_size, v_dir=v_dir
    )


def _engines(pair, name="verifier"):
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm import VLLMEngine

    return TextEngine(pair.verifier, name=name), VLLMEngine(pair.llm_v, name=name)


# ------------------------------------------------------------------ engine equality
@needs_vllm
def test_served_model_stands_in_for_the_transformers_verifier(pair):
    from asymspec_mm.engines.vllm import VLLMEngine, logit_width

    served = pair.served
    assert served.eval() is served
    assert logit_width(served) == logit_width(pair.verifier) == pair.vocab
    assert served.config.vocab_size == pair.vocab and served.max_model_len == LLM_KW["max_model_len"]
    assert served.generation_config is not None
    eng = served.engine("verifier")
    assert isinstance(eng, VLLMEngine) and eng.name == "verifier" and eng.length == 0
    assert eng.device.type == "cpu"  # logits come back where the loop can use them


@needs_vllm
def test_logits_equal_transformers_over_40_accept_reject_rounds(pair):
    rng = random.Random(0)
    ref, eng = _engines(pair)
    prompt = torch.tensor([rng.randrange(pair.vocab) for _ in range(77)])
    ref.prefill(prompt[:-1])
    eng.prefill(prompt[:-1])
    assert eng.length == ref.length == 76
    pending = prompt[-1:]
    for step in range(40):
        k = rng.randint(1, 6)
        x = torch.cat([pending, torch.tensor([rng.randrange(pair.vocab) for _ in range(k)])])
        base, computed = ref.length, eng.tokens_computed
        want, got = ref.extend(x), eng.extend(x)
        assert got.shape == want.shape == (k + 1, pair.vocab)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=lambda m, step=step: f"step {step}: {m}")
        # O(K): vLLM recomputed only the last partial cache block and the new tokens, never the prompt.
        assert eng.tokens_computed - computed <= BLOCK - 1 + k + 1
        keep = rng.randint(0, k) + 1  # accepted drafts + the pending token
        ref.truncate(base + keep)
        eng.truncate(base + keep)
        assert eng.length == ref.length
        pending = torch.tensor([rng.randrange(pair.vocab)])
    assert eng.forward_calls == 41 and eng.cache_rerequests == 0
    assert eng.tokens_computed < prompt.numel() + 40 * (BLOCK + 7)
    assert pair.llm_v.collective_rpc("asymspec_pending") == [0]  # every captured row was collected


@needs_vllm
def test_rows_served_from_the_prefix_cache_are_recovered(pair):
    """Re-extending identical tokens after a rollback: vLLM serves the block from its cache and does
    not recompute the rows; the engine keeps them from the previous call, or re-requests."""
    rng = random.Random(1)
    ref, eng = _engines(pair)
    prompt = torch.tensor([rng.randrange(pair.vocab) for _ in range(50)])
    ref.prefill(prompt)
    eng.prefill(prompt)
    x = torch.tensor([rng.randrange(pair.vocab) for _ in range(40)])  # spans a whole 32-token block
    want = ref.extend(x)
    torch.testing.assert_close(eng.extend(x), want, atol=ATOL, rtol=RTOL)
    eng.truncate(50)
    torch.testing.assert_close(eng.extend(x), want, atol=ATOL, rtol=RTOL)
    assert eng.rows_reused > 0 and eng.cache_rerequests == 0
    eng.truncate(50)
    eng.row_memory = ([], {})  # nothing to reuse: the engine must re-request under a fresh cache salt
    torch.testing.assert_close(eng.extend(x), want, atol=ATOL, rtol=RTOL)
    assert eng.cache_rerequests == 1
    # two streams of one LLM with the same prompt do not share blocks (each has its own salt)
    other = type(eng)(pair.llm_v, name="other")
    other.prefill(prompt)
    before = other.tokens_computed
    torch.testing.assert_close(other.extend(x), want, atol=ATOL, rtol=RTOL)
    assert other.cache_rerequests == 0 and other.tokens_computed - before >= 40
    # share_prefix: no per-stream namespace, so a second stream finds the first's blocks and must re-request
    shared = [type(eng)(pair.llm_v, name=f"shared{i}", share_prefix=True) for i in range(2)]
    for s in shared:
        s.prefill(prompt)
        torch.testing.assert_close(s.extend(x), want, atol=ATOL, rtol=RTOL)
    assert shared[0].cache_rerequests == 0 and shared[1].cache_rerequests == 1


@needs_vllm
def test_extend_split_over_several_vllm_steps(pair):
    """An extend longer than vLLM's token budget per step is prefilled in chunks; rows of every chunk come back."""
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm import VLLMEngine

    assert pair.llm_v.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens == CHUNK
    rng = random.Random(3)
    ref, eng = TextEngine(pair.verifier), VLLMEngine(pair.llm_v)
    prompt = torch.tensor([rng.randrange(pair.vocab) for _ in range(150)])
    ref.prefill(prompt)
    eng.prefill(prompt)
    for n in (100, 3, 70):
        x = torch.tensor([rng.randrange(pair.vocab) for _ in range(n)])
        torch.testing.assert_close(eng.extend(x), ref.extend(x), atol=ATOL, rtol=RTOL)
    assert eng.cache_rerequests == 0 and pair.llm_v.collective_rpc("asymspec_pending") == [0]


@needs_vllm
def test_context_window_is_checked(pair):
    from asymspec_mm.base.errors import ContextOverflowError

    _, eng = _engines(pair)
    eng.prefill(torch.zeros(1020, dtype=torch.long))
    with pytest.raises(ContextOverflowError, match="max_model_len"):
        eng.extend(torch.zeros(5, dtype=torch.long))
    assert eng.length == 1020


# ------------------------------------------------------------------ tensor parallelism (vLLM's own)
_TP_CHECK = r"""
import json, random, sys
import torch
from transformers import AutoModelForCausalLM
from asymspec_mm.engines import TextEngine
from asymspec_mm.engines.vllm import VLLMEngine, vllm_llm

v_dir, block = sys.argv[1], int(sys.argv[2])
llm = vllm_llm(v_dir, dtype="float32", enforce_eager=True, block_size=block, max_model_len=1024, seed=0,
               tensor_parallel_size=2, distributed_executor_backend="mp", max_num_batched_tokens=64)
ranks = llm.collective_rpc("asymspec_install")
ref = TextEngine(AutoModelForCausalLM.from_pretrained(v_dir, dtype=torch.float32).eval())
eng = VLLMEngine(llm)
rng = random.Random(7)
vocab = ref.model.config.vocab_size
prompt = torch.tensor([rng.randrange(vocab) for _ in range(90)])
ref.prefill(prompt[:-1]); eng.prefill(prompt[:-1])
pending, worst, steps = prompt[-1:], 0.0, []
for step in range(12):
    k = rng.randint(1, 6)
    x = torch.cat([pending, torch.tensor([rng.randrange(vocab) for _ in range(k)])])
    base, computed = ref.length, eng.tokens_computed
    want, got = ref.extend(x), eng.extend(x)
    assert got.shape == want.shape, (got.shape, want.shape)
    worst = max(worst, (got - want).abs().max().item())
    steps.append(eng.tokens_computed - computed - (k + 1))
    keep = rng.randint(0, k) + 1
    ref.truncate(base + keep); eng.truncate(base + keep)
    pending = torch.tensor([rng.randrange(vocab)])
print("ASYMSPEC_TP " + json.dumps({"ranks": len(ranks), "max_abs_diff": worst, "extra_recomputed": max(steps),
                                   "rerequests": eng.cache_rerequests, "pending": llm.collective_rpc("asymspec_pending")}))
"""


@needs_vllm
def test_tensor_parallel_2_on_cpu_equals_transformers(pair):
    """tensor_parallel_size=2 on vLLM's CPU build (mp executor: two worker processes, the hook on both ranks,
    the logits gathered on rank 0): the same logits as transformers. In a subprocess, so that the TP workers
    do not share this process's vLLM state. VLLM_CPU_OMP_THREADS_BIND=nobind: vLLM's automatic thread binding
    wants one NUMA node per rank."""
    import json
    import subprocess

    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _TP_CHECK, str(pair.v_dir), str(BLOCK)], env=env, capture_output=True, text=True, timeout=560
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ASYMSPEC_TP ")]
    assert proc.returncode == 0 and lines, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    res = json.loads(lines[-1].removeprefix("ASYMSPEC_TP "))
    assert res["ranks"] == 2 and res["pending"] == [0, 0] and res["rerequests"] == 0
    assert res["max_abs_diff"] <= ATOL, res
    assert res["extra_recomputed"] <= BLOCK - 1, res  # O(K) per step under TP as well


# ------------------------------------------------------------------ the AsymSpec loop, unchanged
def _run_loop(pair, method, verifier_on_vllm, comp_on_vllm, seed):
    from asymspec_mm.decode import AsymSpecConfig, Counters, asymspec_steps, greedy_steps, sd_steps
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm import VLLMEngine

    rng = random.Random(100 + seed)
    full_prompt = torch.tensor([rng.randrange(pair.vocab) for _ in range(rng.randint(40, 90))])
    text_prompt = torch.tensor([rng.randrange(pair.vocab) for _ in range(rng.randint(20, 70))])
    full = TextEngine(pair.drafter, name="drafter_full")
    comp = VLLMEngine(pair.llm_d, name="drafter_comp") if comp_on_vllm else TextEngine(pair.drafter, name="drafter_comp")
    ver = VLLMEngine(pair.llm_v, name="verifier") if verifier_on_vllm else TextEngine(pair.verifier, name="verifier")
    full.prefill(full_prompt[:-1])
    comp.prefill(text_prompt[:-1])
    ver.prefill(text_prompt[:-1])
    cfg = AsymSpecConfig(k=4, max_new_tokens=48, trace_top=3, gamma=GAMMA)
    streams = {"drafter_full": full, "drafter_comp": comp, "verifier": ver}
    counters = Counters(cfg.k, streams)
    if method == "asymspec":
        steps = asymspec_steps(full, comp, ver, (full_prompt[-1:], text_prompt[-1:], text_prompt[-1:]), cfg, set(), counters=counters)
    elif method == "sd":
        steps = sd_steps(comp, ver, (text_prompt[-1:], text_prompt[-1:]), cfg, set(), counters=counters)
    else:
        steps = greedy_steps(ver, text_prompt[-1:], cfg, set(), counters=counters, is_verifier=True)
    events = [ev for step in steps for ev in step]
    return events, counters.as_dict()


def _summary(events):
    return [(ev.token_id, ev.source, ev.step, ev.verifier_argmax, ev.draft_token, [t for t, _ in ev.top_verifier]) for ev in events]


@needs_vllm
@pytest.mark.parametrize("method", ["asymspec", "sd", "floor"])
def test_loop_emits_identical_tokens_with_the_verifier_on_vllm(pair, method):
    sources = set()
    for seed in range(3):
        ref, ref_stats = _run_loop(pair, method, verifier_on_vllm=False, comp_on_vllm=False, seed=seed)
        got, got_stats = _run_loop(pair, method, verifier_on_vllm=True, comp_on_vllm=False, seed=seed)
        assert _summary(got) == _summary(ref), f"seed {seed}"
        for a, b in zip(got, ref):
            for x, y in ((a.p_verifier, b.p_verifier), (a.p_base, b.p_base), (a.jsd, b.jsd)):
                assert (x is None) == (y is None) and (x is None or abs(x - y) < 1e-4)
        assert got_stats["accepted"] == ref_stats["accepted"] and got_stats["steps"] == ref_stats["steps"]
        sources |= {ev.source for ev in got}
    if method != "floor":  # drafts were accepted, rejected (fused / SD: corrected) and fully accepted (bonus)
        assert {"accepted", "fused" if method == "asymspec" else "corrected", "bonus"} <= sources, sources


@needs_vllm
def test_loop_identical_with_verifier_and_drafter_comp_on_vllm(pair):
    for seed in range(2):
        ref, _ = _run_loop(pair, "asymspec", verifier_on_vllm=False, comp_on_vllm=False, seed=seed)
        got, _ = _run_loop(pair, "asymspec", verifier_on_vllm=True, comp_on_vllm=True, seed=seed)
        assert _summary(got) == _summary(ref), f"seed {seed}"
    assert pair.llm_d.collective_rpc("asymspec_pending") == [0]


# ------------------------------------------------------------------ the drafter's streams (Qwen3-VL) on vLLM
VL_MAX_PIXELS = 256 * 256  # room for images of more than one cache block of image tokens


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    """A tiny Qwen3-VL drafter + correlated Qwen3 verifier, loaded twice through the real path: all on
    transformers (the reference) and with every stream on vLLM (verifier, drafter compressed + full view)."""
    if _SKIP_REASON:
        pytest.skip(_SKIP_REASON)
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.checkpoints.small import build_tiny_checkpoints

    dirs = build_tiny_checkpoints(tmp_path_factory.mktemp("vllm_vl"), max_pixels=VL_MAX_PIXELS)
    ref = AsymSpecPipeline.from_pretrained(*dirs, ocr="none")
    pipe = AsymSpecPipeline.from_pretrained(
        *dirs, ocr="none", verifier_backend="vllm", drafter_backend="vllm", vllm_kwargs=LLM_KW, drafter_vllm_kwargs=LLM_KW
    )
    return types.SimpleNamespace(
        ref=ref,
        pipe=pipe,
        drafter=ref.drafter,
        served=pipe.drafter_comp,
        llm=pipe.drafter_comp.llm,
        vocab=ref.drafter.config.text_config.vocab_size,
    )


def _full_view(vl, seed, size=(256, 160)):
    """(prompt ids [L] with expanded image pads, mm types, vision features, PIL image) of one request."""
    from conftest import make_case, make_image

    from asymspec_mm.request.prompts import build_prompts

    case = make_case(seed)
    image = make_image(seed, size)
    p = build_prompts(vl.ref.processor, vl.ref.verifier_tokenizer, image, case["caption"], case["question"])
    features, _ = vl.ref.encoder.encode(p.pixel_values, p.image_grid_thw)
    return p.drafter_full_ids[0], p.mm_token_type_ids[0], features, image


def _accept_reject_rounds(ref, eng, pending, vocab, rounds, rng):
    """Random K-token extends and rollbacks on both engines; logits equal at every step, O(K) work in vLLM."""
    for step in range(rounds):
        k = rng.randint(1, 6)
        x = torch.cat([pending, torch.tensor([rng.randrange(vocab) for _ in range(k)])])
        base, computed = ref.length, eng.tokens_computed
        want, got = ref.extend(x), eng.extend(x)
        assert got.shape == want.shape == (k + 1, vocab)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=lambda m, step=step: f"step {step}: {m}")
        assert eng.tokens_computed - computed <= BLOCK - 1 + k + 1  # never the prompt (nor the image) again
        keep = rng.randint(0, k) + 1
        ref.truncate(base + keep)
        eng.truncate(base + keep)
        assert eng.length == ref.length
        pending = torch.tensor([rng.randrange(vocab)])


@needs_vllm
def test_drafter_comp_stream_on_vllm_equals_transformers(vl):
    """The Qwen3-VL drafter's text-only stream: vLLM (text positions on all three M-RoPE axes) vs VLEngine."""
    from asymspec_mm.engines import VLEngine
    from asymspec_mm.engines.vllm import VLLMEngine

    assert vl.served.logit_width == vl.vocab and vl.served.accepts_images
    rng = random.Random(5)
    ref, eng = VLEngine(vl.drafter, name="drafter_comp"), vl.served.engine("drafter_comp")
    assert type(eng) is VLLMEngine
    prompt = torch.tensor([rng.randrange(vl.vocab) for _ in range(77)])
    ref.prefill(prompt[:-1])
    eng.prefill(prompt[:-1])
    _accept_reject_rounds(ref, eng, prompt[-1:], vl.vocab, 40, rng)
    assert eng.cache_rerequests == 0 and vl.llm.collective_rpc("asymspec_pending") == [0]


@needs_vllm
def test_drafter_full_view_on_vllm_equals_transformers(vl):
    """The image stream: vLLM's own processor, vision tower and M-RoPE positions vs VLEngine with the
    transformers drafter's cached vision features, over 40 accept/reject rounds per image."""
    from asymspec_mm.engines import VLEngine
    from asymspec_mm.engines.vllm import VLLMVLEngine

    image_id = vl.drafter.config.image_token_id
    for seed, size in ((1, (72, 136)), (0, (256, 160))):  # the last one is used below
        ids, mm_types, features, image = _full_view(vl, seed, size)
        n_image = int((ids == image_id).sum())
        assert n_image == features.num_tokens and (seed or n_image > BLOCK)  # the first image spans > 1 cache block
        rng = random.Random(10 + seed)
        ref, eng = VLEngine(vl.drafter, name="drafter_full"), vl.served.vision_engine()
        assert isinstance(eng, VLLMVLEngine)
        ref.prefill_features(ids[:-1], mm_types[:-1], features)
        eng.prefill(ids[:-1], [image])
        assert eng.length == ref.length == ids.numel() - 1 and eng.tokens == ids[:-1].tolist()
        assert eng.tokens_computed == ids.numel() - 1  # first time: prompt and image computed once
        _accept_reject_rounds(ref, eng, ids[-1:], vl.vocab, 40, rng)
        assert eng.cache_rerequests == 0
    # the same prompt given with one unexpanded pad; a second stream on the same image (own namespace)
    other = vl.served.vision_engine("other")
    prompt = ids[:-1].tolist()
    collapsed = [t for i, t in enumerate(prompt) if not (t == image_id and i and prompt[i - 1] == image_id)]
    assert len(collapsed) == len(prompt) - n_image + 1
    other.prefill(torch.tensor(collapsed), image)
    assert other.tokens == ids[:-1].tolist()
    x = torch.cat([ids[-1:], torch.tensor([rng.randrange(vl.vocab) for _ in range(40)])])  # > one block
    ref.truncate(ids.numel() - 1)
    want = ref.extend(x)
    torch.testing.assert_close(other.extend(x), want, atol=ATOL, rtol=RTOL)
    # rows served from the prefix cache: taken from the previous call, or recomputed under a fresh salt
    other.truncate(ids.numel() - 1)
    torch.testing.assert_close(other.extend(x), want, atol=ATOL, rtol=RTOL)
    assert other.rows_reused > 0 and other.cache_rerequests == 0
    other.truncate(ids.numel() - 1)
    other.row_memory = ([], {})
    torch.testing.assert_close(other.extend(x), want, atol=ATOL, rtol=RTOL)
    assert other.cache_rerequests == 1
    with pytest.raises(ValueError, match="cannot truncate into the prompt"):
        other.truncate(5)
        other.extend(x[:1])
    with pytest.raises(ValueError, match="1 image placeholder"):
        vl.served.vision_engine().prefill(ids[:-1], [image, image])
    assert vl.llm.collective_rpc("asymspec_pending") == [0]


def _generate_both(ref, pipe, cfg, seeds=range(2), methods=("asymspec", "sd", "floor", "drafter")):
    """``(seed, method, ref's result, pipe's result)`` for the same case (image, question, caption, OCR)."""
    from conftest import make_case

    for seed in seeds:
        case = make_case(seed)
        kw = dict(caption=case["caption"], ocr=case["ocr"], config=cfg)
        for method in methods:
            yield (
                seed,
                method,
                ref.generate(case["image"], case["question"], method=method, **kw),
                pipe.generate(case["image"], case["question"], method=method, **kw),
            )


@needs_vllm
def test_pipeline_with_every_stream_on_vllm_emits_identical_tokens(vl):
    """AsymSpecPipeline.from_pretrained(verifier_backend="vllm", drafter_backend="vllm"): the verifier and both
    drafter streams on vLLM, the same tokens as the transformers pipeline for every method."""
    from asymspec_mm import AsymSpecConfig
    from asymspec_mm.engines.vllm import VLLMModel

    pipe, ref = vl.pipe, vl.ref
    assert isinstance(pipe.verifier, VLLMModel) and pipe.drafter_full is pipe.drafter_comp
    cfg = AsymSpecConfig(max_new_tokens=24, gamma=GAMMA)
    sources = set()
    for seed, method, a, b in _generate_both(ref, pipe, cfg):
        assert b.token_ids == a.token_ids, (seed, method)
        assert b.stats["accepted"] == a.stats["accepted"] and b.stats["steps"] == a.stats["steps"]
        assert a.stats["batch_size"] == b.stats["batch_size"] == 1, method  # both a row of an engine core: the direct path
        if method in ("asymspec", "drafter"):
            assert b.stats["vision_calls"] == 0  # the image went to vLLM, not through the transformers tower
        if method == "asymspec":
            sources |= {ev.source for ev in b.trace}
    assert {"accepted", "fused"} <= sources, sources
    assert pipe.drafter_comp.llm.collective_rpc("asymspec_pending") == [0]
    assert pipe.verifier.llm.collective_rpc("asymspec_pending") == [0]


@needs_vllm
def test_sampling_on_vllm_draws_the_transformers_tokens_for_the_same_seed(vl):
    """Sampling runs in this toolkit, on the logits vLLM returns (a sampled row drafts token by token instead of
    vLLM's greedy K-token drafting): the same seed gives the same tokens on both backends for every method (fp32)."""
    from asymspec_mm import AsymSpecConfig

    cfg = AsymSpecConfig(max_new_tokens=20, gamma=GAMMA, temperature=0.8, top_p=0.95, seed=11)
    seen = 0
    for seed, method, a, b in _generate_both(vl.ref, vl.pipe, cfg):
        assert b.token_ids == a.token_ids, (seed, method)
        assert a.stats["seed"] == b.stats["seed"] == 11
        seen += 1
    assert seen == 8
    assert vl.pipe.drafter_comp.llm.collective_rpc("asymspec_pending") == [0]


# ------------------------------------------------------------------ pipeline wiring (main venv, after the patch)
def _pipeline_takes_backends() -> str:
    """Why the wiring tests cannot run here ('' when they can)."""
    import inspect

    if importlib.util.find_spec("torchvision") is None:
        return "the tiny Qwen3-VL drafter's processor needs torchvision (absent in the vLLM CPU venv)"
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

    if "verifier_backend" not in inspect.signature(AsymSpecPipeline.from_pretrained).parameters:
        return "AsymSpecPipeline.from_pretrained has no verifier_backend yet (vllm_pipeline.patch not applied)"
    return ""


class _ServedByTransformers:
    """Stands in for VLLMModel (same attributes) with a transformers model behind it, so the pipeline's
    wiring is tested where vLLM is not installed; engine equality itself is tested above on vLLM."""

    def __init__(self, path, dtype, vl=False, **vllm_kwargs):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, GenerationConfig

        loader = AutoModelForImageTextToText if vl else AutoModelForCausalLM
        self.model = loader.from_pretrained(str(path), dtype=dtype).eval()
        self.vl, self.vllm_kwargs = vl, vllm_kwargs
        self.accepts_images = vl and bool(vllm_kwargs["limit_mm_per_prompt"].get("image", 1))
        self.processor = AutoProcessor.from_pretrained(str(path)) if self.accepts_images else None
        self.config = self.model.config
        self.generation_config = GenerationConfig.from_pretrained(str(path))
        self.name_or_path = str(path)
        self.logit_width = self.model.get_output_embeddings().weight.shape[0]
        self.max_model_len = vllm_kwargs.get("max_model_len", 4096)

    def eval(self):
        return self

    def engine(self, name="verifier"):
        from asymspec_mm.engines import TextEngine, VLEngine

        return (VLEngine if self.vl else TextEngine)(self.model, name=name)

    def vision_engine(self, name="drafter_full"):
        """VLLMVLEngine's interface (prefill(ids, images: PromptImages)) on transformers: the images through the processor
        and the drafter's tower, then a VLEngine."""
        from asymspec_mm.engines import VLEngine
        from vision_cache.features import VisionEncoder

        assert self.accepts_images
        model, processor, encoder = self.model, self.processor, VisionEncoder(self.model)

        class VisionStandIn(VLEngine):
            def prefill(self, ids, images):
                enc = processor.image_processor(images=images.images, return_tensors="pt")
                features, _ = encoder.encode(enc["pixel_values"], enc["image_grid_thw"])
                self.prefill_features(ids, (ids == model.config.image_token_id).long(), features)

        return VisionStandIn(model, name=name)


def test_pipeline_backend_options(request, monkeypatch):
    reason = _pipeline_takes_backends()
    if reason:
        pytest.skip(reason)
    tiny_dirs = request.getfixturevalue("tiny_dirs")  # after the skip: building it needs torchvision
    from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
    from asymspec_mm.base.errors import UnknownOptionError
    from asymspec_mm.engines import vllm as vllm_engine

    with pytest.raises(UnknownOptionError, match="verifier_backend"):
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", verifier_backend="sglang")
    with pytest.raises(UnknownOptionError, match="tensor_parallel_size"):
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", verifier_backend="vllm", verifier_device_map="auto")
    if not HAVE_VLLM:
        with pytest.raises(VLLMUnavailableError, match="vllm_venv.sh"):
            AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", verifier_backend="vllm")

    made = []

    def fake_from_pretrained(path, *, trust_remote_code=False, local_files_only=None, dtype=None, **kw):
        served = _ServedByTransformers(path, dtype, vl="limit_mm_per_prompt" in kw, **kw)
        made.append(served)
        return served

    monkeypatch.setattr(vllm_engine.VLLMModel, "from_pretrained", staticmethod(fake_from_pretrained))
    ref = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    pipe = AsymSpecPipeline.from_pretrained(
        *tiny_dirs,
        ocr="none",
        verifier_backend="vllm",
        drafter_backend="vllm",
        vllm_kwargs={"tensor_parallel_size": 1, "max_model_len": 2048},
    )
    assert made[0].vllm_kwargs == {"tensor_parallel_size": 1, "max_model_len": 2048}
    assert made[1].vllm_kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 0}
    assert pipe.verifier is made[0] and pipe.drafter_comp is made[1] and pipe.eos_ids == ref.eos_ids
    assert pipe.drafter_full is made[1]  # the served drafter takes images: the full-view stream runs there too
    comp_only = AsymSpecPipeline.from_pretrained(
        *tiny_dirs, ocr="none", drafter_backend="vllm", drafter_vllm_kwargs={"limit_mm_per_prompt": {"image": 0, "video": 0}}
    )
    assert comp_only.drafter_comp is made[2] and comp_only.drafter_full is None  # full view on transformers
    cfg = AsymSpecConfig(max_new_tokens=16)
    for seed, method, a, b in _generate_both(ref, pipe, cfg):
        assert b.token_ids == a.token_ids and b.stats["accepted"] == a.stats["accepted"], (seed, method)
    for seed, _, a, c in _generate_both(ref, comp_only, cfg, methods=("asymspec",)):
        assert c.token_ids == a.token_ids, seed
    assert pipe.complete("Say something", max_new_tokens=5) == ref.complete("Say something", max_new_tokens=5)


@needs_vllm
def test_a_cross_family_pair_on_vllm_is_refused_in_one_line():
    """The vocabulary map reaches the transformers streams only: a cross-family pair with a vLLM-served verifier is
    refused at load, naming the backend and what to do, rather than decoding without the map."""
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.base.errors import UnknownOptionError
    from asymspec_mm.pipeline.presets import TINY_DIR, TINY_XFAMILY_DIR

    with pytest.raises(UnknownOptionError) as err:
        AsymSpecPipeline.from_pretrained(
            TINY_DIR / "drafter", TINY_XFAMILY_DIR / "verifier", ocr="none", verifier_backend="vllm", vllm_kwargs=LLM_KW
        )
    assert str(err.value) == (
        "a cross-family pair (two vocabularies) decodes on the transformers backend only; the verifier is served by vLLM: "
        "load it with the transformers backend, or pair models of one vocabulary"
    )
