"""``POST /v1/responses``: the route (:func:`add_responses_route`) and a streamed answer as the Responses API's
server-sent events (:func:`response_events`).

A request is one row of the scheduler, as a chat completion with ``n=1``. Streamed, the events are:
``response.created`` and ``response.in_progress``; the message's ``response.output_item.added``,
``response.content_part.added``, a ``response.output_text.delta`` per committed step (held back where a stop string,
an unfinished character or the start of a ``<tool_call>`` may be forming), ``response.output_text.done``,
``response.content_part.done`` and ``response.output_item.done``; for each function call
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done`` and
``response.output_item.done``; then ``response.completed`` (``response.incomplete`` when the token budget cut the
answer) with the whole response and its usage. Every event has its ``sequence_number``. Function calls are
announced once the answer has ended: a call is certain as soon as its block closes
(:class:`~asymspec_mm.request.tools.ToolCallStream`), but the message item before it closes with the answer's
final status (``incomplete`` when the budget cuts the answer later), and a stream never takes back or restates an
item it has announced; a model writes its calls last, so they arrive moments later than they could. The joined
deltas equal the non-streamed response's text and arguments. A failure mid-stream sends ``error`` and
``response.failed``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ..request.tools import ToolCallStream, parse_tool_calls
from .chat_answers import TextDeltas
from .chat_request import ChatRequest
from .errors import RequestError, bad_request
from .models_fields import field_value
from .models_responses import CreateResponseRequest
from .openapi import answer_docs
from .responses_api import ResponsesRequest, parse_responses_request, responses_error
from .responses_output import (
    answer_logprobs,
    answer_message,
    answer_parts,
    function_call_id,
    function_item,
    is_cut,
    message_id,
    message_item,
    output_text,
    response_object,
)
from .responses_store import MemoryResponseStore, ResponseStore
from .transport import Reader, SSEResponse, dumps, error_of, until_disconnected

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

    from ..request.session import MMResult


class AnswerText:
    """The message text of an answer as it grows: every step's committed tokens decoded (:class:`TextDeltas`), and
    with tools offered only the text before the first call (:class:`ToolCallStream`'s content)."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...], rid: str, tools: bool):
        self.text_deltas = TextDeltas(tokenizer, stop_strings)
        self.calls = ToolCallStream(rid) if tools else None
        self.rid = rid
        self.text = ""

    def step(self, token_ids: list[int]) -> str:
        return self._content(self.text_deltas.push(token_ids))

    def finish(self, res: MMResult) -> str:
        return self._content(self.text_deltas.finish(res.text), res)

    def _content(self, piece: str, final: MMResult | None = None) -> str:
        self.text += piece
        if self.calls is None:
            return piece
        if final is None:
            deltas = self.calls.push(self.text)
        else:
            deltas = self.calls.finish(final.text, parse_tool_calls(final.text, self.rid, finished=not final.cut_by_budget))
        return "".join(d.get("content") or "" for d in deltas)  # calls are announced from the final parse


async def response_events(
    req: ResponsesRequest,
    reader: Reader,
    first: tuple[str, Any],
    gone: asyncio.Future,
    *,
    rid: str,
    created: int,
    model: str,
    tokenizer: Any,
    on_result: Callable[[MMResult], None],
) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed response (module docstring); ``first`` is the reader's first item."""
    seq = itertools.count()
    mid = message_id(rid)

    def event(kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: ".encode() + dumps({"type": kind, "sequence_number": next(seq), **fields}) + b"\n\n"

    def shell(status: str) -> dict:
        return response_object(rid, created, model, req, status=status, tokenizer=tokenizer)

    yield event("response.created", response=shell("in_progress"))
    yield event("response.in_progress", response=shell("in_progress"))
    text = AnswerText(tokenizer, req.config.stop_strings, rid, req.request.reads_tool_calls)
    sent: list[str] = []  # the message's text pieces; none yet: no message item
    pending: list[dict[str, Any]] = []  # log-probabilities of tokens whose text has not gone out yet
    every: list[dict[str, Any]] = []

    def message_delta(piece: str) -> list[bytes]:
        out = []
        if not sent:
            out.append(event("response.output_item.added", output_index=0, item=message_item(mid, None, "in_progress")))
            out.append(event("response.content_part.added", item_id=mid, output_index=0, content_index=0, part=output_text("")))
        sent.append(piece)
        if piece:
            out.append(event("response.output_text.delta", item_id=mid, output_index=0, content_index=0, delta=piece, logprobs=pending[:]))
            pending.clear()
        return out

    item = first
    while True:
        kind, value = item
        if kind == "error":
            if not isinstance(value, CancelledError):
                err = responses_error(error_of(value))
                yield event("error", code=err.code, message=err.message, param=err.param)
                failure = {"code": "server_error", "message": err.message}
                yield event("response.failed", response={**shell("failed"), "error": failure})
            return
        if kind == "events":
            lp = answer_logprobs(value, tokenizer, req.top_logprobs)  # the step's tokens ride on its next delta
            pending.extend(lp)
            every.extend(lp)
            piece = text.step([ev.token_id for ev in value])
            for chunk in message_delta(piece) if piece else ():
                yield chunk
        else:
            res: MMResult = value
            break
        item = await reader.get(gone)
        if item is None:
            return  # the client went away: the response's on_close cancels the row
    _, calls = answer_parts(res, rid)
    piece = text.finish(res)
    if piece or (not sent and not calls):  # an answer without calls always has its message, if empty
        for chunk in message_delta(piece):
            yield chunk
    if sent:
        joined = "".join(sent)
        status = "incomplete" if is_cut(res) else "completed"
        yield event("response.output_text.done", item_id=mid, output_index=0, content_index=0, text=joined, logprobs=every)
        yield event("response.content_part.done", item_id=mid, output_index=0, content_index=0, part=output_text(joined, every))
        yield event("response.output_item.done", output_index=0, item=message_item(mid, joined, status, every))
    first_call = 1 if sent else 0
    for i, call in enumerate(calls):
        index, fid, args = first_call + i, function_call_id(rid, i), call["function"]["arguments"]
        yield event("response.output_item.added", output_index=index, item=function_item(fid, call, "in_progress", ""))
        yield event("response.function_call_arguments.delta", item_id=fid, output_index=index, delta=args)
        yield event("response.function_call_arguments.done", item_id=fid, output_index=index, arguments=args, name=call["function"]["name"])
        yield event("response.output_item.done", output_index=index, item=function_item(fid, call, "completed"))
    await asyncio.to_thread(on_result, res)  # a shared store's write may wait on another process's lock
    body = response_object(rid, created, model, req, res, tokenizer=tokenizer)
    yield event("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)


def add_responses_route(
    app: FastAPI,
    state: Any,
    *,
    submit: Callable[[ChatRequest], list[Any]],
    forget: Callable[[Any], None],
    end: Callable[[list[Any], asyncio.Future], None],
    store: ResponseStore | None = None,
) -> ResponseStore:
    """Register ``POST /v1/responses`` on ``app`` with the chat endpoint's helpers (the key check, the body's size
    limit, the scheduler's rows) and ``store`` (:mod:`.responses_store`; None: a new one in this process's memory);
    returns the store (also ``app.state.responses_store``)."""
    store = app.state.responses_store = MemoryResponseStore() if store is None else store

    def stored(rid: str) -> list[dict[str, Any]]:
        history = store.get(rid)
        if history is None:
            raise bad_request(
                f"{field_value('previous_response_id', rid)} names no stored response: {store.advice()}",
                "previous_response_id",
                "previous_response_not_found",
            )
        return history

    def parse(body: CreateResponseRequest) -> ResponsesRequest:
        return parse_responses_request(
            body,
            stored=stored,
            allow_local_images=state.allow_local_images,
            max_images=state.max_images,
            base=state.base_config,
            compression=state.compression,
        )

    @app.post("/v1/responses", responses=answer_docs("Response"))
    async def responses(request: HTTPRequest, body: CreateResponseRequest) -> Response:
        """A response (OpenAI's Responses API; the ``asymspec`` object sets the method and its options)."""
        req = await asyncio.to_thread(lambda: parse(body))
        try:
            handles = submit(ChatRequest(request=req.request))
        except RequestError as err:  # refused before it queued: named by the Responses fields
            raise responses_error(err) from None
        handle = handles[0]
        reader = Reader(handle, asyncio.get_running_loop(), state.metrics, lambda: forget(handle))
        gone = asyncio.ensure_future(until_disconnected(request.receive))
        rid, created = f"resp_{uuid.uuid4().hex}", int(time.time())

        def keep(res: MMResult) -> None:
            if req.store:
                store.put(rid, [*req.history, answer_message(res, rid)])

        first = await reader.get(gone)  # set-up errors (e.g. a prompt over the context window) still get a status
        if first is None or first[0] == "error":
            end(handles, gone)
            if first is None:
                return Response(status_code=499)
            raise responses_error(error_of(first[1]))
        if req.stream:
            events = response_events(
                req, reader, first, gone, rid=rid, created=created, model=state.model, tokenizer=state.pipe.tokenizer, on_result=keep
            )
            return SSEResponse(events, on_close=lambda: end(handles, gone))
        try:
            item = first
            while item[0] == "events":
                item = await reader.get(gone)
                if item is None:  # the client went away: free the row
                    handle.cancel()
                    return Response(status_code=499)
            if item[0] == "error":
                raise responses_error(error_of(item[1]))
            await asyncio.to_thread(keep, item[1])  # off the event loop: a shared store's write may wait for its lock
            body = response_object(rid, created, state.model, req, item[1], tokenizer=state.pipe.tokenizer)
            return Response(dumps(body), media_type="application/json")
        finally:
            gone.cancel()

    return store
