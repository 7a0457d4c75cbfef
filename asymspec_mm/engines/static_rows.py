"""Static-slot row storage: the rows of one model in KV buffers allocated once (the GPU fast path of batching).

A :class:`StaticBatchEngine` holds keys and values ``[max_rows, H, max_len, D]`` per layer, allocated when it is
built and never reallocated, so their addresses stay fixed (what CUDA graphs need). A row gets a free *slot* (a
batch index) when it joins and keeps it until it leaves; leaving copies nothing. All slots share one write
*cursor* on the column (time) axis: a forward of ``n`` tokens writes columns ``cursor .. cursor+n-1`` of every
slot. Each row keeps the list of its live columns in order; the others are holes (rolled-back tokens, the pads of
a ragged extend, the columns of rows left out of a forward, free slots), masked through a 2D ``attention_mask``
``[slots, columns]`` that transformers combines with causality over columns (the query offset is the cursor).
RoPE is already in the cached keys, so a live key's column plays no part in attention: when the cursor would pass
``max_len``, *compaction* gathers each row's live columns left-aligned, in place.

With ``compile_decode`` every forward runs with the FIXED batch ``max_rows`` over all ``max_len`` columns (free
slots are padding rows whose queries see only their own new columns), so the shapes of the 1-token drafting
forward and the (K+1)-token scoring forward never change and ``torch.compile(mode="reduce-overhead")`` can
capture each in a CUDA graph. Eager forwards run only the slots and columns in use (the same results, less work).

Prefill stays single-row, as for :class:`~asymspec_mm.engines.rows.BatchEngine`: a row joins by copying the
cache of a prefilled single-row engine.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, StaticLayer

from ..base.errors import AsymSpecError
from .rows import RowBook, RowView, _layer_kv
from .single import model_device


class StaticRowsFullError(AsymSpecError):
    """A static-slot engine cannot take a row (every slot is taken) or a token (the column axis is full)."""


class SlotLayer(StaticLayer):
    """One layer's preallocated keys/values ``[max_rows, H, max_len, D]``; a forward writes its ``n`` new keys at
    the shared cursor (``cumulative_length``, a device tensor so that a compiled graph reads it, not a constant).

    ``cols``: when set (eager forwards), attention and the mask cover only the first ``cols`` columns; a forward
    over fewer slots than ``max_rows`` writes and reads the first slots only.
    """

    def __init__(self, max_len: int):
        super().__init__(max_cache_len=max_len)
        self.cols: int | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        n, b = key_states.shape[-2], key_states.shape[0]
        at = torch.arange(n, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(n)
        keys = self.keys if b == self.keys.shape[0] else self.keys[:b]
        values = self.values if b == self.values.shape[0] else self.values[:b]
        keys.index_copy_(2, at, key_states)
        values.index_copy_(2, at, value_states)
        if self.cols is None:
            return keys, values
        return keys[:, :, : self.cols], values[:, :, : self.cols]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.max_cache_len if self.cols is None else self.cols), 0


def layer_devices(model) -> list[torch.device]:
    """Where each decoder layer's keys live (a model spread over GPUs by a device_map keeps them on its layer's)."""
    n = model.config.get_text_config(decoder=True).num_hidden_layers
    devices = [model_device(model)] * n
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "k_proj") and module.layer_idx < n:
            devices[module.layer_idx] = module.k_proj.weight.device
    return devices


class StaticBatchEngine(RowBook):
    """Rows of one model in preallocated slots: the :class:`~asymspec_mm.decode.rows.RowEngine` protocol of
    :class:`BatchEngine` (join / leave / extend / truncate / length / view, ``kv_bytes``, ``slot_bytes``,
    ``engine_calls``), on buffers ``[max_rows, kv_heads, max_len, head_dim]`` per layer allocated once.

    max_rows: slots (rows live at once); max_len: columns (a row's context plus the holes the rows beside it leave,
    reclaimed by compaction). compile_decode: forwards of at most ``compile_tokens`` tokens run through
    ``torch.compile(model, mode=compile_mode, dynamic=False)`` at the fixed batch ``max_rows`` (one graph per
    token count); any compile failure falls back to eager once, with a warning.
    """

    adopts = False
    drafts_itself = False
    rebuilds = False  # its slots are allocated once: dropping a row frees nothing
    hands_out_rows = False

    def __init__(
        self,
        model,
        name: str,
        *,
        max_rows: int = 8,
        max_len: int = 4096,
        compile_decode: bool = False,
        compile_mode: str = "reduce-overhead",
        compile_tokens: int = 16,
        vision: bool | None = None,
    ):
        if max_rows < 1 or max_len < 2:
            raise ValueError(f"{name}: max_rows must be >= 1 and max_len >= 2 (got {max_rows}, {max_len})")
        self.model, self.name = model, name
        self.vision = hasattr(model.config, "vision_config") if vision is None else vision
        self.device: torch.device = model_device(model)
        self.max_rows, self.max_len = max_rows, max_len
        self.compile_decode, self.compile_mode, self.compile_tokens = compile_decode, compile_mode, compile_tokens
        self.tokens_forwarded: dict[int, int] = {}
        self.forward_calls: dict[int, int] = {}
        self.compactions = 0  # how many times the columns were compacted
        self.batch_forwards = 0  # model forwards this engine ran
        text = model.config.get_text_config(decoder=True)
        types = getattr(text, "layer_types", None) or ()
        if any(t != "full_attention" for t in types):
            raise NotImplementedError(f"{name}: StaticBatchEngine needs full-attention layers only (got {set(types)})")
        self._n_layers = text.num_hidden_layers
        self._kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self._head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self._dtype = model.get_input_embeddings().weight.dtype
        self._compiled = None
        self.cache = Cache(layers=[SlotLayer(max_len) for _ in range(self._n_layers)])
        for layer, device in zip(self.cache.layers, layer_devices(model)):
            # zeros [max_rows, H, max_len, D] on the layer's device (a device_map spreads them), static addresses
            empty = torch.empty(max_rows, self._kv_heads, 0, self._head_dim, dtype=self._dtype, device=device)
            layer.lazy_initialization(empty, empty)
        self._rows: list[int] = []  # join order
        self._slots: dict[int, list[int]] = {}  # row -> its live columns, ascending (logical order)
        self._delta: dict[int, int] = {}  # row -> rope delta (VL rows; 0 for text)
        self._slot: dict[int, int] = {}  # row -> its slot (batch index)
        self._free = list(range(max_rows))  # free slots, the lowest taken first (eager forwards run fewer slots)
        self._live = torch.zeros(max_rows, max_len, dtype=torch.bool, device=self.device)  # [slots, columns]
        self._cursor = 0  # the next write column, shared by all slots
        self._layers_at: int | None = 0  # the cursor the layers hold (None: unknown, set before the next forward)

    # ------------------------------------------------------------------ rows
    @property
    def _width(self) -> int:
        return self._cursor

    def _index(self, row: int) -> int:
        try:
            return self._slot[row]
        except KeyError:
            raise KeyError(f"{self.name}: no live row {row}") from None

    @torch.no_grad()
    def join(self, row: int, engine) -> None:
        """Add ``row`` with the context of a prefilled single-row ``engine`` (copied into a free slot, the engine
        untouched). Its ``L`` keys go right before the cursor (no holes in the row), or to columns ``0 .. L-1``
        with the cursor moved to ``L`` when it is shorter."""
        if row in self._slots:
            raise ValueError(f"{self.name}: row {row} is already live")
        if not self._free:
            raise StaticRowsFullError(f"{self.name}: all {self.max_rows} static slots are taken; raise max_rows")
        length = int(engine.length)
        if length >= self.max_len:
            raise StaticRowsFullError(f"{self.name}: a context of {length} tokens does not fit max_len={self.max_len}; raise max_len")
        src = engine.cache
        if length and (src is None or src.layers[0].keys.shape[0] != 1):
            raise ValueError(f"{self.name}: join needs a single-row engine with a filled cache")
        self._free.sort()
        b = self._free.pop(0)
        start = self._cursor - length if length <= self._cursor else 0
        for i, layer in enumerate(self.cache.layers):
            if length:
                k, v = _layer_kv(src, i, length)
                layer.keys[b, :, start : start + length] = k[0].to(layer.keys.device, self._dtype)
                layer.values[b, :, start : start + length] = v[0].to(layer.values.device, self._dtype)
        self._live[b] = False
        self._live[b, start : start + length] = True
        self._cursor = max(self._cursor, length)
        self._slot[row] = b
        self._book(row, engine, range(start, start + length))

    @torch.no_grad()
    def leave(self, row: int) -> None:
        """Free ``row``'s slot (nothing is copied; its columns become holes); its counters stay."""
        b = self._index(row)
        self._rows.remove(row)
        del self._slots[row], self._delta[row], self._slot[row]
        self._free.append(b)
        self._live[b] = False
        self._trim_tail()

    def _trim_tail(self) -> None:
        """Move the cursor back over trailing columns no row holds (nothing is copied)."""
        self._cursor = self._end()

    # ------------------------------------------------------------------ compaction
    def maybe_compact(self) -> bool:
        """Static storage compacts only when it must (see :meth:`extend`): holes cost no memory and, at the fixed
        shapes of a compiled forward, no attention work."""
        return False

    @torch.no_grad()
    def compact(self) -> None:
        """Gather each row's live columns left-aligned, in order, in place; the cursor becomes the longest row."""
        if not self._rows:
            return
        hi = max(self._slot.values()) + 1
        lengths = torch.zeros(hi, dtype=torch.long)
        T = max(len(s) for s in self._slots.values())
        index = torch.zeros(hi, T, dtype=torch.long)
        for r, b in self._slot.items():
            n = len(self._slots[r])
            lengths[b] = n
            if n:
                index[b, :n] = torch.tensor(self._slots[r])
        if T:
            for layer in self.cache.layers:
                H, D = layer.keys.shape[1], layer.keys.shape[3]
                idx = index.to(layer.keys.device).view(hi, 1, T, 1).expand(hi, H, T, D)
                # gather first (sources and destinations overlap), then copy back into the same buffers
                layer.keys[:hi, :, :T].copy_(layer.keys[:hi].gather(2, idx))
                layer.values[:hi, :, :T].copy_(layer.values[:hi].gather(2, idx))
        self._live.zero_()
        self._live[:hi, :T] = torch.arange(T).unsqueeze(0).to(self.device) < lengths.to(self.device).unsqueeze(1)
        for r in self._rows:
            self._slots[r] = list(range(len(self._slots[r])))
        self._cursor = T
        self.compactions += 1

    # ------------------------------------------------------------------ decoding
    def _set_layers(self, cursor: int, cols: int | None) -> None:
        """The cursor and the attention window of every layer before a forward (the cursor only when it moved)."""
        for layer in self.cache.layers:
            layer.cols = cols
            if self._layers_at != cursor:
                layer.cumulative_length.fill_(cursor)
        self._layers_at = cursor

    def _run(self, compiled: bool, **kwargs):
        if not compiled:
            return self.model(**kwargs)
        if self._compiled is None:
            import torch._dynamo.config as dynamo_config

            # one graph per (batch, tokens) shape of each model: the drafter alone has 4 token counts (1, 2, K+1, K+2)
            # per batch size, so dynamo's default of 8 recompiles would silently fall back to eager at a second size
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
            self._compiled = torch.compile(self.model, mode=self.compile_mode, dynamic=False)
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        if mark is not None:  # each call is a new inference step: earlier graph outputs were copied already
            mark()
        return self._compiled(**kwargs)

    @torch.no_grad()
    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Append ``ids[row]`` ``[n_r]`` (``n_r >= 1``) to each given row in one forward; return ``{row: logits
        [n_r, V]}``. Rows not given keep their context (their new columns are holes)."""
        if not ids:
            return {}
        for row, t in ids.items():
            self._index(row)
            if t.numel() < 1:
                raise ValueError(f"{self.name}: row {row}: extend needs at least one token")
        n = {r: int(t.numel()) for r, t in ids.items()}
        n_max = max(n.values())
        if self._cursor + n_max > self.max_len:
            self.compact()
        cursor = self._cursor
        if cursor + n_max > self.max_len:
            raise StaticRowsFullError(
                f"{self.name}: {cursor} + {n_max} tokens do not fit max_len={self.max_len} after compaction; raise max_len"
            )
        compiled = self.compile_decode and n_max <= self.compile_tokens
        # a compiled forward runs every slot over every column (fixed shapes); eager the slots and columns in use
        B = self.max_rows if compiled else max(self._slot.values()) + 1
        cols = None if compiled else cursor + n_max
        by_slot = {self._slot[r]: r for r in self._rows}
        none = torch.zeros(0, dtype=torch.long, device=self.device)
        # ids stay where they are (drafts on the GPU: no host sync); pads are token 0
        input_ids = torch.nn.utils.rnn.pad_sequence(
            [ids[by_slot[b]].reshape(-1).to(self.device, torch.long) if by_slot.get(b) in ids else none for b in range(B)],
            batch_first=True,
        )
        starts = torch.tensor([len(self._slots[by_slot[b]]) + self._delta[by_slot[b]] if b in by_slot else 0 for b in range(B)])
        positions = (starts.unsqueeze(1) + torch.arange(n_max)).to(self.device)
        if self.vision:
            positions = positions.unsqueeze(0).expand(3, B, n_max)
        # the new columns are visible to every slot (causality over columns keeps a token from seeing the pads after
        # it, and a query always sees itself: never a fully masked row, whose NaN would be cached)
        mask = self._live[:B, : (self.max_len if compiled else cols)].clone()
        mask[:, cursor : cursor + n_max] = True
        kwargs = dict(input_ids=input_ids, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True, logits_to_keep=0)
        self._set_layers(cursor, cols)
        try:
            out = self._run(compiled, **kwargs)
        except Exception as exc:  # noqa: BLE001 - compile problems must not break decoding
            self._layers_at = None  # the failed forward may have moved some layers' cursors
            if not compiled:
                raise
            warnings.warn(f"{self.name}: compiled decode failed ({type(exc).__name__}: {exc}); using eager", stacklevel=2)
            self.compile_decode, self._compiled = False, None
            return self.extend(ids)
        finally:
            for layer in self.cache.layers:
                layer.cols = None
        # a CUDA graph's outputs live in its memory pool, overwritten by the next replay: keep a copy
        logits = out.logits.clone() if compiled else out.logits
        self._layers_at = cursor + n_max
        self.batch_forwards += 1
        new_live = torch.zeros(B, n_max, dtype=torch.bool)
        result: dict[int, torch.Tensor] = {}
        for r in ids:
            b = self._slot[r]
            new_live[b, : n[r]] = True
            self._slots[r].extend(range(cursor, cursor + n[r]))
            self.tokens_forwarded[r] += n[r]
            self.forward_calls[r] += 1
            result[r] = logits[b, : n[r]]
        self._live[:B, cursor : cursor + n_max] = new_live.to(self.device)
        self._cursor = cursor + n_max
        self._trim_tail()
        return result

    # ------------------------------------------------------------------ memory
    def slot_bytes(self) -> int:
        """Bytes of one column of one row over all layers (keys and values)."""
        return self._n_layers * 2 * self._kv_heads * self._head_dim * torch.empty((), dtype=self._dtype).element_size()

    @property
    def engine_calls(self) -> int:
        """Model calls this engine made (one batched forward each), the unit of per-step cost in ``stats``."""
        return self.batch_forwards

    def kv_bound(self, lengths: list[int], step_tokens: int) -> int:
        """The buffers are allocated once, whatever the rows: ``max_rows * max_len`` slots (refused beyond that)."""
        return self.max_rows * self.max_len * self.slot_bytes()

    def step_bytes(self, grow: int, join: int | None = None) -> int:
        """The preallocated buffers, whatever the rows do."""
        return self.kv_bytes()

    @property
    def peak_kv_bytes(self) -> int:
        return self.kv_bytes()

    @peak_kv_bytes.setter
    def peak_kv_bytes(self, value: int) -> None:  # allocated once: nothing to reset
        pass

    def kv_bytes(self, row: int | None = None) -> int:
        """KV memory held by ``row``'s live columns; ``None``: the whole preallocated buffers."""
        if row is not None:
            return self.length(row) * self.slot_bytes()
        return self.max_rows * self.max_len * self.slot_bytes()

    def view(self, row: int) -> RowView:
        self._index(row)
        return RowView(self, row)


