"""Batched KV-cached streams: many rows (independent requests) of one model decoded with one forward per step.

A :class:`BatchEngine` holds the rows of one model (the verifier, or one view of the drafter) in one
transformers ``DynamicCache`` of shape ``[B, H, T, D]`` per layer. Slot ``t`` of row ``b`` is either live (a token
of that row's context) or a *hole* (a token that was rolled back, a padding slot of a ragged extend, a slot a
shorter row never filled). Each row keeps the list of its live slots in order; its logical length is that list's
length and its next positions follow from it, never from the slot count.

Holes are masked through the 2D ``attention_mask`` ``[B, T + n]`` that transformers turns into the 4D causal mask
(``create_causal_mask``: causality over slot indices AND the 2D mask, for SDPA and eager alike). RoPE is already
in the cached keys, so a live key's slot index plays no part in its attention: gathering each row's live slots
left-aligned (*compaction*) changes nothing but the cost, and runs when the reclaimable slots exceed a fraction of
the time dimension. Rolling back at the tail of the cache, when no row has a live slot there, just crops.

A row joins with the context of a prefilled single-row engine (a :class:`~asymspec_mm.engines.TextEngine` or
:class:`~asymspec_mm.engines.VLEngine`, or a :class:`RowContext` another storage :meth:`~BatchEngine.detach`-ed); the
batch copies its keys/values and leaves the source untouched. :meth:`BatchEngine.prefill` appends prompt pieces of
several rows in one ragged forward (image embeddings and M-RoPE positions per row): the batched, chunked prefill of
:mod:`asymspec_mm.core.prefill` runs on it.
"""

from __future__ import annotations

import math

import torch

from .pieces import PrefillChunk, RowContext, vision_inputs
from .single import model_device


def _new_cache(config):
    from transformers import DynamicCache

    return DynamicCache(config=config)


