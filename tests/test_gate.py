"""Property and unit tests of the gate math."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asymspec_mm.base.gate import LN2, accept, context_gain, effective_threshold, first_rejection, fuse, gate_step, jsd, kl

logits = st.integers(min_value=0, max_value=10_000).map(
    lambda seed: torch.randn(3, 17, generator=torch.Generator().manual_seed(seed)) * (1 + seed % 7)
)


@settings(max_examples=60, deadline=None)
@given(logits, logits)
def test_jsd_symmetric_and_bounded(a, b):
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    d_ab, d_ba = jsd(la, lb), jsd(lb, la)
    assert torch.allclose(d_ab, d_ba, atol=1e-6)
    assert (d_ab >= 0).all() and (d_ab <= LN2 + 1e-7).all()


@settings(max_examples=30, deadline=None)
@given(logits)
def test_jsd_zero_for_equal_inputs(a):
    assert torch.allclose(jsd(a.log_softmax(-1), a.log_softmax(-1)), torch.zeros(3), atol=1e-6)


def test_jsd_reaches_ln2_for_disjoint_supports():
    a = torch.tensor([[0.0, -1e9, -1e9, -1e9]])
    b = torch.tensor([[-1e9, 0.0, -1e9, -1e9]])
    assert math.isclose(float(jsd(a.log_softmax(-1), b.log_softmax(-1))), math.log(2), rel_tol=1e-6)


def test_jsd_matches_direct_formula():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    p, q = a.double().softmax(-1), b.double().softmax(-1)
    m = (p + q) / 2
    ref = 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1)
    assert torch.allclose(jsd(a.log_softmax(-1), b.log_softmax(-1)).double(), ref, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(logits, logits, st.floats(min_value=0.01, max_value=1.0))
def test_cda_threshold_in_range(a, b, gamma):
    d = jsd(a.log_softmax(-1), b.log_softmax(-1))
    g = effective_threshold(gamma, "cda", d)
    assert (g <= gamma + 1e-6).all() and (g >= gamma / 2 - 1e-6).all()


def test_fixed_and_tuned_thresholds():
    d = torch.tensor([0.1, 0.5])
    assert torch.equal(effective_threshold(0.4, "fixed", d), torch.tensor([0.4, 0.4]))
    lr = torch.tensor([0.0, 2.0])
    got = effective_threshold(0.5, "tuned", d, lr, lam=0.1)
    assert torch.allclose(got, torch.tensor([0.5, 0.5 * math.exp(-0.2)]))


@settings(max_examples=40, deadline=None)
@given(logits, logits, logits)
def test_fusion_beta_zero_is_verifier_argmax(a, b, t):
    for src in ("contrast", "raw", "scd"):
        assert torch.equal(fuse(t, context_gain(a, b, t, src), 0.0), t.argmax(-1))


def test_context_gain_sources():
    a, b, t = torch.ones(1, 3), torch.zeros(1, 3) + 0.25, torch.full((1, 3), 2.0)
    assert torch.equal(context_gain(a, b, t, "contrast"), a - b)
    assert torch.equal(context_gain(a, b, t, "raw"), a)
    assert torch.equal(context_gain(a, b, t, "scd"), t - b)


def test_accept_and_first_rejection():
    acc = accept(torch.tensor([0.3, 0.2, 0.9]), torch.tensor([0.5, 0.9, 0.1]), torch.tensor([0.5, 0.5, 0.5]))
    assert acc.tolist() == [True, False, True]
    assert int(first_rejection(acc)) == 1
    assert int(first_rejection(torch.tensor([True, True]))) == 2
    assert int(first_rejection(torch.tensor([False, True]))) == 0


def test_gate_step_fp32_whatever_dtype():
    g = torch.Generator().manual_seed(3)
    a, b, t = (torch.randn(4, 50, generator=g) for _ in range(3))
    d = a.argmax(-1)
    full = gate_step(a, b, t, d)
    half = gate_step(a.bfloat16(), b.bfloat16(), t.bfloat16(), d)
    assert half.jsd.dtype == torch.float32 and half.gamma_eff.dtype == torch.float32
    ref_acc = t.softmax(-1)[range(4), d] > full.gamma_eff * b.softmax(-1)[range(4), d]
    assert torch.equal(full.accepted, ref_acc)
    assert torch.equal(full.fused, (t + (a - b)).argmax(-1))


# ---------------------------------------------------------------- the KL gates (tuned_kl, kl)


def _kl_reference(pa: list[float], pb: list[float]) -> float:
    """KL(pa || pb) in float64, term by term: 0 where pa is 0, infinite where pa > 0 and pb is 0."""
    total = 0.0
    for x, y in zip(pa, pb):
        if x > 0:
            total += math.inf if y == 0 else x * (math.log(x) - math.log(y))
    return total


def _softmax64(row: torch.Tensor) -> list[float]:
    return torch.softmax(row.double(), -1).tolist()


def _masked_logits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[6, 13]`` of a and b: plain; a masking tokens; b masking tokens a also masks; both masking the
    same; b masking a token a gives mass (KL infinite); a masking a token b gives mass (KL finite)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(6, 13, generator=g) * 3, torch.randn(6, 13, generator=g) * 3
    inf = float("-inf")
    a[1, [0, 5]] = inf
    a[2, [2, 3]] = inf
    b[2, [2, 3]] = inf
    a[3, 7:] = inf
    b[3, 7:] = inf
    b[4, 4] = inf
    a[5, [1, 9]] = inf
    return a, b


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0.05, max_value=1.0), st.floats(min_value=0.0, max_value=3.0))
def test_kl_gates_match_float64_reference(seed, gamma, lam):
    a, b = _masked_logits(seed)
    got_kl = effective_threshold(gamma, "kl", kl(a.log_softmax(-1), b.log_softmax(-1)))
    got_tuned = effective_threshold(gamma, "tuned_kl", kl(a.log_softmax(-1), b.log_softmax(-1)), lam=lam)
    for i in range(a.shape[0]):
        div = _kl_reference(_softmax64(a[i]), _softmax64(b[i]))
        want_kl = gamma * math.exp(-div)
        want_tuned = gamma if lam == 0 else gamma * math.exp(-lam * div)
        assert not math.isnan(float(got_kl[i])) and not math.isnan(float(got_tuned[i]))
        assert float(got_kl[i]) == pytest.approx(want_kl, rel=1e-4, abs=1e-7), (i, div)
        assert float(got_tuned[i]) == pytest.approx(want_tuned, rel=1e-4, abs=1e-7), (i, div, lam)


def test_kl_divergence_values_on_masked_rows():
    a, b = _masked_logits(7)
    got = kl(a.log_softmax(-1), b.log_softmax(-1))
    want = [_kl_reference(_softmax64(a[i]), _softmax64(b[i])) for i in range(6)]
    assert math.isinf(want[4]) and math.isinf(float(got[4]))  # b masks a token a gives mass
    assert all(math.isfinite(w) for j, w in enumerate(want) if j != 4)
    finite = [j for j in range(6) if j != 4]
    assert got[finite].double().tolist() == pytest.approx([want[j] for j in finite], rel=1e-4, abs=1e-6)
    # KL is not symmetric: reversed, row 4 is finite (a gives the masked token mass) and row 5 infinite
    reverse = kl(b.log_softmax(-1), a.log_softmax(-1))
    assert math.isfinite(float(reverse[4])) and math.isinf(float(reverse[5]))


def test_kl_gate_threshold_is_zero_when_kl_infinite_and_gamma_when_lam_zero():
    a = torch.tensor([[0.0, 0.0, float("-inf")]])
    b = torch.tensor([[0.0, float("-inf"), float("-inf")]])
    d = kl(a.log_softmax(-1), b.log_softmax(-1))
    assert math.isinf(float(d))
    assert float(effective_threshold(0.5, "kl", d)) == 0.0
    assert float(effective_threshold(0.5, "tuned_kl", d, lam=0.1)) == 0.0
    assert float(effective_threshold(0.5, "tuned_kl", d, lam=0.0)) == 0.5


def test_kl_of_equal_rows_is_zero_so_kl_gates_keep_gamma():
    a, _ = _masked_logits(3)
    d = kl(a.log_softmax(-1), a.log_softmax(-1))
    assert torch.equal(d, torch.zeros(6))
    assert torch.equal(effective_threshold(0.5, "kl", d), torch.full((6,), 0.5))


@pytest.mark.parametrize("gate", ["kl", "tuned_kl"])
def test_gate_step_kl_gates_decide_as_float64_reference(gate):
    """gate_step's accept decisions and thresholds with the KL gates, masked logits included, against float64."""
    a, b = _masked_logits(11)
    t = torch.randn(6, 13, generator=torch.Generator().manual_seed(12)) * 3
    t[0, 2] = float("-inf")
    drafts = a.argmax(-1)
    lam = 0.7
    g = gate_step(a, b, t, drafts, gamma=0.6, gate=gate, lam=lam)
    assert not torch.isnan(g.gamma_eff).any() and not torch.isnan(g.jsd).any()
    accepted = 0
    for i in range(6):
        pa, pb, pt = _softmax64(a[i]), _softmax64(b[i]), _softmax64(t[i])
        div = _kl_reference(pa, pb)
        ge = 0.6 * math.exp(-(1.0 if gate == "kl" else lam) * div)
        assert float(g.gamma_eff[i]) == pytest.approx(ge, rel=1e-4, abs=1e-7)
        d = int(drafts[i])
        assert bool(g.accepted[i]) == (pt[d] > ge * pb[d]), i
        accepted += bool(g.accepted[i])
    assert 0 < accepted < 6  # both branches exercised


