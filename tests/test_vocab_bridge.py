"""The tensors of a cross-family map (asymspec_mm.base.vocab_bridge) and the gate where the verifier decides alone,
checked entry by entry against plain Python on a small hand-made map."""

from __future__ import annotations

import torch

from asymspec_mm.base.gate import gate_step
from asymspec_mm.base.vocab_bridge import FORBIDDEN, VocabBridge, bridge_of
from asymspec_mm.base.vocab_map import VocabMap

# drafter ids 0..5, verifier ids 0..6; pairs (d, v): (0, 3) (2, 0) (3, 6) (5, 1); the logits are wider than the
# tokenizers (drafter 7, verifier 8): the extra ids are never in the map
TO_VERIFIER = [3, -1, 0, 6, -1, 1]
TO_DRAFTER = [2, 5, -1, 0, -1, -1, 3]
VMAP = VocabMap(TO_VERIFIER, TO_DRAFTER, {"eos": (3, 6)})


def test_drafter_logits_in_the_verifier_order_and_the_restriction():
    bridge = VocabBridge(VMAP, drafter_width=7, verifier_width=8)
    assert bridge.inside_ids == [0, 1, 3, 6] and bridge.shared == 4
    a = torch.arange(14, dtype=torch.float32).view(2, 7) * 1.5
    got = bridge.verifier_order(a)
    for r in range(2):
        for v in range(8):
            d = TO_DRAFTER[v] if v < len(TO_DRAFTER) else -1
            assert got[r, v] == (a[r, d] if d >= 0 else FORBIDDEN)
    t = torch.tensor([[0.0, 1.0, 9.0, 2.0, 0.0, 0.0, 3.0, 0.0], [5.0, 1.0, 0.0, 2.0, 0.0, 0.0, 3.0, 4.0]])
    restricted, alone = bridge.restrict(t)
    assert alone.tolist() == [True, False]  # row 0's best (id 2) has no drafter id; row 1's (id 0) has
    assert restricted[0].tolist() == [0.0, 1.0, FORBIDDEN, 2.0, FORBIDDEN, FORBIDDEN, 3.0, FORBIDDEN]
    assert bridge.drafter_ids(torch.tensor([0, 6, 1, 3])).tolist() == [2, 3, 5, 0]
    assert [bridge.drafter_id(v) for v in range(9)] == [2, 5, None, 0, None, None, 3, None, None]
    # softmax of the restricted row is the verifier's distribution renormalised over the map
    p = restricted[0].softmax(-1)
    expect = torch.zeros(8)
    expect[[0, 1, 3, 6]] = torch.tensor([0.0, 1.0, 2.0, 3.0]).softmax(-1)
    torch.testing.assert_close(p, expect)


def test_one_vocabulary_has_no_bridge():
    same = VocabMap(list(range(4)), list(range(4)), {}, True)
    assert bridge_of(same, 4, 4) is None and bridge_of(None, 4, 4) is None
    assert isinstance(bridge_of(VMAP, 7, 8), VocabBridge)


def test_where_the_verifier_decides_alone_it_is_not_steered_and_keeps_only_its_own_token():
    torch.manual_seed(0)
    a, b, t = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    a[:, 0] += 8.0  # the drafter's steer points at token 0 everywhere
    own = t.argmax(-1)
    drafts = torch.tensor([int(own[0]), int(own[1]), 0, 0])
    alone = torch.tensor([True, False, True, False])
    free = gate_step(a, b, t, drafts, gamma=0.0, beta=5.0)
    g = gate_step(a, b, t, drafts, gamma=0.0, beta=5.0, alone=alone)
    # gamma = 0 accepts every draft where the gate decides; where the verifier decides alone only its own token passes
    assert g.accepted.tolist() == [True, True, bool(own[2] == 0), True]
    assert g.fused[0] == own[0] and g.fused[2] == own[2]  # no steering there
    assert g.fused[1] == free.fused[1] and g.fused[3] == free.fused[3] == 0  # steered elsewhere
    torch.testing.assert_close(g.fused_logits[alone], t[alone])


def test_a_grammar_that_leaves_no_token_both_models_have_fails_the_row_in_one_line():
    """The loop cannot emit a token outside the map; a grammar whose allowed tokens all lie outside it would leave
    argmax over FORBIDDEN logits (token 0), so the row fails with a one-line error instead."""
    from types import SimpleNamespace

    import pytest

    from asymspec_mm.base.errors import VocabularyMismatchError
    from asymspec_mm.decode.rows import _grammar_mask

    bridge = VocabBridge(VMAP, drafter_width=7, verifier_width=8)
    only = lambda ids: SimpleNamespace(mask=lambda: torch.isin(torch.arange(8), torch.tensor(ids)))  # noqa: E731
    row = SimpleNamespace(vocab=bridge)
    assert _grammar_mask(row, only([2, 6])).tolist() == [False, False, True, False, False, False, True, False]
    with pytest.raises(VocabularyMismatchError, match=r"^the grammar allows only tokens outside the vocabulary map .*method='floor'"):
        _grammar_mask(row, only([2, 4, 5, 7]))  # none of them has a drafter id
    assert _grammar_mask(SimpleNamespace(vocab=None), only([2])).tolist()[2]  # one vocabulary: any mask goes
