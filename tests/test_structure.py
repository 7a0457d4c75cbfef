"""The public extension points (prepare / run / engine factories / timer) and the defects the structure issue
fixed, each with a check that failed before its fix. Real forwards on the random tiny pair."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys

import pytest
import torch
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.config import METHODS
from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.base.gate import context_gain, gate_step
from asymspec_mm.decode import SOURCES, Counters, steps_for
from asymspec_mm.decode.stats import STOP_REASONS
from asymspec_mm.engines import StaticEngines, StaticTextEngine, StaticVLEngine, TextEngine, TransformersEngines
from asymspec_mm.frontend.variants import build_variants, parse_variant, parse_variants
from asymspec_mm.request.session import GenerationStream, Session


def _request(seed: int) -> tuple[tuple, dict]:
    case = make_case(seed)
    return (case["image"], case["question"]), {"caption": case["caption"], "ocr": case["ocr"]}


@pytest.mark.parametrize("method", METHODS)
def test_prepare_then_run_equals_generate(tiny_pipe, method):
    args, kw = _request(11)
    cfg = AsymSpecConfig(k=3, max_new_tokens=12)
    ref = tiny_pipe.generate(*args, method=method, config=cfg, **kw)
    session = tiny_pipe.prepare(*args, method=method, config=cfg, **kw, prefill=True)
    assert isinstance(session, Session) and session.method == method
    need = {
        "asymspec": {"drafter_full", "drafter_comp", "verifier"},
        "sd": {"drafter_comp", "verifier"},
        "floor": {"verifier"},
        "drafter": {"drafter_full"},
    }[method]
    assert set(session.streams) == need == set(session.pending)
    for name, engine in session.streams.items():  # prefilled: prompt[:-1] cached, the last token pending
        ids = getattr(session.prompts, f"{name}_ids")
        assert engine.length == ids.shape[1] - 1 and session.pending[name].tolist() == ids[0, -1:].tolist()
    stream = tiny_pipe.run(session)
    assert isinstance(stream, GenerationStream) and not stream.done
    steps = list(stream)
    assert stream.done and stream.result.token_ids == ref.token_ids == [ev.token_id for s in steps for ev in s]
    assert [ev.source for ev in stream.result.trace] == [ev.source for ev in ref.trace]


def test_stream_result_and_texts(tiny_pipe):
    args, kw = _request(12)
    ref = tiny_pipe.generate(*args, max_new_tokens=10, **kw)
    stream = tiny_pipe.stream(*args, max_new_tokens=10, **kw)
    pieces = list(stream.texts())
    assert "".join(pieces) == "".join(ev.text for ev in ref.trace) and stream.result.token_ids == ref.token_ids
    # .result alone decodes what is left
    assert tiny_pipe.stream(*args, max_new_tokens=10, **kw).result.token_ids == ref.token_ids


def test_engine_factory_and_ignore_eos(tiny_pipe):
    args, kw = _request(13)
    cfg = AsymSpecConfig(k=2, max_new_tokens=9)
    ref = tiny_pipe.generate(*args, config=cfg, **kw)
    session = tiny_pipe.prepare(*args, config=cfg, engines=StaticEngines(headroom=64), ignore_eos=True, **kw)
    assert isinstance(session.streams["verifier"], StaticTextEngine)
    assert isinstance(session.streams["drafter_full"], StaticVLEngine) and isinstance(session.streams["drafter_comp"], StaticVLEngine)
    assert session.eos_ids == set()
    res = tiny_pipe.run(session).result
    assert res.stats["new_tokens"] == 9 and res.stats["stopped_by"] == "max_new_tokens"
    n = len(ref.token_ids)
    assert res.token_ids[:n] == ref.token_ids  # the static engines decode the same tokens
    default = tiny_pipe.prepare(*args, config=cfg, engines=TransformersEngines(), **kw)
    assert type(default.streams["verifier"]) is TextEngine


def test_max_caption_chars_lifts_the_caption_budget(tiny_pipe):
    args, kw = _request(14)
    kw["caption"] = "word " * 600  # 3,000 characters, over the 1,600 budget
    short = tiny_pipe.prepare(*args, **kw, prefill=True)
    full = tiny_pipe.prepare(*args, max_caption_chars=10**6, **kw, prefill=True)
    assert len(short.view.caption) <= 1600 < len(full.view.caption) and full.view.caption.strip() == kw["caption"].strip()


def test_timer_wraps_gate_and_trace(tiny_pipe):
    args, kw = _request(15)
    entered: list[str] = []

    def timer(name):
        entered.append(name)
        return contextlib.nullcontext()

    res = tiny_pipe.run(tiny_pipe.prepare(*args, config=AsymSpecConfig(k=3, max_new_tokens=12), **kw, prefill=True), timer=timer).result
    gated = res.stats["bonus_drafted"]
    assert entered.count("gate") == entered.count("trace") == res.stats["steps"] + gated


def test_steps_for_runs_a_loop_on_given_streams(tiny_pipe):
    args, kw = _request(16)
    cfg = AsymSpecConfig(k=3, max_new_tokens=10)
    ref = tiny_pipe.generate(*args, method="sd", config=cfg, **kw)
    session = tiny_pipe.prepare(*args, method="sd", config=cfg, **kw, prefill=True)
    counters = Counters(cfg.k, session.streams)
    tokens = [
        ev.token_id for step in steps_for("sd", session.streams, session.pending, cfg, tiny_pipe.eos_ids, counters=counters) for ev in step
    ]
    assert tokens == ref.token_ids and counters.as_dict()["steps"] == ref.stats["steps"]
    with pytest.raises(UnknownOptionError, match="method='beam'"):
        steps_for("beam", session.streams, session.pending, cfg, set())


def test_sd_correction_is_not_called_fused(tiny_pipe):
    """SD's token at a mismatch is the verifier's own (no fusion): source 'corrected', with the rejected draft."""
    corrected = 0
    for seed in range(4):
        args, kw = _request(seed)
        res = tiny_pipe.generate(*args, method="sd", config=AsymSpecConfig(k=3, max_new_tokens=14), **kw)
        assert {ev.source for ev in res.trace} <= {"accepted", "corrected", "bonus"}
        for ev in res.trace:
            if ev.source == "corrected":
                corrected += 1
                assert ev.token_id == ev.verifier_argmax and ev.draft_token is not None and ev.draft_token != ev.token_id
    assert corrected > 0 and set(SOURCES) >= {"accepted", "fused", "bonus", "corrected", "greedy"}


def test_gated_bonus_counted_apart_from_the_k_positions(tiny_pipe):
    """acceptance_rate and accepted_per_position describe the same K drafts under both bonus rules; the gated
    bonus is put to the gate once per step with K acceptances and counted in bonus_drafted / bonus_accepted."""
    seen_bonus = 0
    for seed in range(4):
        args, kw = _request(seed)
        k = 2
        s = tiny_pipe.generate(*args, config=AsymSpecConfig(k=k, gamma=0.2, bonus="gated", max_new_tokens=16), **kw).stats
        assert s["drafted"] == k * s["steps"] and s["accepted"] == sum(s["accepted_per_position"])
        assert s["acceptance_rate"] == pytest.approx(sum(s["accepted_per_position"]) / (k * s["steps"]))
        assert s["bonus_drafted"] == s["accepted_per_position"][k - 1]
        assert 0 <= s["bonus_accepted"] <= s["bonus_drafted"]
        assert s["stopped_by"] in STOP_REASONS
        seen_bonus += s["bonus_drafted"]
    assert seen_bonus > 0


def test_mm_generate_honours_the_preset_on_every_call():
    from asymspec_mm import mm_generate
    from asymspec_mm.eval.mathvista import load_minivista_problems

    problem = load_minivista_problems(1, seed=0)[0]
    first = mm_generate(problem["decoded_image"], problem["query"], preset="tiny", caption="", ocr=False, max_new_tokens=4)
    assert first.token_ids
    with pytest.raises(UnknownOptionError):  # was: the cached tiny pipeline answered, ignoring the preset
        mm_generate(problem["decoded_image"], problem["query"], preset="no-such-preset", caption="", ocr=False)


def test_masked_logits_never_give_nan_or_win_fusion():
    """-inf entries in a, b and t: delta stays finite, no NaN, a token the verifier masks never wins, and rows
    without masks are unchanged (equal to t + beta * (a - b))."""
    gen = torch.Generator().manual_seed(0)
    a, b, t = (torch.randn(4, 11, generator=gen) for _ in range(3))
    plain = gate_step(a.clone(), b.clone(), t.clone(), a.argmax(-1))
    ninf = float("-inf")
    a[0, 3] = ninf  # masked in the drafter's full view only
    b[1, 5] = ninf  # masked in the compressed view only (a - b = +inf)
    a[2, 7] = b[2, 7] = ninf  # masked in both (a - b = NaN)
    t[1, 5] = ninf  # the verifier masks the token b masks: it must not win although a - b = +inf
    t[2, 2] = ninf
    delta = context_gain(a, b, t, "contrast")
    assert torch.isfinite(delta).all()
    for row in range(3):
        assert delta[row][~torch.isfinite(a[row] - b[row])].eq(0).all()
    drafts = torch.tensor([0, 1, 2, 4])
    g = gate_step(a, b, t, drafts, beta=2.0)
    assert not torch.isnan(g.fused_logits).any() and not torch.isnan(g.jsd).any() and not torch.isnan(g.p_base).any()
    assert g.fused[1] != 5 and g.fused[2] != 2
    assert torch.isneginf(g.fused_logits[1, 5]) and torch.isneginf(g.fused_logits[2, 2])
    expected = t[3] + 2.0 * (a[3] - b[3])
    assert torch.equal(g.fused_logits[3], expected) and torch.equal(plain.fused_logits[3], t[3] + 1.0 * (a[3] - b[3]))


@pytest.mark.parametrize("field", ["beta", "gamma", "lam"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_options_refused(field, value):
    with pytest.raises(UnknownOptionError, match=f"{field}=.*finite"):
        AsymSpecConfig(**{field: value}).validated()


@pytest.mark.parametrize("flag", ["--beta", "--gamma", "--lam"])
def test_cli_refuses_nan_before_loading_models(flag):
    proc = subprocess.run(
        [sys.executable, "-m", "asymspec_mm.cli", "generate", "--image", "x.png", "--question", "q", flag, "nan"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "is not a finite number" in proc.stderr and "Traceback" not in proc.stderr


def test_one_variant_grammar():
    assert [v.name for v in parse_variants("floor,asymspec@gate=fixed,beta=0;sd,asymspec:bonus=gated,fixed")] == [
        "floor",
        "asymspec@gate=fixed,beta=0",
        "sd",
        "asymspec@bonus=gated",
        "fixed",
    ]
    v = parse_variant("asymspec@gate=fixed,beta=0.5,k=2")
    assert (v.method, dict(v.config)) == ("asymspec", {"gate": "fixed", "beta": 0.5, "k": 2})
    assert parse_variant("asymspec@beta=0").config == parse_variant("beta0").config == {"beta": 0.0}
    assert v.apply(AsymSpecConfig(max_new_tokens=7)).max_new_tokens == 7
    names = [x.name for x in build_variants("asymspec@gate=fixed;tuned;floor", k=[2, 4], lam=[0.2])]
    assert names == ["asymspec@gate=fixed,k=2", "asymspec@gate=fixed,k=4", "tuned@k=2,lam=0.2", "tuned@k=4,lam=0.2", "floor"]
    for bad in ("nonsense", "asymspec@gate=bogus", "asymspec@beta=nan", "asymspec@unknown=1", "asymspec@k"):
        with pytest.raises(UnknownOptionError):
            parse_variant(bad)


def test_cli_parser_imports_no_torch():
    """`asymspec-mm --help` stays fast: building every subcommand's parser imports no torch (nor gradio)."""
    code = "import sys, asymspec_mm.cli.main as c; c.build_parser(); print(sorted(m for m in ('torch', 'gradio') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
