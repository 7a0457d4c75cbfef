"""Batched streams on vLLM: many rows of one served model, one ``LLM.generate`` call per batched step.

:class:`VLLMBatchEngine` has :class:`~asymspec_mm.engines.rows.BatchEngine`'s interface (``rows``, ``length``,
``join``, ``leave``, ``extend``, ``truncate``, ``tokens_forwarded`` / ``forward_calls``, ``kv_bytes``,
``slot_bytes``, ``device``, ``name``) over one :class:`~asymspec_mm.engines.vllm.VLLMModel` (or a ``vllm.LLM``).
A row is the state of a prefilled :class:`~asymspec_mm.engines.vllm.VLLMEngine` / ``VLLMVLEngine`` (its tokens,
prefix-cache salt, row memory and, for the image stream, its prompt with the images): :meth:`join` copies
that state, so the row goes on exactly as the single engine would and the engine itself is left as it was.

:meth:`extend` submits one request per given row (that row's whole context, as the single engine does) in ONE
``LLM.generate`` call, and collects every row's captured logits in one RPC; vLLM schedules the rows together
(one forward per vLLM step for all of them) and its prefix cache, under each row's own salt, recomputes only
each row's last partial block and new tokens. :meth:`draft` lets vLLM decode the ``k`` greedy tokens of every
row itself (one request per row with ``max_tokens=k``, temperature 0) and returns the ``k`` logits rows of every
row: one call for the whole drafting phase instead of ``k``. ``generate_calls`` counts the ``LLM.generate``
calls (each followed by one ``collective_rpc``).
"""

from __future__ import annotations

import copy

import torch

from .rows import RowView
from .vllm import VLLMEngine, _in_process
from .vllm_calls import draft_many, extend_many


