"""The sampled rule (temperature > 0) draws exactly from its closed form.

The closed form is computed here from scratch in float64 (softmax, top-k / top-p, the JSD and the gate's set
written out), independently of :mod:`asymspec_mm.base.sampling`; the sampler runs the library's whole position
procedure (draft from q, the greedy gate's threshold, the sampled gate, the residual) on 10^5 independent
uniforms, and a chi-square test compares the counts. A mutant that ignores the gate must fail the same test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from asymspec_mm.base.gate import gate_step
from asymspec_mm.base.sampling import emitted_distribution, filter_logits, gate_set, sample_from, sampled_gate, tempered_probs

DRAWS = 100_000
#: p-values below this reject; every case is seeded, so a pass is repeatable.
ALPHA = 1e-4


# ---------------------------------------------------------------- the closed form, written out in float64
def softmax(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    z = np.where(finite, x - x[finite].max(), -np.inf)
    e = np.where(finite, np.exp(z), 0.0)
    return e / e.sum()


def filtered(x: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Top-k then top-p over the top-k distribution, by a plain loop; tokens tied with the last one kept stay."""
    x = x.copy()
    order = sorted(range(len(x)), key=lambda i: -x[i])
    if top_k > 0:
        kth = x[order[min(top_k, len(x)) - 1]]
        x[x < kth] = -np.inf
    if top_p < 1.0:
        p = softmax(x)
        mass, cutoff = 0.0, None
        for rank, i in enumerate(order):
            if rank == 0 or mass < top_p:
                cutoff = x[i]
            mass += p[i]
        x[x < cutoff] = -np.inf
    return x


def jsd(p: np.ndarray, q: np.ndarray) -> float:
    m = 0.5 * (p + q)
    kl = lambda x: float(sum(x[i] * math.log(x[i] / m[i]) for i in range(len(x)) if x[i] > 0))  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def closed_form(a, b, t, beta, gamma, tau, top_k, top_p, use_gate=True):
    """(P, q, f, A, E) of the rule at one position."""
    q = softmax(filtered(a / tau, top_k, top_p))
    f = softmax(filtered((t + beta * (a - b)) / tau, top_k, top_p))
    pa, pb, pt = softmax(a), softmax(b), softmax(t)
    gamma_eff = gamma * math.exp(-jsd(pa, pb))
    gate = (pt > gamma_eff * pb) if use_gate else np.zeros(len(a), dtype=bool)
    over, under = np.clip(q - f, 0, None), np.clip(f - q, 0, None)
    excess = float(over[gate].sum())
    r = under / under.sum() if under.sum() > 0 else f
    return f + np.where(gate, over, 0.0) - excess * r, q, f, gate, excess


