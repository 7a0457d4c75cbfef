"""Attention over paged rows in one packed (ragged) forward, registered with transformers' ``AttentionInterface``.

A :class:`~.paged_rows.PagedBatchEngine` runs the new tokens of all the rows it extends as ONE sequence ``[1, N]``
(``N`` = the sum of the rows' new tokens: nothing padded), with each token's own position. Before the forward it
builds a :class:`RaggedPlan` (once; every layer reads it): where each new token's keys go in the pool, and the rows
grouped by their number of new tokens ``n``. The plan rides to the attention function in the forward's keyword
arguments (``paged_plan=``), which transformers passes through to every attention call.

Per layer, :func:`paged_attention` reads each group's rows in one gather (each row: its context, then its own new
tokens, then hole slots up to the group's longest context) and runs one batched SDPA ``[G, H, n, P + n]`` under a
boolean mask built once per forward: a query sees its row's context and its row's new tokens up to itself. Decode
rows (every row the same ``n``) are one group; a long prompt chunk beside them is a group of its own, so no decode
row computes its width. How a layer reads depends on the pool (:class:`RaggedPlan`'s ``reads``):

- ``"in_place"`` (a contiguous pool, or a segment pool of one segment: one tensor holds the layer's slots): the
  layer writes its new keys into their slots, then each group gathers its slots from that tensor. Nothing else is
  copied.
- ``"whole"`` (a segment pool, the groups reading at least half of it): the layer hands its new keys to the plan
  (the storage writes every layer's at once after the forward, one write per segment they land in), copies its
  segments and new keys into one tensor, and the groups gather from that.
- ``"segments"``: as ``"whole"``, but each group reads each segment at its own slots.
- ``"runs"`` (a segment pool of several segments, every group one row): each row's context is a few runs of
  consecutive slots (its blocks are taken lowest id first, so a row alone has one run per segment it spans); the
  layer reads each run where it lies and puts them and its new keys side by side in one copy of the row's context,
  and hands the new keys on to the plan as ``"whole"`` does.

A group of one row whose slots are such runs (:func:`slot_runs`, at most :data:`MAX_RUNS`) reads them as slices
rather than through an index, in ``"in_place"`` too: a row alone on a pool with one tensor per layer (its blocks
consecutive) is one run, and the attention reads it where it lies, copying nothing at all.

The function is chosen through the model's config (:func:`use_paged_attention` sets the text model's
``_attn_implementation`` to a registered name, once per model): the single-row engines and the padded storage
sharing the model pass no plan, and their calls go straight to the attention the model had (``sdpa`` or
``eager``), with that implementation's own mask builder. In a paged forward the storage passes a
:class:`PagedCache` (it only makes transformers' mask builder size the mask to the new tokens, so that ``sdpa``'s
mask builder returns no mask at all and never reads the packed positions as separate sequences): the paged
attention builds its own group masks.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .block_pool import BlockTable
from .paged_kv import SLOT_DIM, PagedKV, ReadPlan, WritePlan, _on

PREFIX = "asymspec_paged_"


def implementation_name(base: str) -> str:
    """The registered name of paged attention over ``base`` (what a call without a plan runs)."""
    return PREFIX + base


@dataclass
class RowGroup:
    """Rows of one forward with the same number of new tokens ``n``: ``rows`` of them, ``tokens`` ``[rows * n]``
    their new tokens' places in the packed sequence (``None``: the whole sequence, in order), ``read`` where the
    ``[rows * width]`` slots (context, new tokens, holes) are read from: their slot numbers (``"in_place"``: in the
    layer's one tensor; ``"whole"``: in the segments then the new keys, a new token ``t`` of the packed sequence at
    ``RaggedPlan.fresh_at + t``), or their :meth:`PagedKV.read_plan` (``"segments"``); ``mask`` ``[rows, 1, n,
    width]`` (``None``: every query sees every slot)."""

    rows: int
    n: int
    width: int
    tokens: torch.Tensor | None
    read: ReadPlan | torch.Tensor | None
    mask: torch.Tensor | None
    runs: list[tuple[int, int, int]] | None = None  # a one-row group read by slices: (source, first slot, slots)
    causal: bool = False  # the rows hold nothing but their new tokens: SDPA's own causal rule, no mask


#: How a forward's layers read the pool (module docstring).
READS = ("in_place", "whole", "segments", "runs")
#: The most slices a one-row group is read by (:func:`slot_runs`); a row scattered wider is read through an index.
MAX_RUNS = 16


def slot_runs(table: BlockTable, length: int, block_size: int, starts: list[int], total: int) -> list[tuple[int, int, int]]:
    """Tokens ``0 .. length - 1`` of ``table`` as runs of consecutive slots, each within one source: ``(source,
    first slot in it, slots)``, in the row's order; source ``s`` holds slots ``starts[s] ..`` (the next one's start,
    or ``total``). A row's blocks are taken lowest id first, so a row alone is one run per segment it spans."""
    merged: list[list[int]] = []  # [first slot, slots] over the whole pool
    left = length
    for block in table.blocks:
        if left <= 0:
            break
        take = min(block_size, left)
        first = block * block_size
        if merged and merged[-1][0] + merged[-1][1] == first:  # only a row's last block is partly filled
            merged[-1][1] += take
        else:
            merged.append([first, take])
        left -= take
    runs = []
    for first, count in merged:
        while count:
            source = bisect.bisect_right(starts, first) - 1
            end = starts[source + 1] if source + 1 < len(starts) else total
            take = min(count, end - first)
            runs.append((source, first - starts[source], take))
            first, count = first + take, count - take
    return runs


