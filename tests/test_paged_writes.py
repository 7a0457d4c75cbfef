"""How a paged forward writes and reads the pool (issue #51, speed of paged decode). A segment pool of several
segments writes every layer's new keys at once, one write per segment the new tokens land in, however many layers
the model has, and copies each layer's segments into one tensor to read them; a pool whose layer slots are one
tensor (a contiguous pool, or a segment pool of one segment) writes each layer in place and reads it with one
gather, copying no pool. Observed with a ``TorchDispatchMode`` that records the aten ops touching the pool's
tensors (nothing mocked: real forwards of the tiny verifier), and checked against single-row engines and the
padded storage fed the same tokens."""

from __future__ import annotations

import bisect
import random

import torch
from row_checks import assert_logits_close
from torch.utils._python_dispatch import TorchDispatchMode

from asymspec_mm.engines import TextEngine
from asymspec_mm.engines.paged_rows import PagedBatchEngine
from asymspec_mm.engines.pieces import PrefillChunk


def _tensors(held) -> list[torch.Tensor]:
    """Every tensor in ``held`` (nested lists and tuples; anything else is left out)."""
    if isinstance(held, torch.Tensor):
        return [held]
    if isinstance(held, (list, tuple)):
        return [t for item in held for t in _tensors(item)]
    return []


class PoolWrites(TorchDispatchMode):
    """Records the aten ops that write into a storage of ``kv``'s tensors (``writes``) and the other ops that take
    one as an input (``reads``; views aside), looked up at each op, so tensors the pool adds meanwhile count too."""

    def __init__(self, kv):
        super().__init__()
        self.kv, self.writes, self.reads = kv, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pool = {t.untyped_storage().data_ptr() for t in _tensors(self.kv.tensors())}
        target = args[0] if args else None
        alias = func._schema.arguments[0].alias_info if func._schema.arguments else None
        writes = isinstance(target, torch.Tensor) and alias is not None and alias.is_write
        if writes and target.untyped_storage().data_ptr() in pool:
            self.writes.append(func.overloadpacket.__name__)
        elif not writes and not any(r.alias_info for r in func._schema.returns):  # a view reads nothing
            if any(t.untyped_storage().data_ptr() in pool for t in _tensors([*args, *kwargs.values()])):
                self.reads.append(func.overloadpacket.__name__)
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
    forward whose new tokens land in 5 segments writes the pool 5 times (not once per layer and segment), a row
    alone in one segment once per join and once per forward (read where it lies), a row alone over two segments once
    per segment (read as its runs of slots); every row stays equal to its single-row engine."""
    model, rng = tiny_pipe.verifier, random.Random(3)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    assert layers > 1
    engine = PagedBatchEngine(model, "verifier", block_size=4, layout="segments")
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
    assert seen.reads.count("cat") == layers  # each layer copies its segments into one tensor to read them
    for r, t in ids.items():
        assert_logits_close(got[r], singles[r].extend(t), ("first", r))
    more = {r: torch.tensor([rng.randint(20, 480) for _ in range(3)]) for r in (1, 3)}
    got = engine.extend(more)  # reads what the first forward wrote
    for r, t in more.items():
        assert_logits_close(got[r], singles[r].extend(t), ("second", r))

    ids = [rng.randint(20, 480) for _ in range(29)]
    alone, single = PagedBatchEngine(model, "verifier", block_size=4, layout="segments"), _prefilled(model, ids)
    alone.join(0, _prefilled(model, ids))
    assert len(alone.pool.segments) == 1
    with PoolWrites(alone.kv) as seen:
        got = alone.extend({0: torch.tensor([40, 41])})  # 31 tokens: the 8 blocks it has
    # one segment holds every slot and the row's blocks are consecutive: each layer writes its new keys in place and
    # the attention reads the row's slots where they lie (its one read of the pool), no gather, no copy
    assert seen.writes == ["index_copy_"] * layers, seen.writes
    assert len(seen.reads) == layers and "index_select" not in seen.reads and "cat" not in seen.reads, seen.reads
    assert_logits_close(got[0], single.extend(torch.tensor([40, 41])), "alone, one segment")
    with PoolWrites(alone.kv) as seen:
        got = alone.extend({0: torch.tensor([42, 43, 44])})  # the last slot of the 8th block, a 9th: a second segment
    assert len(alone.pool.segments) == 2
    # a row alone over two segments: each layer copies the row's two runs and its new keys side by side (one cat
    # of the row's own slots), then every layer's new keys are written at once, once per segment they land in (both)
    assert seen.reads == ["cat"] * layers and seen.writes == ["index_copy_"] * 2, seen.__dict__
    assert_logits_close(got[0], single.extend(torch.tensor([42, 43, 44])), "alone, two segments")


def test_a_contiguous_pool_reads_in_place_and_equals_the_segments_and_the_padded_storage(tiny_pipe):
    """The same rows (joined one after another: 4 growth steps of the pool) in a contiguous pool, a segment pool
    and the padded storage: a decode forward of the contiguous pool writes each layer's new keys once in place and
    reads each layer with one gather per group of rows, copying no pool (the segment pool copies each layer's
    segments); its logits are bit-identical to the segment pool's and equal the padded storage's and each row's
    single-row engine's, and again after rollbacks and a prompt chunk beside the decode rows."""
    from asymspec_mm.core import BatchEngine

    model, rng = tiny_pipe.verifier, random.Random(5)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    prompts = [[rng.randint(20, 480) for _ in range(length)] for length in (10, 13, 6, 21)]
    arms = {
        "contiguous": PagedBatchEngine(model, "verifier", block_size=4, layout="contiguous"),
        "segments": PagedBatchEngine(model, "verifier", block_size=4, layout="segments"),
        "padded": BatchEngine(model, "verifier"),
    }
    for arm in arms.values():
        for row, ids in enumerate(prompts):
            arm.join(row, _prefilled(model, ids))
    singles = {row: _prefilled(model, ids) for row, ids in enumerate(prompts)}
    contiguous = arms["contiguous"]
    assert len(contiguous.pool.segments) == 4 and len(contiguous.kv.tensors()) == layers
    ids = {r: torch.tensor([rng.randint(20, 480) for _ in range(2)]) for r in range(4)}  # the last blocks have room
    capacity = contiguous.pool.capacity
    with PoolWrites(contiguous.kv) as seen:
        got = contiguous.extend(ids)
    assert contiguous.pool.capacity == capacity  # no reallocation in this forward
    assert seen.writes == ["index_copy_"] * layers and seen.reads == ["index_select"] * layers, seen.__dict__
    others = {name: arms[name].extend(ids) for name in ("segments", "padded")}
    for r, t in ids.items():
        assert torch.equal(got[r], others["segments"][r]), r
        assert_logits_close(got[r], others["padded"][r], ("padded", r))
        assert_logits_close(got[r], singles[r].extend(t), ("single", r))
    for arm in (contiguous, arms["segments"]):
        arm.truncate(1, 11)
        arm.truncate(3, 20)
    for single, length in ((singles[1], 11), (singles[3], 20)):
        single.truncate(length)
    more = {0: torch.tensor([rng.randint(20, 480) for _ in range(3)]), 3: torch.tensor([rng.randint(20, 480) for _ in range(3)])}
    chunk = {1: PrefillChunk(torch.tensor([rng.randint(20, 480) for _ in range(40)]))}  # rides; the pool grows
    got = {name: arms[name].extend(more, prompts=chunk) for name in ("contiguous", "segments")}
    singles[1].extend(chunk[1].ids)
    for r, t in more.items():
        assert torch.equal(got["contiguous"][r], got["segments"][r]), r
        assert_logits_close(got["contiguous"][r], singles[r].extend(t), ("single", r))
    after = {1: torch.tensor([rng.randint(20, 480) for _ in range(2)])}
    assert_logits_close(contiguous.extend(after)[1], singles[1].extend(after[1]), ("single", "after the chunk"))


