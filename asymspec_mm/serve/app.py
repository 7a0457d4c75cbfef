"""The OpenAI-compatible HTTP app: :func:`create_app` (FastAPI) on one pipeline's batching scheduler.

Endpoints: ``POST /v1/chat/completions`` (see [asymspec_mm.serve.chat_request][] for what a request may hold),
``POST /v1/completions`` (a text prompt: [asymspec_mm.serve.completions][]), ``POST /v1/responses`` (OpenAI's
Responses API: [asymspec_mm.serve.responses_api][]), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``,
``GET /ready``, ``GET /get_load``, ``GET /get_server_info`` (what routers poll: [asymspec_mm.serve.status][]),
``GET /metrics`` (Prometheus text) and ``GET /openapi.json`` (the request models and the answers' schemas); any other
path is a 404 naming them. Every request is one row of the scheduler (``pipe.scheduler(max_batch_size=...)``), so concurrent requests share
decoding steps; each answer equals ``pipe.generate`` of that request alone. A client that disconnects, while
its answer streams or while it waits for it, cancels its row. Errors are OpenAI's JSON error object with a
one-line message naming the field; the server goes on serving after each.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from .. import __version__
from ..base.config import AsymSpecConfig
from ..base.errors import AsymSpecError
from ..core.setup_pool import DEFAULT_SETUP_WORKERS
from .body import CheckedBodyRoute
from .chat_api import add_chat_routes
from .chat_request import DEFAULT_MAX_IMAGES, ChatRequest
from .drain import DEFAULT_DRAIN_LINGER, DEFAULT_DRAIN_TIMEOUT, Drain, DrainGate, timeout_error
from .errors import RequestError
from .load_metrics import load_series
from .metrics import Metrics
from .openapi import openapi_of
from .responses_events import add_responses_route
from .responses_store import ResponseStore
from .sampling_fields import GENERATION_CONFIGS, choice_configs, model_sampling_defaults
from .status import LOAD_FORMATS, add_status_routes
from .transport import dumps, error_of
from .validation_errors import request_error

if TYPE_CHECKING:  # pragma: no cover
    from ..pipeline.facade import AsymSpecPipeline


DEFAULT_MAX_BATCH_SIZE = 16
"""Rows the scheduler decodes together (``--max-batch-size``)."""
DEFAULT_MAX_QUEUE = 64
"""Requests that may wait for a row before the server answers 429 (``--max-queue``)."""
DEFAULT_MAX_REQUEST_MB = 20.0
"""The largest request body in MB, images included (``--max-request-mb``; 413 beyond)."""
#: Seconds a client refused for a full queue is told to wait (``Retry-After``).
RETRY_AFTER_S = 1
#: What a 404 names: the endpoints the server serves.
ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /v1/models, GET /health, GET /ready, GET /get_load, "
    "GET /get_server_info, GET /metrics, GET /openapi.json"
)


def check_tools(pipe: Any, request: Any) -> Any:
    """``request`` as :meth:`~asymspec_mm.request.preparing.RequestPreparer.check_tools` returns it (carrying the
    grammar it built, which the scheduler and the set-up reuse), before the request queues; a 400 when ``pipe``'s
    verifier cannot take the tools its prompt would carry (naming ``tools``, code ``unsupported``) or the grammar of
    its forced tool call or response format cannot be built (naming the field, code ``invalid_json_schema`` /
    ``invalid_grammar``)."""
    from ..request.tools import ToolError

    preparer = getattr(pipe, "preparer", None)
    if preparer is None:
        return request
    try:
        return preparer.check_tools(request)
    except ToolError as exc:
        raise RequestError(400, str(exc), param=exc.param, code=exc.code or "unsupported") from None


# ---------------------------------------------------------------------------------------------- the app
@dataclass
class ServerState:
    """What the endpoints share: the pipeline, its scheduler, the limits and the counters."""

    pipe: Any
    scheduler: Any
    model: str
    api_key: str | None = None
    allow_local_images: Path | None = None
    max_request_bytes: int = int(DEFAULT_MAX_REQUEST_MB * 2**20)
    max_images: int = DEFAULT_MAX_IMAGES
    base_config: AsymSpecConfig | None = None  # what a request's fields start from (--generation-config)
    own_scheduler: bool = True
    metrics: Metrics = field(default_factory=Metrics)
    created: int = field(default_factory=lambda: int(time.time()))
    handles: set = field(default_factory=set)
    drain: Drain = field(default_factory=Drain)  # SIGTERM's drain (serve.server.DrainingServer begins it)
    load_format: str = "sglang"  # the shape of GET /get_load (serve.status.LOAD_FORMATS)
    compression: Any = None  # a chat request's compression unless it names its own (--compression)
    lock: threading.Lock = field(default_factory=threading.Lock)


def create_app(
    pipe: AsymSpecPipeline,
    *,
    scheduler: Any = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_queue: int | None = DEFAULT_MAX_QUEUE,
    max_kv_bytes: int | None = None,
    setup_workers: int = DEFAULT_SETUP_WORKERS,
    max_stall: float | None = None,
    api_key: str | None = None,
    allow_local_images: str | Path | None = None,
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
    model_name: str | None = None,
    max_images: int = DEFAULT_MAX_IMAGES,
    generation_config: str = "none",
    responses_store: ResponseStore | None = None,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    drain_linger: float = DEFAULT_DRAIN_LINGER,
    load_format: str = "sglang",
    compression: Any = None,
) -> FastAPI:
    """The FastAPI app serving ``pipe`` (see the module docstring).

    scheduler: a ``pipe.scheduler(...)`` to use (default: one made here with ``max_batch_size``, ``max_queue``
    and ``max_kv_bytes``, ``setup_workers`` set-up threads and the stall bound ``max_stall``, closed when the app
    shuts down). api_key: bearer key every ``/v1`` and ``/metrics`` request must send (``/health`` stays open).
    allow_local_images: the folder local image paths may point into (default: none, only data URLs). max_request_mb: largest request body (413 beyond).
    model_name: the id ``/v1/models`` lists (default ``pipe.name``). max_images: images one request may hold.
    generation_config: ``none`` (a request without temperature is greedy) or ``model`` (the verifier's
    ``generation_config.json`` supplies temperature, top_p and top_k; see :mod:`.sampling_fields`).
    responses_store: where ``previous_response_id``'s conversations are kept (:mod:`.responses_store`; default:
    this process's memory); the caller closes it.
    drain_timeout: seconds the requests in flight get to finish once SIGTERM starts the drain (:mod:`.drain`);
    drain_linger: seconds the drain lasts at least, refusing new work, so that routers take the server out of
    rotation before its port closes.
    load_format: the shape of ``GET /get_load``, ``sglang`` or ``vllm-router`` (:mod:`.status`).
    compression: the verifier view's per-turn compression of a chat request that sets no
    ``asymspec.compression`` (:class:`~asymspec_mm.request.compression.Compression`, a name or settings).
    """
    if load_format not in LOAD_FORMATS:
        raise AsymSpecError(f"load_format={load_format!r} is not valid; choose one of {', '.join(LOAD_FORMATS)}")
    if generation_config not in GENERATION_CONFIGS:
        raise AsymSpecError(f"generation_config={generation_config!r} is not valid; choose one of {', '.join(GENERATION_CONFIGS)}")
    from ..request.compression import Compression

    compression = Compression.of(compression, "--compression")  # a bad default fails at start, not per request
    base = AsymSpecConfig()
    if generation_config == "model":
        base = base.with_(**model_sampling_defaults(getattr(getattr(pipe, "verifier", None), "generation_config", None)))
    if not (isinstance(max_request_mb, (int, float)) and math.isfinite(max_request_mb) and max_request_mb > 0):
        raise AsymSpecError(f"max_request_mb={max_request_mb!r} must be a positive number")
    allowed = None
    if allow_local_images is not None:
        allowed = Path(allow_local_images).expanduser().resolve()
        if not allowed.is_dir():
            raise AsymSpecError(f"--allow-local-images {str(allow_local_images)!r} is not a directory")
    own = scheduler is None
    if own:
        scheduler = pipe.scheduler(
            max_batch_size=max_batch_size,
            max_queue=max_queue,
            max_kv_bytes=max_kv_bytes,
            setup_workers=setup_workers,
            max_stall=max_stall,
        )
    state = ServerState(
        pipe=pipe,
        scheduler=scheduler,
        model=model_name or getattr(pipe, "name", "asymspec"),
        api_key=api_key or None,
        allow_local_images=allowed,
        max_request_bytes=int(max_request_mb * 2**20),
        max_images=max_images,
        base_config=base,
        own_scheduler=own,
        drain=Drain(drain_timeout, drain_linger),
        load_format=load_format,
        compression=compression,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        with state.lock:
            live = list(state.handles)
        for handle in live:  # the clients are gone with the server
            handle.cancel()
        if state.own_scheduler:
            await asyncio.to_thread(state.scheduler.close, 30)

    app = FastAPI(
        title="asymspec-mm",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
        strict_content_type=False,  # a body without a Content-Type is read as JSON, as before
    )
    app.router.route_class = CheckedBodyRoute  # the key, the body limit and the JSON parse before any model reads it
    app.add_middleware(DrainGate, drain=state.drain, on_refused=state.metrics.refused)  # 503 to new work while draining
    app.state.asymspec = state
    app.openapi = lambda: openapi_of(app)  # type: ignore[method-assign]

    def json_response(body: Any, status: int = 200, headers: dict | None = None) -> Response:
        return Response(dumps(body), status_code=status, media_type="application/json", headers=headers)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> Response:
        state.metrics.refused(exc.status)
        return json_response(exc.body(), exc.status, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        err = request_error(list(exc.errors()))
        state.metrics.refused(err.status)
        return json_response(err.body(), err.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        state.metrics.refused(exc.status_code)
        message = {
            404: f"no endpoint {request.url.path}; this server serves {ENDPOINTS}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }
        err = RequestError(
            exc.status_code, message.get(exc.status_code, str(exc.detail)), code="not_found" if exc.status_code == 404 else None
        )
        return json_response(err.body(), exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        err = error_of(exc)
        state.metrics.refused(err.status)
        return json_response(err.body(), err.status)

    add_status_routes(app, state, json_response)

    def model_card() -> dict:
        # ``root``: where the verifier's tokenizer is (vLLM's field; its benchmark client loads the tokenizer from it)
        root = getattr(getattr(state.pipe, "verifier_tokenizer", None), "name_or_path", None) or state.model
        return {"id": state.model, "object": "model", "created": state.created, "owned_by": "asymspec-mm", "root": root}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        if model_id != state.model:
            raise RequestError(
                404, f"model {model_id!r} is not served here; this server serves {state.model!r}", param="model", code="model_not_found"
            )
        return json_response(model_card())

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        text = await asyncio.to_thread(state.metrics.render, state.scheduler, state.model)
        text += load_series(state.scheduler, getattr(state.pipe, "prefix_kv", None), state.model)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def submit(req: ChatRequest) -> list[Any]:
        """The request's rows in the scheduler, one per choice (``n``), each with its own seed; tools the verifier
        cannot take and output grammars that cannot be built are refused first (a 400 naming the field, before the
        request queues: the client gets it at once, however long the queue)."""
        from ..core.handle import QueueFullError

        request = check_tools(state.pipe, req.request)
        handles: list[Any] = []
        try:
            if state.drain.expired:  # set up after the drain ran out: it would only be cut off
                raise timeout_error(state.drain.timeout)
            for config in choice_configs(req.config, req.n):  # the request as checked; each choice its own seed
                handles.append(state.scheduler.add(dataclasses.replace(request, config=config)))
                state.metrics.started()
                with state.lock:
                    state.handles.add(handles[-1])
        except QueueFullError as exc:
            for h in handles:
                h.cancel()
            raise RequestError(
                429,
                f"the server is busy: {exc}",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except AsymSpecError as exc:
            for h in handles:
                h.cancel()
            raise error_of(exc) from None
        return handles

    def _forget(handle: Any) -> None:
        with state.lock:
            state.handles.discard(handle)

    def _end(handles: list[Any], gone: asyncio.Future) -> None:
        gone.cancel()
        for handle in handles:
            if not handle.done():
                handle.cancel()

    def _end_all(error: RequestError) -> None:
        """The drain ran out: the requests still decoding fail with ``error`` (their clients get it as the answer)."""
        with state.lock:
            live = list(state.handles)
        for handle in live:
            handle.cancel(error)

    state.drain.on_expire(_end_all)
    add_chat_routes(app, state, submit=submit, forget=_forget, end=_end)
    add_responses_route(app, state, submit=submit, forget=_forget, end=_end, store=responses_store)
    return app
