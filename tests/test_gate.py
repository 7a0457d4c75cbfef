"""Property and unit tests of the gate math."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asymspec_mm.gate import LN2, accept, context_gain, effective_threshold, first_rejection, fuse, gate_step, jsd

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
