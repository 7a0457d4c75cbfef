"""Fixed-size KV blocks of one model's storage, and each row's block table: pure bookkeeping, no tensors.

A *block* holds ``block_size`` consecutive tokens of one row (keys and values of every layer live in the storage's
tensors at the block's slots ``block * block_size .. + block_size - 1``). A row's context is its
:class:`BlockTable`: the blocks in logical order and its length, so token ``i`` of the row sits at slot
``blocks[i // block_size] * block_size + i % block_size``. A row wastes at most the unfilled tail of its last block.

Blocks are reference counted: a prompt prefix shared by several rows (:meth:`BlockPool.fork`) is one set of
blocks; a row about to write into a shared, partly filled last block first gets its own copy of it
(copy-on-write: :meth:`BlockPool.append` returns the ``(source, copy)`` block pairs the storage must copy). A
rollback frees the blocks past the new length, a row that leaves frees all of its own.

The pool grows in *segments* (a segment-layout storage allocates one tensor per segment, never reallocating or
copying an existing one; a contiguous one grows its per-layer tensors by the segment's slots): a segment is at least ``min_segment`` blocks and ``growth`` times the capacity so far, so the
capacity exceeds what the rows need by at most that share. Free blocks are taken lowest id first, so rows that
leave empty the last segments, which :meth:`BlockPool.trim` gives back.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ..base.checks import is_int


@dataclass
class BlockTable:
    """One row's context: its ``blocks`` in logical order and its ``length`` in tokens
    (``len(blocks) == ceil(length / block_size)``)."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens of one row."""
    return -(-tokens // block_size)


def capacity_bound(capacity: int, need: int, growth: float, min_segment: int) -> int:
    """The most blocks a pool of ``capacity`` blocks holds once ``need`` blocks are in use, allocated in any order.

    :meth:`BlockPool.allocate` adds a segment only when the free blocks run short, of ``max(short, ceil(capacity *
    growth), min_segment)`` blocks: either exactly what is needed then, or, from a capacity of at most ``need - 1``,
    at most ``max(ceil(need * growth), min_segment)`` more."""
    if need <= capacity:
        return capacity
    return need - 1 + max(math.ceil(need * growth), min_segment)


class BlockPool:
    """Block ids ``0 .. capacity - 1``, their reference counts and free list (module docstring).

    block_size: tokens per block; growth / min_segment: the size of each new segment (a share of the capacity so
    far, and a floor in blocks). ``segments``: the blocks of each segment, in id order.
    """

    def __init__(self, block_size: int = 16, *, growth: float = 1 / 16, min_segment: int = 1):
        if not is_int(block_size, minimum=1):
            raise ValueError(f"block_size={block_size!r} must be an integer >= 1")
        if not 0.0 <= growth <= 1.0 or min_segment < 1:
            raise ValueError(f"growth must be in [0, 1] and min_segment >= 1 (got {growth}, {min_segment})")
        self.block_size, self.growth, self.min_segment = block_size, growth, min_segment
        self.segments: list[int] = []
        self._refs: list[int] = []  # block id -> rows (and contexts) that hold it; 0: free
        self._free: list[int] = []  # a heap of free ids: the lowest is taken first

    # ------------------------------------------------------------------ blocks
    @property
    def capacity(self) -> int:
        """Blocks that exist (free or not)."""
        return len(self._refs)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.capacity - len(self._free)

    def refs(self, block: int) -> int:
        """How many tables hold ``block`` (0: free)."""
        return self._refs[block]

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks (lowest ids first), each with one reference; a segment is added if too few are free."""
        short = n - len(self._free)
        if short > 0:
            size = max(short, math.ceil(self.capacity * self.growth), self.min_segment)
            start = self.capacity
            self.segments.append(size)
            self._refs.extend([0] * size)
            for block in range(start, start + size):
                heapq.heappush(self._free, block)
        out = [heapq.heappop(self._free) for _ in range(n)]
        for block in out:
            self._refs[block] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        """One more reference to each of ``blocks`` (all in use)."""
        for block in blocks:
            if not self._refs[block]:
                raise ValueError(f"block {block} is free: only a block in use can be shared")
            self._refs[block] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each of ``blocks``; a block nobody holds is free again."""
        for block in blocks:
            if not self._refs[block]:
                raise ValueError(f"block {block} is already free")
            self._refs[block] -= 1
            if not self._refs[block]:
                heapq.heappush(self._free, block)

    def trim(self) -> int:
        """Give back the last segments while all their blocks are free; returns how many segments went."""
        gone = 0
        while self.segments:
            start = self.capacity - self.segments[-1]
            if any(self._refs[start:]):
                break
            del self._refs[start:]
            self.segments.pop()
            gone += 1
        if gone:
            self._free = [b for b in self._free if b < self.capacity]
            heapq.heapify(self._free)
        return gone

    # ------------------------------------------------------------------ tables
    def slot(self, table: BlockTable, i: int) -> int:
        """The storage slot of token ``i`` of ``table``."""
        return table.blocks[i // self.block_size] * self.block_size + i % self.block_size

    def slots(self, table: BlockTable, start: int = 0, stop: int | None = None) -> list[int]:
        """The storage slots of tokens ``start .. stop - 1`` of ``table`` (default: all of them), in order."""
        stop = table.length if stop is None else stop
        bs = self.block_size
        return [table.blocks[i // bs] * bs + i % bs for i in range(start, stop)]

    def append(self, table: BlockTable, n: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Make room for ``n`` more tokens of ``table``: returns their slots and the ``(source, copy)`` block pairs
        to copy first (a shared, partly filled last block becomes the row's own copy before it is written)."""
        copies: list[tuple[int, int]] = []
        if n <= 0:
            return [], copies
        if table.length % self.block_size and self._refs[table.blocks[-1]] > 1:
            (own,) = self.allocate(1)
            copies.append((table.blocks[-1], own))
            self.free([table.blocks[-1]])
            table.blocks[-1] = own
        start = table.length
        more = blocks_for(start + n, self.block_size) - len(table.blocks)
        if more > 0:
            table.blocks.extend(self.allocate(more))
        table.length = start + n
        return self.slots(table, start, start + n), copies

    def truncate(self, table: BlockTable, length: int) -> None:
        """Keep the first ``length`` tokens of ``table``; the blocks past them are freed (a rollback)."""
        if not 0 <= length <= table.length:
            raise ValueError(f"a row of {table.length} tokens cannot keep {length}")
        keep = blocks_for(length, self.block_size)
        self.free(table.blocks[keep:])
        del table.blocks[keep:]
        table.length = length

    def fork(self, table: BlockTable, length: int | None = None) -> BlockTable:
        """A new table sharing the blocks of the first ``length`` tokens of ``table`` (default: all), by reference."""
        length = table.length if length is None else length
        if not 0 <= length <= table.length:
            raise ValueError(f"a row of {table.length} tokens cannot share {length}")
        blocks = table.blocks[: blocks_for(length, self.block_size)]
        self.share(blocks)
        return BlockTable(list(blocks), length)

    def release(self, table: BlockTable) -> None:
        """Free every block of ``table`` (a row that leaves, a context that was joined); it is empty afterwards."""
        self.free(table.blocks)
        table.blocks, table.length = [], 0
