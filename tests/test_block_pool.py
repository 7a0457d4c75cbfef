"""The block pool of paged KV (issue #51): exact block counts, reference counts, copy-on-write, freeing, segments."""

from __future__ import annotations

import random

import pytest

from asymspec_mm.engines.block_pool import BlockPool, BlockTable, blocks_for, capacity_bound


def test_append_allocates_exactly_the_blocks_the_tokens_fill():
    pool = BlockPool(4, growth=0.0, min_segment=1)
    table = BlockTable()
    slots, copies = pool.append(table, 5)
    assert (table.blocks, table.length, copies) == ([0, 1], 5, [])
    assert slots == [0, 1, 2, 3, 4]
    slots, _ = pool.append(table, 3)  # fills block 1 exactly: no new block
    assert (table.blocks, slots) == ([0, 1], [5, 6, 7])
    slots, _ = pool.append(table, 1)
    assert (table.blocks, slots) == ([0, 1, 2], [8])
    assert pool.used_blocks == 3 and pool.capacity == 3
    assert pool.slots(table) == list(range(9))
    assert pool.slot(table, 8) == 8


def test_rollback_frees_the_blocks_past_the_new_length():
    pool = BlockPool(4, growth=0.0, min_segment=1)
    table = BlockTable()
    pool.append(table, 10)  # 3 blocks
    pool.truncate(table, 8)  # 2 full blocks
    assert (table.blocks, table.length, pool.used_blocks, pool.free_blocks) == ([0, 1], 8, 2, 1)
    pool.truncate(table, 5)
    assert (table.blocks, pool.used_blocks) == ([0, 1], 2)  # block 1 still holds token 4
    pool.truncate(table, 0)
    assert (table.blocks, pool.used_blocks) == ([], 0)
    with pytest.raises(ValueError, match="cannot keep 1"):
        pool.truncate(table, 1)


def test_free_blocks_are_reused_lowest_first():
    pool = BlockPool(2, growth=0.0, min_segment=1)
    a, b = BlockTable(), BlockTable()
    pool.append(a, 4)  # blocks 0, 1
    pool.append(b, 4)  # blocks 2, 3
    pool.release(a)
    assert (a.blocks, a.length, pool.free_blocks) == ([], 0, 2)
    c = BlockTable()
    pool.append(c, 3)
    assert c.blocks == [0, 1] and pool.capacity == 4


def test_fork_shares_by_reference_and_copy_on_write_copies_only_the_partial_last_block():
    pool = BlockPool(4, growth=0.0, min_segment=1)
    prompt = BlockTable()
    pool.append(prompt, 6)  # blocks 0 (full), 1 (2 of 4)
    a, b = pool.fork(prompt), pool.fork(prompt)
    assert pool.used_blocks == 2 and [pool.refs(x) for x in (0, 1)] == [3, 3]
    slots, copies = pool.append(a, 1)  # a writes into the shared block 1: its own copy first
    assert copies == [(1, 2)] and a.blocks == [0, 2] and slots == [2 * 4 + 2]
    assert [pool.refs(x) for x in (0, 1, 2)] == [3, 2, 1]
    _, copies = pool.append(a, 1)  # now its own: no copy
    assert copies == []
    pool.release(prompt)
    _, copies = pool.append(b, 1)  # b alone holds block 1 now: written in place
    assert copies == [] and b.blocks == [0, 1]
    assert [pool.refs(x) for x in (0, 1, 2)] == [2, 1, 1]


def test_fork_at_a_block_boundary_never_copies():
    pool = BlockPool(4, growth=0.0, min_segment=1)
    prompt = BlockTable()
    pool.append(prompt, 8)
    a = pool.fork(prompt)
    _, copies = pool.append(a, 3)
    assert copies == [] and a.blocks == [0, 1, 2]
    part = pool.fork(prompt, 5)  # a prefix of 5 tokens: blocks 0 and 1, block 1 partly its own
    assert part.blocks == [0, 1] and part.length == 5 and pool.refs(1) == 3
    _, copies = pool.append(part, 1)
    assert copies == [(1, 3)] and part.blocks == [0, 3]


def test_truncating_into_a_shared_block_then_writing_copies_it():
    pool = BlockPool(4, growth=0.0, min_segment=1)
    a = BlockTable()
    pool.append(a, 8)
    b = pool.fork(a)
    pool.truncate(b, 6)  # b's last block (1) is shared and now partly filled
    assert pool.refs(1) == 2
    _, copies = pool.append(b, 1)
    assert copies == [(1, 2)] and b.blocks == [0, 2] and pool.refs(1) == 1


def test_double_free_and_sharing_a_free_block_are_errors():
    pool = BlockPool(4)
    (x,) = pool.allocate(1)
    pool.free([x])
    with pytest.raises(ValueError, match="already free"):
        pool.free([x])
    with pytest.raises(ValueError, match="is free"):
        pool.share([x])
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(0)


def test_segments_grow_by_the_share_and_trim_gives_back_empty_tail_segments():
    pool = BlockPool(16, growth=0.25, min_segment=2)
    assert pool.allocate(1) == [0] and pool.segments == [2]
    pool.allocate(1)
    pool.allocate(1)  # short by 1: max(1, ceil(2 * 0.25), 2) = 2 more
    assert pool.segments == [2, 2]
    pool.allocate(10)  # short by 9 of 4 + 9
    assert pool.segments == [2, 2, 9] and pool.capacity == 13
    pool.allocate(1)  # short by 1: ceil(13 * 0.25) = 4
    assert pool.segments == [2, 2, 9, 4]
    pool.free(list(range(3, 14)))  # blocks 3..13 free: the last two segments are empty
    assert pool.trim() == 2 and pool.segments == [2, 2] and pool.capacity == 4
    assert pool.allocate(1) == [3]  # the freed ids past the capacity are gone from the free list
    assert pool.trim() == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_rows_keep_exact_counts_and_the_capacity_bound(seed):
    """Rows append, roll back, fork and leave at random: every block's reference count equals the tables that hold
    it, the used blocks equal the distinct blocks held, and the capacity stays within :func:`capacity_bound`."""
    rng = random.Random(seed)
    pool = BlockPool(8, growth=1 / 16, min_segment=2)
    tables: list[BlockTable] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.15 or not tables:
            t = BlockTable()
            pool.append(t, rng.randint(1, 40))
            tables.append(t)
        elif op < 0.25:
            src = rng.choice(tables)
            tables.append(pool.fork(src, rng.randint(0, src.length)))
        elif op < 0.35:
            pool.release(tables.pop(rng.randrange(len(tables))))
            pool.trim()
        elif op < 0.55:
            t = rng.choice(tables)
            pool.truncate(t, rng.randint(0, t.length))
        else:
            before = pool.capacity
            need = pool.used_blocks + blocks_for(40, 8) + 1
            pool.append(rng.choice(tables), rng.randint(1, 40))
            assert pool.capacity <= capacity_bound(before, need, pool.growth, pool.min_segment)
        held: dict[int, int] = {}
        for t in tables:
            assert len(t.blocks) == blocks_for(t.length, 8)
            for b in t.blocks:
                held[b] = held.get(b, 0) + 1
        assert {b: pool.refs(b) for b in range(pool.capacity) if pool.refs(b)} == held
        assert pool.used_blocks == len(held)
        assert pool.capacity == sum(pool.segments)
