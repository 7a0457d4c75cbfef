"""The tensors behind a :class:`~.block_pool.BlockPool`: one model's paged KV, and a row's context by reference.

:class:`PagedKV` keeps, per layer, one tensor per pool segment, ``[segment_blocks * block_size, 2, H, D]``
(slot-major, each slot's keys and values side by side: slot ``s`` of the pool is row ``s`` of the segments in
order, and one read takes both). Growing the pool adds a segment (zeros: a hole slot read into attention is masked,
and must never carry a NaN into it); trimming drops the last ones. No existing tensor is ever reallocated, so the
memory the pool holds is exactly its segments. Reads and writes go through plans (:meth:`PagedKV.read_plan`,
:meth:`PagedKV.write_plan`: slots split by segment) computed once per forward and used by every layer; the
attention over the pool is :mod:`.paged_attention`'s.
"""

from __future__ import annotations

import torch

from .block_pool import BlockPool, BlockTable

#: Where a forward's tokens go: the order that groups them by segment (``None``: one segment), and per segment
#: ``(segment, first, stop, offsets)``: the grouped tokens ``first .. stop - 1`` go to ``offsets`` in it.
WritePlan = tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]]
#: Where tokens are read from: each segment's offsets, and the order that puts the reads back (``None``: in order).
ReadPlan = tuple[list[tuple[int, torch.Tensor]], torch.Tensor | None]