class VLLMBatchEngine:
    """Rows (independent streams) of one vLLM-served model, each batched step in one ``LLM.generate`` call."""

    def __init__(self, model, name: str, *, device: str | torch.device | None = None):
        self.llm = getattr(model, "llm", model)  # a VLLMModel, or the LLM itself
        self.name = name
        if device is None:
            device = "cpu"
            if _in_process(self.llm):
                device = getattr(self.llm.llm_engine.vllm_config.device_config, "device", None) or "cpu"
        self.device = torch.device(device)
        self.tokens_forwarded: dict[int, int] = {}
        self.forward_calls: dict[int, int] = {}
        self.tokens_computed: dict[int, int] = {}  # tokens vLLM actually ran for the row (see VLLMEngine)
        self.generate_calls = 0  # LLM.generate calls: one per extend / draft (two when a re-request was needed)
        self.draft_argmax_mismatches = 0  # drafted tokens (vLLM's greedy samples) that differ from our rows' argmax
        self._rows: dict[int, VLLMEngine] = {}  # row -> its stream state, in join order

    # ------------------------------------------------------------------ rows
    @property
    def rows(self) -> list[int]:
        """Live row ids, in join order."""
        return list(self._rows)

    def _row(self, row: int) -> VLLMEngine:
        try:
            return self._rows[row]
        except KeyError:
            raise KeyError(f"{self.name}: no live row {row}") from None

    def length(self, row: int) -> int:
        """Tokens of ``row``'s context (the image stream counts the expanded image pads)."""
        return self._row(row).length

    def join(self, row: int, engine) -> None:
        """Add ``row`` with the state of a prefilled ``VLLMEngine`` / ``VLLMVLEngine`` on this engine's LLM (copied:
        the engine itself is not changed, and vLLM's cached blocks under its salt serve the row)."""
        if row in self._rows:
            raise ValueError(f"{self.name}: row {row} is already live")
        engine = getattr(engine, "_engine", engine)  # a timing proxy around the stream
        if not isinstance(engine, VLLMEngine):
            raise TypeError(f"{self.name}: join needs a VLLMEngine / VLLMVLEngine, got {type(engine).__name__}")
        if engine.llm is not self.llm:
            raise ValueError(f"{self.name}: row {row}'s stream runs on another vllm.LLM than this batch")
        state = copy.copy(engine)  # its lists are replaced, never changed in place, so a shallow copy is a clean fork
        state.device = self.device
        self._rows[row] = state
        self._sync(row)

    def leave(self, row: int) -> None:
        """Free ``row`` (its counters stay); its blocks stay in vLLM's cache until vLLM evicts them."""
        self._row(row)
        self._sync(row)
        del self._rows[row]

    def truncate(self, row: int, length: int) -> None:
        """Keep the first ``length`` tokens of ``row`` (no other row changes; vLLM reuses the blocks that match)."""
        state = self._row(row)
        if not 0 <= length <= state.length:
            raise ValueError(f"{self.name}: row {row} has {state.length} tokens, cannot keep {length}")
        state.truncate(length)

    def _sync(self, row: int) -> None:
        state = self._rows[row]
        self.tokens_forwarded[row] = state.tokens_forwarded
        self.forward_calls[row] = state.forward_calls
        self.tokens_computed[row] = state.tokens_computed

    def _items(self, ids: dict[int, torch.Tensor]) -> list[tuple[VLLMEngine, list[int]]]:
        items = []
        for row, t in ids.items():
            new = [int(x) for x in t.reshape(-1).tolist()]
            if not new:
                raise ValueError(f"{self.name}: row {row}: extend needs at least one token")
            items.append((self._row(row), new))
        return items

    # ------------------------------------------------------------------ decoding
    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Append ``ids[row]`` ``[n_r]`` (``n_r >= 1``) to each given row in ONE ``LLM.generate`` call; return
        ``{row: logits [n_r, V]}`` (float32, on :attr:`device`). Rows not given are not submitted."""
        if not ids:
            return {}
        logits, calls = extend_many(self.llm, self._items(ids))
        self.generate_calls += calls
        for row in ids:
            self._sync(row)
        return dict(zip(ids, logits))

    #: the decoder lets this storage decode the K drafts itself (one call) instead of K extends
    drafts_itself = True
    adopts = False
    rebuilds = False  # its rows live in vLLM's own block pool
    hands_out_rows = False

    def draft(self, ids: dict[int, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward ``ids[row]`` (the pending tokens) and decode ``k`` greedy tokens per row, all rows in ONE
        ``LLM.generate`` call (:func:`~asymspec_mm.engines.vllm.draft_many`): drafts ``[R, k]`` and their logits
        ``[R, k, V]`` float32, rows in ``ids`` order. ``draft_argmax_mismatches`` counts drafts that differ from the
        argmax of their returned rows (a near-tie computed in two kernels; 0 in fp32)."""
        if not ids:
            v = int(self.llm.llm_engine.vllm_config.model_config.get_vocab_size())
            return torch.zeros(0, k, dtype=torch.long, device=self.device), torch.zeros(0, k, v, device=self.device)
        drafts, logits, mismatches = draft_many(self.llm, self._items(ids), k)
        self.generate_calls += 1
        self.draft_argmax_mismatches += mismatches
        for row in ids:
            self._sync(row)
        return drafts.to(self.device), logits.to(self.device)

    # ------------------------------------------------------------------ memory
    def slot_bytes(self) -> int:
        """KV bytes of one token of one row over all layers (keys and values, all tensor-parallel ranks)."""
        cfg = self.llm.llm_engine.vllm_config
        mc = cfg.model_config
        layers = mc.get_num_layers(cfg.parallel_config)
        return layers * 2 * mc.get_total_num_kv_heads() * mc.get_head_size() * torch.empty((), dtype=mc.dtype).element_size()

    def kv_bound(self, lengths: list[int], step_tokens: int) -> int:
        """The most KV bytes rows that reach ``lengths`` tokens take in vLLM's block pool: whole blocks per row (each
        step's speculative positions included). The pool itself is allocated up front by vLLM."""
        block = self._block_size()
        return sum(-(-(n + step_tokens) // block) * block for n in lengths) * self.slot_bytes()

    def _block_size(self) -> int:
        return int(self.llm.llm_engine.vllm_config.cache_config.block_size)

    @property
    def engine_calls(self) -> int:
        """``LLM.generate`` calls this engine made, the unit of per-step cost in ``stats``."""
        return self.generate_calls

    def step_bytes(self, grow: int, join: int | None = None) -> int:
        """:meth:`kv_bound` of the rows once they (and a row of ``join`` tokens) have grown by ``grow`` tokens."""
        lengths = [self.length(r) for r in self._rows] + ([join] if join is not None else [])
        return self.kv_bound(lengths, grow)

    @property
    def peak_kv_bytes(self) -> int:
        return self.kv_bytes()

    @peak_kv_bytes.setter
    def peak_kv_bytes(self, value: int) -> None:  # vLLM's pool is its own: the rows' blocks are read when asked
        pass

    def kv_bytes(self, row: int | None = None) -> int:
        """KV bytes ``row``'s context takes (``None``: all live rows). vLLM holds them in its own block pool,
        allocated up front (``gpu_memory_utilization``), in whole blocks, shared with its prefix cache."""
        rows = self._rows if row is None else [row]
        return sum(self.length(r) for r in rows) * self.slot_bytes()

    def view(self, row: int) -> RowView:
        return RowView(self, row)
