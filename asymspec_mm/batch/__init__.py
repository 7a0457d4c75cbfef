"""Batched decoding: many requests decoded together, one forward per stream per step for all rows.

:mod:`.engines` rows of one model in one KV cache (:mod:`.static_rows` in preallocated slots, :mod:`.vllm` the
same on vLLM), :mod:`.decoder` the loops over many rows, :mod:`.generate` ``pipe.generate_batch``, :mod:`.scheduler` continuous batching for concurrent
callers, :mod:`.cli` the ``asymspec-mm batch`` command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "ROW_FIELDS": "decoder",
    "BatchDecoder": "decoder",
    "Row": "decoder",
    "batch_key": "decoder",
    "BatchEngine": "engines",
    "RowView": "engines",
    "StaticBatchEngine": "static_rows",
    "static_batch_engines": "static_rows",
    "Request": "generate",
    "generate_batch": "generate",
    "Handle": "scheduler",
    "QueueFullError": "scheduler",
    "Scheduler": "scheduler",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy so that the CLI (which registers `batch` from .cli) imports no torch for --help.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from .decoder import ROW_FIELDS, BatchDecoder, Row, batch_key
    from .engines import BatchEngine, RowView
    from .generate import Request, generate_batch
    from .scheduler import Handle, QueueFullError, Scheduler
    from .static_rows import StaticBatchEngine, static_batch_engines
