"""Attention over paged rows in one packed (ragged) forward, registered with transformers' ``AttentionInterface``.

A :class:`~.paged_rows.PagedBatchEngine` runs the new tokens of all the rows it extends as ONE sequence ``[1, N]``
(``N`` = the sum of the rows' new tokens: nothing padded), with each token's own position. Before the forward it
builds a :class:`RaggedPlan` (once; every layer reads it): where each new token's keys go in the pool, and the rows
grouped by their number of new tokens ``n``. The plan rides to the attention function in the forward's keyword
arguments (``paged_plan=``), which transformers passes through to every attention call.

Per layer, :func:`paged_attention` hands the layer's new keys and values to the plan (it writes nothing: the pool's
segments hold every layer, so the storage writes all layers' new keys at once after the forward, one write per
segment they land in), then for each group reads its rows' keys in one gather (each row: its context from the pool,
then its own new tokens from the plan, then hole slots up to the group's longest context) and runs one batched SDPA
``[G, H, n, P + n]`` under a boolean mask built once per forward: a query sees its row's context and its row's new
tokens up to itself. Decode rows (every row the same ``n``) are one group; a long prompt chunk beside them is a
group of its own, so no decode row computes its width. When the groups read at least half of the pool, each layer
reads its segments and new keys whole once (one copy) and the groups take their slots from that, instead of one
read per segment and group.

The function is chosen through the model's config (:func:`use_paged_attention` sets the text model's
``_attn_implementation`` to a registered name, once per model): the single-row engines and the padded storage
sharing the model pass no plan, and their calls go straight to the attention the model had (``sdpa`` or
``eager``), with that implementation's own mask builder. In a paged forward the storage passes a
:class:`PagedCache` (it only makes transformers' mask builder size the mask to the new tokens, so that ``sdpa``'s
mask builder returns no mask at all and never reads the packed positions as separate sequences): the paged
attention builds its own group masks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .block_pool import BlockTable
from .paged_kv import PagedKV, ReadPlan, WritePlan, _on

PREFIX = "asymspec_paged_"


def implementation_name(base: str) -> str:
    """The registered name of paged attention over ``base`` (what a call without a plan runs)."""
    return PREFIX + base


@dataclass
class RowGroup:
    """Rows of one forward with the same number of new tokens ``n``: ``rows`` of them, ``tokens`` ``[rows * n]``
    their new tokens' places in the packed sequence (``None``: the whole sequence, in order), ``read`` the
    :meth:`PagedKV.read_plan` of ``[rows, width]`` slots (context, new tokens, holes; a new token ``t`` of the packed
    sequence is slot ``RaggedPlan.fresh_at + t``; in a forward that reads the whole pool, the slots themselves
    ``[rows * width]``) and ``mask`` ``[rows, 1, n, width]`` (``None``: every query sees every slot)."""

    rows: int
    n: int
    width: int
    tokens: torch.Tensor | None
    read: ReadPlan | torch.Tensor
    mask: torch.Tensor | None


@dataclass
class RaggedPlan:
    """One packed forward's reads and writes (module docstring): ``write`` the new tokens' slots in packed order;
    ``whole``: the groups read most of the pool, so each layer reads it whole once (:meth:`PagedKV.whole`) and the
    groups take their slots from that, rather than one read per segment and group; ``fresh_at``: the slot number
    the reads give the packed sequence's first new token (the pool's slots come first); ``fresh``: each layer's new
    keys and values ``[N, 2, H, D]``, handed on by the attention and written by :meth:`commit`."""

    kv: PagedKV
    write: WritePlan
    groups: list[RowGroup]
    whole: bool
    fresh_at: int
    fresh: list[torch.Tensor | None]

    def commit(self) -> None:
        """Write every layer's new keys and values into the pool (after the forward; one write per segment)."""
        missing = [layer for layer, f in enumerate(self.fresh) if f is None]
        if missing:
            raise RuntimeError(f"the paged forward ran no attention for layers {missing}: their new keys were never seen")
        self.kv.write_layers(self.write, self.fresh)