@dataclass
class RaggedPlan:
    """One packed forward's reads and writes (module docstring): ``write`` the new tokens' slots in packed order;
    ``reads``: one of :data:`READS`; ``fresh_at``: the slot number the reads give the packed sequence's first new
    token when they take new keys from the plan (the pool's slots come first); ``fresh``: each layer's new keys and
    values ``[2, H, N, D]``, handed on by the attention (``"in_place"``: already written) and written by
    :meth:`commit`."""

    kv: PagedKV
    write: WritePlan
    groups: list[RowGroup]
    reads: str
    fresh_at: int
    fresh: list[torch.Tensor | None]

    def commit(self) -> None:
        """Write every layer's new keys and values into the pool (after the forward; one write per segment), unless
        the layers wrote their own in place."""
        missing = [layer for layer, f in enumerate(self.fresh) if f is None]
        if missing:
            raise RuntimeError(f"the paged forward ran no attention for layers {missing}: their new keys were never seen")
        if self.reads != "in_place":
            self.kv.write_layers(self.write, self.fresh)


def _group_index(kv: PagedKV, tables: list[BlockTable], count: int, firsts: list[int], fresh_at: int | None) -> torch.Tensor:
    """``[rows * width]``: the slots each of ``tables`` (rows with ``count`` new tokens, already appended; the
    first of row ``b``'s new tokens at ``firsts[b]`` in the packed sequence) reads: its tokens ``0 .. length - 1``,
    then hole slots (the rest of its blocks, or block 0 past them: any slot, the mask hides them). With
    ``fresh_at``, its new tokens are read from the plan's new keys (slot ``fresh_at + t`` for packed token ``t``).
    Few ops (on a small model their number, not their arithmetic, costs the time): Python lists, one tensor each."""
    bs = kv.pool.block_size
    width, most = max(t.length for t in tables), max(len(t.blocks) for t in tables)
    blocks = torch.tensor([t.blocks + [0] * (most - len(t.blocks)) for t in tables], dtype=torch.long)
    index = (blocks.unsqueeze(2) * bs + kv.block_offsets).view(len(tables), -1)[:, :width].reshape(-1)
    if fresh_at is not None:  # row b's new tokens sit at columns length_b - count .. length_b - 1
        at = [b * width + t.length - count + i for b, t in enumerate(tables) for i in range(count)]
        index[torch.tensor(at)] = torch.tensor([fresh_at + first + i for first in firsts for i in range(count)])
    return index


def _group_mask(lengths: list[int], count: int, width: int, device: torch.device) -> torch.Tensor | None:
    """``[rows, 1, count, width]``: query ``i`` of row ``b`` sees slots ``j <= length_b - count + i`` (its context
    and its new tokens up to itself); ``None`` when every query sees every slot."""
    if count == 1 and min(lengths) == width:
        return None
    if len(lengths) == 1:  # one row: the lower triangle shifted by its context, two ops
        return _on(torch.ones(1, 1, count, width, dtype=torch.bool).tril_(width - count), device)
    seen = torch.tensor([[length - count + i + 1 for i in range(count)] for length in lengths])
    return _on(torch.arange(width) < seen.view(len(lengths), 1, count, 1), device)