def _set_layer(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Install ``keys`` / ``values`` ``[B, H, T, D]`` in a DynamicLayer without copying them."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def _layer_kv(cache, i: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` positions of layer ``i`` of a single-row cache (dynamic, or static up to its length)."""
    layer = cache.layers[i]
    return layer.keys[..., :length, :], layer.values[..., :length, :]


def dynamic_kv_bound(slot_bytes: int, n_layers: int, compact_at: float, lengths: list[int], step_tokens: int) -> int:
    """The most KV bytes a :class:`BatchEngine` allocates while rows that reach ``lengths`` tokens live in it.

    Every row spans the whole time dimension ``T`` (padding and holes are allocated too). Compaction runs before a
    forward once ``T - L_max > compact_at * T``, so ``T <= L_max / (1 - compact_at) + step_tokens``. A join or a
    compaction replaces one layer at a time, so its old tensors live beside the new ones for one layer only:
    ``bytes <= slot_bytes * T * (R + (R - 1) / n_layers)`` for ``R`` rows. ``slot_bytes``: one token of one row over
    all layers (keys and values).
    """
    if not lengths:
        return 0
    if compact_at >= 1.0:
        raise ValueError("a KV bound needs compact_at < 1 (with compact_at=1 holes are never reclaimed)")
    rows = len(lengths)
    time = math.ceil(max(lengths) / (1.0 - compact_at)) + step_tokens
    per_layer = slot_bytes // n_layers
    return slot_bytes * time * rows + per_layer * time * (rows - 1)


def ragged_inputs(
    pieces: list[PrefillChunk | None], starts: torch.Tensor, vision: bool, device: torch.device, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``input_ids`` ``[B, n_max]`` and ``position_ids`` of one ragged forward: each batch row's piece (``None``:
    no tokens) right-padded with ``pad_id`` (a token that is never an image pad; ids stay on their device, so drafts
    on the GPU cost no host sync); positions ``starts[b] + i`` (``[B]``: each row's length plus rope delta; pads
    continue the count), ``[3, B, n_max]`` on every M-RoPE axis with ``vision``, a piece's own positions where it
    gives them (a prompt piece with an image)."""
    none = torch.zeros(0, dtype=torch.long, device=device)
    input_ids = torch.nn.utils.rnn.pad_sequence(
        [none if c is None else c.ids.reshape(-1).to(device, torch.long) for c in pieces], batch_first=True, padding_value=pad_id
    )
    n_max = input_ids.shape[1]
    positions = (starts.unsqueeze(1) + torch.arange(n_max)).to(device)
    if not vision:
        return input_ids, positions
    positions = positions.unsqueeze(0).expand(3, len(pieces), n_max)
    given = [(b, c) for b, c in enumerate(pieces) if c is not None and c.positions is not None]
    if given:
        positions = positions.clone()
        for b, c in given:
            positions[:, b, : c.ids.numel()] = c.positions.to(device)
    return input_ids, positions


class RowBook:
    """The logical side of a row storage: each row's live columns in order (its length, from which its next
    positions follow), over a time width shared by the rows (``_width``: the cache's time dimension, or a static
    storage's write cursor). Subclasses keep ``_rows`` (their order), ``_slots`` (row -> live columns, ascending),
    ``_live`` (``[batch, >= width]`` bool: the live slots) and ``_width``, say where a row is in the batch
    (``_index``) and give back the slots after the last live one (``_trim_tail``)."""

    name: str
    device: torch.device
    _rows: list[int]
    _slots: dict[int, list[int]]
    _live: torch.Tensor
    _width: int
    _delta: dict[int, int]
    tokens_forwarded: dict[int, int]
    forward_calls: dict[int, int]

    def _index(self, row: int) -> int:
        raise NotImplementedError

    @property
    def rows(self) -> list[int]:
        """Live row ids, in batch order."""
        return list(self._rows)

    def length(self, row: int) -> int:
        """Logical cached tokens of ``row``."""
        try:
            return len(self._slots[row])
        except KeyError:
            raise KeyError(f"{self.name}: no live row {row}") from None

    @property
    def slots(self) -> int:
        """The time width: every live slot of every row lies before it (the rest up to it are holes)."""
        return self._width

    def holes(self) -> int:
        """Hole slots before the width over all rows (``rows * width`` minus the live ones)."""
        return len(self._rows) * self._width - sum(len(s) for s in self._slots.values())

    def reclaimable(self) -> int:
        """Slots per row that compaction would free: ``width - longest row``."""
        return self._width - max((len(s) for s in self._slots.values()), default=0)

    def truncate(self, row: int, length: int) -> None:
        """Keep the first ``length`` logical tokens of ``row``; its later slots become holes (no other row changes)."""
        b = self._index(row)
        slots = self._slots[row]
        if not 0 <= length <= len(slots):
            raise ValueError(f"{self.name}: row {row} has {len(slots)} tokens, cannot keep {length}")
        dropped = slots[length:]
        if not dropped:
            return
        del slots[length:]
        if dropped[-1] - dropped[0] == len(dropped) - 1:  # a contiguous run (the usual rollback): one slice
            self._live[b, dropped[0] : dropped[-1] + 1] = False
        else:
            self._live[b, torch.tensor(dropped, device=self.device)] = False
        self._trim_tail()

    def _trim_tail(self) -> None:
        raise NotImplementedError

    def _book(self, row: int, engine, slots: range) -> None:
        """Record a joined row: its live ``slots``, rope delta and counters (from the single-row ``engine``)."""
        self._rows.append(row)
        self._slots[row] = list(slots)
        self._delta[row] = int(getattr(engine, "rope_delta", 0) or 0)
        self.tokens_forwarded[row] = int(getattr(engine, "tokens_forwarded", 0))
        self.forward_calls[row] = int(getattr(engine, "forward_calls", 0))

    def _end(self) -> int:
        """One past the last slot any row holds."""
        return max((s[-1] + 1 for s in self._slots.values() if s), default=0)


class BatchEngine(RowBook):
    """Rows (independent streams of one model) in one batched KV cache.

    A row joins by adopting the cache of a prefilled single-row engine (a :class:`TextEngine` / :class:`VLEngine`,
    or anything with ``.cache``, ``.length`` and optionally ``.rope_delta``), so prefill, the vision feature cache
    and the prefix-KV reuse stay exactly the single-row code. Decode forwards are batched: :meth:`extend` appends
    ``n_r`` tokens to each given row in ONE model forward (rows right-padded to ``max n_r``; padding slots, and the
    slots of rows not given, become holes). Each row has its own logical length and positions; slots of rolled-back
    or padding tokens are holes, masked in attention through a 2D ``attention_mask``, and reclaimed by compaction
    (each row's live slots gathered left-aligned in order; RoPE is already in the keys, so attention is unchanged)
    when the reclaimable slots exceed ``compact_at`` of the time dimension.

    vision: Qwen3-VL text positions (3D ``[3, B, n]`` = length + i + rope_delta on every axis); default: detected
    from ``model.config`` (a ``vision_config``).
    """

    adopts = False
    drafts_itself = False
    rebuilds = True
    hands_out_rows = True
    detach_copies = True  # detach gathers the row into a new single-row cache

    def __init__(self, model, name: str, *, vision: bool | None = None, compact_at: float = 0.5):
        if not 0.0 <= compact_at <= 1.0:
            raise ValueError(f"compact_at must be in [0, 1], got {compact_at}")
        self.model = model
        self.name = name
        self.vision = hasattr(model.config, "vision_config") if vision is None else vision
        self.compact_at = compact_at
        self.device: torch.device = model_device(model)
        self.cache = None  # DynamicCache [B, H, T, D] per layer; None while there are no rows
        self.tokens_forwarded: dict[int, int] = {}
        self.forward_calls: dict[int, int] = {}
        self.compactions = 0  # how many times the cache was compacted
        self.batch_forwards = 0  # model forwards this engine ran
        self.peak_kv_bytes = 0  # the most KV bytes held after a join, a forward or a compaction (reset by the caller)
        self._rows: list[int] = []  # batch order
        self._slots: dict[int, list[int]] = {}  # row -> its live slot indices, ascending (logical order)
        self._delta: dict[int, int] = {}  # row -> rope delta (VL rows; 0 for text)
        self._live = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, T]: live slots
        self._T = 0
        text = model.config.get_text_config(decoder=True)
        self._n_layers = text.num_hidden_layers
        self._kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self._head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self._dtype = model.get_input_embeddings().weight.dtype
        # where each layer's keys live (a model spread over GPUs by a device_map keeps them on its layer's device)
        self._layer_devices = [self.device] * self._n_layers
        for module in model.modules():
            if hasattr(module, "layer_idx") and hasattr(module, "k_proj") and module.layer_idx < self._n_layers:
                self._layer_devices[module.layer_idx] = module.k_proj.weight.device
        # ragged rows are padded with a token that is never an image pad (the model scatters image embeddings there)
        self._pad_id = 1 if getattr(model.config, "image_token_id", None) == 0 else 0
        types = getattr(text, "layer_types", None) or ()
        if any(t != "full_attention" for t in types):
            raise NotImplementedError(f"{name}: BatchEngine needs full-attention layers only (got {set(types)})")

    # ------------------------------------------------------------------ rows
    @property
    def _width(self) -> int:
        return self._T

    def _index(self, row: int) -> int:
        try:
            return self._rows.index(row)
        except ValueError:
            raise KeyError(f"{self.name}: no live row {row}") from None

    def _empty_kv(self, batch: int, time: int, layer: int) -> torch.Tensor:
        return torch.zeros(batch, self._kv_heads, time, self._head_dim, dtype=self._dtype, device=self._layer_devices[layer])

    @torch.no_grad()
    def join(self, row: int, engine) -> None:
        """Add ``row`` with the context of a prefilled single-row ``engine`` (its cache is copied, not changed).

        The row's keys/values go to slots ``0 .. L-1``; the time dimension grows with hole slots if ``L`` exceeds
        it, and a shorter row's remaining slots are holes.
        """
        if row in self._slots:
            raise ValueError(f"{self.name}: row {row} is already live")
        length = int(engine.length)
        src = engine.cache
        if length and (src is None or src.layers[0].keys.shape[0] != 1):
            raise ValueError(f"{self.name}: join needs a single-row engine with a filled cache")
        grow = max(0, length - self._T)
        new_T = self._T + grow
        B = len(self._rows)
        if self.cache is None:
            self.cache = _new_cache(self.model.config)
        for i in range(self._n_layers):
            # one new tensor per layer (the batch owns it: never a view of the engine's, which a static engine
            # writes in place); hole slots are zeros, so a masked key never carries a NaN into attention
            ks = []
            for part in (0, 1):
                buf = self._empty_kv(B + 1, new_T, i)
                if B:
                    old = self.cache.layers[i].keys if part == 0 else self.cache.layers[i].values
                    buf[:B, :, : self._T] = old
                if length:
                    buf[B, :, :length] = _layer_kv(src, i, length)[part][0].to(buf.device, self._dtype)
                ks.append(buf)
            _set_layer(self.cache.layers[i], ks[0], ks[1])
        live = torch.zeros(B + 1, new_T, dtype=torch.bool, device=self.device)
        live[:B, : self._T] = self._live
        live[B, :length] = True
        self._live, self._T = live, new_T
        self._book(row, engine, range(length))
        self._note_peak()

    @torch.no_grad()
    def leave(self, row: int) -> None:
        """Free ``row``: its batch index is removed at once (the batch dimension shrinks); its counters stay."""
        b = self._index(row)
        self._rows.pop(b)
        del self._slots[row], self._delta[row]
        if not self._rows:
            self.cache, self._T = None, 0
            self._live = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
            return
        keep = torch.tensor([i for i in range(len(self._rows) + 1) if i != b])
        for layer in self.cache.layers:
            k = keep.to(layer.keys.device)
            _set_layer(layer, layer.keys.index_select(0, k), layer.values.index_select(0, k))
        self._live = self._live.index_select(0, keep.to(self.device))
        self._trim_tail()

    def _trim_tail(self) -> None:
        """Crop trailing slots that no row holds (the time dimension shrinks, nothing is copied)."""
        end = self._end()
        if end < self._T and self.cache is not None:
            self.cache.crop(-(self._T - end))
            self._live = self._live[:, :end]
            self._T = end

    # ------------------------------------------------------------------ compaction
    def maybe_compact(self) -> bool:
        """Compact when the reclaimable share of the time dimension exceeds ``compact_at``; True if it did."""
        if self._T and self.reclaimable() > self.compact_at * self._T:
            self.compact()
            return True
        return False

    @torch.no_grad()
    def compact(self) -> None:
        """Gather each row's live slots left-aligned, in order; the time dimension becomes the longest row."""
        if self.cache is None:
            return
        lengths = [len(self._slots[r]) for r in self._rows]
        T = max(lengths, default=0)
        index = torch.zeros(len(self._rows), T, dtype=torch.long)
        for b, r in enumerate(self._rows):
            if lengths[b]:
                index[b, : lengths[b]] = torch.tensor(self._slots[r])
        for layer in self.cache.layers:
            B, H, _, D = layer.keys.shape
            idx = index.to(layer.keys.device).view(B, 1, T, 1).expand(B, H, T, D)
            _set_layer(layer, layer.keys.gather(2, idx), layer.values.gather(2, idx))
        self._live = torch.arange(T, device=self.device).unsqueeze(0) < torch.tensor(lengths, device=self.device).unsqueeze(1)
        for r, n in zip(self._rows, lengths):
            self._slots[r] = list(range(n))
        self._T = T
        self.compactions += 1
        self._note_peak()

    # ------------------------------------------------------------------ decoding
    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Append ``ids[row]`` ``[n_r]`` (``n_r >= 1``) to each given row in one forward; return ``{row: logits
        [n_r, V]}``. Rows not given keep their context (they only get hole slots)."""
        if not ids:
            return {}
        return self._forward({r: PrefillChunk(t) for r, t in ids.items()}, keep=0)

    def prefill(self, chunks: dict[int, PrefillChunk]) -> None:
        """Append a piece of each given row's prompt in one forward (rows of different lengths, images and explicit
        M-RoPE positions side by side: batched, chunked prefill); no logits are kept."""
        if chunks:
            self._forward(chunks, keep=1)

    @torch.no_grad()
    def _forward(self, chunks: dict[int, PrefillChunk], keep: int) -> dict[int, torch.Tensor]:
        """One forward appending ``chunks[row].ids`` ``[n_r]`` to each given row; ``keep=0``: ``{row: logits [n_r, V]}``,
        ``keep=1``: only each padded row's last column is computed (prefill: nothing is returned)."""
        for row, c in chunks.items():
            if row not in self._slots:
                raise KeyError(f"{self.name}: no live row {row}")
            if c.ids.numel() < 1:
                raise ValueError(f"{self.name}: row {row}: extend needs at least one token")
        self.maybe_compact()
        B, T = len(self._rows), self._T
        n = {r: int(c.ids.numel()) for r, c in chunks.items()}
        n_max = max(n.values())
        starts = torch.tensor([len(self._slots[r]) + self._delta[r] for r in self._rows])
        input_ids, positions = ragged_inputs([chunks.get(r) for r in self._rows], starts, self.vision, self.device, self._pad_id)
        # The new columns are all visible in this forward: causality over slots keeps a real token from seeing the
        # pads after it, and a pad query always sees itself (never a fully masked row, whose NaN would be cached).
        # Without holes (one row, or rows of one length in step) the plain causal mask is the same thing.
        mask = None
        if self.holes():
            mask = torch.cat([self._live, torch.ones(B, n_max, dtype=torch.bool, device=self.device)], dim=1)
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=keep,
            **vision_inputs([chunks[r] for r in self._rows if r in chunks]),
        )
        self.batch_forwards += 1
        new_live = torch.zeros(B, n_max, dtype=torch.bool)
        result: dict[int, torch.Tensor] = {}
        for b, r in enumerate(self._rows):
            if r in chunks:
                new_live[b, : n[r]] = True
                self._slots[r].extend(range(T, T + n[r]))
                self.tokens_forwarded[r] += n[r]
                self.forward_calls[r] += 1
                if not keep:
                    result[r] = out.logits[b, : n[r]]
        self._live = torch.cat([self._live, new_live.to(self.device)], dim=1)
        self._T = T + n_max
        self._note_peak()
        self._trim_tail()
        return {r: result[r] for r in chunks} if not keep else {}

    @torch.no_grad()
    def detach(self, row: int) -> RowContext:
        """``row``'s context as a single-row cache (its live slots gathered in order), ready to :meth:`join` another
        storage; the row stays here (:meth:`leave` frees it)."""
        b, slots = self._index(row), self._slots[row]
        cache = _new_cache(self.model.config)
        for i, layer in enumerate(self.cache.layers if self.cache is not None and slots else ()):
            index = torch.tensor(slots, device=layer.keys.device)
            _set_layer(cache.layers[i], layer.keys[b : b + 1].index_select(2, index), layer.values[b : b + 1].index_select(2, index))
        return RowContext(cache if slots else None, len(slots), self._delta[row], self.tokens_forwarded[row], self.forward_calls[row])

    @torch.no_grad()
    def row_kv(self, row: int, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Positions ``start .. stop-1`` of ``row``'s context, gathered: ``[(keys, values)]`` per layer, each ``[1, H,
        stop - start, D]`` (what KV reuse stores of a finished row, without copying the rest of it)."""
        b, slots = self._index(row), self._slots[row][start:stop]
        if self.cache is None or not slots:
            return []
        index = torch.tensor(slots, device=self.device)
        return [
            (layer.keys[b : b + 1].index_select(2, index), layer.values[b : b + 1].index_select(2, index)) for layer in self.cache.layers
        ]

    # ------------------------------------------------------------------ memory
    def slot_bytes(self) -> int:
        """Bytes of one slot of one row over all layers (keys and values)."""
        return self._n_layers * 2 * self._kv_heads * self._head_dim * torch.empty((), dtype=self._dtype).element_size()

    def kv_bound(self, lengths: list[int], step_tokens: int) -> int:
        """The most KV bytes this storage can hold at once while rows that reach ``lengths`` tokens live in it, each
        forward appending at most ``step_tokens`` slots: :func:`dynamic_kv_bound` of this engine's shapes."""
        return dynamic_kv_bound(self.slot_bytes(), self._n_layers, self.compact_at, lengths, step_tokens)

    def step_bytes(self, grow: int, join: int | None = None) -> int:
        """An upper bound of the KV bytes this storage holds while its rows (and a row of ``join`` tokens joining)
        append up to ``grow`` slots: every row spans the time width, which grows by at most ``grow``, and a forward's
        cache update, a join or a compaction copies one layer beside the old one."""
        rows = len(self._rows) + (join is not None)
        if not rows:
            return 0
        time = max(self._T, join or 0) + grow
        return (self.slot_bytes() + self.slot_bytes() // self._n_layers) * time * rows

    def _note_peak(self) -> None:
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes())

    @property
    def engine_calls(self) -> int:
        """Model calls this engine made (one batched forward each), the unit of per-step cost in ``stats``."""
        return self.batch_forwards

    def kv_bytes(self, row: int | None = None) -> int:
        """KV memory held by ``row``'s live slots; ``None``: the whole cache, holes included."""
        if row is not None:
            return self.length(row) * self.slot_bytes()
        if self.cache is None:
            return 0
        return sum(
            layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
            for layer in self.cache.layers
        )

    def view(self, row: int) -> RowView:
        return RowView(self, row)


class RowView:
    """One row of a :class:`BatchEngine` with the single-row engine attributes the stats code reads (name, length,
    tokens_forwarded, forward_calls, device); ``extend`` / ``truncate`` act on that row alone (a one-row forward)."""

    def __init__(self, batch: BatchEngine, row: int):
        self.batch = batch
        self.row = row

    @property
    def name(self) -> str:
        return self.batch.name

    @property
    def device(self) -> torch.device:
        return self.batch.device

    @property
    def length(self) -> int:
        return self.batch.length(self.row)

    @property
    def tokens_forwarded(self) -> int:
        return self.batch.tokens_forwarded[self.row]

    @property
    def forward_calls(self) -> int:
        return self.batch.forward_calls[self.row]

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        return self.batch.extend({self.row: ids})[self.row]

    def truncate(self, length: int) -> None:
        self.batch.truncate(self.row, length)

    def __repr__(self) -> str:
        return f"RowView({self.name!r}, row={self.row}, length={self.length})"
