"""The KV bound the scheduler budgets with (issue #28): what a batched storage really allocates (padding, holes up
to the compaction threshold) never exceeds it, and it is not vacuous (within a small factor of what was seen)."""

from __future__ import annotations

import random

import pytest

from asymspec_mm.batch.engines import BatchEngine, dynamic_kv_bound
from asymspec_mm.engines import TextEngine


def _prefilled(model, n: int, rng: random.Random) -> TextEngine:
    import torch

    engine = TextEngine(model, "verifier")
    engine.prefill(torch.tensor([rng.randint(20, 480) for _ in range(n)]))
    return engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_real_allocation_stays_within_the_bound(tiny_pipe, seed):
    """Rows join with ragged prompts, decode with ragged extends of up to ``step`` tokens, roll back and leave; after
    every operation the bytes the cache holds are within :func:`dynamic_kv_bound` of the rows' final lengths."""
    import torch

    rng = random.Random(seed)
    model = tiny_pipe.verifier
    step = 5
    engine = BatchEngine(model, "verifier")
    finals = {}
    live: dict[int, int] = {}
    seen = 0
    for rid in range(6):
        prompt = rng.randint(3, 40)
        finals[rid] = prompt + rng.randint(10, 60)
        engine.join(rid, _prefilled(model, prompt, rng))
        live[rid] = prompt
    bound = engine.kv_bound(list(finals.values()), step)
    for _ in range(120):
        rows = [r for r in live if live[r] < finals[r] - step]
        if not rows:
            break
        ids = {r: torch.tensor([rng.randint(20, 480) for _ in range(rng.randint(1, step))]) for r in rows if rng.random() < 0.8}
        if not ids:
            continue
        engine.extend(ids)
        for r, t in ids.items():
            keep = engine.length(r) - rng.randint(0, t.numel())  # a rejection keeps a prefix of the new tokens
            engine.truncate(r, keep)
            live[r] = keep
        seen = max(seen, engine.kv_bytes())
        assert engine.kv_bytes() <= bound
    lower = len(finals) * max(live.values()) * engine.slot_bytes()
    assert lower <= seen <= bound <= 4 * max(seen, lower)


def test_the_bound_formula():
    # two rows reaching 100 and 60 tokens, compact at half: T <= 200 + 4; one layer's old tensors beside the new
    assert dynamic_kv_bound(slot_bytes=800, n_layers=4, compact_at=0.5, lengths=[100, 60], step_tokens=4) == 800 * 204 * 2 + 200 * 204
    assert dynamic_kv_bound(800, 4, 0.5, [], 4) == 0
    with pytest.raises(ValueError, match="compact_at < 1"):
        dynamic_kv_bound(800, 4, 1.0, [10], 4)
