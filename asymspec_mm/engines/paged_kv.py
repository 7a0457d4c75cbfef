"""The tensors behind a :class:`~.block_pool.BlockPool`: one model's paged KV, and the cache a forward attends through.

:class:`PagedKV` keeps, per layer, one tensor per pool segment, ``[segment_blocks * block_size, 2, H, D]``
(slot-major, each slot's keys and values side by side: slot ``s`` of the pool is row ``s`` of the segments in
order, and one read takes both). Growing the pool adds a segment (zeros: a hole gathered into attention is masked, and must never carry a NaN into it); trimming
drops the last ones. No existing tensor is ever reallocated, so the memory the pool holds is exactly its segments.

:class:`PagedCache` is the transformers ``Cache`` a batched forward runs on. Before the forward the storage sets its
:class:`ForwardPlan`: for each row in the batch, the slots of its context (left-aligned, hole slots after a
shorter row's context up to the longest, ``past`` columns in all) and the slots its new tokens go to. Each layer's
``update`` writes the row's new keys/values into their slots and returns that row-major view ``[B, H, past + n,
D]``: the gathered context, then the new keys (pads included, as the forward computed them). The view is transient
(one layer at a time, freed after that layer's attention); the 2D mask ``[B, past + n]`` hides the hole columns,
and causality over columns hides the pads after a row's last real token, as for the batched dynamic cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .block_pool import BlockPool, BlockTable


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

    def _split(self, slots: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """``slots`` ``[N]`` (CPU, long) by segment: ``(segment, positions in slots, offsets in the segment)``."""
        if len(self._starts) == 1:
            return [(0, torch.arange(slots.numel()), slots)]
        starts = torch.tensor(self._starts)
        seg = torch.bucketize(slots, starts, right=True) - 1
        out = []
        for s in seg.unique().tolist():
            at = (seg == s).nonzero().reshape(-1)
            out.append((s, at, slots[at] - self._starts[s]))
        return out

    def write_plan(self, slots: list[int]) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """Where tokens bound for ``slots`` go, by segment (computed once per forward, used by every layer)."""
        return self._split(torch.tensor(slots, dtype=torch.long)) if slots else []

    def write(self, layer: int, plan: list[tuple[int, torch.Tensor, torch.Tensor]], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``keys`` / ``values`` ``[N, H, D]`` of layer ``layer`` at the slots of ``plan`` (:meth:`write_plan`)."""
        if not plan:
            return
        both = torch.stack([keys, values], dim=1).to(self.dtype)  # [N, 2, H, D]
        device = self.devices[layer]
        for s, at, offsets in plan:
            part = both if len(plan) == 1 else both.index_select(0, at.to(both.device))
            self.segments[layer][s].index_copy_(0, offsets.to(device), part.to(device))

    def read_plan(self, slots: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor]], torch.Tensor | None]:
        """Where the tokens at ``slots`` ``[N]`` (CPU, long) are read from (once per forward, used by every layer):
        each segment's offsets, and the order that puts the segments' reads back in the order of ``slots``
        (``None``: one segment, already in order)."""
        parts = self._split(slots.reshape(-1).to("cpu", torch.long))
        if len(parts) == 1:
            return [(parts[0][0], parts[0][2])], None
        back = torch.argsort(torch.cat([at for _, at, _ in parts])) if parts else torch.zeros(0, dtype=torch.long)
        return [(s, offsets) for s, _, offsets in parts], back

    def gather(self, layer: int, plan: tuple[list[tuple[int, torch.Tensor]], torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``layer`` at the slots of ``plan`` (:meth:`read_plan`): ``[N, H, D]`` each. Each
        segment is read at its own slots only (never concatenated whole: that would copy the pool every layer)."""
        device, segments = self.devices[layer], self.segments[layer]
        parts, back = plan
        if not parts:
            empty = torch.zeros(0, self.kv_heads, self.head_dim, dtype=self.dtype, device=device)
            return empty, empty
        got = [segments[s].index_select(0, o.to(device)) for s, o in parts]
        both = got[0] if back is None else torch.cat(got).index_select(0, back.to(device))
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


@dataclass
class ForwardPlan:
    """What one batched forward reads and writes (module docstring): ``rows`` x ``past`` columns of context (``read``:
    :meth:`PagedKV.read_plan` of each row's context slots, row-major; hole columns read slot 0 and are masked),
    ``write`` (:meth:`PagedKV.write_plan` of the real new tokens' slots) and ``new`` ``[N]``: where those tokens are
    in the forward's flattened ``[B * n]`` new columns."""

    rows: int
    past: int
    read: tuple[list[tuple[int, torch.Tensor]], torch.Tensor | None]
    write: list[tuple[int, torch.Tensor, torch.Tensor]]
    new: torch.Tensor


class PagedLayer(CacheLayerMixin):
    """One layer of a :class:`PagedCache`: writes a forward's new keys into the pool, returns the row-major view."""

    is_sliding = False

    def __init__(self, kv: PagedKV, index: int):
        super().__init__()
        self.kv, self.index = kv, index
        self.plan: ForwardPlan | None = None
        self.device = kv.devices[index]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.plan
        B, H, n, D = key_states.shape
        new = plan.new.to(key_states.device)
        fresh_k = key_states.transpose(1, 2).reshape(B * n, H, D).index_select(0, new)
        fresh_v = value_states.transpose(1, 2).reshape(B * n, H, D).index_select(0, new)
        # gather before writing: the forward's own tokens come from key_states, the pool only holds the context
        past_k, past_v = self.kv.gather(self.index, plan.read)
        self.kv.write(self.index, plan.write, fresh_k, fresh_v)
        shape = (B, plan.past, H, D)
        keys = torch.cat([past_k.view(shape).transpose(1, 2).to(key_states.dtype), key_states], dim=2)
        values = torch.cat([past_v.view(shape).transpose(1, 2).to(value_states.dtype), value_states], dim=2)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if self.plan is None else self.plan.past

    def get_max_length(self) -> int:
        return -1


class PagedCache(Cache):
    """The cache of one batched forward over paged rows: a :class:`PagedLayer` per layer, all reading one plan."""

    def __init__(self, kv: PagedKV):
        super().__init__(layers=[PagedLayer(kv, i) for i in range(kv.n_layers)])

    def set_plan(self, plan: ForwardPlan | None) -> None:
        for layer in self.layers:
            layer.plan = plan


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