def ragged_plan(kv: PagedKV, tables: list[BlockTable], n: list[int], fresh: list[int], device: torch.device) -> RaggedPlan:
    """The plan of a forward whose rows (in packed order) have their ``tables`` already extended by ``n[r]`` new
    tokens each (their slots ``fresh``, in packed order); ``device``: where the masks go."""
    fresh_at = kv.slots
    if len(tables) == 1:  # a row alone (one request on the loop): its runs, without the groups' bookkeeping
        plan = _one_row_plan(kv, tables[0], n[0], fresh, device)
        if plan is not None:
            return plan
    by_n: dict[int, list[int]] = {}
    for r, count in enumerate(n):
        by_n.setdefault(count, []).append(r)
    starts = [0]
    for count in n:
        starts.append(starts[-1] + count)
    in_place = kv.reads_in_place
    runs = _one_row_runs(kv, tables, by_n, starts, in_place)
    indexes = {
        count: _group_index(kv, [tables[r] for r in rows], count, [starts[r] for r in rows], None if in_place else fresh_at)
        for count, rows in by_n.items()
        if count not in runs
    }
    # reading the pool whole per layer (one copy) beats one read per segment once the forward reads half of it
    if in_place or len(runs) == len(by_n):
        reads = "in_place" if in_place else "runs"
    else:
        reads = "whole" if 2 * sum(i.numel() for i in indexes.values()) >= fresh_at else "segments"
    groups = []
    for count, rows in by_n.items():
        width = max(tables[r].length for r in rows)
        # rows of new tokens alone (a prompt's first piece): the causal rule SDPA applies itself (and the single-row
        # engines' prefill uses), no mask to build
        causal = count > 1 and all(tables[r].length == count for r in rows)
        mask = None if causal else _group_mask([tables[r].length for r in rows], count, width, device)
        tokens = None
        if len(rows) != len(n):
            tokens = torch.tensor([t for r in rows for t in range(starts[r], starts[r + 1])], dtype=torch.long, device=device)
        if count in runs:
            groups.append(RowGroup(1, count, width, tokens, None, mask, runs[count], causal))
            continue
        index = indexes[count]
        read = kv.read_plan(index, fresh_at) if reads == "segments" else _on(index, kv.devices[0])
        groups.append(RowGroup(len(rows), count, width, tokens, read, mask, None, causal))
    return RaggedPlan(kv, kv.write_plan(fresh), groups, reads, fresh_at, [None] * kv.n_layers)


def _one_row_plan(kv: PagedKV, table: BlockTable, count: int, fresh: list[int], device: torch.device) -> RaggedPlan | None:
    """:func:`ragged_plan` of a forward of one row: one group read by its runs (``None`` when it spans more than
    :data:`MAX_RUNS`: read through an index instead)."""
    in_place = kv.reads_in_place
    runs = _row_runs(kv, table, count, 0, in_place)
    if runs is None:
        return None
    causal = count > 1 and table.length == count
    mask = None if causal else _group_mask([table.length], count, table.length, device)
    group = RowGroup(1, count, table.length, None, None, mask, runs, causal)
    return RaggedPlan(kv, kv.write_plan(fresh), [group], "in_place" if in_place else "runs", kv.slots, [None] * kv.n_layers)


def _one_row_runs(
    kv: PagedKV, tables: list[BlockTable], by_n: dict[int, list[int]], starts: list[int], in_place: bool
) -> dict[int, list[tuple[int, int, int]]]:
    """The slot runs (:func:`slot_runs`) of each group of one row, by its number of new tokens: on a pool read in
    place its every token (the layer writes its new keys first), else its context then its new keys (a last source
    after the segments, the packed sequence); none for a row scattered over more than :data:`MAX_RUNS` runs. On a
    pool not read in place, runs only where every group is one row (the forward then reads no pool whole)."""
    if not in_place and any(len(rows) > 1 for rows in by_n.values()):
        return {}
    out = {}
    for count, rows in by_n.items():
        if len(rows) != 1:
            continue
        runs = _row_runs(kv, tables[rows[0]], count, starts[rows[0]], in_place)
        if runs is not None:
            out[count] = runs
        elif not in_place:
            return {}
    return out


def _row_runs(kv: PagedKV, table: BlockTable, count: int, first: int, in_place: bool) -> list[tuple[int, int, int]] | None:
    """The runs a row of ``count`` new tokens (the first at ``first`` in the packed sequence) is read by: on a pool
    read in place its every token (the layer writes its new keys first), else its context then its new keys (a last
    source after the segments: the plan's); ``None`` beyond :data:`MAX_RUNS`."""
    starts = kv._starts or [0]
    runs = slot_runs(table, table.length if in_place else table.length - count, kv.pool.block_size, starts, kv.slots)
    if not in_place:
        runs.append((len(starts), first, count))
    return runs if len(runs) <= MAX_RUNS else None


