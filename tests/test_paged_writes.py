"""How often a paged forward writes the pool (issue #51, speed of paged decode): every layer's new keys are written
at once, one write per pool segment the new tokens land in, however many layers the model has. Observed with a
``TorchDispatchMode`` that counts the aten ops mutating the pool's tensors (nothing mocked: real forwards of the
tiny verifier), and checked against single-row engines fed the same tokens."""

from __future__ import annotations

import bisect
import random

import torch
from row_checks import assert_logits_close
from torch.utils._python_dispatch import TorchDispatchMode

from asymspec_mm.engines import TextEngine
from asymspec_mm.engines.paged_rows import PagedBatchEngine


def _tensors(held) -> list[torch.Tensor]:
    """Every tensor in ``held`` (nested lists of tensors)."""
    if isinstance(held, torch.Tensor):
        return [held]
    return [t for item in held for t in _tensors(item)]


class PoolWrites(TorchDispatchMode):
    """Counts the aten ops that write into a storage of ``kv``'s segments (looked up at each write, so segments
    the pool adds meanwhile count too)."""

    def __init__(self, kv):
        super().__init__()
        self.kv, self.writes = kv, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else None
        alias = func._schema.arguments[0].alias_info if func._schema.arguments else None
        if isinstance(target, torch.Tensor) and alias is not None and alias.is_write:
            pool = {t.untyped_storage().data_ptr() for t in _tensors(self.kv.segments)}
            if target.untyped_storage().data_ptr() in pool:
                self.writes.append(func.overloadpacket.__name__)
        return func(*args, **kwargs)


def _segments_touched(engine: PagedBatchEngine, new: dict[int, int]) -> int:
    """How many pool segments hold the last ``new[row]`` tokens of each row."""
    pool, bs = engine.pool, engine.pool.block_size
    ends, total = [], 0
    for size in pool.segments:
        total += size
        ends.append(total)
    touched = set()
    for row, n in new.items():
        blocks, length = engine.blocks(row), engine.length(row)
        touched.update(bisect.bisect_right(ends, blocks[i // bs]) for i in range(length - n, length))
    return len(touched)


def _prefilled(model, ids: list[int]) -> TextEngine:
    engine = TextEngine(model, "verifier")
    engine.prefill(torch.tensor(ids))
    return engine


def test_a_forward_writes_the_pool_once_per_segment_whatever_the_layers(tiny_pipe):
    """Rows joined one after another each start a segment of their own (the pool never reallocates one); a decode
    forward whose new tokens land in 5 segments writes the pool 5 times (not once per layer and segment),
    a row alone in one segment once per join and once per forward; every row stays equal to its single-row engine."""
    model, rng = tiny_pipe.verifier, random.Random(3)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    assert layers > 1
    engine = PagedBatchEngine(model, "verifier", block_size=4)
    singles = {}
    for row, length in enumerate([10, 13, 7, 21]):  # the last blocks partly filled; row 2's fills up next
        ids = [rng.randint(20, 480) for _ in range(length)]
        with PoolWrites(engine.kv) as seen:
            engine.join(row, _prefilled(model, ids))
        assert seen.writes == ["index_copy_"], seen.writes  # all layers of the row's tokens at once
        singles[row] = _prefilled(model, ids)
    assert len(engine.pool.segments) == 4
    new = {0: 2, 1: 2, 2: 2, 3: 2}
    ids = {r: torch.tensor([rng.randint(20, 480) for _ in range(n)]) for r, n in new.items()}
    with PoolWrites(engine.kv) as seen:
        got = engine.extend(ids)
    touched = _segments_touched(engine, new)
    assert len(engine.pool.segments) == 5 and touched == 5  # row 2's new block is a fifth segment
    assert seen.writes == ["index_copy_"] * touched, (seen.writes, touched, layers)
    for r, t in ids.items():
        assert_logits_close(got[r], singles[r].extend(t), ("first", r))
    more = {r: torch.tensor([rng.randint(20, 480) for _ in range(3)]) for r in (1, 3)}
    got = engine.extend(more)  # reads what the first forward wrote
    for r, t in more.items():
        assert_logits_close(got[r], singles[r].extend(t), ("second", r))

    alone = PagedBatchEngine(model, "verifier", block_size=4)
    alone.join(0, _prefilled(model, [rng.randint(20, 480) for _ in range(30)]))
    assert len(alone.pool.segments) == 1
    with PoolWrites(alone.kv) as seen:
        alone.extend({0: torch.tensor([40, 41])})  # 32 tokens: the 8 blocks it has
    assert seen.writes == ["index_copy_"], seen.writes
