"""A POST request's way in, before FastAPI validates its body against the endpoint's pydantic model: the API key,
the body read within ``--max-request-mb`` (413 beyond, told by ``Content-Length`` or counted as it arrives), and the
body parsed as UTF-8 JSON no deeper than :data:`MAX_JSON_DEPTH` (each a 400 naming the problem, code
``invalid_json``). :class:`CheckedBodyRoute` does this for every route of the app, off the event loop for the
parse; the endpoint then gets the parsed object, so FastAPI neither reads nor parses the body again.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .errors import RequestError, bad_request

MAX_JSON_DEPTH = 64
"""How deeply a request body's arrays and objects may nest (a JSON schema in ``tools`` needs a handful of levels);
deeper is a 400 before any field is read, so no later walk over the body can exhaust the stack."""


def authorize(state: Any, request: Request) -> None:
    """Refuse (401) a request without the server's key, when it has one."""
    if state.api_key is None:
        return
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), state.api_key.encode()):
        raise RequestError(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer <key>' (the key the server was started with)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (a 413 beyond, before reading it when ``Content-Length`` says so)."""
    too_big = RequestError(
        413,
        f"the request body is over the server's limit of {limit / 2**20:g} MB (--max-request-mb); send a smaller image",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_big
        except ValueError:
            raise RequestError(400, "the Content-Length header is not an integer") from None
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError(400, "the client disconnected while sending the request body", code="client_disconnected") from None
    return b"".join(chunks)


def json_depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (a scalar: 0); iterative."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object (NaN and infinities parse, to be refused by the field they are in)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"the request body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start}): send JSON encoded as UTF-8",
            None,
            "invalid_json",
        ) from None
    too_deep = bad_request(
        f"the request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep; send a flatter body", None, "invalid_json"
    )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", None, "invalid_json"
        ) from None
    except RecursionError:  # nested deeper than the parser goes
        raise too_deep from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}", None, "invalid_json")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep
    return data


class _ParsedRequest(Request):
    """A request whose body was read and parsed already."""

    def __init__(self, request: Request, body: bytes, data: dict):
        super().__init__(request.scope, request.receive)
        self._body, self._parsed = body, data

    async def body(self) -> bytes:
        return self._body

    async def json(self) -> Any:
        return self._parsed


class CheckedBodyRoute(APIRoute):
    """A route whose POST requests are authorized, read within the body limit and parsed (module docstring) before
    FastAPI validates the parsed object against the endpoint's model; other methods are authorized only."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            state = request.app.state.asymspec
            if self.path not in ("/health", "/ready"):  # the probes: orchestrators send no key
                authorize(state, request)
            if request.method == "POST":
                body = await read_body(request, state.max_request_bytes)
                data = await asyncio.to_thread(parse_json, body)  # a 20 MB body parses off the event loop
                request = _ParsedRequest(request, body, data)
            return await handler(request)

        return checked