def _group_attention(
    plan: RaggedPlan, group: RowGroup, layer: int, query: torch.Tensor, scaling: float | None, source: torch.Tensor
) -> torch.Tensor:
    """One group's attention output ``[rows, n, Hq, D]``; ``query`` ``[1, Hq, N, D]`` (the packed sequence);
    ``source``: the layer's one tensor holding its slots (``"in_place"``), its slots and new keys read whole
    (``"whole"``), or the new keys alone (``"segments"``: the pool's segments are read per segment)."""
    heads, dim = query.shape[1], query.shape[3]
    q = query if group.tokens is None else query.index_select(2, group.tokens)
    q = q.view(heads, group.rows, group.n, dim).transpose(0, 1)  # [G, Hq, n, D]
    if group.runs is not None:  # slices where they lie: one run is read without a copy
        sources = plan.kv.views[layer] if plan.reads == "in_place" else [*plan.kv.views[layer], source]
        pieces = [sources[s].narrow(SLOT_DIM, first, count) for s, first, count in group.runs]
        both = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=SLOT_DIM)
    elif plan.reads == "segments":
        both = plan.kv.gather_both(layer, group.read, source)
    else:
        both = source.index_select(SLOT_DIM, _on(group.read, source.device))
    if both.dtype != q.dtype:
        both = both.to(q.dtype)
    # [2, Hkv, G * width, D] -> keys, values [G, Hkv, width, D] (one row: views of the slots as they lie)
    keys, values = both.view(2, plan.kv.kv_heads, group.rows, group.width, dim).transpose(1, 2).unbind(0)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=group.mask, is_causal=group.causal, scale=scaling, enable_gqa=heads != keys.shape[1]
    )
    return out.transpose(1, 2)


def base_attention(base: str, module):
    """``base``'s attention function for ``module`` (``eager`` is each model's own, not a registered one)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _paged(base: str):
    """The attention function registered as :func:`implementation_name` ``(base)``."""

    def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """``query`` ``[1, Hq, N, D]``, ``key`` / ``value`` ``[1, Hkv, N, D]``: the packed forward's new tokens; returns
        ``([1, N, Hq, D], None)``. Without a ``paged_plan`` it is ``base``'s attention, unchanged."""
        plan: RaggedPlan | None = kwargs.pop("paged_plan", None)
        if plan is None:
            return base_attention(base, module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        layer, kv = module.layer_idx, plan.kv
        fresh = torch.stack([key[0], value[0]])  # [2, Hkv, N, D]: the pool's layout (paged_kv)
        if fresh.dtype != kv.dtype or fresh.device != kv.devices[layer]:  # what the pool will hold and later forwards read
            fresh = fresh.to(kv.devices[layer], kv.dtype)
        plan.fresh[layer] = fresh
        if plan.reads == "in_place":  # the layer's one tensor holds every slot: write, then read it where it is
            kv.write_layer(layer, plan.write, fresh)
            source = kv.views[layer][0]
        else:  # "runs" and "segments" read the pool where it lies, the new keys from here
            source = kv.whole(layer, fresh) if plan.reads == "whole" else fresh
        heads, dim = query.shape[1], query.shape[3]
        if len(plan.groups) == 1:
            return _group_attention(plan, plan.groups[0], layer, query, scaling, source).reshape(1, -1, heads, dim), None
        out = query.new_empty(query.shape[2], heads, dim)
        for group in plan.groups:
            out.index_copy_(0, group.tokens, _group_attention(plan, group, layer, query, scaling, source).reshape(-1, heads, dim))
        return out.unsqueeze(0), None

    return paged_attention


_registered: set[str] = set()


def register(base: str) -> str:
    """Register paged attention over ``base`` with transformers (once) and return its name. Its mask builder is
    ``base``'s: a model's other engines keep their masks."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base not in ALL_MASK_ATTENTION_FUNCTIONS or (base != "eager" and base not in ALL_ATTENTION_FUNCTIONS):
        raise NotImplementedError(f"paged rows cannot run beside the model's {base!r} attention: load it with sdpa or eager")
    name = implementation_name(base)
    if name not in _registered:
        AttentionInterface.register(name, _paged(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
        _registered.add(name)
    return name


def use_paged_attention(model) -> None:
    """Make ``model``'s text layers run paged attention (a no-op when they do): its config's implementation becomes
    :func:`implementation_name` of the one it had, so that calls without a plan run exactly as before."""
    text = model.config.get_text_config(decoder=True)
    if uses_paged_attention(text):
        return
    name = register(text._attn_implementation)
    model.set_attn_implementation({"text_config": name} if text is not model.config else name)


class PagedLayer(CacheLayerMixin):
    """A layer of :class:`PagedCache`: it keeps nothing (the attention writes the pool) and hands the new keys on."""

    is_sliding = False
    is_compileable = False

    def __init__(self):
        super().__init__()
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1


class PagedCache(Cache):
    """The cache a packed paged forward passes (module docstring): the model's mask builder sees a cache with no
    past, so it sizes a mask to the new tokens alone (``sdpa``: none at all)."""

    def __init__(self, n_layers: int):
        super().__init__(layers=[PagedLayer() for _ in range(n_layers)])


def uses_paged_attention(text_config) -> bool:
    """Whether a text config selects paged attention (:func:`use_paged_attention`)."""
    return text_config._attn_implementation.startswith(PREFIX)
