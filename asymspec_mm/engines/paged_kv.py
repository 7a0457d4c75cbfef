"""The tensors behind a :class:`~.block_pool.BlockPool`: one model's paged KV, and a row's context by reference.

Slot ``s`` of the pool holds one token's keys and values of every layer. A layer's slots are head-major, ``[2, H,
slots, D]`` (keys then values, each head's slots in order), the layout of a single-row cache: a run of consecutive
slots read in place is a view whose rows of ``D`` lie one after another within each head, which is what SDPA reads
fastest (a token-major ``[slots, 2, H, D]`` view made SDPA 1.5-1.8x slower on CPU at 8 KV heads of 128 and 300-2,000
tokens). The tensors come in one of two layouts, chosen by the model's number of layers (:func:`choose_layout`):

- ``"segments"``: one tensor per pool segment (per device, when a device_map spreads the layers), holding every
  layer: ``[layers, 2, H, segment_blocks * block_size, D]``; slot ``s`` is slot ``s`` of the segments in order.
  Growing the pool adds a segment (zeros: a hole slot read into attention is masked, and must never carry a NaN into
  it); trimming drops the last ones. No tensor is ever reallocated, so the memory the pool holds is exactly its
  segments, with no copy beside it. A forward's new keys are written once per segment they land in, not once per
  layer and segment: the attention hands each layer's new keys on to the forward's plan (:mod:`.paged_attention`
  reads them from there) and :meth:`PagedKV.write_layers` stores all layers' at the end. A pool of several segments
  is read by copying a layer's segments into one tensor (or per segment), since no tensor holds a layer's slots; a
  forward of one row copies only that row's runs of slots (:func:`~.paged_attention.slot_runs`).
- ``"contiguous"``: one tensor per layer, ``[2, H, slots, D]``, so a forward writes each layer's new keys in place
  and reads the rows' slots with one gather, copying nothing else. Growing or trimming the pool reallocates the
  layers one at a time: while a layer copies, its old tensor is held beside the pool, one layer's share of it, which
  the peak (:attr:`PagedKV.peak_bytes`) and the bounds (:attr:`PagedKV.realloc_share`) count.

A segment pool of one segment is read in place too (its one tensor holds every slot). Reads and writes go through
plans (:meth:`PagedKV.read_plan`, :meth:`PagedKV.write_plan`: slots split by segment) computed once per forward and
used by every layer.
"""

from __future__ import annotations

import bisect

import torch

from .block_pool import BlockPool, BlockTable

#: Where a forward's tokens go: the order that groups them by segment (``None``: one segment), and per segment
#: ``(segment, first, stop, offsets)``: the grouped tokens ``first .. stop - 1`` go to ``offsets`` in it.
WritePlan = tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]]
#: Where tokens are read from: each source's offsets, and the order that puts the reads back (``None``: in order).
ReadPlan = tuple[list[tuple[int, torch.Tensor]], torch.Tensor | None]


#: The pool layouts (module docstring).
LAYOUTS = ("segments", "contiguous")
#: The slot dimension of a layer's ``[2, H, slots, D]`` (a segment's ``[layers, 2, H, slots, D]``: one more).
SLOT_DIM = 2


def choose_layout(n_layers: int, growth: float) -> str:
    """The layout of a pool of ``n_layers`` layers growing by ``growth`` of its size (module docstring):
    ``"contiguous"`` when a reallocation's copy beside the pool (one layer's share, ``1 / n_layers``) is at most the
    growth share the pool's bounds already allow (1/16: 16 layers and more, e.g. 28 on Qwen3-0.6B and
    Qwen3-VL-2B), else ``"segments"`` (the 4-layer tiny pair, where a layer is a quarter of the pool)."""
    return "contiguous" if n_layers * growth >= 1 else "segments"


def device_groups(devices: list[torch.device]) -> list[tuple[torch.device, list[int]]]:
    """The layers on each device, in order of first appearance: ``[(device, [layer, ...])]``."""
    groups: dict[torch.device, list[int]] = {}
    for layer, device in enumerate(devices):
        groups.setdefault(device, []).append(layer)
    return list(groups.items())