@dataclass(frozen=True)
class StaticBatchEngines:
    """A :data:`~asymspec_mm.core.decoder.BatchEngineFactory` of :class:`StaticBatchEngine` rows:
    ``factory(model, stream_name) -> engine``, for ``pipe.scheduler(batch_engines=...)`` and
    ``BatchDecoder(..., engines=...)``."""

    max_rows: int = 8
    max_len: int = 4096
    compile_decode: bool = False
    compile_mode: str = "reduce-overhead"
    compile_tokens: int = 16

    def __call__(self, model, name: str) -> StaticBatchEngine:
        return StaticBatchEngine(
            model,
            name,
            max_rows=self.max_rows,
            max_len=self.max_len,
            compile_decode=self.compile_decode,
            compile_mode=self.compile_mode,
            compile_tokens=self.compile_tokens,
        )


def static_batch_engines(
    max_rows: int = 8, max_len: int = 4096, compile_decode: bool = False, compile_mode: str = "reduce-overhead", compile_tokens: int = 16
) -> StaticBatchEngines:
    """The static-slot factory: ``pipe.scheduler(batch_engines=static_batch_engines(max_rows=32, max_len=2048,
    compile_decode=True))``. ``max_rows`` must cover the decoder's batch size, ``max_len`` a row's prompt plus its
    token budget and a step's speculative tokens (and the holes of the rows beside it, which compaction reclaims)."""
    return StaticBatchEngines(max_rows, max_len, compile_decode, compile_mode, compile_tokens)
