"""A streamed chat answer as server-sent events: :func:`chat_chunks` interleaves the choices of one request (``n``)
as their steps arrive, each chunk naming its choice's ``index`` (OpenAI's layout for ``n > 1``); one choice is the
case ``n = 1``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any

from ..request.tools import ToolCallStream, parse_tool_calls
from .chat_answers import TextDeltas, asymspec_object, finish_reason, total_usage, trace_entry
from .request_metrics import answer_metrics
from .transport import Reader, dumps, error_of

if TYPE_CHECKING:  # pragma: no cover
    from ..request.session import MMResult
    from .chat_request import ChatRequest

#: One update of one choice: its index and its reader's ``(kind, value)``.
Update = tuple[int, tuple[str, Any]]


def call_id(cid: str, index: int) -> str:
    """The id of choice ``index``'s tool calls, as the non-streamed answer names them."""
    return f"{cid}-{index}" if index else cid


class ChoiceDeltas:
    """One choice's message as OpenAI deltas while it grows: plain ``content`` pieces, or with tools offered the
    content and tool-call pieces of :class:`~asymspec_mm.request.tools.ToolCallStream`: a call once its block has
    closed and parsed, content once no continuation can change it, so that the deltas joined are the non-streamed
    message (:func:`~asymspec_mm.serve.chat_answers.message_of`; its ``None`` content streams as no content)."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...], call_prefix: str, tools: bool):
        self.text_deltas = TextDeltas(tokenizer, stop_strings)
        self.calls = ToolCallStream(call_prefix) if tools else None
        self.call_prefix = call_prefix
        self.text = ""  # the answer so far, as the deltas sent it

    def step(self, token_ids: list[int]) -> list[dict]:
        """The deltas of one step's committed tokens."""
        return self._deltas(self.text_deltas.push(token_ids))

    def finish(self, result: MMResult) -> list[dict]:
        """The deltas that complete the message once ``result`` is known."""
        return self._deltas(self.text_deltas.finish(result.text), result)

    def _deltas(self, piece: str, final: MMResult | None = None) -> list[dict]:
        self.text += piece
        if self.calls is None:
            return [{"content": piece}] if piece else []
        if final is None:
            return self.calls.push(self.text)
        return self.calls.finish(final.text, parse_tool_calls(final.text, self.call_prefix, finished=not final.cut_by_budget))


