"""Sampling on two vocabularies (docs/algorithm.md, "Two vocabularies"): the exact rule restricted to the tokens both
vocabularies have. The first token's distribution over many seeds equals the closed form computed from no-cache
forwards on that set (every distribution renormalised over it), and where the verifier's best token lies outside it,
the verifier's own tempered distribution on it (the verifier decides alone); no draw ever leaves the set."""

from __future__ import annotations

import numpy as np
import pytest
from test_sampling import closed_form, filtered, softmax
from test_sampling_models import ALPHA, binned_pvalue, first_tokens
from two_vocab_reference import TwoVocabReference

from asymspec_mm.eval import minivista as mv

SETTINGS = dict(beta=1.0, gamma=0.6, tau=0.7, top_k=50, top_p=0.95)


def _first_position(pipe, case):
    """(a, b, t on the set, float64 numpy; whether the verifier decides alone; the reference) at the first position."""
    res = pipe.generate(**case, max_new_tokens=1)
    ref = TwoVocabReference(pipe, res.prompts)
    t_full = ref.verifier([])[-1].double()
    a = ref._on_set(ref.drafter_full([])[-1], ref.cols).numpy()
    b = ref._on_set(ref.drafter_comp([])[-1], ref.cols).numpy()
    t = t_full[ref.inside].numpy()
    return a, b, t, int(t_full.argmax()) not in ref.v2d, ref


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """The cross-family pair with the verifier's own tokens less strong than in the other tests' (outside_scale 1.0),
    so that its first positions are of both kinds."""
    from two_vocab_pair import TINY_DRAFTER, build_verifier

    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_pretrained(TINY_DRAFTER, build_verifier(tmp_path_factory.mktemp("v"), outside_scale=1.0), ocr="none")


def _testable(a, b, t, alone: bool, n: int = 900) -> bool:
    """Whether ``n`` draws can tell the position's distribution from the other rule's: it spreads over at least two
    tokens (a chi-square of one bin says nothing) and the two differ by at least 0.2 in total variation."""
    own = softmax(filtered(t / SETTINGS["tau"], SETTINGS["top_k"], SETTINGS["top_p"]))
    steered = closed_form(a, b, t, **SETTINGS)[0]
    drawn, other = (own, steered) if alone else (steered, own)
    return int((drawn * n >= 5).sum()) >= 2 and 0.5 * float(np.abs(drawn - other).sum()) >= 0.2


@pytest.fixture(scope="module")
def positions(pipe):
    """The first steered and the first alone first position among MiniVista questions (with and without the hint)
    whose distribution the draws can test (:func:`_testable`)."""
    found = {}
    for p in mv.generate(12, seed=1):
        for question in (p["query"], p["question"]):
            case = dict(image=p["decoded_image"], question=question, caption=p["caption"], ocr=p["ocr"])
            *logits, alone, ref = _first_position(pipe, case)
            if alone not in found and _testable(*logits, alone):
                found[alone] = (case, logits, ref)
        if len(found) == 2:
            return found
    pytest.fail(f"no testable {'alone' if True not in found else 'steered'} first position among the questions")


def _counts(pipe, case, ref, n):
    counts, _ = first_tokens(
        pipe,
        case,
        n,
        "asymspec",
        k=2,
        temperature=SETTINGS["tau"],
        top_k=SETTINGS["top_k"],
        top_p=SETTINGS["top_p"],
        gamma=SETTINGS["gamma"],
        beta=SETTINGS["beta"],
    )
    outside = np.ones(len(counts), dtype=bool)
    outside[ref.inside] = False
    assert counts[outside].sum() == 0  # no draw leaves the set
    return counts[ref.inside]


def test_a_steered_first_token_follows_the_closed_form_on_the_set(pipe, positions):
    case, (a, b, t), ref = positions[False]
    counts = _counts(pipe, case, ref, 900)
    P = closed_form(a, b, t, **SETTINGS)[0]
    assert binned_pvalue(counts, P) > ALPHA
    # the test can tell: the verifier's own tempered distribution on the set is rejected
    assert binned_pvalue(counts, softmax(filtered(t / SETTINGS["tau"], SETTINGS["top_k"], SETTINGS["top_p"]))) < ALPHA


def test_where_the_verifier_decides_alone_it_samples_its_own_distribution_on_the_set(pipe, positions):
    case, (a, b, t), ref = positions[True]
    counts = _counts(pipe, case, ref, 900)
    own = softmax(filtered(t / SETTINGS["tau"], SETTINGS["top_k"], SETTINGS["top_p"]))
    assert binned_pvalue(counts, own) > ALPHA
    # the test can tell: the steered rule (what the position would emit if the verifier did not decide alone) is rejected
    assert binned_pvalue(counts, closed_form(a, b, t, **SETTINGS)[0]) < ALPHA