def test_the_layout_is_chosen_by_the_number_of_layers_and_a_reallocation_counts_in_the_peak(tiny_pipe):
    """Contiguous from 16 layers on (a reallocation's copy, one layer, is at most the pool's 1/16 growth share),
    segments below (the 4-layer tiny pair: a quarter of the pool); a contiguous pool that grows from 10 to 11 blocks
    peaks at exactly the new pool plus one old layer's tensor, which its bound counts, and keeps every slot."""
    from asymspec_mm.engines.block_pool import BlockPool
    from asymspec_mm.engines.paged_kv import PagedKV, choose_layout
    from asymspec_mm.engines.paged_rows import paged_kv_bound

    assert [choose_layout(n, 1 / 16) for n in (2, 4, 15, 16, 28, 36)] == ["segments"] * 3 + ["contiguous"] * 3
    assert PagedBatchEngine(tiny_pipe.verifier, "verifier").kv.layout == "segments"
    layers, bs = 28, 4
    kv = PagedKV(BlockPool(bs), kv_heads=2, head_dim=8, dtype=torch.float32, devices=[torch.device("cpu")] * layers)
    assert kv.layout == "contiguous" and kv.realloc_share == 1 / layers
    kv.pool.allocate(10)
    kv.sync()
    slot = kv.slot_bytes()
    assert kv.peak_bytes == kv.nbytes() == 10 * bs * slot
    kv.write_layers(kv.write_plan(list(range(40))), [torch.full((2, 2, 40, 8), float(layer)) for layer in range(layers)])
    kv.pool.allocate(1)  # a segment of ceil(10 / 16) = 1 block: every layer reallocated
    kv.sync()
    assert kv.pool.capacity == 11 and kv.nbytes() == 11 * bs * slot
    assert kv.peak_bytes == 11 * bs * slot + 10 * bs * slot // layers
    assert kv.peak_bytes <= paged_kv_bound(bs * slot, bs, 1 / 16, 1, [44], kv.realloc_share)
    assert kv.peak_bytes > paged_kv_bound(bs * slot, bs, 1 / 16, 1, [44])  # without the copy it would not bound it
    for layer, both in enumerate(kv.gather_layers(kv.read_plan(torch.arange(44)))):
        assert torch.equal(both[:, :, :40], torch.full((2, 2, 40, 8), float(layer))) and not both[:, :, 40:].any()