def test_kl_and_jsd_gates_differ():
    """The KL gates are not CDA under another name: on rows far apart KL exceeds ln 2 and the threshold drops below gamma/2."""
    a = torch.tensor([[4.0, 0.0, 0.0, 0.0]])
    b = torch.tensor([[0.0, 4.0, 0.0, 0.0]])
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    assert float(effective_threshold(0.5, "cda", jsd(la, lb))) >= 0.25
    assert float(effective_threshold(0.5, "kl", kl(la, lb))) < 0.25


@pytest.mark.parametrize("gate", ["cda", "fixed", "tuned", "tuned_kl", "kl"])
def test_per_position_settings_equal_the_scalar_gate_position_by_position(gate):
    """gamma, beta and lam as ``[P]`` tensors (rows of a batch with their own settings) give, at each position,
    exactly what the scalar settings give there (lam 0 and negative lam included, beta 0 included)."""
    torch.manual_seed(7)
    P, V = 6, 40
    a, b, t = torch.randn(P, V) * 3, torch.randn(P, V) * 3, torch.randn(P, V) * 3
    a[0, 5] = -math.inf  # a masked token: delta 0 there, KL infinite
    drafts = torch.randint(0, V, (P,))
    gammas, betas, lams = [0.5, 0.1, 0.9, 0.3, 0.5, 0.0], [1.0, 0.0, 2.5, -1.0, 0.3, 1.0], [0.1, 0.0, 2.0, -0.5, 0.1, 1.0]
    g = gate_step(a, b, t, drafts, gamma=torch.tensor(gammas), beta=torch.tensor(betas), lam=torch.tensor(lams), gate=gate)
    for i in range(P):
        one = gate_step(a[i : i + 1], b[i : i + 1], t[i : i + 1], drafts[i : i + 1], gamma=gammas[i], beta=betas[i], lam=lams[i], gate=gate)
        for name in ("accepted", "gamma_eff", "fused", "p_verifier_fused", "p_base_fused"):
            assert torch.equal(getattr(g, name)[i : i + 1], getattr(one, name)), (gate, i, name)
        assert torch.equal(g.fused_logits[i : i + 1], one.fused_logits)
