"""Batched decoding: many requests decoded together, one forward per stream per step for all rows.

:mod:`.engines` rows of one model in one KV cache, :mod:`.decoder` the loops over many rows,
:mod:`.generate` ``pipe.generate_batch``, :mod:`.scheduler` continuous batching for concurrent callers.
"""

from __future__ import annotations

from .decoder import ROW_FIELDS, BatchDecoder, Row, batch_key
from .engines import BatchEngine, RowView
from .generate import Request, generate_batch
from .scheduler import Handle, QueueFullError, Scheduler

__all__ = [
    "ROW_FIELDS",
    "BatchDecoder",
    "BatchEngine",
    "Handle",
    "QueueFullError",
    "Request",
    "Row",
    "RowView",
    "Scheduler",
    "batch_key",
    "generate_batch",
]
