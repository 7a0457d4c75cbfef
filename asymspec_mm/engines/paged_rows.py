"""Paged row storage: the rows of one model in fixed-size KV blocks, a block table per row.

A :class:`PagedBatchEngine` is a :class:`~.rows.BatchEngine` in interface (``join`` / ``leave`` / ``extend`` /
``prefill`` / ``truncate`` / ``detach`` / ``row_kv`` and the memory accounting the decoder and scheduler read), but
its rows hold no padded time dimension: each row's context is a :class:`~.block_pool.BlockTable` over a shared
:class:`~.paged_kv.PagedKV`, so a row costs its own tokens rounded up to a block. A rollback frees the blocks past
the new length, a row that leaves frees its blocks, and no compaction ever runs (there are no holes to reclaim).

Several storages of one model may share one ``PagedKV`` (:class:`PagedStorages` gives the batched prefill's
staging storage the decode storage's pool): a row prefilled there moves to the decode storage by reference
(``detach`` hands out a :class:`~.paged_kv.PagedRowContext`, ``join`` shares its blocks): nothing is copied. A
context from anywhere else (a single-row engine, the prefix-KV store) is copied into blocks once. Two rows joined
from one context share its blocks until one writes into the last partly filled one (copy-on-write).

A forward runs only the rows it extends (a row not given costs nothing), as ONE packed sequence of their new tokens
(:func:`packed_inputs`: nothing padded, each token at its own position); :mod:`.paged_attention` attends each row
over its own slots and its new tokens, the storage then writes every layer's new keys into the rows' blocks at once
(one write per pool segment they land in), and the logits are split per row.

The static-slot GPU path (:class:`~.static_rows.StaticBatchEngine`) stays as it is: CUDA graphs need buffers whose
shapes and addresses never change, which a pool that grows and a gather per forward do not give.
"""

from __future__ import annotations

import math

import torch

from .block_pool import BlockPool, BlockTable, blocks_for, capacity_bound
from .paged_attention import PagedCache, ragged_plan, use_paged_attention, uses_paged_attention
from .paged_kv import PagedKV, PagedRowContext, _on
from .pieces import PrefillChunk, vision_inputs
from .rows import RowView
from .single import model_device
from .static_rows import layer_devices

#: Tokens per KV block unless a storage says otherwise.
DEFAULT_BLOCK_TOKENS = 16


def paged_kv_for(model, *, block_size: int = DEFAULT_BLOCK_TOKENS, growth: float = 1 / 16, layout: str | None = None) -> PagedKV:
    """An empty :class:`PagedKV` shaped for ``model``'s text layers (full attention only); ``layout``: the pool's
    layout (default: chosen by the number of layers, :func:`~.paged_kv.choose_layout`)."""
    text = model.config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None) or ()
    if any(t != "full_attention" for t in types):
        raise NotImplementedError(f"paged KV needs full-attention layers only (got {set(types)})")
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = model.get_input_embeddings().weight.dtype
    pool = BlockPool(block_size, growth=growth)
    return PagedKV(pool, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, devices=layer_devices(model), layout=layout)


def packed_inputs(pieces: list[PrefillChunk], starts: list[int], vision: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``input_ids`` ``[1, N]`` and ``position_ids`` of one packed forward: the pieces' tokens one after another
    (``N`` = their sum, nothing padded; ids stay on their device, so drafts on the GPU cost no host sync); piece
    ``r``'s positions ``starts[r] + i`` (each row's length plus rope delta), ``[1, N]``, or ``[3, 1, N]`` on every
    M-RoPE axis with ``vision``, a piece's own positions where it gives them (a prompt piece with an image)."""
    if len(pieces) == 1:  # one row (a request alone): its ids as they are, its positions in one op
        return _one_row_inputs(pieces[0], starts[0], vision, device)
    input_ids = torch.cat([_long_on(c.ids, device) for c in pieces]).unsqueeze(0)
    n = [c.ids.numel() for c in pieces]
    positions = torch.tensor([[s + i for s, count in zip(starts, n) for i in range(count)]], dtype=torch.long)
    if not vision:
        return input_ids, _on(positions, device)
    positions = positions.view(1, 1, -1).expand(3, 1, -1)
    if any(c.positions is not None for c in pieces):
        positions, at = positions.clone(), 0
        for c, count in zip(pieces, n):
            if c.positions is not None:
                positions[:, 0, at : at + count] = c.positions.reshape(3, -1)
            at += count
    return input_ids, positions.to(device)