async def updates(readers: list[Reader], firsts: list[tuple[str, Any]], gone: asyncio.Future) -> AsyncIterator[Update]:
    """Every choice's updates in the order they arrive (each choice's ``firsts`` item first), until every choice has
    ended (a result or an error); stops early once the client has gone (``gone`` done)."""
    waiting: dict[asyncio.Future, int] = {}

    def wait_on(i: int) -> None:
        waiting[asyncio.ensure_future(readers[i].queue.get())] = i

    for i, item in enumerate(firsts):
        yield i, item
        if item[0] == "events":
            wait_on(i)
    try:
        while waiting:
            done, _ = await asyncio.wait({*waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone in done:
                return
            for getter in sorted((g for g in done if g in waiting), key=waiting.get):
                i = waiting.pop(getter)
                item = getter.result()
                yield i, item
                if item[0] == "events":
                    wait_on(i)
    finally:
        for getter in waiting:
            getter.cancel()


async def chat_chunks(
    req: ChatRequest,
    readers: list[Reader],
    firsts: list[tuple[str, Any]],
    gone: asyncio.Future,
    *,
    cid: str,
    created: int,
    model: str,
    tokenizer: Any,
    logprobs: Callable[[list, ChatRequest], dict | None],
) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed answer with ``len(readers)`` choices: each choice's role, a chunk per
    committed step (with that step's provenance under ``asymspec.trace`` when asked), its finish reason with stats and
    view; then, when asked, the usage chunk (every choice's tokens, and vLLM's per-request ``metrics``) and ``[DONE]`` once all have finished. A choice that fails ends the
    stream with the error (the other choices are cancelled when the response closes)."""
    stops, tools = req.config.stop_strings, req.request.reads_tool_calls  # as the session decodes
    choices = [ChoiceDeltas(tokenizer, stops, call_id(cid, i), tools) for i in range(len(readers))]
    results: dict[int, MMResult] = {}

    def chunk(index: int, delta: dict, finish: str | None = None, lp: dict | None = None, **extra: Any) -> bytes:
        body = chat_chunk(cid, created, model, [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}], **extra)
        return b"data: " + dumps(body) + b"\n\n"

    for i in range(len(choices)):
        yield chunk(i, {"role": "assistant", "content": ""})
    # closed with the stream, so a choice's pending read is cancelled at once (an error or hang-up ends it early)
    async with contextlib.aclosing(updates(readers, firsts, gone)) as items:
        async for i, (kind, value) in items:
            if kind == "events":
                out = choices[i].step([ev.token_id for ev in value])
                lp = logprobs(value, req)  # the step's tokens ride on its first chunk
                if req.request.return_trace or lp is not None:
                    extra = {"asymspec": {"trace": [trace_entry(ev, tokenizer) for ev in value]}} if req.request.return_trace else {}
                    out = out or [{"content": ""}]
                    yield chunk(i, out[0], lp=lp, **extra)
                    out = out[1:]
                for delta in out:
                    yield chunk(i, delta)
            elif kind == "result":
                for delta in choices[i].finish(value):
                    yield chunk(i, delta)
                yield chunk(i, {}, finish_reason(value), asymspec=asymspec_object(value, tokenizer, False))
                results[i] = value
            else:
                if not isinstance(value, CancelledError):
                    yield b"data: " + dumps(error_of(value).body()) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                return
    if len(results) < len(choices):
        return  # the client disconnected: the response's on_close cancels the rows
    if req.include_usage:
        done = [results[i] for i in range(len(choices))]
        body = chat_chunk(cid, created, model, [], usage=total_usage(done), metrics=answer_metrics(done))
        yield b"data: " + dumps(body) + b"\n\n"
    yield b"data: [DONE]\n\n"


def chat_chunk(cid: str, created: int, model: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` (built as the ``openai`` package's ``ChatCompletionChunk``: only the fields given)."""
    from openai.types.chat import ChatCompletionChunk

    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices, **extra}
    return ChatCompletionChunk.model_validate(body).model_dump(mode="json", exclude_unset=True, warnings=False)


async def completion_chunks(
    req: ChatRequest,
    readers: list[Reader],
    firsts: list[tuple[str, Any]],
    gone: asyncio.Future,
    *,
    cid: str,
    created: int,
    model: str,
    tokenizer: Any,
    logprobs: Callable[[list, ChatRequest], dict | None],
) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed text completion: a ``text_completion`` chunk per committed step of each
    choice (its text, its tokens' log-probabilities when asked), the choice's finish reason, then the usage chunk
    (with vLLM's per-request ``metrics``) when asked and ``[DONE]``; a failing choice ends the stream with the error."""
    from .completions import choice, completion_logprobs, finish_of, text_completion
    from .completions import total_usage as completion_usage

    texts = [TextDeltas(tokenizer, req.config.stop_strings) for _ in readers]
    offsets = [0] * len(readers)  # characters of each choice's answer whose tokens' logprobs were sent
    results: dict[int, MMResult] = {}

    def chunk(index: int, text: str, finish: str | None = None, lp: dict | None = None, **extra: Any) -> bytes:
        return b"data: " + dumps(text_completion(cid, created, model, [choice(index, text, finish, lp)], **extra)) + b"\n\n"

    async with contextlib.aclosing(updates(readers, firsts, gone)) as items:
        async for i, (kind, value) in items:
            if kind == "events":
                piece, lp = texts[i].push([ev.token_id for ev in value]), logprobs(value, req)
                if lp is not None:
                    lp = completion_logprobs(lp["content"], offsets[i])
                    offsets[i] += sum(len(t) for t in lp["tokens"])
                if piece or lp is not None:
                    yield chunk(i, piece, lp=lp)
            elif kind == "result":
                yield chunk(i, texts[i].finish(value.text), finish_of(value), asymspec=asymspec_object(value, tokenizer, False))
                results[i] = value
            else:
                if not isinstance(value, CancelledError):
                    yield b"data: " + dumps(error_of(value).body()) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                return
    if len(results) < len(readers):
        return
    if req.include_usage:
        done = [results[i] for i in range(len(readers))]
        last = text_completion(cid, created, model, [], usage=completion_usage(done), metrics=answer_metrics(done))
        yield b"data: " + dumps(last) + b"\n\n"
    yield b"data: [DONE]\n\n"
