"""One request with no engine loop running, on the engine core, stepped on the caller's thread.

``pipe.generate`` / ``chat`` / ``stream`` / ``chat_stream`` (and ``pipe.run`` of a session set up with
``prefill=False``) and ``pipe.complete`` take the route a request takes in the loop: one record
(:class:`~.request_state.RequestState`), the pure policy's plan each turn, the paged row storages, its prompt
prefilled in the storages' own forwards, then one decode step a turn (:class:`~.engine_core.EngineCore`, a batch of
one). No thread is started: each turn runs on the thread that reads the stream, as vLLM's ``LLM.generate`` steps its
engine core in-process. Each turn is one model call of the pipeline (:func:`~.loop_client.model_call`): under the
models' lock, or in a loop that starts meanwhile, between two of its steps.

:func:`on_core` says which requests take it: every stream of the method on a transformers model (what the loop's
batched prefill fills) or served by vLLM (prefilled at set-up, a row of a ``VLLMBatchEngine``). A stream served by
another model object and a set-up with the single-row options (``engines=``, ``on_phase=``, ``prefill=``) keep the
single-row engines (:func:`~asymspec_mm.decode.steps_for` over :class:`~asymspec_mm.decode.row_engines.SoloEngine`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..base.gc_heap import frozen_heap
from ..decode.rows import STREAMS_OF
from ..engines import RowStorages
from .engine_core import EngineCore, EngineOutput
from .loop_client import model_call
from .request_state import RequestKind, RequestState, prompt_counts

if TYPE_CHECKING:
    from ..decode import TokenEvent
    from ..engines.model_calls import TokenRequest, TokenResult
    from ..request.preparing import ServingPipeline
    from ..request.session import Session

T = TypeVar("T")

#: Prompt tokens a direct turn prefills: a request alone has no decoding row to stall, so its prompt goes in one
#: forward per row storage, as a single-row engine prefills it.
DIRECT_TOKEN_BUDGET = 1 << 30


def on_core(pipe: ServingPipeline, method: str) -> bool:
    """Whether a request of ``method`` decodes on the engine core when no loop runs: every one of its streams is on a
    transformers model (the batched prefill fills it) or served by vLLM (set-up prefills it; its row storage is
    ``VLLMBatchEngine``, as in the loop); another served model keeps the single-row engines."""
    from ..engines.vllm import VLLMModel

    staged = set(pipe.staged_streams(method))
    models = pipe.stream_models(method)
    return all(name in staged or isinstance(models.get(name), VLLMModel) for name in STREAMS_OF[method])


def direct_core(pipe: ServingPipeline, *, texts: bool = True, timer: Any = None) -> EngineCore:
    """An engine core of one row for a request alone (its prompt in one forward per storage; ``texts``: the events'
    and the answer's texts made here, there is no output side).

    Each stream's KV is in a pool of its own, one tensor per layer: the row's blocks are then consecutive and every
    layer reads them where they lie, as the single-row cache it replaces did, with no copy. (One pool shared by the
    drafter's two views hands their blocks out alternately, and a pool of segments spreads a growing row over
    several; either way each layer would copy the row's runs of slots per forward.) Growing a contiguous pool holds
    one layer's old tensor beside it while it copies, counted in the peak and the bounds: the transient a single-row
    cache's concatenation has too."""
    storages = RowStorages(layout="contiguous", per_stream=True)
    core = EngineCore(
        pipe,
        1,
        batch_engines=storages,
        prefill_chunk_tokens=DIRECT_TOKEN_BUDGET,
        token_budget=DIRECT_TOKEN_BUDGET,
        texts=texts,
        measures=False,
    )
    core.timer = timer
    return core


def turns(pipe: ServingPipeline, core: EngineCore) -> Iterator[EngineOutput]:
    """The core's outputs, one turn at a time while it has work, each turn one model call of ``pipe``; a request's
    error is raised (it is the only one)."""
    with frozen_heap():  # the loaded heap out of the collector's scans while this request decodes
        while core.has_work:
            for out in model_call(pipe, core.step, pipe.models_lock):
                if out.error is not None:
                    raise out.error
                yield out


def session_steps(pipe: ServingPipeline, session: Session, timer: Any = None) -> tuple[Iterator[list[TokenEvent]], list]:
    """The committed steps of ``session`` (set up with ``prefill=False``) decoded alone on an engine core, and a list
    that holds its :class:`~asymspec_mm.request.session.MMResult` once they are exhausted."""
    core = direct_core(pipe, timer=timer)
    core.add_session(session)
    result: list = []

    def steps() -> Iterator[list[TokenEvent]]:
        for out in turns(pipe, core):
            if out.finished:
                result.append(out.result)
            elif out.events:
                yield out.events

    return steps(), result


def decode_alone(pipe: ServingPipeline, request: TokenRequest) -> TokenResult:
    """A token request (a completion, a caption) decoded alone on an engine core: what the loop's ``decode_row``
    returns."""
    core = direct_core(pipe, texts=False)
    kind = RequestKind(request.kind)
    state = RequestState(next(core.ids), None, request, -1, kind.entry, work=request, kind=kind)
    state.set_prompts(*prompt_counts(request.to_prefill))
    core.add(state)
    return next(out.result for out in turns(pipe, core) if out.finished)


class DirectCalls:
    """The model calls of a request's set-up on the direct path, on the caller's thread (a
    :class:`~asymspec_mm.engines.model_calls.ModelLoop`, scoped with ``using_loop``): a call (the vision tower's) under
    the models' lock, or in a loop that starts meanwhile; a token request (an automatic caption) decoded alone on an
    engine core, as the loop decodes it as a row. So a caption takes the route of the request it is for."""

    def __init__(self, pipe: ServingPipeline):
        self.pipe = pipe

    def run(self, fn: Callable[[], T]) -> T:
        return model_call(self.pipe, fn, self.pipe.models_lock)

    def decode_row(self, request: TokenRequest) -> TokenResult:
        return decode_alone(self.pipe, request)
