"""A request with no engine loop running, on the engine core, stepped on its callers' threads.

``pipe.generate`` / ``chat`` / ``stream`` / ``chat_stream`` (and ``pipe.run`` of a session set up with
``prefill=False``) and ``pipe.complete`` take the route a request takes in the loop: one record
(:class:`~.request_state.RequestState`), the pure policy's plan each turn, the paged row storages, its prompt
prefilled in the storages' own forwards, then one decode step a turn. The requests are rows of the pipeline's
:class:`~.direct_loop.DirectLoop`, one engine core its callers drive: a caller alone steps its own request on its
thread, as vLLM's ``LLM.generate`` steps its engine core in-process; callers on several threads share each turn.
No thread is started.

:func:`on_core` says which requests take it: every stream of the method on a transformers model (what the loop's
batched prefill fills) or served by vLLM (prefilled at set-up, a row of a ``VLLMBatchEngine``). A stream served by
another model object and a set-up with the single-row options (``engines=``, ``prefill=``) keep the single-row
engines (:func:`~asymspec_mm.decode.steps_for` over :class:`~asymspec_mm.decode.row_engines.SoloEngine`),
whose steps are model calls of the same loop (:func:`~.loop_client.model_call`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..base.gc_heap import frozen_heap
from ..decode.rows import STREAMS_OF
from .direct_loop import direct_core
from .engine_core import EngineCore, EngineOutput
from .loop_client import direct_loop, model_call

if TYPE_CHECKING:
    from ..decode import TokenEvent
    from ..engines.model_calls import TokenRequest, TokenResult
    from ..request.preparing import ServingPipeline
    from ..request.session import Session


def on_core(pipe: ServingPipeline, method: str) -> bool:
    """Whether a request of ``method`` decodes on the engine core when no loop runs: every one of its streams is on a
    transformers model (the batched prefill fills it) or served by vLLM (set-up prefills it; its row storage is
    ``VLLMBatchEngine``, as in the loop); another served model keeps the single-row engines."""
    from ..engines.vllm import VLLMModel

    staged = set(pipe.staged_streams(method))
    models = pipe.stream_models(method)
    return all(name in staged or isinstance(models.get(name), VLLMModel) for name in STREAMS_OF[method])


def turns(pipe: ServingPipeline, core: EngineCore) -> Iterator[EngineOutput]:
    """The outputs of ``core`` (a core of one request, stepped by its caller alone), one turn at a time while it has
    work, each turn one model call of ``pipe``; the request's error is raised."""
    while core.has_work:
        for out in model_call(pipe, core.step):
            if out.error is not None:
                raise out.error
            yield out


def session_steps(pipe: ServingPipeline, session: Session, timer: Any = None) -> tuple[Iterator[list[TokenEvent]], list]:
    """The committed steps of ``session`` (set up with ``prefill=False``) decoded on the engine core, and a list that
    holds its :class:`~asymspec_mm.request.session.MMResult` once they are exhausted. The request enters the
    pipeline's direct loop when the steps are first read; with a ``timer`` (a profile of its own steps) it decodes
    on a core of its own, each turn a model call of that loop."""

    def outputs() -> Iterator[EngineOutput]:
        if timer is not None:
            core = direct_core(pipe, timer=timer)
            core.add_session(session)
            yield from turns(pipe, core)
            return
        loop = direct_loop(pipe)
        yield from loop.outputs(loop.add_session(session))

    result: list = []

    def steps() -> Iterator[list[TokenEvent]]:
        with frozen_heap():  # the loaded heap out of the collector's scans while this request decodes
            outs = outputs()
            try:
                for out in outs:
                    if out.error is not None:
                        raise out.error
                    if out.finished:
                        result.append(out.result)
                    elif out.events:
                        yield out.events
            finally:
                outs.close()

    return steps(), result


def decode_alone(pipe: ServingPipeline, request: TokenRequest) -> TokenResult:
    """A token request (a completion, a caption) decoded on the engine core with no loop running, as a row of the
    pipeline's direct loop: what the loop's ``decode_row`` returns."""
    return direct_loop(pipe).decode_row(request)
