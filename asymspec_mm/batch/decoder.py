"""Pipeline requests decoded together: the one decoder (:class:`~asymspec_mm.decode.rows.RowDecoder`) over rows
that are prepared :class:`~asymspec_mm.session.Session` objects, on batched engines.

A request is set up and prefilled alone (:meth:`AsymSpecPipeline.prepare`: the same prompts, vision cache and
prefix reuse as a single request), then its streams join the decoder's batched engines (their KV is copied and
the single-row streams released). Every step is Algorithm 1 over all live rows at once: K drafting forwards of
R rows, one scoring forward of R rows on each other stream, the gate over ``[R*K, V]``, and one device-to-host
transfer for the whole batch.

Rows of one decoder share the method and every decoding setting except :data:`ROW_FIELDS`: K, the gate, the delta
source and the bonus rule shape the step, while gamma, beta and lam enter the gate as per-row values
(``[R*K]`` tensors) and the token budget and stop strings are each row's emitter's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..config import AsymSpecConfig
from ..decode.rows import GATE_ROW_FIELDS, STREAMS_OF, Row, RowDecoder, gate_settings  # noqa: F401 - re-exported
from ..errors import UnknownOptionError
from .engines import BatchEngine

if TYPE_CHECKING:
    from ..pipeline import AsymSpecPipeline
    from ..session import Session

#: Settings that may differ between the rows of one batch: each row's emitter applies its own budget and stop
#: strings, and the gate takes each row's gamma, beta and lam.
ROW_FIELDS = ("max_new_tokens", "stop_strings", *GATE_ROW_FIELDS)

#: Builds the batched engine of one stream: ``(model, stream name) -> engine`` (the default is :func:`batch_engine`).
BatchEngineFactory = Callable[[Any, str], Any]


def batch_engine(model, name: str):
    """The batched engine of one stream: on vLLM when ``model`` is served there, else on transformers."""
    from ..vllm_engine import VLLMModel

    if isinstance(model, VLLMModel):
        from .vllm import VLLMBatchEngine

        return VLLMBatchEngine(model, name)
    return BatchEngine(model, name)


#: The settings each method's loop reads (the rest cannot change its tokens, so rows may differ there).
_USED_BY = {"asymspec": None, "sd": ("k", "trace_top"), "floor": ("trace_top",), "drafter": ("trace_top",)}


def batch_key(method: str, cfg: AsymSpecConfig) -> tuple:
    """What rows of one batch must share: the method and the settings its loop reads, but :data:`ROW_FIELDS`
    (Floor rows with different K or gates share a batch; AsymSpec rows share K, the gate, delta and bonus)."""
    used = _USED_BY[method]
    names = [f.name for f in fields(AsymSpecConfig) if f.name not in ROW_FIELDS and (used is None or f.name in used)]
    return (method,) + tuple(getattr(cfg, n) for n in names)


def stream_models(pipe: AsymSpecPipeline, method: str) -> dict[str, Any]:
    """Which model serves each of ``method``'s streams (SD drafts with its own text drafter when the pipeline has one)."""
    models = {
        "drafter_full": pipe.drafter_full or pipe.drafter,
        "drafter_comp": pipe.drafter_comp or pipe.drafter,
        "verifier": pipe.verifier,
    }
    if method == "sd" and getattr(pipe, "sd_drafter", None) is not None:
        models["drafter_comp"] = pipe.sd_drafter
    return {name: models[name] for name in STREAMS_OF[method]}


class BatchDecoder(RowDecoder):
    """Rows of one method and one batch key (pipeline sessions), stepped together on one batched engine per stream
    (``engines(model, stream_name)`` builds them; default :func:`batch_engine`)."""

    def __init__(self, pipe: AsymSpecPipeline, method: str, config: AsymSpecConfig, *, engines: BatchEngineFactory | None = None):
        make = engines or batch_engine
        built = {name: make(model, name) for name, model in stream_models(pipe, method).items()}
        super().__init__(method, config, built, lock=pipe.models_lock, decode_token=lambda i: pipe.tokenizer.decode([i]))
        self.pipe = pipe
        self.key = batch_key(method, self.cfg)

    def add(self, rid: int, session: Session) -> Row:
        """Let a prepared request join (all or nothing, see :meth:`RowDecoder.join`)."""
        if batch_key(session.method, session.config) != self.key:
            raise UnknownOptionError(
                f"request {rid}: method/config differ from this batch's ({self.method}); "
                f"rows of one batch share every setting but {', '.join(ROW_FIELDS)}"
            )
        need = self.kv_need(session)
        row = self.join(rid, session.streams, session.pending, session.config, session.eos_ids, session.stop_fn)
        row.session, row.kv_need = session, need
        return row

    def kv_need(self, session: Session) -> int:
        """The most KV bytes ``session`` can hold in this batch: its prompts plus its token budget and one step's
        speculative positions, on every stream (what a memory budget reserves for it)."""
        extra = session.config.max_new_tokens + session.config.k + 2
        return sum(engine.slot_bytes() * (session.streams[name].length + extra) for name, engine in self.engines.items())

    @property
    def kv_reserved(self) -> int:
        """:meth:`kv_need` summed over the live rows (each reserved when it joined)."""
        return sum(row.kv_need for row in self.rows.values())

    def finish(self, row: Row) -> None:
        """The row's :class:`MMResult` (with the batch's statistics), then its slots are freed."""
        row.result = self.pipe.result_of(row.session, row.counters, row.trace)
        row.result.stats["batch_size"] = row.max_batch
        row.result.stats["kv_bytes"] = {name: engine.kv_bytes(row.id) for name, engine in self.engines.items()}
        # the calls of the steps this row took part in, shared with the rows beside it
        row.result.stats["engine_calls"] = row.engine_calls
        row.result.stats["engine_calls_per_step"] = row.engine_calls / row.step if row.step else 0.0
        super().finish(row)
