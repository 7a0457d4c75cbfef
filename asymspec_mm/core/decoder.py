"""Pipeline requests decoded together: the one decoder (:class:`~asymspec_mm.decode.rows.RowDecoder`) over rows
that are prepared :class:`~asymspec_mm.request.session.Session` objects, on batched engines.

A request arrives either prefilled alone (:meth:`AsymSpecPipeline.prepare`: its streams join the batched engines,
their KV copied and the single-row streams released) or set up without prefill (``prepare(..., prefill=False)``,
what the scheduler and ``generate_batch`` do): then its prompts wait in the decoder's batched, chunked prefill
(:mod:`.prefill`; on paged storages their pieces ride in the steps' forwards) and it joins once they are in. Every
step is Algorithm 1 over all live rows at once: K drafting forwards of R rows, one scoring forward of R rows on each
other stream, the gate over ``[R*K, V]``, and one device-to-host transfer for the whole batch.

Rows of one decoder may differ in every setting, the method included (:class:`~asymspec_mm.decode.rows.RowDecoder`
groups them by step shape and lets the groups share each phase's forwards): a Floor row adds its token to the
verifier's scoring forward, a drafter-alone row to the first drafting forward, an SD row drafts on the compressed
stream's storage (or the pipeline's own SD drafter's) and scores on the verifier's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ..decode.row_engines import forget_row
from ..decode.rows import GATE_ROW_FIELDS, STREAMS_OF, Row, RowDecoder, gate_settings  # noqa: F401 - re-exported
from ..engines import RowStorages
from ..engines.model_calls import TokenResult
from ..engines.pieces import StreamPrompt, resumed_prompt
from ..request.session import remember_answer
from .prefill import DEFAULT_CHUNK_TOKENS, ChunkedPrefill, Rides
from .request_state import RequestKind

if TYPE_CHECKING:
    from ..engines.model_calls import TokenRequest
    from ..request.preparing import ServingPipeline
    from ..request.session import Session

#: Builds the batched engine of one stream: ``(model, stream name) -> engine`` (the default is :class:`~asymspec_mm.engines.RowStorages`).
BatchEngineFactory = Callable[[Any, str], Any]

#: Tokens one decode step forwards for a row of each method over all its storages, by its draft length K: K drafts
#: and K + 1 scored positions on each scoring stream of a speculative row, one token of a plain row.
STEP_TOKENS: dict[str, Callable[[int], int]] = {
    "asymspec": lambda k: 3 * k + 2,
    "sd": lambda k: 2 * k + 1,
    "floor": lambda k: 1,
    "drafter": lambda k: 1,
}


@dataclass
class Staged:
    """The decoder's record of a row in the batched prefill: its session (or caption request), the most tokens each
    storage holds for it (:meth:`BatchDecoder.final_lengths`), when its prefill began, its storages (stream ->
    storage name), and the row itself when it is a preempted row coming back."""

    session: Any
    final: dict[str, int]
    t0: float
    storage: dict[str, str]
    row: Row | None = None


class BatchDecoder(RowDecoder):
    """Pipeline sessions of any method and settings, stepped together on one batched row storage per stream
    (``engines(model, stream_name)`` builds each when a row first needs it; default
    :class:`~asymspec_mm.engines.RowStorages`: paged KV).

    A session set up without prefill (``pipe.prepare(..., prefill=False)``) first waits in the decoder's
    :class:`~asymspec_mm.core.prefill.ChunkedPrefill`, as a row of its decode storages where they take prompt pieces
    in their own forwards: each turn :meth:`stage` cuts at most ``prefill_chunk_tokens`` prompt tokens a stream,
    :meth:`step` carries them in its forwards (``rides``) and :meth:`join_ready` lets the rows whose prompts are in
    decode from the next step; :meth:`prefill_step` runs the pieces in forwards of their own instead.
    """

    def __init__(
        self,
        pipe: ServingPipeline,
        *,
        engines: BatchEngineFactory | None = None,
        prefill_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        texts: bool = True,
    ):
        # texts=False: token ids only, the events' and answers' texts made on an output side (the scheduler's)
        super().__init__({}, decode_token=(lambda i: pipe.tokenizer.decode([i])) if texts else None)
        self.pipe, self.texts = pipe, texts
        self._make = engines or RowStorages()
        self.models: dict[str, Any] = {}  # storage name -> its model (the prefill reads the same dict)
        # a factory with a ``staging`` method (paged storages) also builds the prefill's storages, on the same pools
        staging = getattr(self._make, "staging", None)
        self.arriving = ChunkedPrefill(
            self.models,
            chunk_tokens=prefill_chunk_tokens,
            prefix_kv=pipe.prefix_kv,
            staging=staging,
            decode=self.engines,
        )
        self.parked: dict[int, tuple[Row, dict[str, Any]]] = {}  # preempted rows: the row and its prompts to prefill anew

    def storage_of(self, method: str) -> dict[str, str]:
        """The row storage of each of ``method``'s streams, built on first use: the stream's own name, but
        ``sd_drafter`` for SD's compressed stream when the pipeline drafts SD with a model of its own."""
        shared = self.pipe.stream_models("asymspec")
        out = {}
        for name, model in self.pipe.stream_models(method).items():
            key = name if model is shared[name] else "sd_drafter"
            if key not in self.engines:
                self.engines[key], self.models[key] = self._make(model, name), model
            out[name] = key
        return out

    def _storage_for(self, session: Session | TokenRequest) -> dict[str, str]:
        """:meth:`storage_of` the session's method; a token request (its :class:`RequestKind` answers nothing) on a
        model of its own (the captioner's, when the pipeline's full view is served elsewhere) gets a storage of that
        model."""
        storage = self.storage_of(session.method)
        model = None if RequestKind(session.kind).answers else session.model
        if model is not None and model is not self.models.get(storage.get("drafter_full", "")):
            if "captioner" not in self.engines:
                self.engines["captioner"], self.models["captioner"] = self._make(model, "drafter_full"), model
            storage = {**storage, "drafter_full": "captioner"}
        return storage

    def add(self, rid: int, session: Session) -> Row | None:
        """Let a prepared request join (all or nothing, see :meth:`RowDecoder.join`); a session with streams still to
        prefill waits for :meth:`prefill_step` instead (returns ``None``)."""
        storage = self._storage_for(session)
        final = self.final_lengths(session, storage)
        if session.to_prefill:
            if rid in self.rows:
                raise ValueError(f"row {rid} is already live")
            # copies: the prefill advances its own counters, the session's prompts stay as set up (a row taken back
            # out and admitted again starts from them; the request's record counts what is in)
            prompts = {storage[name]: replace(p) for name, p in session.to_prefill.items()}
            streams = {storage[name]: s for name, s in session.streams.items()}
            self.arriving.add(rid, prompts, streams=streams, record=Staged(session, final, time.perf_counter(), storage))
            return None
        return self._join_session(rid, session, session.streams, final, storage)

    def _join_session(
        self,
        rid: int,
        session: Session,
        streams: dict[str, Any],
        final: dict[str, int],
        storage: dict[str, str],
        held: frozenset[str] = frozenset(),
    ) -> Row:
        row = self.join(
            rid,
            session.method,
            streams,
            session.pending,
            session.config,
            session.eos_ids,
            session.stop_fn,
            constraint=session.constraint,
            storage=storage,
            vocab=getattr(session, "vocab", None),
            held=held,
        )
        row.session, row.final_lengths = session, final
        return row

    def step_tokens(self) -> int:
        """Tokens the next step forwards over every storage (:data:`STEP_TOKENS` of each live row)."""
        return sum(STEP_TOKENS[row.method](row.config.k) for row in self.rows.values())

    def prefill_step(self, budget: int | None = None, failures: list[tuple[int, BaseException]] | None = None) -> list[Row]:
        """One batched prefill forward per stream with prompt tokens waiting (``budget``: the prompt tokens all of them
        may carry, see :meth:`ChunkedPrefill.step`; the pieces for decode storages in forwards of their own, where
        :meth:`step` would carry them); returns the rows that joined (see :meth:`join_ready`)."""
        if not self.arriving:
            return []
        self.arriving.step(budget)
        return self.join_ready(failures)

    def stage(self, budget: int | None = None) -> Rides:
        """The turn's prompt pieces: the staging storages' forwards run now; the decode storages' pieces are returned
        for :meth:`step` to carry (:meth:`ChunkedPrefill.stage`)."""
        return self.arriving.stage(budget) if self.arriving else {}

    def step(self, timer: Any = None, rides: Rides | None = None) -> list[tuple[Row, list]]:
        """One step of every live row, its forwards carrying ``rides`` (:meth:`stage`); the arriving rows' prompts
        go on past them once the step ran (:meth:`join_ready` lets the rows whose prompts are in join)."""
        out = super().step(timer, rides)
        if rides:
            self.arriving.rode(rides)
        return out

    def join_ready(self, failures: list[tuple[int, BaseException]] | None = None) -> list[Row]:
        """The rows whose prompts are all in join the decoding rows (a row held by its decode storages stays where it
        is: nothing is copied); returns them. A row whose join fails is gone (its slots freed): it goes to
        ``failures`` as ``(row, error)``, or without that list its error is raised once the others have joined."""
        joined = []
        failed: list[tuple[int, BaseException]] = []
        for rid in self.arriving.ready():
            try:
                prompts = self.arriving.prompts(rid)
                held_keys = self.arriving.held(rid)
                by_storage, staged = self.arriving.take(rid)
                session, storage = staged.session, staged.storage
                streams = {name: by_storage[key] for name, key in storage.items()}
                held = frozenset(name for name, key in storage.items() if key in held_keys)
                if staged.row is not None:  # a preempted row back with its contexts rebuilt
                    self.rejoin(staged.row, streams, held)
                    joined.append(staged.row)
                    continue
                if RequestKind(session.kind).answers:  # what its answer reports, on its record
                    _prefill_stats(session.record.stats, prompts, storage, time.perf_counter() - staged.t0)
                joined.append(self._join_session(rid, session, streams, staged.final, storage, held))
            except Exception as exc:  # noqa: BLE001 - this row fails alone
                for key, engine in self.engines.items():  # a row its storages held: its slots go
                    if key in held_keys and rid in engine.rows and rid not in self.rows:
                        engine.leave(rid)
                        forget_row(engine, rid)
                failed.append((rid, exc))
        if failures is not None:
            failures.extend(failed)
        elif failed:
            raise failed[0][1]
        return joined

    def prompts_of(self, rid: int) -> dict[str, StreamPrompt]:
        """Row ``rid``'s prompts to prefill (by storage): being prefilled, or a parked row's prompt and the tokens it
        had cached; none for a row decoding."""
        if rid in self.arriving.rows:
            return self.arriving.prompts(rid)
        return self.parked[rid][1] if rid in self.parked else {}

    @property
    def waiting_rows(self) -> list[int]:
        """Rows still being prefilled, and preempted rows waiting to be."""
        return list(self.arriving.rows) + list(self.parked)

    def remove(self, rid: int) -> None:
        """Drop a row being prefilled, parked or decoded (a cancelled request): its slots are freed, no result is made."""
        if rid in self.arriving.rows:
            self.arriving.remove(rid)
        elif rid in self.parked:
            del self.parked[rid]
        else:
            super().remove(rid)
        self._forget(rid)

    def _forget(self, rid: int) -> None:
        """Row ``rid`` is gone for good: its counters go from every storage (see :func:`forget_row`)."""
        for engine in self.engines.values():
            forget_row(engine, rid)

    # ------------------------------------------------------------------ memory: what is allocated, preemption
    def preemptible(self, rid: int) -> bool:
        """Whether a live row can be preempted: every stream was staged (its prompt is known) and lives on a storage
        that can take it back (not an engine prefilled elsewhere, such as vLLM's)."""
        row = self.rows.get(rid)
        return (
            row is not None
            and row.session is not None
            and all(name in row.session.to_prefill for name in row.storage)
            and all(self.engines[key].rebuilds for key in row.storage.values())
        )

    def preempt(self, rid: int) -> None:
        """Drop live row ``rid``'s KV (preemption by recompute): it waits, parked, until :meth:`resume` prefills each
        stream's prompt and the tokens it had cached again; it then decodes on exactly as before."""
        row = self.rows[rid]
        first = row.session.pending
        committed = torch.tensor([ev.token_id for ev in row.trace], dtype=torch.long)
        prompts = {}
        for name, key in row.storage.items():
            prompt = row.session.to_prefill[name]
            fed = row.streams[name].own_ids(committed)  # a cross-family drafter stream holds the drafter's ids
            tail = torch.cat([first[name].reshape(-1).cpu(), fed])[: row.streams[name].engine.length - prompt.ids.numel()]
            prompts[key] = resumed_prompt(prompt, tail)
        self.park(rid)
        self.parked[rid] = (row, prompts)

    def resume(self, rid: int) -> None:
        """A parked row's prompts go to the batched prefill; it rejoins the steps once they are in (it stays parked
        if that fails)."""
        row, prompts = self.parked[rid]
        counted = {key: (self.engines[key].tokens_forwarded.get(rid, 0), self.engines[key].forward_calls.get(rid, 0)) for key in prompts}
        self.arriving.add(rid, prompts, record=Staged(row.session, row.final_lengths, time.perf_counter(), row.storage, row))
        del self.parked[rid]
        for key in self.arriving.held(rid):  # its storages hold it again: the re-prefill counts on top
            self.engines[key].tokens_forwarded[rid] += counted[key][0]
            self.engines[key].forward_calls[rid] += counted[key][1]

    def unstage(self, rid: int) -> Session | TokenRequest | None:
        """Take an arriving row back out of the batched prefill, its staging KV dropped (to make room for rows that
        go first): a preempted row is parked again (returns None); a new request's session is returned, its prompts
        to be prefilled from the start when it is admitted again."""
        prompts = {key: replace(p, done=0, cached=0) for key, p in self.arriving.prompts(rid).items()}
        staged = self.arriving.record(rid)
        session = staged.session
        self.arriving.remove(rid)
        if staged.row is not None:
            self.parked[rid] = (staged.row, prompts)
            return None
        return session  # its prompts as set up (the prefill had copies)

    def allocated(self) -> int:
        """KV bytes the row storages and the staging engines hold now (padding and holes included)."""
        return sum(e.kv_bytes() for e in self.engines.values()) + self.arriving.kv_bytes()

    def held_tokens(self) -> int:
        """Context tokens the live rows hold in the fullest row storage (each storage keeps one stream per row: the
        verifier's and the drafter's; the longest of them is what a row costs)."""
        return max((sum(e.length(r) for r in e.rows) for e in self.engines.values()), default=0)

    def step_need(self, members: Sequence[int] | None = None, joining: Mapping[int, Any] | None = None) -> int:
        """An upper bound of the KV bytes allocated through the next prefill forward and decode step with the rows
        ``members`` holding KV (default: the live and arriving rows): live rows decode, arriving rows are staged, a
        parked row resumes, any other id is a set-up session of ``joining`` taking a row. Each storage's
        :meth:`~asymspec_mm.engines.rows.BatchEngine.step_bytes` with the step's most appended slots (K_max + 1
        drafting, K_max + 1 scoring and a gated bonus: 2 K_max + 3) and the rows joining it as rows of their prompts'
        lengths, plus the staging engines' bound for the prompts waiting. A live row left out (preempted) frees its
        share of a padded storage; the storage's time width is kept, so the bound holds whatever its leaving trims."""
        members = list(self.rows) + list(self.arriving.rows) if members is None else list(members)
        joining = joining or {}
        ks: list[int] = []
        staged: dict[str, list[int]] = {}
        kept: dict[str, int] = dict.fromkeys(self.engines, 0)
        for rid in members:
            if rid in self.rows:
                row = self.rows[rid]
                ks.append(row.config.k)
                for key in row.storage.values():
                    kept[key] += 1
                continue
            if rid in self.arriving.rows:
                k, prompts = self.arriving.record(rid).session.config.k, self.arriving.prompts(rid)
                ks.append(k)
                for key, prompt in prompts.items():  # a row its decode storage holds grows by what is left
                    held = key in self.arriving.held(rid)
                    kept[key] += held
                    staged.setdefault(key, []).append(prompt.left if held else int(prompt.ids.numel()))
                continue
            elif rid in self.parked:
                row, prompts = self.parked[rid]
                k = row.config.k
            else:
                session = joining[rid]
                storage = self._storage_for(session)
                k, prompts = session.config.k, {storage[n]: p for n, p in session.to_prefill.items()}
            ks.append(k)
            for key, prompt in prompts.items():
                staged.setdefault(key, []).append(int(prompt.ids.numel()))
        grow = 2 * max(ks, default=0) + 3
        total = 0
        for key, engine in self.engines.items():
            lengths = staged.get(key, [])
            join = max(lengths) if lengths else None
            if kept.get(key, 0) == len(engine.rows) and len(lengths) <= 1:
                total += engine.step_bytes(grow, join)
            elif kept.get(key, 0) == len(engine.rows):
                total += self._many(engine, grow, join, len(lengths))
            else:  # rows leave: each row's share of the padded storage, its width kept
                base = engine.step_bytes(grow, join)
                total += base // (len(engine.rows) + (join is not None)) * (kept[key] + len(lengths))
        return total + self.arriving.kv_bound(staged)

    @staticmethod
    def _many(engine: Any, grow: int, length: int, n: int) -> int:
        """:meth:`step_bytes` with ``n`` rows of up to ``length`` tokens joining."""
        base = engine.step_bytes(grow, length)
        per_row = base // (len(engine.rows) + 1)
        return base + per_row * (n - 1)

    def reset_peaks(self) -> None:
        """Start a new measure of the storages' peak KV bytes."""
        for engine in self.engines.values():
            engine.peak_kv_bytes = engine.kv_bytes()
        self.arriving.reset_peaks()

    def peak(self) -> int:
        """The storages' and staging engines' peak KV bytes since :meth:`reset_peaks`, summed (at least the most they
        held at once)."""
        return sum(e.peak_kv_bytes for e in self.engines.values()) + self.arriving.peak()

    def final_lengths(self, session: Session, storage: dict[str, str]) -> dict[str, int]:
        """The most tokens each of ``session``'s storages holds for it: its prompt, its token budget and one step's
        speculative positions."""
        extra = session.config.max_new_tokens + session.config.k + 2
        out = {}
        for name, key in storage.items():
            staged = session.to_prefill.get(name)
            out[key] = (int(staged.ids.numel()) if staged is not None else session.streams[name].length) + extra
        return out

    def kv_bound(self, session: Session | None = None, *, alone: bool = False) -> int:
        """The most KV bytes this batch's storages can allocate at once with its rows (decoding and arriving) and
        ``session`` joining (``alone``: ``session`` by itself), every row at its :meth:`final_lengths`: what each row
        storage's ``kv_bound`` says (padding, holes and join transients included; a storage without one counts
        its tokens), plus the batched prefill's staging KV of the rows still arriving."""
        live = [] if alone else [(r.final_lengths, r.config.k) for r in self.rows.values()]
        arriving = [] if alone else [self.arriving.record(r) for r in self.arriving.rows]
        rows = live + [(a.final, a.session.config.k) for a in arriving]
        staged = [(a.session, a.storage) for a in arriving]
        if session is not None:
            storage = self._storage_for(session)
            rows.append((self.final_lengths(session, storage), session.config.k))
            if session.to_prefill:
                staged.append((session, storage))
        step = max((k for _, k in rows), default=0) + 1
        total = 0
        for key, engine in self.engines.items():
            lengths = [r[key] for r, _ in rows if key in r]
            if not lengths:
                continue
            total += engine.kv_bound(lengths, step)
        prompt_lengths: dict[str, list[int]] = {}
        for s, storage in staged:
            for name, prompt in s.to_prefill.items():
                prompt_lengths.setdefault(storage[name], []).append(len(prompt.ids))
        return total + self.arriving.kv_bound(prompt_lengths)

    def finish(self, row: Row) -> None:
        """A row is done: its result made (a session's :class:`MMResult`, a caption's or completion's tokens: its
        :class:`RequestKind` says which), then its slots freed."""
        if not RequestKind(row.session.kind).answers:  # only its tokens are wanted
            row.result = TokenResult([ev.token_id for ev in row.trace], {"steps": row.step, "preemptions": row.preemptions})
            super().finish(row)
        else:
            self._finish_session(row)
        self._forget(row.id)  # its result holds what it counted

    def _finish_session(self, row: Row) -> None:
        """The row's :class:`MMResult` (with the batch's statistics), its context stored for the conversation's next
        turn (storages that can hand a row out), then its slots are freed."""
        row.result = self.pipe.result_of(row.session, row.counters, row.trace, text=self.texts)
        engines = {name: self.engines[key] for name, key in row.storage.items()}
        contexts = {
            name: (e.length(row.id), functools.partial(e.row_kv, row.id))
            for name, e in engines.items()
            if e.hands_out_rows and name in row.session.reuse_keys
        }
        models = {name: self.models[key] for name, key in row.storage.items()}
        remember_answer(self.pipe.prefix_kv, models, row.session, row.result.token_ids, contexts)
        row.result.stats["batch_size"] = row.max_batch
        row.result.stats["kv_bytes"] = {name: engine.kv_bytes(row.id) for name, engine in engines.items()}
        # the calls of the steps this row took part in, shared with the rows beside it
        row.result.stats["engine_calls"] = row.engine_calls
        row.result.stats["engine_calls_per_step"] = row.engine_calls / row.step if row.step else 0.0
        row.result.stats["preemptions"] = row.preemptions
        super().finish(row)


def _prefill_stats(stats: dict[str, Any], prompts: Mapping[str, StreamPrompt], storage: Mapping[str, str], seconds: float) -> None:
    """What a row's batched prefill measured, into its record's ``stats``: whether its full view's stored prefix covered
    its images (``prefix_cache_hit``, or set-up's), each stream's tokens from stored prefixes (``cached_tokens``) and
    ``seconds`` from its admission to its join added to set-up's ``prefill_s``."""
    full = prompts.get(storage.get("drafter_full", ""))
    stats["prefix_cache_hit"] = bool(full is not None and full.images_reused) or stats.get("prefix_cache_hit", False)
    stats.setdefault("cached_tokens", {}).update({name: prompts[key].cached for name, key in storage.items() if key in prompts})
    stats["prefill_s"] = stats.get("prefill_s", 0.0) + seconds
