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

A decode storage that takes prompt pieces in its own forwards (``takes_chunks``: the paged default) holds an
arriving row from the turn it is admitted: its stream starts there (from its stored prefix), :meth:`ChunkedPrefill.stage`
hands that stream's pieces out as *rides* that the decode step's forwards carry (``extend(ids, prompts=...)``;
:meth:`~asymspec_mm.decode.rows.RowDecoder.step`), :meth:`ChunkedPrefill.rode` counts them once the step ran, and
the row decodes in place: no staging forward, nothing detached or copied at join. Staging storages stay for the
storages that do not (the padded ``BatchEngine``, static slots).

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

from ..base.checks import is_int
from ..decode.row_engines import forget_row
from ..engines.pieces import PrefillChunk, StreamPrompt, image_prompt, remember, start_context, text_prompt
from ..engines.prefix_kv import PrefixKV
from ..engines.rows import BatchEngine
from .policy import prompt_chunks

__all__ = ["DEFAULT_CHUNK_TOKENS", "ChunkedPrefill", "Rides", "StreamPrompt", "image_prompt", "text_prompt"]

#: Tokens per staging forward (each stream) unless a scheduler says otherwise.
DEFAULT_CHUNK_TOKENS = 512

#: Prompt pieces that ride in a decode step's forwards: storage -> ``{row: PrefillChunk}``.
Rides = dict[str, dict[int, PrefillChunk]]


@dataclass
class _Arriving:
    prompts: dict[str, StreamPrompt]
    forwards: int = 0
    record: Any = None  # the caller's (the decoder keeps its record of the row here)
    streams: dict[str, Any] = field(default_factory=dict)  # streams prefilled elsewhere (joined as they are)
    held: frozenset[str] = frozenset()  # streams whose decode storage holds the row (prefilled in the steps)


class ChunkedPrefill:
    """Prefills arriving rows of ``models`` (stream name -> model) in batched, chunked forwards (module docstring).

    ``lock`` is held around each forward (the models are shared); ``prefix_kv`` (a
    :class:`~asymspec_mm.engines.prefix_kv.PrefixKV`) serves every stream's prompt prefix and keeps its prompt;
    ``staging(model, name)`` builds each stream's staging storage (default: a compacting
    :class:`~asymspec_mm.engines.rows.BatchEngine`; a paged factory's puts it on the decode storage's pool);
    ``decode``: the decode storages by name (read when a row is added): a row's stream on one that ``takes_chunks``
    is prefilled there, its pieces riding in the decode steps' forwards (module docstring).
    """

    def __init__(
        self,
        models: dict[str, Any],
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        prefix_kv: PrefixKV | None = None,
        lock=None,
        staging: Callable[[Any, str], Any] | None = None,
        decode: dict[str, Any] | None = None,
    ):
        if not is_int(chunk_tokens, minimum=1):
            raise ValueError(f"chunk_tokens={chunk_tokens!r} must be an integer >= 1")
        self.chunk_tokens = chunk_tokens
        self.prefix_kv = prefix_kv
        self.lock = lock if lock is not None else nullcontext()
        self._models = models
        self._make_staging = staging
        self._decode = decode if decode is not None else {}
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
        held = frozenset(name for name in prompts if self.takes_chunks(name))
        row = _Arriving(prompts, record=record, streams=dict(streams or {}), held=held)
        joined = []
        try:
            for name, prompt in prompts.items():
                self._holder(row, name).join(rid, start_context(self.prefix_kv, self._models[name], prompt))
                joined.append(name)
        except BaseException:
            for name in joined:
                self._holder(row, name).leave(rid)
            raise
        self.rows[rid] = row

    def takes_chunks(self, name: str) -> bool:
        """Whether stream storage ``name``'s arriving rows are prefilled in the decode storage's own forwards."""
        return bool(getattr(self._decode.get(name), "takes_chunks", False))

    def _holder(self, row: _Arriving, name: str) -> Any:
        """The storage that holds ``row``'s stream ``name`` while it arrives: its decode storage, or a staging one."""
        return self._decode[name] if name in row.held else self._engine(name)

    def held(self, rid: int) -> frozenset[str]:
        """Row ``rid``'s streams held by their decode storages (nothing to join: the row is theirs already)."""
        return self.rows[rid].held

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
        are :func:`~.policy.prompt_chunks`'; a decode storage's pieces in a forward of their own); returns the rows
        whose prompts are now all in (take each with :meth:`take`)."""
        rides = self.stage(budget)
        with self.lock:
            for name, pieces in rides.items():
                self._decode[name].extend({}, prompts=pieces)
        self.rode(rides)
        return self.ready()

    def stage(self, budget: int | None = None) -> Rides:
        """The turn's pieces (as :meth:`step` cuts them): the staging storages' run now, one forward each; the decode
        storages' are returned, to ride in the decode step's forwards (then :meth:`rode`)."""
        rides: Rides = {}
        for name, pieces in prompt_chunks(self.left(), budget, self.chunk_tokens).items():
            if self.takes_chunks(name):
                rides[name] = {rid: self.rows[rid].prompts[name].piece(n) for rid, n in pieces}
            else:
                self._forward(name, pieces)
        return rides

    def rode(self, rides: Rides) -> None:
        """The pieces of ``rides`` are in their storages (the step's forwards ran): each prompt goes on past them."""
        for name, pieces in rides.items():
            for rid, chunk in pieces.items():
                row = self.rows.get(rid)
                if row is not None:
                    row.prompts[name].done += int(chunk.ids.numel())
                    row.forwards += 1
                    self.tokens += int(chunk.ids.numel())

    def ready(self) -> list[int]:
        """The rows whose prompts are all in, first come first."""
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
            if name in row.held:  # the row stays where it is; its prompt's KV not stored yet goes to the store
                out[name] = None
                _remember_row(self.prefix_kv, self._models[name], prompt.key, self._decode[name], rid)
                continue
            out[name] = context = self._staging[name].detach(rid)  # carries the counts on
            self._staging[name].leave(rid)
            forget_row(self._staging[name], rid)
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
            self._holder(row, name).leave(rid)
            if name not in row.held:  # a decode storage keeps a preempted row's counts (its caller forgets them)
                forget_row(self._staging[name], rid)

    def kv_bound(self, prompt_lengths: dict[str, list[int]]) -> int:
        """The most KV bytes the staging engines hold at once for prompts of ``prompt_lengths`` (per stream), pieces
        of ``chunk_tokens``, plus the single-row copy a finished row makes on its way out (:meth:`take`) where the
        staging storage's ``detach`` copies."""
        total = 0
        for name, lengths in prompt_lengths.items():
            if lengths and not self.takes_chunks(name):  # a decode storage's bound counts its own rows
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


def _remember_row(prefix_kv: PrefixKV | None, model: Any, key: Any, storage: Any, rid: int) -> None:
    """Store row ``rid``'s prompt (its context on ``storage``, under ``key``) for later requests: only the positions
    not stored yet are gathered (``row_kv``), as single-row prefill's :func:`~asymspec_mm.engines.pieces.remember`
    stores them."""
    if prefix_kv is None or key is None:
        return
    length = storage.length(rid)
    space = prefix_kv.space(model)
    start = prefix_kv.stored(space, key[:length])
    if 0 < length and start < length:
        prefix_kv.insert(space, key[:length], storage.row_kv(rid, start, length), offset=start)
