"""What connects the scheduler's threads to the HTTP event loop: a scheduler handle read from the loop (:class:`Reader`),
the client's disconnection, server-sent events (:class:`SSEResponse`), strict JSON, and the HTTP error of a request
that failed inside the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import CancelledError
from typing import Any

from starlette.responses import Response

from ..base.errors import AsymSpecError, ContextOverflowError
from ..core.handle import SchedulerStoppedError
from .errors import RequestError
from .metrics import Metrics

log = logging.getLogger("asymspec_mm.serve")


def dumps(obj: Any) -> bytes:
    """Strict JSON (non-finite floats become null, so a statistic can never break a response)."""
    return json.dumps(_finite(obj), allow_nan=False, separators=(",", ":")).encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------------- handles
class Reader:
    """A scheduler handle followed from the event loop: the handle's listener (called on the scheduler's threads)
    puts ``("events", [TokenEvent])`` per step, then ``("result", MMResult)`` or ``("error", exception)`` on an
    asyncio queue, and records the outcome in the metrics. No thread per request."""

    def __init__(self, handle: Any, loop: asyncio.AbstractEventLoop, metrics: Metrics, on_end: Callable[[], None]):
        self.handle, self.loop, self.metrics, self.on_end = handle, loop, metrics, on_end
        self.queue: asyncio.Queue = asyncio.Queue()
        handle.listen(self._update)

    def _update(self, kind: str, value: Any) -> None:
        try:
            if kind != "events":  # counted before the loop can answer: a client that has its answer sees it in /metrics
                self.metrics.finished("ok" if kind == "result" else outcome_of(value), value if kind == "result" else None)
                self.on_end()
        finally:
            self._put((kind, value))

    def _put(self, item: tuple) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def get(self, gone: asyncio.Future) -> tuple | None:
        """The next item, or ``None`` once the client has gone (``gone`` done)."""
        getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        return None


async def until_disconnected(receive: Callable) -> None:
    """Return once the client has disconnected (the request body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def error_code(exc: AsymSpecError) -> str:
    """The snake_case ``code`` of a library error, as every other code of the server: OpenAI's
    ``context_length_exceeded`` for a context overflow, else the class name's words (``InvalidImageError`` ->
    ``invalid_image``, ``OCRUnavailableError`` -> ``ocr_unavailable``; the base class: ``invalid_request``), unless
    the error carries its own ``code``."""
    if isinstance(exc, ContextOverflowError):
        return "context_length_exceeded"
    if isinstance(getattr(exc, "code", None), str):  # the error names its own (a schema: invalid_json_schema)
        return exc.code  # type: ignore[attr-defined]
    if type(exc) is AsymSpecError:
        return "invalid_request"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", type(exc).__name__.removesuffix("Error")).lower()


def error_param(exc: AsymSpecError) -> str | None:
    """The request field a library error is about, where one is: a context overflow's ``max_tokens`` when
    the prompt fits and the budget does not, else ``messages`` (the question or its caption/OCR text)."""
    if isinstance(exc, ContextOverflowError):
        return "max_tokens" if exc.too_long == "max_new_tokens" else "messages"
    return getattr(exc, "param", None)


def outcome_of(exc: BaseException) -> str:
    """How a request that failed in the scheduler ended, for the metrics (:data:`~.metrics.OUTCOMES`): ``cancelled``,
    ``refused`` when its answer is a 4xx (the request asked for what cannot be done) or ``error`` when it is a 5xx
    (the server failed); decided by the same rules as :func:`error_of`, without logging."""
    if isinstance(exc, CancelledError) or (isinstance(exc, RequestError) and exc.code == "drain_timeout"):
        return "cancelled"  # the server shut down under it: neither the client's mistake nor a failure
    if isinstance(exc, RequestError):
        return "refused" if exc.status < 500 else "error"
    if isinstance(exc, AsymSpecError) and not isinstance(exc, SchedulerStoppedError):
        return "refused"
    return "error"


def error_of(exc: BaseException) -> RequestError:
    """The HTTP error of a request that failed in the scheduler (set-up or a step)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, CancelledError):
        return RequestError(503, "the request was cancelled (the server is shutting down); retry", code="cancelled")
    if isinstance(exc, SchedulerStoppedError):  # the server cannot decode any more: restart it
        return RequestError(503, f"the server cannot decode: {exc}; restart it".replace("\n", " "), code="scheduler_stopped")
    if isinstance(exc, AsymSpecError):
        return RequestError(400, str(exc).replace("\n", " "), param=error_param(exc), code=error_code(exc))
    log.error("request failed", exc_info=exc)
    return RequestError(500, f"internal error: {type(exc).__name__}: {exc}".replace("\n", " "), code="internal_error")


class SSEResponse(Response):
    """Server-sent events from an async iterator of encoded ``data:`` lines; ``on_close`` runs however the
    stream ends (finished, failed, or the client disconnected)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]):
        self.status_code, self.background = 200, None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})  # no body attribute: no content-length
        self.chunks, self.on_close = chunks, on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for data in self.chunks:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-stream
            pass
        finally:
            with contextlib.suppress(Exception):
                await self.chunks.aclose()  # type: ignore[attr-defined]
            self.on_close()
