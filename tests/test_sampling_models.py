"""Sampling through the models: the first token's distribution over many seeds equals the closed form computed from
no-cache forwards of the checkpoints; a seed repeats its tokens alone and in a mixed batch; a temperature near 0
gives the greedy tokens; greedy rows beside sampled ones are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_case
from reference import Reference
from scipy.stats import chisquare
from test_sampling import closed_form, filtered, softmax

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.errors import UnknownOptionError

ALPHA = 1e-4


def binned_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square of ``counts`` against ``probs`` with the tokens expected fewer than ``min_expected`` times pooled
    into one bin; a drawn token of probability 0 rejects outright."""
    n = counts.sum()
    if counts[probs <= 1e-12].sum() > 0:
        return 0.0
    big = probs * n >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(probs[big], probs[~big].sum()) * n
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep] / exp[keep].sum() * obs[keep].sum()).pvalue)


def first_tokens(pipe, case, n: int, method: str, **settings) -> tuple[np.ndarray, object]:
    """Counts ``[V]`` of the first token of ``n`` requests with seeds 0..n-1 (through the scheduler, 64 rows a
    step), and one result (for its prompts)."""
    sched = pipe.scheduler(max_batch_size=64)
    try:
        kw = dict(caption=case["caption"], ocr=case["ocr"], method=method, max_new_tokens=1, **settings)
        handles = [sched.submit(case["image"], case["question"], seed=i, **kw) for i in range(n)]
        results = [h.result() for h in handles]
    finally:
        sched.close()
    vocab = pipe.verifier.config.vocab_size
    return np.bincount([r.token_ids[0] for r in results], minlength=vocab), results[0]


def position_logits(pipe, res):
    """a_1, b_1, t_1 (float64 numpy) of the request's first position, from no-cache forwards."""
    ref = Reference(pipe, res.prompts)
    return tuple(x[-1].double().numpy() for x in (ref.drafter_full([]), ref.drafter_comp([]), ref.verifier([])))


def test_asymspec_first_token_follows_the_closed_form(tiny_pipe):
    case = make_case(3)
    settings = dict(k=2, temperature=0.5, top_k=60, top_p=0.95, gamma=0.6, beta=1.0)
    counts, res = first_tokens(tiny_pipe, case, 900, "asymspec", **settings)
    a, b, t = position_logits(tiny_pipe, res)
    P, _, f, gate, excess = closed_form(a, b, t, beta=1.0, gamma=0.6, tau=0.5, top_k=60, top_p=0.95)
    assert binned_pvalue(counts, P) > ALPHA
    # the test can tell: the same counts against the verifier's own tempered distribution are rejected
    assert binned_pvalue(counts, softmax(filtered(t / 0.5, 60, 0.95))) < ALPHA


def test_sd_samples_the_verifier(tiny_pipe):
    """Symmetric SD at temperature > 0 is lossless: its first token follows Floor's distribution softmax(F(t/tau))."""
    case = make_case(5)
    counts, res = first_tokens(tiny_pipe, case, 600, "sd", k=3, temperature=0.6)
    _, _, t = position_logits(tiny_pipe, res)
    assert binned_pvalue(counts, softmax(t / 0.6)) > ALPHA


def test_a_seed_repeats_its_tokens_alone_and_in_a_mixed_batch(tiny_pipe):
    case, other = make_case(11), make_case(12)
    kw = dict(caption=case["caption"], ocr=case["ocr"], max_new_tokens=14)
    sampled = dict(temperature=0.9, top_p=0.9, seed=1234)
    alone = {m: tiny_pipe.generate(case["image"], case["question"], method=m, **kw, **sampled) for m in ("asymspec", "sd", "floor")}
    greedy = tiny_pipe.generate(case["image"], case["question"], **kw)
    assert alone["asymspec"].stats["seed"] == 1234
    assert any(ev.accept_prob is not None for ev in alone["asymspec"].trace)
    sched = tiny_pipe.scheduler(max_batch_size=8)
    try:
        handles = {
            "mine": sched.submit(case["image"], case["question"], **kw, **sampled),
            "greedy": sched.submit(case["image"], case["question"], **kw),
            "hot": sched.submit(other["image"], other["question"], caption=other["caption"], temperature=1.5, seed=9, max_new_tokens=20),
            "cold": sched.submit(other["image"], other["question"], caption=other["caption"], temperature=0.3, top_k=5, max_new_tokens=9),
            "sd": sched.submit(case["image"], case["question"], method="sd", **kw, **sampled),
            "floor": sched.submit(case["image"], case["question"], method="floor", **kw, **sampled),
        }
        got = {name: h.result() for name, h in handles.items()}
    finally:
        sched.close()
    assert got["mine"].token_ids == alone["asymspec"].token_ids
    assert [ev.source for ev in got["mine"].trace] == [ev.source for ev in alone["asymspec"].trace]
    assert got["sd"].token_ids == alone["sd"].token_ids
    assert got["floor"].token_ids == alone["floor"].token_ids
    assert got["greedy"].token_ids == greedy.token_ids and got["greedy"].stats["seed"] is None
    assert all(ev.accept_prob is None and not ev.residual for ev in got["greedy"].trace)
    # a row without a seed reports the one it drew, and that seed repeats it
    drawn = got["cold"].stats["seed"]
    again = tiny_pipe.generate(
        other["image"], other["question"], caption=other["caption"], temperature=0.3, top_k=5, seed=drawn, max_new_tokens=9
    )
    assert again.token_ids == got["cold"].token_ids