# ---------------------------------------------------------------- the library's procedure, N independent times
def sample_rule(a, b, t, beta, gamma, tau, top_k, top_p, *, seed: int, use_gate: bool = True, n: int = DRAWS) -> np.ndarray:
    """Emitted token counts ``[V]`` of ``n`` runs of one position through the library."""
    gen = torch.Generator().manual_seed(seed)
    rep = lambda x: torch.tensor(x, dtype=torch.float32).expand(n, -1)  # noqa: E731
    A, B, T = rep(a), rep(b), rep(t)
    taus, ks, ps = torch.full((n,), tau), torch.full((n,), top_k, dtype=torch.long), torch.full((n,), top_p)
    u = torch.rand(3, n, generator=gen, dtype=torch.float64)
    q = tempered_probs(A, taus, ks, ps)
    drafts = sample_from(q, u[0])
    g = gate_step(A, B, T, drafts, gamma=gamma, beta=beta)
    f = tempered_probs(g.fused_logits, taus, ks, ps)
    in_gate = gate_set(g.log_verifier, g.log_base, g.gamma_eff) if use_gate else None
    s = sampled_gate(q, f, in_gate, drafts, u[1], u[2])
    emitted = torch.where(s.accepted, drafts, s.residual)
    return np.bincount(emitted.numpy(), minlength=len(a))


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; a count where the expected probability is 0 rejects outright."""
    zero = probs <= 1e-12
    if counts[zero].sum() > 0:
        return 0.0
    if (~zero).sum() == 1:  # one possible token, drawn every time
        return 1.0
    expected = probs[~zero] / probs[~zero].sum() * counts.sum()
    return float(chisquare(counts[~zero], expected).pvalue)


def random_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    v = int(rng.integers(3, 9))
    a = rng.normal(0, 2, v)
    b = a + rng.normal(0, 1.5, v)  # the same drafter, less context
    t = b + rng.normal(0, 1.0, v)
    return dict(
        a=a,
        b=b,
        t=t,
        beta=float(rng.choice([0.0, 0.5, 1.0, 2.0])),
        gamma=float(rng.uniform(0.2, 1.0)),
        tau=float(rng.uniform(0.3, 1.5)),
        top_k=int(rng.choice([0, 0, int(rng.integers(2, v + 1))])),
        top_p=float(rng.choice([1.0, 1.0, rng.uniform(0.5, 0.95)])),
    )


CASES = [random_case(s) for s in range(16)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_emitted_tokens_follow_the_closed_form(case):
    c = CASES[case]
    P, q, f, gate, excess = closed_form(**c)
    assert P.min() > -1e-12 and abs(P.sum() - 1) < 1e-9
    counts = sample_rule(**c, seed=case)
    assert chi2_pvalue(counts, P) > ALPHA, (counts / DRAWS, P)
    # TV(P, f) = E, and the library's own closed form agrees with the one written out here
    assert abs(0.5 * np.abs(P - f).sum() - excess) < 1e-9
    lib = emitted_distribution(torch.tensor(q), torch.tensor(f), torch.tensor(gate)).numpy()
    np.testing.assert_allclose(lib, P, atol=1e-12)


def test_a_mutant_that_ignores_the_gate_is_rejected():
    """The same test rejects plain speculative sampling of f where the gate adds mass (E large)."""
    rejected = 0
    strong = [i for i, c in enumerate(CASES) if closed_form(**c)[4] > 0.02]
    assert len(strong) >= 3, "the cases must include some where the gate matters"
    for i in strong:
        c = CASES[i]
        P = closed_form(**c)[0]
        counts = sample_rule(**c, seed=100 + i, use_gate=False)
        rejected += chi2_pvalue(counts, P) < ALPHA
    assert rejected == len(strong)


def test_reductions():
    """A empty: P = f (lossless speculative sampling of the fused target); A empty and beta = 0: the verifier's own
    tempered distribution; tau -> 0: the greedy rule's token."""
    for i, c in enumerate(CASES):
        P0, _, f, _, _ = closed_form(**c, use_gate=False)
        np.testing.assert_allclose(P0, f, atol=1e-12)
        Pv = closed_form(**{**c, "beta": 0.0}, use_gate=False)[0]
        np.testing.assert_allclose(Pv, softmax(filtered(c["t"] / c["tau"], c["top_k"], c["top_p"])), atol=1e-12)
        counts = sample_rule(**{**c, "beta": 0.0}, seed=200 + i, use_gate=False, n=20_000)
        assert chi2_pvalue(counts, Pv) > ALPHA
        # tau -> 0: the draft is argmax a; the gate keeps it if it is in A, else argmax(t + beta * delta)
        cold = closed_form(**{**c, "tau": 1e-4, "top_k": 0, "top_p": 1.0})
        d = int(np.argmax(c["a"]))
        greedy = d if cold[3][d] else int(np.argmax(c["t"] + c["beta"] * (c["a"] - c["b"])))
        assert cold[0][greedy] > 1 - 1e-6


def test_filter_logits_matches_the_loop():
    rng = np.random.default_rng(7)
    for _ in range(200):
        v = int(rng.integers(2, 12))
        x = np.round(rng.normal(0, 2, v), 1)  # rounding makes ties
        k, p = int(rng.integers(0, v + 2)), float(rng.choice([1.0, rng.uniform(0.05, 1.0)]))
        got = filter_logits(torch.tensor(x)[None], torch.tensor([k]), torch.tensor([p], dtype=torch.float64))[0].numpy()
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(filtered(x, k, p)))
        only_p = filter_logits(torch.tensor(x)[None], None, torch.tensor([p], dtype=torch.float64))[0].numpy()
        np.testing.assert_array_equal(np.isfinite(only_p), np.isfinite(filtered(x, 0, p)))
        only_k = filter_logits(torch.tensor(x)[None], torch.tensor([k]), None)[0].numpy()
        np.testing.assert_array_equal(np.isfinite(only_k), np.isfinite(filtered(x, k, 1.0)))
    # rows with different settings in one call: each as it would be alone
    x = torch.tensor(np.round(rng.normal(0, 2, (4, 9)), 1))
    ks, ps = torch.tensor([0, 3, 0, 9]), torch.tensor([1.0, 1.0, 0.6, 0.3], dtype=torch.float64)
    together = filter_logits(x, ks, ps)
    for j in range(4):
        np.testing.assert_array_equal(np.isfinite(together[j].numpy()), np.isfinite(filtered(x[j].numpy(), int(ks[j]), float(ps[j]))))
    assert filter_logits(x, None, None) is x


def test_sample_from_never_draws_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5)
    u = torch.tensor([0.0, 0.25, 0.75, 0.999999, 1.0 - 2**-53], dtype=torch.float64)
    assert sample_from(probs, u).tolist() == [1, 1, 3, 3, 3]