class PagedKV:
    """Keys and values of one model in the blocks of ``pool`` (module docstring). ``kv_heads``, ``head_dim``,
    ``dtype``: the model's KV shape; ``devices``: each layer's device (a device_map may spread them)."""

    def __init__(self, pool: BlockPool, *, kv_heads: int, head_dim: int, dtype: torch.dtype, devices: list[torch.device]):
        self.pool = pool
        self.kv_heads, self.head_dim, self.dtype, self.devices = kv_heads, head_dim, dtype, devices
        # layer -> segment -> [blocks * bs, 2, H, D]: a slot's keys and values side by side, read in one op
        self.segments: list[list[torch.Tensor]] = [[] for _ in devices]
        self._starts: list[int] = []  # the first slot of each segment
        self.peak_bytes = 0  # the most bytes the segments held (the owning storage resets it)

    @property
    def n_layers(self) -> int:
        return len(self.devices)

    def slot_bytes(self) -> int:
        """One token over all layers, keys and values."""
        return self.n_layers * 2 * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    def nbytes(self) -> int:
        """Bytes the segments hold (every block, free or not)."""
        return self.pool.capacity * self.pool.block_size * self.slot_bytes()

    def sync(self) -> None:
        """Match the tensors to the pool's segments: new segments get zero tensors, trimmed ones are dropped."""
        bs = self.pool.block_size
        have, want = len(self._starts), len(self.pool.segments)
        for size in self.pool.segments[have:]:
            self._starts.append(sum(self.pool.segments[: len(self._starts)]) * bs)
            for i, device in enumerate(self.devices):
                self.segments[i].append(torch.zeros(size * bs, 2, self.kv_heads, self.head_dim, dtype=self.dtype, device=device))
        if want < have:
            del self._starts[want:]
            for i in range(self.n_layers):
                del self.segments[i][want:]
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def _split(self, slots: torch.Tensor) -> tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]]:
        """``slots`` ``[N]`` (CPU, long) by segment: the order that sorts them by segment (``None``: one segment, in
        order) and, per segment, ``(segment, first, stop, offsets)``: sorted positions ``first .. stop - 1`` go to
        (or come from) ``offsets`` in that segment."""
        if len(self._starts) == 1:
            return None, [(0, 0, slots.numel(), slots)]
        starts = torch.tensor(self._starts)
        seg = torch.bucketize(slots, starts, right=True) - 1
        order = torch.argsort(seg, stable=True)
        offsets = slots[order] - starts[seg[order]]
        counts = torch.bincount(seg, minlength=len(self._starts)).tolist()
        parts, first = [], 0
        for s, count in enumerate(counts):
            if count:
                parts.append((s, first, first + count, offsets[first : first + count]))
                first += count
        return (None if len(parts) == 1 else order), parts

    def _on(self, plan: tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]], device: torch.device):
        order, parts = plan
        return (None if order is None else order.to(device)), [(s, a, b, o.to(device)) for s, a, b, o in parts]

    def write_plan(self, slots: list[int]) -> WritePlan:
        """Where tokens bound for ``slots`` go, by segment (computed once per forward, used by every layer)."""
        return self._on(self._split(torch.tensor(slots, dtype=torch.long)), self.devices[0]) if slots else (None, [])

    def write(self, layer: int, plan: WritePlan, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys`` / ``values`` ``[N, H, D]`` of layer ``layer`` at the slots of ``plan`` (:meth:`write_plan`)."""
        order, parts = plan
        if not parts:
            return
        device = self.devices[layer]
        both = torch.stack([keys, values], dim=1)  # [N, 2, H, D]
        if both.device != device or both.dtype != self.dtype:
            both = both.to(device, self.dtype)
        if order is not None:  # grouped by segment: each segment takes one slice
            both = both.index_select(0, _on(order, device))
        for s, first, stop, offsets in parts:
            self.segments[layer][s].index_copy_(0, _on(offsets, device), both if len(parts) == 1 else both[first:stop])

    def read_plan(self, slots: torch.Tensor) -> ReadPlan:
        """Where the tokens at ``slots`` (CPU, long; any shape, read flattened) are read from (once per forward, used
        by every layer): each segment's offsets, and the order that puts the segments' reads back in the order of
        ``slots`` (``None``: one segment, already in order)."""
        order, parts = self._on(self._split(slots.reshape(-1).to("cpu", torch.long)), self.devices[0])
        back = None if order is None else torch.argsort(order)
        return [(s, offsets) for s, _, _, offsets in parts], back

    def gather_both(self, layer: int, plan: ReadPlan) -> torch.Tensor:
        """Keys and values of layer ``layer`` at the slots of ``plan`` (:meth:`read_plan`), side by side: ``[N, 2, H,
        D]``. Each segment is read at its own slots only (never concatenated whole: that would copy the pool)."""
        device, segments = self.devices[layer], self.segments[layer]
        parts, back = plan
        if not parts:
            return torch.zeros(0, 2, self.kv_heads, self.head_dim, dtype=self.dtype, device=device)
        got = [segments[s].index_select(0, _on(o, device)) for s, o in parts]
        return got[0] if back is None else torch.cat(got).index_select(0, _on(back, device))

    def whole(self, layer: int) -> torch.Tensor:
        """Every slot of layer ``layer`` in one tensor ``[slots, 2, H, D]`` (a copy when the pool has several
        segments): what a forward that reads most of the pool gathers from, one read instead of one per segment."""
        segments = self.segments[layer]
        return segments[0] if len(segments) == 1 else torch.cat(segments)

    def gather(self, layer: int, plan: ReadPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``layer`` at the slots of ``plan`` (:meth:`read_plan`): ``[N, H, D]`` each."""
        both = self.gather_both(layer, plan)
        return both[:, 0], both[:, 1]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy each ``(source, destination)`` block on every layer (copy-on-write of a shared last block)."""
        if not copies:
            return
        bs = self.pool.block_size
        src = [b * bs + i for b, _ in copies for i in range(bs)]
        dst = [b * bs + i for _, b in copies for i in range(bs)]
        plan, read = self.write_plan(dst), self.read_plan(torch.tensor(src))
        for layer in range(self.n_layers):
            k, v = self.gather(layer, read)
            self.write(layer, plan, k, v)

    def store(self, table: BlockTable, start: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write ``layers`` (``[(keys, values)]`` per layer, each ``[1, H, n, D]``) as tokens ``start .. start + n -
        1`` of ``table`` (their blocks already allocated)."""
        n = layers[0][0].shape[-2]
        plan = self.write_plan(self.pool.slots(table, start, start + n))
        for layer, (k, v) in enumerate(layers):
            self.write(layer, plan, k[0].transpose(0, 1), v[0].transpose(0, 1))

    def read(self, table: BlockTable, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Tokens ``start .. stop - 1`` of ``table``, gathered: ``[(keys, values)]`` per layer, each ``[1, H, n, D]``."""
        read = self.read_plan(torch.tensor(self.pool.slots(table, start, stop), dtype=torch.long))
        out = []
        for layer in range(self.n_layers):
            k, v = self.gather(layer, read)
            out.append((k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)))
        return out


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` (the plans are made on the first layer's device; a device_map may put a layer elsewhere)."""
    return t if t.device == device else t.to(device)


class PagedRowContext:
    """One row's context held in a :class:`PagedKV` by reference (what a paged storage's ``detach`` hands out): a
    storage on the same ``kv`` joins it without copying (sharing its blocks), any other reads ``cache`` (a gathered
    single-row ``DynamicCache``). :meth:`release` drops this context's references."""

    def __init__(self, kv: PagedKV, table: BlockTable, rope_delta: int = 0, tokens_forwarded: int = 0, forward_calls: int = 0):
        self.kv, self.table = kv, table
        self.rope_delta, self.tokens_forwarded, self.forward_calls = rope_delta, tokens_forwarded, forward_calls
        self._cache = None

    @property
    def length(self) -> int:
        return self.table.length

    @property
    def cache(self):
        """The context as a single-row ``DynamicCache`` (gathered once, on first use; ``None`` when empty)."""
        if self._cache is None and self.table.length:
            from .prefix_kv import new_cache

            self._cache = new_cache(None, self.kv.read(self.table, 0, self.table.length))
        return self._cache

    def release(self) -> None:
        if self.table.blocks:
            self.kv.pool.release(self.table)
        self._cache = None