def _one_row_inputs(piece: PrefillChunk, start: int, vision: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`packed_inputs` of one piece: its ids ``[1, n]`` and positions ``start ..`` (``[1, n]``, or ``[3, 1, n]``
    with ``vision``: the piece's own where it gives them)."""
    input_ids = _long_on(piece.ids, device).unsqueeze(0)
    if vision and piece.positions is not None:
        return input_ids, piece.positions.reshape(3, 1, -1).to(device, torch.long)
    positions = torch.arange(start, start + input_ids.shape[1], device=device).unsqueeze(0)
    return input_ids, positions.expand(3, 1, -1) if vision else positions


def _long_on(ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``ids`` flat, long, on ``device`` (no op where they already are: a forward's per-row calls add up)."""
    if ids.dim() != 1:
        ids = ids.reshape(-1)
    return ids if ids.device == device and ids.dtype == torch.long else ids.to(device, torch.long)


def paged_kv_bound(
    block_bytes: int, block_size: int, growth: float, min_segment: int, lengths: list[int], realloc_share: float = 0.0
) -> int:
    """The most KV bytes a pool holds while rows that reach ``lengths`` tokens live in it: every row's blocks at its
    length (a block shared by several rows counts once per row, which covers its copy-on-write), the pool's growth
    slack (:func:`~.block_pool.capacity_bound` from empty) and what a reallocation holds beside the pool
    (``realloc_share`` of it: :attr:`~.paged_kv.PagedKV.realloc_share`). A forward's tokens are part of the length a
    row reaches, so a forward's step (the padded storage's time-width slack) adds nothing here: no row spans another's
    width."""
    if not lengths:
        return 0
    need = sum(blocks_for(n, block_size) for n in lengths)
    return with_realloc(capacity_bound(0, need, growth, min_segment) * block_bytes, realloc_share)


def with_realloc(pool_bytes: int, realloc_share: float) -> int:
    """``pool_bytes`` and the copy a reallocation holds beside a pool of that size (``realloc_share`` of it)."""
    return pool_bytes + math.ceil(pool_bytes * realloc_share)


class PagedBatchEngine:
    """Rows of one model in paged KV (module docstring). ``kv``: the pool to share (default: a new one of
    ``block_size`` tokens per block, in ``layout``: ``"segments"`` or ``"contiguous"``, by default chosen by the
    model's number of layers, :func:`~.paged_kv.choose_layout`); ``reports_pool``: whether ``kv_bytes()`` / ``peak_kv_bytes`` report the pool's
    bytes (one storage per pool does, so the sum over storages counts it once); ``counts_rows``: whether the KV
    bounds count this storage's rows (not a staging storage whose rows move on to a decode storage of the pool).

    vision: Qwen3-VL text positions (3D ``[3, B, n]``); default: detected from ``model.config``.
    """

    adopts = False
    drafts_itself = False
    rebuilds = True
    hands_out_rows = True
    takes_chunks = True  # extend(ids, prompts=...): arriving rows' prompt pieces ride in a decode forward
    detach_copies = False  # detach shares the row's blocks

    def __init__(
        self,
        model,
        name: str,
        *,
        kv: PagedKV | None = None,
        reports_pool: bool = True,
        counts_rows: bool = True,
        block_size: int = DEFAULT_BLOCK_TOKENS,
        layout: str | None = None,
        vision: bool | None = None,
    ):
        self.model, self.name = model, name
        self.vision = hasattr(model.config, "vision_config") if vision is None else vision
        self.device: torch.device = model_device(model)
        self.kv = kv if kv is not None else paged_kv_for(model, block_size=block_size, layout=layout)
        self.reports_pool, self.counts_rows = reports_pool, counts_rows
        self.cache = PagedCache(self.kv.n_layers)
        use_paged_attention(model)
        self._text = model.config.get_text_config(decoder=True)
        self.tokens_forwarded: dict[int, int] = {}
        self.forward_calls: dict[int, int] = {}
        self.batch_forwards = 0
        self.compactions = 0  # never: a paged storage has no holes to reclaim
        self._rows: list[int] = []  # join order
        self._tables: dict[int, BlockTable] = {}
        self._delta: dict[int, int] = {}

    @property
    def pool(self) -> BlockPool:
        return self.kv.pool

    # ------------------------------------------------------------------ rows
    @property
    def rows(self) -> list[int]:
        """Live row ids, in join order."""
        return list(self._rows)

    def _table(self, row: int) -> BlockTable:
        try:
            return self._tables[row]
        except KeyError:
            raise KeyError(f"{self.name}: no live row {row}") from None

    def length(self, row: int) -> int:
        """Logical cached tokens of ``row``."""
        return self._table(row).length

    def blocks(self, row: int) -> list[int]:
        """``row``'s block table (block ids in logical order)."""
        return list(self._table(row).blocks)

    @torch.no_grad()
    def join(self, row: int, engine) -> None:
        """Add ``row`` with the context of ``engine``: a :class:`PagedRowContext` of this pool is shared by reference
        (nothing copied; the caller may release it), anything else with ``.cache`` and ``.length`` (a single-row
        engine, a :class:`~.pieces.RowContext`) is copied into new blocks."""
        if row in self._tables:
            raise ValueError(f"{self.name}: row {row} is already live")
        length = int(engine.length)
        if isinstance(engine, PagedRowContext) and engine.kv is self.kv:
            table = self.pool.fork(engine.table)
        else:
            src = engine.cache
            if length and (src is None or src.layers[0].keys.shape[0] != 1):
                raise ValueError(f"{self.name}: join needs a single-row engine with a filled cache")
            table = BlockTable()
            self.pool.append(table, length)
            self.kv.sync()
            if length:
                self.kv.store(table, 0, [(layer.keys[..., :length, :], layer.values[..., :length, :]) for layer in src.layers])
        self._rows.append(row)
        self._tables[row] = table
        self._delta[row] = int(getattr(engine, "rope_delta", 0) or 0)
        self.tokens_forwarded[row] = int(getattr(engine, "tokens_forwarded", 0))
        self.forward_calls[row] = int(getattr(engine, "forward_calls", 0))

    def leave(self, row: int) -> None:
        """Free ``row``'s blocks (shared ones stay with their other holders); its counters stay."""
        table = self._table(row)
        self._rows.remove(row)
        del self._tables[row], self._delta[row]
        self.pool.release(table)
        self.pool.trim()
        self.kv.sync()

    def truncate(self, row: int, length: int) -> None:
        """Keep the first ``length`` tokens of ``row``; the blocks past them are freed."""
        table = self._table(row)
        if not 0 <= length <= table.length:
            raise ValueError(f"{self.name}: row {row} has {table.length} tokens, cannot keep {length}")
        self.pool.truncate(table, length)

    # ------------------------------------------------------------------ decoding
    def extend(self, ids: dict[int, torch.Tensor], prompts: dict[int, PrefillChunk] | None = None) -> dict[int, torch.Tensor]:
        """Append ``ids[row]`` ``[n_r]`` (``n_r >= 1``) to each given row in one forward; ``{row: logits [n_r, V]}``.

        ``prompts``: pieces of other rows' prompts (arriving rows, images and M-RoPE positions per piece) that ride in
        the same forward: their KV is written and no logits are made for them (a decode step's forward carries the
        turn's prompt chunks, vLLM's mixed prefill/decode batch). A piece with image pads rides apart from ids that
        hold the image pad token (the model fills every image pad of a forward with the images' embeddings)."""
        if not prompts:
            return self._forward({r: PrefillChunk(t) for r, t in ids.items()}, keep=0) if ids else {}
        both = set(ids) & set(prompts)
        if both:
            raise ValueError(f"{self.name}: rows {sorted(both)} are given both decode ids and a prompt piece")
        if ids and self._pads_in(ids, prompts):
            self._forward(dict(prompts), keep=1)
            return self._forward({r: PrefillChunk(t) for r, t in ids.items()}, keep=0)
        chunks = {**{r: PrefillChunk(t) for r, t in ids.items()}, **prompts}
        if not ids:
            self._forward(chunks, keep=1)
            return {}
        return self._forward(chunks, keep=0, wanted=list(ids))

    def _pads_in(self, ids: dict[int, torch.Tensor], prompts: dict[int, PrefillChunk]) -> bool:
        """Whether ``prompts`` carry image embeddings while some ``ids`` hold the image pad token."""
        pad = getattr(self.model.config, "image_token_id", None)
        if pad is None or not any(c.image_embeds is not None and c.image_embeds.shape[0] for c in prompts.values()):
            return False
        return any(bool((t == pad).any()) for t in ids.values())

    def prefill(self, chunks: dict[int, PrefillChunk]) -> None:
        """Append a piece of each given row's prompt in one forward (images and M-RoPE positions per row)."""
        if chunks:
            self._forward(chunks, keep=1)

    @torch.no_grad()
    def _forward(
        self, chunks: dict[int, PrefillChunk], keep: int | torch.Tensor, wanted: list[int] | None = None
    ) -> dict[int, torch.Tensor]:
        """One packed forward of every given row's new tokens (module docstring); ``keep``: logits to keep (0: all, 1:
        none wanted); ``wanted``: only these rows' logits (the others' pieces ride without any), ``{row: [n_r, V]}``."""
        for row, c in chunks.items():
            self._table(row)
            if c.ids.numel() < 1:
                raise ValueError(f"{self.name}: row {row}: extend needs at least one token")
        if not uses_paged_attention(self._text):  # someone reset the model's attention since
            use_paged_attention(self.model)
        order = [r for r in self._rows if r in chunks]
        n = [int(chunks[r].ids.numel()) for r in order]
        tables = [self._tables[r] for r in order]
        starts = [t.length + self._delta[r] for r, t in zip(order, tables)]
        input_ids, positions = packed_inputs([chunks[r] for r in order], starts, self.vision, self.device)
        if wanted is not None:  # the lm head runs over the wanted rows' tokens only, never over a riding prompt piece
            offsets = [sum(n[:i]) for i in range(len(n))]
            keep = torch.tensor([o + i for r, o, c in zip(order, offsets, n) if r in wanted for i in range(c)], device=self.device)
        past = [t.length for t in tables]
        fresh, copies = [], []
        for table, count in zip(tables, n):
            got, copy = self.pool.append(table, count)
            fresh += got
            copies += copy
        self.kv.sync()
        self.kv.copy_blocks(copies)
        try:
            plan = ragged_plan(self.kv, tables, n, fresh, self.device)
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                paged_plan=plan,
                **vision_inputs([chunks[r] for r in order]),
            )
            plan.commit()  # every layer's new keys, one write per segment they land in
        except BaseException:
            for table, p in zip(tables, past):  # the forward never happened: the rows keep their contexts
                self.pool.truncate(table, p)
            raise
        self.batch_forwards += 1
        for r, count in zip(order, n):
            self.tokens_forwarded[r] += count
            self.forward_calls[r] += 1
        if wanted is None and isinstance(keep, int) and keep:
            return {}
        counts = [(r, count) for r, count in zip(order, n) if wanted is None or r in wanted]
        logits = out.logits[0].split([count for _, count in counts])  # one op, not one slice per row
        at = {r: piece for (r, _), piece in zip(counts, logits)}
        return {r: at[r] for r in (chunks if wanted is None else wanted)}

    def detach(self, row: int) -> PagedRowContext:
        """``row``'s context by reference (its blocks shared, nothing copied), ready to :meth:`join` a storage on the
        same pool (or any storage, through its gathered ``cache``); the row stays here (:meth:`leave` frees it)."""
        table = self._table(row)
        return PagedRowContext(self.kv, self.pool.fork(table), self._delta[row], self.tokens_forwarded[row], self.forward_calls[row])

    @torch.no_grad()
    def row_kv(self, row: int, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Tokens ``start .. stop - 1`` of ``row``, gathered: ``[(keys, values)]`` per layer, each ``[1, H, n, D]``."""
        table = self._table(row)
        stop = min(stop, table.length)
        return self.kv.read(table, start, stop) if stop > start else []

    # ------------------------------------------------------------------ memory
    def slot_bytes(self) -> int:
        """Bytes of one token of one row over all layers (keys and values)."""
        return self.kv.slot_bytes()

    def block_bytes(self) -> int:
        return self.slot_bytes() * self.pool.block_size

    def kv_bound(self, lengths: list[int], step_tokens: int) -> int:
        """The most KV bytes this storage's rows take in the pool while they reach ``lengths`` tokens, forwards
        included (:func:`paged_kv_bound`; ``step_tokens`` adds nothing: no row spans another's width); 0 for a staging storage on a shared pool (its rows move to a decode storage, whose
        bound counts them at their final lengths)."""
        if not self.counts_rows:
            return 0
        pool = self.pool
        return paged_kv_bound(self.block_bytes(), pool.block_size, pool.growth, pool.min_segment, lengths, self.kv.realloc_share)

    def step_bytes(self, grow: int, join: int | None = None) -> int:
        """An upper bound of the pool bytes this storage accounts for while its rows (and a row of ``join`` tokens
        joining) append up to ``grow`` tokens: the blocks its rows hold and will take, with the pool's growth
        slack; the storage that reports the pool adds its free blocks. Summed over the storages on a pool, this
        bounds the pool (a block shared by several rows counts once per holder, which covers its copy-on-write)."""
        pool = self.pool
        free = (pool.capacity - pool.used_blocks) if self.reports_pool else 0
        rows = len(self._rows) + (join is not None)
        if not self.counts_rows or not rows:
            return with_realloc(free * self.block_bytes(), self.kv.realloc_share)
        need = sum(len(t.blocks) for t in self._tables.values()) + rows * blocks_for(grow, pool.block_size)
        if join is not None:
            need += blocks_for(join, pool.block_size)
        return with_realloc((capacity_bound(0, need, pool.growth, pool.min_segment) + free) * self.block_bytes(), self.kv.realloc_share)

    @property
    def peak_kv_bytes(self) -> int:
        """The most bytes the pool held since the caller last set this (0 for a storage that does not report it)."""
        return self.kv.peak_bytes if self.reports_pool else 0

    @peak_kv_bytes.setter
    def peak_kv_bytes(self, value: int) -> None:
        if self.reports_pool:
            self.kv.peak_bytes = value

    @property
    def engine_calls(self) -> int:
        return self.batch_forwards

    def kv_bytes(self, row: int | None = None) -> int:
        """KV memory held by ``row``'s tokens; ``None``: the pool's segments (every block, free or not; 0 for a
        storage that does not own the pool)."""
        if row is not None:
            return self.length(row) * self.slot_bytes()
        return self.kv.nbytes() if self.reports_pool else 0

    def view(self, row: int) -> RowView:
        self._table(row)
        return RowView(self, row)


class PagedStorages:
    """A batch-engine factory (``(model, stream name) -> storage``) whose storages of one model share one pool, and
    whose :meth:`staging` storages (the batched prefill's) share it too, so a prefilled row joins without a copy.
    ``layout``: the pools' layout (default: by each model's number of layers, :func:`~.paged_kv.choose_layout`);
    ``per_stream``: one pool per stream instead (a model's two drafter views apart), so that a row alone holds
    consecutive blocks in each pool, which the attention reads where they lie (one pool shared by two growing rows
    hands their blocks out alternately, and each layer then copies the row's scattered runs)."""

    def __init__(self, *, block_size: int = DEFAULT_BLOCK_TOKENS, layout: str | None = None, per_stream: bool = False):
        self.block_size, self.layout, self.per_stream = block_size, layout, per_stream
        self._kv: dict[tuple[int, str], tuple[object, PagedKV]] = {}  # (id(model), stream or "") -> (model, its pool)

    def _pool(self, model, name: str) -> tuple[PagedKV, bool]:
        """The pool of ``model`` (of its stream ``name`` with ``per_stream``), and whether it is new (its first
        storage owns it)."""
        key = (id(model), name if self.per_stream else "")
        held = self._kv.get(key)
        if held is not None and held[0] is model:
            return held[1], False
        kv = paged_kv_for(model, block_size=self.block_size, layout=self.layout)
        self._kv[key] = (model, kv)
        return kv, True

    def __call__(self, model, name: str) -> PagedBatchEngine:
        kv, new = self._pool(model, name)
        return PagedBatchEngine(model, name, kv=kv, reports_pool=new)

    def staging(self, model, name: str) -> PagedBatchEngine:
        """The batched prefill's storage of ``model``: on the decode storages' pool when one exists (then it reports
        no bytes and its rows count in the decode storages' bounds), else on a new pool of its own."""
        kv, new = self._pool(model, name)
        return PagedBatchEngine(model, name, kv=kv, reports_pool=new, counts_rows=new)
