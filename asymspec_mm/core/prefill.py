"""Batched, chunked prefill: the prompts of arriving rows, several per forward, a token budget per forward.

A request arrives set up but not prefilled (its compressed view, prompts and vision features ready:
``pipe.prepare(..., prefill=False)``). Each of its streams' prompt (``prompt[:-1]``; the last token is the row's
first pending token) becomes a :class:`StreamPrompt`. Every call of :meth:`ChunkedPrefill.step` runs ONE forward
per stream over pieces of the waiting prompts, first come first served, at most ``chunk_tokens`` tokens in all, on
a staging :class:`~asymspec_mm.engines.rows.BatchEngine` of that stream (so the rows decoding elsewhere get no hole
slots from it); a long prompt is split across calls, as vLLM's chunked prefill splits it across steps. Between two
calls the decoder steps its live rows, so admission costs them one bounded forward per stream, never a whole
set-up. A row whose prompts are all in leaves the staging engines as :class:`~asymspec_mm.engines.rows.RowContext`
objects, which the decoder's row storage joins.

The full view keeps what single-row prefill does: the image pads take the cached vision embeddings and positions
are the prompt's 3D M-RoPE positions. Every stream starts from the longest prefix of its prompt stored for reuse
(:mod:`asymspec_mm.engines.prefix_kv`: an earlier turn of the conversation, another question about the image) and
stores its whole prompt when it is in, as single-row prefill does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..engines.pieces import StreamPrompt, image_prompt, remember, start_context, text_prompt
from ..engines.prefix_kv import PrefixKV
from ..engines.rows import BatchEngine
from .policy import prompt_chunks

__all__ = ["DEFAULT_CHUNK_TOKENS", "ChunkedPrefill", "StreamPrompt", "image_prompt", "text_prompt"]

#: Tokens per staging forward (each stream) unless a scheduler says otherwise.
DEFAULT_CHUNK_TOKENS = 512


@dataclass
class _Arriving:
    prompts: dict[str, StreamPrompt]
    forwards: int = 0
    record: Any = None  # the caller's (the decoder keeps its record of the row here)
    streams: dict[str, Any] = field(default_factory=dict)  # streams prefilled elsewhere (joined as they are)


class ChunkedPrefill:
    """Prefills arriving rows of ``models`` (stream name -> model) in batched, chunked forwards (module docstring).

    ``lock`` is held around each forward (the models are shared); ``prefix_kv`` (a
    :class:`~asymspec_mm.engines.prefix_kv.PrefixKV`) serves every stream's prompt prefix and keeps its prompt;
    ``staging(model, name)`` builds each stream's staging storage (default: a compacting
    :class:`~asymspec_mm.engines.rows.BatchEngine`; a paged factory's puts it on the decode storage's pool).
    """

    def __init__(
        self,
        models: dict[str, Any],
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        prefix_kv: PrefixKV | None = None,
        lock=None,
        staging: Callable[[Any, str], Any] | None = None,
    ):
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens!r} must be an integer >= 1")
        self.chunk_tokens = chunk_tokens
        self.prefix_kv = prefix_kv
        self.lock = lock if lock is not None else nullcontext()
        self._models = models
        self._make_staging = staging
        self._staging: dict[str, BatchEngine] = {}
        self.rows: dict[int, _Arriving] = {}
        self.forwards = 0  # staging forwards run
        self.tokens = 0  # prompt tokens prefilled

    def _engine(self, name: str) -> BatchEngine:
        if name not in self._staging and self._make_staging is not None:
            self._staging[name] = self._make_staging(self._models[name], f"{name} (prefill)")
        if name not in self._staging:
            # compacted before every forward that would leave holes: a staging row lives a few forwards, and its KV
            # is gathered on the way out anyway, so keeping the time dimension at the longest prompt is cheap
            self._staging[name] = BatchEngine(self._models[name], f"{name} (prefill)", compact_at=0.0)
        return self._staging[name]

    def add(self, rid: int, prompts: dict[str, StreamPrompt], *, streams: dict[str, Any] | None = None, record: Any = None) -> None:
        """Queue row ``rid``: ``prompts`` to prefill here, ``streams`` already prefilled (joined later as they are);
        ``record``: the caller's, handed back by :meth:`record` and :meth:`take`."""
        if rid in self.rows:
            raise ValueError(f"row {rid} is already being prefilled")
        row = _Arriving(prompts, record=record, streams=dict(streams or {}))
        joined = []
        try:
            for name, prompt in prompts.items():
                self._engine(name).join(rid, start_context(self.prefix_kv, self._models[name], prompt))
                joined.append(name)
        except BaseException:
            for name in joined:
                self._staging[name].leave(rid)
            raise
        self.rows[rid] = row

    def __len__(self) -> int:
        return len(self.rows)

    def record(self, rid: int) -> Any:
        """The caller's record of row ``rid`` (given to :meth:`add`)."""
        return self.rows[rid].record

    def left(self) -> list[tuple[int, dict[str, int]]]:
        """Each row's prompt tokens left per stream, first come first (what :func:`~.policy.prompt_chunks` reads)."""
        return [(rid, {name: p.left for name, p in row.prompts.items()}) for rid, row in self.rows.items()]

    def step(self, budget: int | None = None) -> list[int]:
        """One forward per stream with waiting prompt tokens: at most ``chunk_tokens`` each, or ``budget`` tokens
        shared by all of them (a turn's token budget less its decode tokens, at least one token a stream; the pieces
        are :func:`~.policy.prompt_chunks`'); returns the rows whose prompts are now all in (take each with
        :meth:`take`)."""
        for name, pieces in prompt_chunks(self.left(), budget, self.chunk_tokens).items():
            self._forward(name, pieces)
        return [rid for rid, row in self.rows.items() if not any(p.left for p in row.prompts.values())]

    def _forward(self, name: str, chunks: tuple[tuple[int, int], ...]) -> None:
        pieces = {rid: (self.rows[rid].prompts[name], n) for rid, n in chunks}
        engine = self._engine(name)
        with self.lock:
            engine.prefill({rid: prompt.piece(n) for rid, (prompt, n) in pieces.items()})
        self.forwards += 1
        for rid, (prompt, n) in pieces.items():
            prompt.done += n
            self.tokens += n
            self.rows[rid].forwards += 1

    def take(self, rid: int) -> tuple[dict[str, Any], Any]:
        """Row ``rid`` leaves the prefill (its prompts stored for reuse): ``({stream: RowContext or its prefilled
        stream}, record)``; each :class:`StreamPrompt` says how much of it was reused (``cached``)."""
        row = self.rows.pop(rid)
        out = dict(row.streams)
        for name, prompt in row.prompts.items():
            out[name] = context = self._staging[name].detach(rid)
            self._staging[name].leave(rid)
            remember(self.prefix_kv, self._models[name], prompt.key, context.cache, context.length)
        return out, row.record

    def prompts(self, rid: int) -> dict[str, StreamPrompt]:
        """Row ``rid``'s prompts being prefilled."""
        return self.rows[rid].prompts

    def remove(self, rid: int) -> None:
        """Drop row ``rid`` before its prompts are in (a cancelled request, a failed forward)."""
        row = self.rows.pop(rid, None)
        if row is None:
            return
        for name in row.prompts:
            self._staging[name].leave(rid)

    def kv_bound(self, prompt_lengths: dict[str, list[int]]) -> int:
        """The most KV bytes the staging engines hold at once for prompts of ``prompt_lengths`` (per stream), pieces
        of ``chunk_tokens``, plus the single-row copy a finished row makes on its way out (:meth:`take`) where the
        staging storage's ``detach`` copies."""
        total = 0
        for name, lengths in prompt_lengths.items():
            if lengths:
                engine = self._engine(name)
                piece = min(self.chunk_tokens, max(lengths))  # the most columns one staging forward appends
                total += engine.kv_bound(lengths, piece) + (max(lengths) * engine.slot_bytes() if engine.detach_copies else 0)
        return total

    def kv_bytes(self) -> int:
        """KV memory the staging engines hold now (holes included)."""
        return sum(e.kv_bytes() for e in self._staging.values())

    def reset_peaks(self) -> None:
        """Start a new measure of the staging engines' peak KV bytes."""
        for e in self._staging.values():
            e.peak_kv_bytes = e.kv_bytes()

    def peak(self) -> int:
        """The staging engines' peak KV bytes since :meth:`reset_peaks`, summed."""
        return sum(e.peak_kv_bytes for e in self._staging.values())