def ragged_plan(kv: PagedKV, tables: list[BlockTable], n: list[int], fresh: list[int], device: torch.device) -> RaggedPlan:
    """The plan of a forward whose rows (in packed order) have their ``tables`` already extended by ``n[r]`` new
    tokens each (their slots ``fresh``, in packed order); ``device``: where the masks go."""
    bs, fresh_at = kv.pool.block_size, kv.slots
    by_n: dict[int, list[int]] = {}
    for r, count in enumerate(n):
        by_n.setdefault(count, []).append(r)
    starts = [0]
    for count in n:
        starts.append(starts[-1] + count)
    indexes = {}
    for count, rows in by_n.items():
        # row b reads tokens 0 .. length_b - 1 of its table (its context from the pool, then its new tokens from the
        # plan), then hole slots: the rest of its blocks, or block 0 past them (any slot: the mask hides them)
        width, most = max(tables[r].length for r in rows), max(len(tables[r].blocks) for r in rows)
        blocks = torch.tensor([tables[r].blocks + [0] * (most - len(tables[r].blocks)) for r in rows], dtype=torch.long)
        index = (blocks.unsqueeze(2) * bs + kv.block_offsets).view(len(rows), -1)[:, :width].reshape(-1)
        # the new tokens of row b sit at columns context_b .. length_b - 1: they are read from the plan's new keys
        at = [b * width + tables[r].length - count + i for b, r in enumerate(rows) for i in range(count)]
        index[torch.tensor(at)] = torch.tensor([fresh_at + t for r in rows for t in range(starts[r], starts[r + 1])])
        indexes[count] = index.view(len(rows), width)
    # reading the pool whole per layer (one copy) beats one read per segment once the forward reads half of it
    whole = 2 * sum(i.numel() for i in indexes.values()) >= fresh_at
    groups = []
    for count, rows in by_n.items():
        lengths = [tables[r].length for r in rows]
        index = indexes[count]
        width = index.shape[1]
        mask = None
        if count > 1 or min(lengths) != width:
            # query i of row b sees slots j <= length_b - n + i: its context and its new tokens up to itself
            seen = torch.tensor([[length - count + i + 1 for i in range(count)] for length in lengths])
            mask = _on(torch.arange(width) < seen.view(len(rows), 1, count, 1), device)
        tokens = None
        if len(rows) != len(n):
            tokens = torch.tensor([t for r in rows for t in range(starts[r], starts[r + 1])], dtype=torch.long, device=device)
        read = _on(index.view(-1), kv.devices[0]) if whole else kv.read_plan(index, fresh_at)
        groups.append(RowGroup(len(rows), count, width, tokens, read, mask))
    return RaggedPlan(kv, kv.write_plan(fresh), groups, whole, fresh_at, [None] * kv.n_layers)


def _group_attention(
    plan: RaggedPlan, group: RowGroup, layer: int, query: torch.Tensor, scaling: float | None, source: torch.Tensor
) -> torch.Tensor:
    """One group's attention output ``[rows, n, Hq, D]``; ``query`` ``[1, Hq, N, D]`` (the packed sequence);
    ``source``: the layer's slots and new keys read whole (:attr:`RaggedPlan.whole`), or the new keys alone (the
    pool's segments are read per segment)."""
    heads, dim = query.shape[1], query.shape[3]
    q = query if group.tokens is None else query.index_select(2, group.tokens)
    q = q.view(heads, group.rows, group.n, dim).transpose(0, 1)  # [G, Hq, n, D]
    if plan.whole:
        both = source.index_select(0, _on(group.read, source.device))
    else:
        both = plan.kv.gather_both(layer, group.read, source)
    if both.dtype != q.dtype:
        both = both.to(q.dtype)
    # [G * width, 2, Hkv, D] -> keys, values [G, Hkv, width, D]
    keys, values = both.view(group.rows, group.width, 2, plan.kv.kv_heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=group.mask, scale=scaling, enable_gqa=heads != keys.shape[1]
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
        # [N, 2, Hkv, D]: each token's keys and values side by side, contiguous (the whole-pool read copies it faster)
        fresh = torch.stack([key[0].transpose(0, 1), value[0].transpose(0, 1)], dim=1)
        if fresh.dtype != kv.dtype or fresh.device != kv.devices[layer]:  # what the pool will hold and later forwards read
            fresh = fresh.to(kv.devices[layer], kv.dtype)
        plan.fresh[layer] = fresh
        source = kv.whole(layer, fresh) if plan.whole else fresh
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
