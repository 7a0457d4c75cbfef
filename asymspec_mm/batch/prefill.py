"""Batched, chunked prefill: the prompts of arriving rows, several per forward, a token budget per forward.

A request arrives set up but not prefilled (its compressed view, prompts and vision features ready:
``pipe.prepare(..., prefill=False)``). Each of its streams' prompt (``prompt[:-1]``; the last token is the row's
first pending token) becomes a :class:`StreamPrompt`. Every call of :meth:`ChunkedPrefill.step` runs ONE forward
per stream over pieces of the waiting prompts, first come first served, at most ``chunk_tokens`` tokens in all, on
a staging :class:`~asymspec_mm.batch.engines.BatchEngine` of that stream (so the rows decoding elsewhere get no hole
slots from it); a long prompt is split across calls, as vLLM's chunked prefill splits it across steps. Between two
calls the decoder steps its live rows, so admission costs them one bounded forward per stream, never a whole
set-up. A row whose prompts are all in leaves the staging engines as :class:`~asymspec_mm.batch.engines.RowContext`
objects, which the decoder's row storage joins.

The full view keeps what single-row prefill does: the image pads take the cached vision embeddings, positions are
the prompt's 3D M-RoPE positions, and the prefix store's KV of the prompt through the image is reused on a hit
(the row starts from it) and stored on a miss (a piece ends exactly there, so the snapshot is that prefix).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from vision_cache.features import VisionFeatures
from vision_cache.positions import mrope_positions

from ..engines import prefix_split, prefix_store_key
from .engines import BatchEngine, PrefillChunk, RowContext

#: Tokens per staging forward (each stream) unless a scheduler says otherwise.
DEFAULT_CHUNK_TOKENS = 512


@dataclass
class StreamPrompt:
    """One stream's prompt to prefill, and how far it got.

    ids: ``[L]``; positions: ``[3, L]`` (the full view's M-RoPE positions; ``None`` on a text stream); image_embeds
    ``[P, hidden]`` / deepstack (``[P, hidden]`` per layer): the embeddings of the prompt's ``P`` image pads, in order;
    pads_before: ``[L + 1]``, image pads among ``ids[:i]``; split / key: the prefix store's share of the prompt and
    its key (split 0: no reuse). ``done``: tokens prefilled so far.
    """

    ids: torch.Tensor
    positions: torch.Tensor | None = None
    rope_delta: int = 0
    image_embeds: torch.Tensor | None = None
    deepstack: tuple[torch.Tensor, ...] = ()
    pads_before: torch.Tensor | None = None
    split: int = 0
    key: str = ""
    done: int = 0

    @property
    def left(self) -> int:
        return int(self.ids.numel()) - self.done

    def piece(self, n: int) -> PrefillChunk:
        """The next ``n`` tokens as a :class:`PrefillChunk` (with their positions and image embeddings)."""
        a, b = self.done, self.done + n
        if self.positions is None:
            return PrefillChunk(self.ids[a:b])
        p, q = int(self.pads_before[a]), int(self.pads_before[b])
        deep = tuple(layer[p:q] for layer in self.deepstack)
        return PrefillChunk(self.ids[a:b], self.positions[:, a:b], self.image_embeds[p:q], deep)


def text_prompt(ids: torch.Tensor) -> StreamPrompt:
    """A text stream's prompt: ``ids`` ``[L]``."""
    return StreamPrompt(ids.reshape(-1))


def image_prompt(ids: torch.Tensor, mm_token_type_ids: torch.Tensor, features: VisionFeatures, merge: int, *, reuse: bool) -> StreamPrompt:
    """The full view's prompt ``ids`` ``[L]`` about ``features`` (``mm_token_type_ids`` ``[>= L]``, 1 at image pads;
    ``merge``: the vision config's spatial merge size); ``reuse``: whether the prefix store serves it."""
    ids = ids.reshape(-1)
    types = mm_token_type_ids.reshape(-1)[: ids.numel()]
    positions, delta = mrope_positions(types, features.image_grid_thw, merge)
    pads_before = torch.cat([torch.zeros(1, dtype=torch.long), (types == 1).long().cumsum(0)])
    split = prefix_split(types, ids.numel()) if reuse else 0
    return StreamPrompt(
        ids,
        positions,
        delta,
        torch.cat(features.embeds),
        tuple(torch.cat(layer) for layer in features.deepstack),
        pads_before,
        split,
        prefix_store_key(features.key, ids, split) if split else "",
    )


@dataclass
class _Arriving:
    prompts: dict[str, StreamPrompt]
    prefix_hit: bool = False
    forwards: int = 0
    extra: Any = None  # the caller's (the decoder keeps the row's session here)
    streams: dict[str, Any] = field(default_factory=dict)  # streams prefilled elsewhere (joined as they are)


class ChunkedPrefill:
    """Prefills arriving rows of ``models`` (stream name -> model) in batched, chunked forwards (module docstring).

    ``lock`` is held around each forward (the models are shared); ``prefix_store`` (a
    :class:`vision_cache.store.FeatureStore`) serves the ``drafter_full`` stream's prompts through the image.
    """

    def __init__(self, models: dict[str, Any], *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, prefix_store=None, lock=None):
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens!r} must be an integer >= 1")
        self.chunk_tokens = chunk_tokens
        self.prefix_store = prefix_store
        self.lock = lock if lock is not None else nullcontext()
        self._models = models
        self._staging: dict[str, BatchEngine] = {}
        self.rows: dict[int, _Arriving] = {}
        self.forwards = 0  # staging forwards run
        self.tokens = 0  # prompt tokens prefilled

    def _engine(self, name: str) -> BatchEngine:
        if name not in self._staging:
            # compacted before every forward that would leave holes: a staging row lives a few forwards, and its KV
            # is gathered on the way out anyway, so keeping the time dimension at the longest prompt is cheap
            self._staging[name] = BatchEngine(self._models[name], f"{name} (prefill)", compact_at=0.0)
        return self._staging[name]

    def add(self, rid: int, prompts: dict[str, StreamPrompt], *, streams: dict[str, Any] | None = None, extra: Any = None) -> None:
        """Queue row ``rid``: ``prompts`` to prefill here, ``streams`` already prefilled (joined later as they are)."""
        if rid in self.rows:
            raise ValueError(f"row {rid} is already being prefilled")
        row = _Arriving(prompts, extra=extra, streams=dict(streams or {}))
        joined = []
        try:
            for name, prompt in prompts.items():
                start = RowContext(None, 0, prompt.rope_delta)
                if prompt.split and self.prefix_store is not None:
                    snapshot = self.prefix_store.get(prompt.key)
                    if snapshot is not None:
                        start = RowContext(snapshot, prompt.split, prompt.rope_delta)
                        prompt.done, row.prefix_hit = prompt.split, True
                self._engine(name).join(rid, start)
                joined.append(name)
        except BaseException:
            for name in joined:
                self._staging[name].leave(rid)
            raise
        self.rows[rid] = row

    def __len__(self) -> int:
        return len(self.rows)

    def extra(self, rid: int) -> Any:
        return self.rows[rid].extra

    def step(self) -> list[int]:
        """One forward per stream with waiting prompt tokens (at most ``chunk_tokens`` each); returns the rows whose
        prompts are now all in (take each with :meth:`take`)."""
        for name in {n for row in self.rows.values() for n, p in row.prompts.items() if p.left}:
            self._forward(name)
        return [rid for rid, row in self.rows.items() if not any(p.left for p in row.prompts.values())]

    def _forward(self, name: str) -> None:
        budget, pieces, snapshots = self.chunk_tokens, {}, []
        for rid, row in self.rows.items():  # first come, first served
            prompt = row.prompts.get(name)
            if prompt is None or not prompt.left:
                continue
            if budget <= 0:
                break
            n = min(budget, prompt.left)
            if self.prefix_store is not None and prompt.done < prompt.split:
                n = min(n, prompt.split - prompt.done)  # a piece ends where the reusable prefix does
                if prompt.done + n == prompt.split:
                    snapshots.append((rid, prompt))
            pieces[rid] = (prompt, n)
            budget -= n
        engine = self._engine(name)
        with self.lock:
            engine.prefill({rid: prompt.piece(n) for rid, (prompt, n) in pieces.items()})
        self.forwards += 1
        for rid, (prompt, n) in pieces.items():
            prompt.done += n
            self.tokens += n
            self.rows[rid].forwards += 1
        for rid, prompt in snapshots:
            self.prefix_store.put(prompt.key, engine.detach(rid).cache)

    def take(self, rid: int) -> tuple[dict[str, Any], bool, Any]:
        """Row ``rid`` leaves the prefill: ``({stream: RowContext or its prefilled stream}, prefix hit, extra)``."""
        row = self.rows.pop(rid)
        out = dict(row.streams)
        for name in row.prompts:
            out[name] = self._staging[name].detach(rid)
            self._staging[name].leave(rid)
        return out, row.prefix_hit, row.extra

    def remove(self, rid: int) -> None:
        """Drop row ``rid`` before its prompts are in (a cancelled request, a failed forward)."""
        row = self.rows.pop(rid, None)
        if row is None:
            return
        for name in row.prompts:
            self._staging[name].leave(rid)

    def kv_bound(self, prompt_lengths: dict[str, list[int]]) -> int:
        """The most KV bytes the staging engines hold at once for prompts of ``prompt_lengths`` (per stream), pieces
        of ``chunk_tokens``, plus the single-row copy a finished row makes on its way out (:meth:`take`)."""
        total = 0
        for name, lengths in prompt_lengths.items():
            if lengths:
                engine = self._engine(name)
                piece = min(self.chunk_tokens, max(lengths))  # the most columns one staging forward appends
                total += engine.kv_bound(lengths, piece) + max(lengths) * engine.slot_bytes()
        return total

    def kv_bytes(self) -> int:
        """KV memory the staging engines hold now (holes included)."""
        return sum(e.kv_bytes() for e in self._staging.values())