def test_gate_excess_is_recorded(tiny_pipe):
    case = make_case(21)
    res = tiny_pipe.generate(case["image"], case["question"], caption=case["caption"], temperature=1.0, seed=5, max_new_tokens=12)
    gated = [ev for ev in res.trace if ev.source in ("accepted", "fused")]
    assert gated and all(ev.gate_excess is not None and 0 <= ev.gate_excess <= 1 for ev in gated)
    assert all(ev.accept_prob == 1.0 for ev in gated if ev.source == "accepted" and ev.p_verifier > ev.gamma_eff * ev.p_base)
    assert all(ev.residual for ev in res.trace if ev.source == "fused")
    assert res.stats["mean_gate_excess"] == pytest.approx(sum(ev.gate_excess for ev in gated) / len(gated))


EXAMPLES = Path(__file__).resolve().parents[1] / "asymspec_mm" / "examples_data"


@pytest.mark.parametrize("method", ["asymspec", "sd", "floor", "drafter"])
def test_a_temperature_near_zero_gives_the_greedy_tokens(method):
    """On the trained tiny pair, tau = 1e-4 emits the greedy tokens on the bundled examples (the tempered
    distributions are one-hot unless two logits are within ~1e-3 of each other: none are here)."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset("tiny")
    for ex in json.loads((EXAMPLES / "examples.json").read_text())[:4]:
        image = EXAMPLES / Path(ex["image"]).name
        kw = dict(caption=ex["caption"], ocr=ex["ocr"] or False, method=method, max_new_tokens=40)
        greedy = pipe.generate(image, ex["question"], **kw)
        cold = pipe.generate(image, ex["question"], temperature=1e-4, seed=3, **kw)
        assert cold.token_ids == greedy.token_ids, ex["question"]


@pytest.mark.parametrize("temperature", [1.2410491815171935e-106, 1e-30, 9.9e-6])
def test_a_temperature_too_small_to_divide_by_decodes_greedily(tiny_pipe, temperature):
    """Logits divided by a temperature under 1e-5 overflow float32 (NaN probabilities drew a token id past the
    vocabulary, an IndexError in the next forward: the server's fuzzer found it as a 500). Such a row decodes
    greedily, as vLLM's do, with the greedy tokens and no seed reported; 1e-5 itself still samples."""
    messages = [{"role": "user", "content": "Z\u00dd\u00ea H"}]
    greedy = tiny_pipe.chat(messages, max_new_tokens=8)
    cold = tiny_pipe.chat(messages, max_new_tokens=8, temperature=temperature, seed=1)
    assert cold.token_ids == greedy.token_ids
    assert not AsymSpecConfig(temperature=temperature).sampling and AsymSpecConfig(temperature=1e-5).sampling


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=3.0), dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=-1), dict(seed=-1), dict(seed=2**63), dict(seed=1.5)],
)
def test_bad_sampling_settings_are_refused(bad):
    with pytest.raises(UnknownOptionError, match=next(iter(bad))):
        AsymSpecConfig(**bad).validated()


def test_greedy_config_is_unchanged():
    cfg = AsymSpecConfig()
    assert cfg.temperature == 0 and not cfg.sampling and cfg.top_p == 1.0 and cfg.top_k == 0 and cfg.seed is None


def test_sd_two_token_sequences_follow_the_verifiers_own_sampling():
    """Sequence level, on the trained tiny pair: SD's first two tokens (A empty, beta 0: the lossless rule) are drawn as
    the verifier samples them alone, P(x1, x2) = f(x1) * f(x2 | x1) with f = softmax(t / tau), the second factor from
    a no-cache forward of the verifier after x1 (every first token drawn gets its own). Chi-square over the pairs."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    ex = json.loads((EXAMPLES / "examples.json").read_text())[0]
    image = EXAMPLES / Path(ex["image"]).name
    tau, n = 1.3, 500
    sched = pipe.scheduler(max_batch_size=64)
    try:
        kw = dict(caption=ex["caption"], ocr=ex["ocr"] or False, method="sd", k=2, temperature=tau, max_new_tokens=2)
        results = [h.result() for h in [sched.submit(image, ex["question"], seed=i, **kw) for i in range(n)]]
    finally:
        sched.close()
    pairs = [tuple(r.token_ids[:2]) for r in results if len(r.token_ids) == 2]
    ref = Reference(pipe, results[0].prompts)
    f1 = softmax(ref.verifier([])[-1].double().numpy() / tau)
    second = {x1: softmax(ref.verifier([x1])[-1].double().numpy() / tau) for x1 in {p[0] for p in pairs}}
    # the pairs expected 5 times or more, each a bin; every other pair, drawn or not, in one remainder bin
    common = [(x1, x2) for x1 in second for x2 in np.flatnonzero(f1[x1] * second[x1] * n >= 5)]
    probs = np.array([f1[x1] * second[x1][x2] for x1, x2 in common])
    counts = np.array([pairs.count((x1, int(x2))) for x1, x2 in common], dtype=float)
    probs, counts = np.append(probs, 1.0 - probs.sum()), np.append(counts, n - counts.sum())
    eos = set(pipe.eos_ids)
    assert not any(a in eos for a, _ in pairs), "a first token ended the answer: the pairs would not be complete"
    assert len(pairs) == n and len(common) >= 3
    assert chisquare(counts, probs * n).pvalue > ALPHA
