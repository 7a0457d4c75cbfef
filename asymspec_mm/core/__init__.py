"""The engine core: one loop that owns the models and decodes many requests together, one forward per row storage
per phase of a step for all rows, whatever their methods and settings.

:mod:`.scheduler` the loop (a plan under the token and KV budgets, then the prefill and one decode step, then
update) and its callers' API (:mod:`.handle` a submitted request's handle), :mod:`.policy` the pure scheduling
policy (``schedule(view) -> TurnPlan``: admission, preemption, prompt chunks), :mod:`.request_state` one record
and status per request, :mod:`.loop_calls` the set-up's
model calls run in the loop, :mod:`.decoder` the one decoder over sessions on row storage (:mod:`asymspec_mm.engines`:
``rows``, ``static_rows``, ``vllm_rows``), :mod:`.prefill` the batched, chunked prefill of arriving rows,
:mod:`.generate` ``pipe.generate_batch``. Requests arrive as :class:`~asymspec_mm.request.request.Request` objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "BatchDecoder": "decoder",
    "Row": "decoder",
    "BatchEngine": "..engines.rows",
    "RowView": "..engines.rows",
    "StaticBatchEngine": "..engines.static_rows",
    "static_batch_engines": "..engines.static_rows",
    "Request": "..request.request",
    "generate_batch": "generate",
    "Handle": "handle",
    "QueueFullError": "handle",
    "RequestState": "request_state",
    "RequestStatus": "request_state",
    "Scheduler": "scheduler",
    "TurnPlan": "policy",
    "TurnView": "policy",
    "schedule": "policy",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy so that the CLI imports no torch for --help.
    if name in _LAZY:
        import importlib

        module = _LAZY[name]
        return getattr(
            importlib.import_module(module, __name__) if module.startswith(".") else importlib.import_module(f"{__name__}.{module}"), name
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from ..engines.rows import BatchEngine, RowView
    from ..engines.static_rows import StaticBatchEngine, static_batch_engines
    from ..request.request import Request
    from .decoder import BatchDecoder, Row
    from .generate import generate_batch
    from .handle import Handle, QueueFullError
    from .policy import TurnPlan, TurnView, schedule
    from .request_state import RequestState, RequestStatus
    from .scheduler import Scheduler
