"""Pipeline requests decoded together: the one decoder (:class:`~asymspec_mm.decode.rows.RowDecoder`) over rows
that are prepared :class:`~asymspec_mm.session.Session` objects, on batched engines.

A request arrives either prefilled alone (:meth:`AsymSpecPipeline.prepare`: its streams join the batched engines,
their KV copied and the single-row streams released) or set up without prefill (``prepare(..., prefill=False)``,
what the scheduler and ``generate_batch`` do): then its prompts wait in the decoder's batched, chunked prefill
(:mod:`.prefill`) and it joins once they are in. Every step is Algorithm 1 over all live rows at once: K drafting
forwards of R rows, one scoring forward of R rows on each other stream, the gate over ``[R*K, V]``, and one
device-to-host transfer for the whole batch.

Rows of one decoder share the method and every decoding setting except :data:`ROW_FIELDS`: K, the gate, the delta
source and the bonus rule shape the step, while gamma, beta and lam enter the gate as per-row values
(``[R*K]`` tensors) and the token budget and stop strings are each row's emitter's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..config import AsymSpecConfig
from ..decode.rows import GATE_ROW_FIELDS, STREAMS_OF, Row, RowDecoder, gate_settings  # noqa: F401 - re-exported
from ..engines import default_row_storage
from ..errors import UnknownOptionError
from ..session import remember_answer
from .prefill import DEFAULT_CHUNK_TOKENS, ChunkedPrefill

if TYPE_CHECKING:
    from ..preparing import ServingPipeline
    from ..session import Session

#: Settings that may differ between the rows of one batch: each row's emitter applies its own budget and stop
#: strings, and the gate takes each row's gamma, beta and lam.
ROW_FIELDS = ("max_new_tokens", "stop_strings", *GATE_ROW_FIELDS)

#: Builds the batched engine of one stream: ``(model, stream name) -> engine`` (the default is :func:`~asymspec_mm.engines.default_row_storage`).
BatchEngineFactory = Callable[[Any, str], Any]


#: The settings each method's loop reads (the rest cannot change its tokens, so rows may differ there).
_USED_BY = {"asymspec": None, "sd": ("k", "trace_top"), "floor": ("trace_top",), "drafter": ("trace_top",)}


def batch_key(method: str, cfg: AsymSpecConfig) -> tuple:
    """What rows of one batch must share: the method and the settings its loop reads, but :data:`ROW_FIELDS`
    (Floor rows with different K or gates share a batch; AsymSpec rows share K, the gate, delta and bonus)."""
    used = _USED_BY[method]
    names = [f.name for f in fields(AsymSpecConfig) if f.name not in ROW_FIELDS and (used is None or f.name in used)]
    return (method,) + tuple(getattr(cfg, n) for n in names)


class BatchDecoder(RowDecoder):
    """Rows of one method and one batch key (pipeline sessions), stepped together on one batched engine per stream
    (``engines(model, stream_name)`` builds them; default :func:`~asymspec_mm.engines.default_row_storage`).

    A session set up without prefill (``pipe.prepare(..., prefill=False)``) first waits in the decoder's
    :class:`~asymspec_mm.batch.prefill.ChunkedPrefill`: :meth:`prefill_step` runs one batched forward per stream of
    at most ``prefill_chunk_tokens`` prompt tokens and lets the rows whose prompts are in join the decoding rows.
    """

    def __init__(
        self,
        pipe: ServingPipeline,
        method: str,
        config: AsymSpecConfig,
        *,
        engines: BatchEngineFactory | None = None,
        prefill_chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ):
        make = engines or default_row_storage
        models = pipe.stream_models(method)
        built = {name: make(model, name) for name, model in models.items()}
        super().__init__(method, config, built, lock=pipe.models_lock, decode_token=lambda i: pipe.tokenizer.decode([i]))
        self.pipe = pipe
        self.key = batch_key(method, self.cfg)
        self.models = models
        self.arriving = ChunkedPrefill(models, chunk_tokens=prefill_chunk_tokens, prefix_kv=pipe.prefix_kv, lock=pipe.models_lock)

    def add(self, rid: int, session: Session) -> Row | None:
        """Let a prepared request join (all or nothing, see :meth:`RowDecoder.join`); a session with streams still to
        prefill waits for :meth:`prefill_step` instead (returns ``None``)."""
        if batch_key(session.method, session.config) != self.key:
            raise UnknownOptionError(
                f"request {rid}: method/config differ from this batch's ({self.method}); "
                f"rows of one batch share every setting but {', '.join(ROW_FIELDS)}"
            )
        final = self.final_lengths(session)
        if session.to_prefill:
            if rid in self.rows:
                raise ValueError(f"row {rid} is already live")
            self.arriving.add(rid, session.to_prefill, streams=session.streams, extra=(session, final, time.perf_counter()))
            return None
        return self._join_session(rid, session, session.streams, final)

    def _join_session(self, rid: int, session: Session, streams: dict[str, Any], final: dict[str, int]) -> Row:
        row = self.join(rid, streams, session.pending, session.config, session.eos_ids, session.stop_fn, constraint=session.constraint)
        row.session, row.final_lengths = session, final
        return row

    def prefill_step(self) -> list[Row]:
        """One batched prefill forward per stream with prompt tokens waiting; returns the rows that joined."""
        if not self.arriving:
            return []
        joined = []
        for rid in self.arriving.step():
            prompts = self.arriving.prompts(rid)
            streams, (session, final, t0) = self.arriving.take(rid)
            full = prompts.get("drafter_full")
            session.stats["prefix_cache_hit"] = bool(full is not None and full.images_reused) or session.stats.get(
                "prefix_cache_hit", False
            )
            session.stats.setdefault("cached_tokens", {}).update({name: p.cached for name, p in prompts.items()})
            session.prefill_s = session.stats["prefill_s"] = session.stats.get("prefill_s", 0.0) + time.perf_counter() - t0
            joined.append(self._join_session(rid, session, streams, final))
        return joined

    @property
    def waiting_rows(self) -> list[int]:
        """Rows still being prefilled."""
        return list(self.arriving.rows)

    def remove(self, rid: int) -> None:
        """Drop a row being prefilled or decoded (a cancelled request): its slots are freed, no result is made."""
        if rid in self.arriving.rows:
            self.arriving.remove(rid)
        else:
            super().remove(rid)

    def final_lengths(self, session: Session) -> dict[str, int]:
        """The most tokens each stream holds for ``session``: its prompt, its token budget and one step's speculative
        positions."""
        extra = session.config.max_new_tokens + session.config.k + 2
        out = {}
        for name in self.engines:
            staged = session.to_prefill.get(name)
            out[name] = (int(staged.ids.numel()) if staged is not None else session.streams[name].length) + extra
        return out

    def kv_bound(self, session: Session | None = None, *, alone: bool = False) -> int:
        """The most KV bytes this batch's storage can allocate at once with its rows (decoding and arriving) and
        ``session`` joining (``alone``: ``session`` by itself), every row at its :meth:`final_lengths`: what each row
        storage's ``kv_bound`` says (padding, holes and join transients included; a storage without one counts
        its tokens), plus the batched prefill's staging KV of the rows still arriving."""
        rows = [] if alone else [r.final_lengths for r in self.rows.values()] + [self.arriving.extra(r)[1] for r in self.arriving.rows]
        if session is not None:
            rows.append(self.final_lengths(session))
        step = self.cfg.k + 1
        total = 0
        for name, engine in self.engines.items():
            lengths = [r[name] for r in rows]
            if hasattr(engine, "kv_bound"):
                total += engine.kv_bound(lengths, step)
            else:
                total += sum(n + step for n in lengths) * engine.slot_bytes()
        arriving = [] if alone else [self.arriving.extra(r)[0] for r in self.arriving.rows]
        if session is not None and session.to_prefill:
            arriving.append(session)
        return total + self.arriving.kv_bound({name: [len(s.to_prefill[name].ids) for s in arriving] for name in self._staged(arriving)})

    @staticmethod
    def _staged(sessions: list[Session]) -> list[str]:
        return sorted({name for s in sessions for name in s.to_prefill})

    def finish(self, row: Row) -> None:
        """The row's :class:`MMResult` (with the batch's statistics), its context stored for the conversation's next
        turn (storages that can hand a row out), then its slots are freed."""
        row.result = self.pipe.result_of(row.session, row.counters, row.trace)
        contexts = {
            name: (e.length(row.id), functools.partial(e.row_kv, row.id))
            for name, e in self.engines.items()
            if hasattr(e, "row_kv") and name in row.session.reuse_keys
        }
        remember_answer(self.pipe.prefix_kv, self.models, row.session, row.result.token_ids, contexts)
        row.result.stats["batch_size"] = row.max_batch
        row.result.stats["kv_bytes"] = {name: engine.kv_bytes(row.id) for name, engine in self.engines.items()}
        # the calls of the steps this row took part in, shared with the rows beside it
        row.result.stats["engine_calls"] = row.engine_calls
        row.result.stats["engine_calls_per_step"] = row.engine_calls / row.step if row.step else 0.0
        super().finish(row)