class PagedKV:
    """Keys and values of one model in the blocks of ``pool`` (module docstring). ``kv_heads``, ``head_dim``,
    ``dtype``: the model's KV shape; ``devices``: each layer's device (a device_map may spread them); ``layout``:
    ``"segments"`` or ``"contiguous"`` (default: :func:`choose_layout` by the number of layers)."""

    def __init__(
        self,
        pool: BlockPool,
        *,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        devices: list[torch.device],
        layout: str | None = None,
    ):
        self.pool = pool
        self.kv_heads, self.head_dim, self.dtype, self.devices = kv_heads, head_dim, dtype, devices
        self.layout = choose_layout(len(devices), pool.growth) if layout is None else layout
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r}: use one of {LAYOUTS}")
        self.groups = device_groups(devices)
        # segments: segment -> device group -> [layers of the group, 2, H, blocks * bs, D]; contiguous: unused
        self.segments: list[list[torch.Tensor]] = []
        # layer -> source -> that layer's slots [2, H, slots of the source, D]: per segment a view (no memory of its
        # own) of the segment; contiguous: the layer's one tensor
        self.views: list[list[torch.Tensor]] = [[] for _ in devices]
        self._starts: list[int] = [0] if self.layout == "contiguous" else []  # the first slot of each source
        self.block_offsets = torch.arange(pool.block_size)  # a slot's place in its block, for the plans
        # one token over all layers, keys and values (read every turn by the KV accounting: computed once)
        self._slot_bytes = len(devices) * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.peak_bytes = 0  # the most bytes the pool held, a reallocation's copy included (the storage resets it)

    @property
    def n_layers(self) -> int:
        return len(self.devices)

    @property
    def slots(self) -> int:
        """Slots the pool holds (every block, free or not)."""
        return self.pool.capacity * self.pool.block_size

    @property
    def realloc_share(self) -> float:
        """What a change of the pool's size holds beside it at most, as a share of the larger size: one layer's
        tensor while it copies (contiguous), nothing (segments)."""
        return 1 / self.n_layers if self.layout == "contiguous" else 0.0

    @property
    def reads_in_place(self) -> bool:
        """Whether one tensor per layer holds every slot (contiguous, or a segment pool of one segment): a forward
        then writes each layer's new keys first and reads the rows' slots from that tensor, copying nothing else."""
        return self.layout == "contiguous" or len(self.segments) == 1

    def slot_bytes(self) -> int:
        """One token over all layers, keys and values."""
        return self._slot_bytes

    def nbytes(self) -> int:
        """Bytes the pool holds (every block, free or not)."""
        return self.slots * self.slot_bytes()

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor that holds the pool's slots (segments, or one per layer)."""
        if self.layout == "contiguous":
            return [views[0] for views in self.views if views]
        return [t for tensors in self.segments for t in tensors]

    def sync(self) -> None:
        """Match the tensors to the pool's size: new segments get zero tensors, trimmed ones are dropped
        (segments); each layer's tensor is reallocated to the new size, new slots zero (contiguous)."""
        if self.layout == "contiguous":
            self._resize_layers()
            return
        bs = self.pool.block_size
        have, want = len(self._starts), len(self.pool.segments)
        for size in self.pool.segments[have:]:
            self._starts.append(sum(self.pool.segments[: len(self._starts)]) * bs)
            tensors = []
            for device, layers in self.groups:
                tensor = torch.zeros(len(layers), 2, self.kv_heads, size * bs, self.head_dim, dtype=self.dtype, device=device)
                tensors.append(tensor)
                for j, layer in enumerate(layers):
                    self.views[layer].append(tensor[j])
            self.segments.append(tensors)
        if want < have:
            del self._starts[want:], self.segments[want:]
            for views in self.views:
                del views[want:]
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def _resize_layers(self) -> None:
        """Reallocate each layer's tensor to the pool's slots, one layer at a time, and count in the peak what is
        held meanwhile: the layers done at the new size, this layer's old tensor beside its new one, the rest old."""
        want = self.slots
        have = self.views[0][0].shape[SLOT_DIM] if self.views[0] else 0
        if want != have:
            layer_bytes = self._slot_bytes // self.n_layers
            keep = min(have, want)
            for layer, device in enumerate(self.devices):
                new = torch.empty(2, self.kv_heads, want, self.head_dim, dtype=self.dtype, device=device)
                if keep:
                    new[:, :, :keep].copy_(self.views[layer][0][:, :, :keep])
                new[:, :, keep:].zero_()
                held = ((layer + 1) * want + (self.n_layers - layer) * have) * layer_bytes
                self.peak_bytes = max(self.peak_bytes, held)
                self.views[layer] = [new]  # the old tensor goes here
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def _split(self, slots: torch.Tensor, starts: list[int]) -> tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]]:
        """``slots`` ``[N]`` (CPU, long) by source (source ``s`` holds slots ``starts[s] ..``): the order that sorts
        them by source (``None``: one source, in order) and, per source, ``(source, first, stop, offsets)``: sorted
        positions ``first .. stop - 1`` go to (or come from) ``offsets`` in that source."""
        if len(starts) == 1:
            return None, [(0, 0, slots.numel(), slots)]
        at = torch.tensor(starts)
        source = torch.bucketize(slots, at, right=True) - 1
        order = torch.argsort(source, stable=True)
        offsets = slots[order] - at[source[order]]
        counts = torch.bincount(source, minlength=len(starts)).tolist()
        parts, first = [], 0
        for s, count in enumerate(counts):
            if count:
                parts.append((s, first, first + count, offsets[first : first + count]))
                first += count
        return (None if len(parts) == 1 else order), parts

    def _on(self, plan: tuple[torch.Tensor | None, list[tuple[int, int, int, torch.Tensor]]], device: torch.device):
        order, parts = plan
        return (None if order is None else _on(order, device)), [(s, a, b, _on(o, device)) for s, a, b, o in parts]

    def write_plan(self, slots: list[int]) -> WritePlan:
        """Where tokens bound for ``slots`` go, by segment (computed once per forward, in Python: a forward writes few
        tokens, and three tensors are cheaper than the ops of :meth:`_split`)."""
        if not slots:
            return None, []
        starts = self._starts
        if len(starts) == 1:
            return None, [(0, 0, len(slots), _on(torch.tensor(slots), self.devices[0]))]
        segment = [bisect.bisect_right(starts, slot) - 1 for slot in slots]
        order = sorted(range(len(slots)), key=segment.__getitem__)  # stable: each segment's tokens in packed order
        offsets = torch.tensor([slots[i] - starts[segment[i]] for i in order])
        counts: dict[int, int] = {}
        for i in order:
            counts[segment[i]] = counts.get(segment[i], 0) + 1
        parts, first = [], 0
        for s, piece in zip(counts, offsets.split(list(counts.values())) if len(counts) > 1 else [offsets]):
            parts.append((s, first, first + counts[s], piece))
            first += counts[s]
        in_order = len(counts) == 1 or order == list(range(len(slots)))
        return self._on((None if in_order else torch.tensor(order), parts), self.devices[0])

    def write_layers(self, plan: WritePlan, layers: list[torch.Tensor]) -> None:
        """Store ``layers[l]`` ``[2, H, N, D]`` (layer ``l``'s keys and values) at the slots of ``plan``
        (:meth:`write_plan`): all layers at once, one write per segment (and device) the slots fall in."""
        order, parts = plan
        if not parts:
            return
        if len(layers) != self.n_layers:
            raise ValueError(f"{len(layers)} layers of new keys for a pool of {self.n_layers}")
        if self.layout == "contiguous":  # one source, in order: one write per layer
            for layer, both in enumerate(layers):
                self.write_layer(layer, plan, both)
            return
        for g, (device, group) in enumerate(self.groups):
            both = torch.stack([layers[layer] for layer in group]) if len(group) > 1 else layers[group[0]].unsqueeze(0)
            if both.device != device or both.dtype != self.dtype:
                both = both.to(device, self.dtype)
            if order is not None:  # grouped by segment: each segment takes one slice
                both = both.index_select(SLOT_DIM + 1, _on(order, device))
            pieces = both.split([stop - first for _, first, stop, _ in parts], dim=SLOT_DIM + 1) if len(parts) > 1 else [both]
            for (s, _, _, offsets), piece in zip(parts, pieces):
                self.segments[s][g].index_copy_(SLOT_DIM + 1, _on(offsets, device), piece)

    def write_layer(self, layer: int, plan: WritePlan, both: torch.Tensor) -> None:
        """Store layer ``layer``'s ``both`` ``[2, H, N, D]`` at the slots of ``plan`` (:meth:`write_plan`), which
        must fall in one source (:attr:`reads_in_place`): what a forward that reads in place writes per layer."""
        order, parts = plan
        if not parts:
            return
        if order is not None or len(parts) != 1:
            raise ValueError("write_layer needs slots in one source, in order (reads_in_place)")
        ((source, _, _, offsets),) = parts
        target = self.views[layer][source]
        if both.device != target.device or both.dtype != self.dtype:
            both = both.to(target.device, self.dtype)
        target.index_copy_(SLOT_DIM, _on(offsets, target.device), both)

    def read_plan(self, slots: torch.Tensor, fresh_at: int | None = None) -> ReadPlan:
        """Where the tokens at ``slots`` (CPU, long; any shape, read flattened) are read from (once per forward, used
        by every layer): each source's offsets (the segments in order; with ``fresh_at``, slots from ``fresh_at``
        on are a forward's new tokens, a last source), and the order that puts the sources' reads back in the order
        of ``slots`` (``None``: one source, already in order)."""
        starts = self._starts if fresh_at is None else [*self._starts, fresh_at]
        order, parts = self._on(self._split(slots.reshape(-1).to("cpu", torch.long), starts), self.devices[0])
        back = None if order is None else torch.argsort(order)
        return [(s, offsets) for s, _, _, offsets in parts], back

    def gather_both(self, layer: int, plan: ReadPlan, fresh: torch.Tensor | None = None) -> torch.Tensor:
        """Keys and values of layer ``layer`` at the slots of ``plan`` (:meth:`read_plan`): ``[2, H, N, D]``; ``fresh``
        ``[2, H, n, D]``: the forward's new tokens (the source after the segments). Each source is
        read at its own slots only (never concatenated whole: that would copy the pool)."""
        sources = self.views[layer] if fresh is None else [*self.views[layer], fresh]
        parts, back = plan
        if not parts:
            return torch.zeros(2, self.kv_heads, 0, self.head_dim, dtype=self.dtype, device=self.devices[layer])
        got = [sources[s].index_select(SLOT_DIM, _on(o, sources[s].device)) for s, o in parts]
        return got[0] if back is None else torch.cat(got, dim=SLOT_DIM).index_select(SLOT_DIM, _on(back, got[0].device))

    def whole(self, layer: int, fresh: torch.Tensor) -> torch.Tensor:
        """Every slot of layer ``layer``, then ``fresh`` ``[2, H, n, D]`` (a forward's new tokens, at slots
        ``slots ..``), in one tensor ``[2, H, slots + n, D]`` (a copy): what a forward that reads most of the pool
        gathers from, one read instead of one per segment."""
        return torch.cat([*self.views[layer], fresh], dim=SLOT_DIM)

    def gather_layers(self, plan: ReadPlan) -> list[torch.Tensor]:
        """Every layer's keys and values at the slots of ``plan`` (:meth:`read_plan` without new tokens): ``[2, H, N,
        D]`` per layer, one read per segment (and device)."""
        if self.layout == "contiguous":
            return [self.gather_both(layer, plan) for layer in range(self.n_layers)]
        parts, back = plan
        out: list[torch.Tensor] = [None] * self.n_layers  # type: ignore[list-item]
        for g, (device, group) in enumerate(self.groups):
            if parts:
                got = [self.segments[s][g].index_select(SLOT_DIM + 1, _on(o, device)) for s, o in parts]
                both = got[0] if back is None else torch.cat(got, dim=SLOT_DIM + 1).index_select(SLOT_DIM + 1, _on(back, device))
            else:
                both = torch.zeros(len(group), 2, self.kv_heads, 0, self.head_dim, dtype=self.dtype, device=device)
            for j, layer in enumerate(group):
                out[layer] = both[j]
        return out

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy each ``(source, destination)`` block on every layer (copy-on-write of a shared last block)."""
        if not copies:
            return
        bs = self.pool.block_size
        src = [b * bs + i for b, _ in copies for i in range(bs)]
        dst = [b * bs + i for _, b in copies for i in range(bs)]
        self.write_layers(self.write_plan(dst), self.gather_layers(self.read_plan(torch.tensor(src))))

    def store(self, table: BlockTable, start: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write ``layers`` (``[(keys, values)]`` per layer, each ``[1, H, n, D]``) as tokens ``start .. start + n -
        1`` of ``table`` (their blocks already allocated)."""
        n = layers[0][0].shape[-2]
        plan = self.write_plan(self.pool.slots(table, start, start + n))
        self.write_layers(plan, [torch.stack([k[0], v[0]]) for k, v in layers])

    def read(self, table: BlockTable, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Tokens ``start .. stop - 1`` of ``table``, gathered: ``[(keys, values)]`` per layer, each ``[1, H, n, D]``."""
        layers = self.gather_layers(self.read_plan(torch.tensor(self.pool.slots(table, start, stop), dtype=torch.long)))
        return [(both[0].unsqueeze(0), both[1].unsqueeze(0)) for both in layers]


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
