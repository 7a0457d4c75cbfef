"""``POST /v1/chat/completions`` and ``POST /v1/completions``: the routes (:func:`add_chat_routes`) and the answers.

Both take the same way: FastAPI validates the body against the endpoint's pydantic model
(:class:`~asymspec_mm.serve.models_chat.ChatCompletionRequest`,
:class:`~asymspec_mm.serve.completions.CompletionRequest`), the model becomes one checked
:class:`~asymspec_mm.request.request.Request` (images loaded) off the event loop, each choice (``n``) is a row of
the scheduler, and the answer is one object (a ``chat.completion`` / ``text_completion`` built as the ``openai``
package's types) or server-sent chunks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.responses import Response

from .chat_answers import asymspec_object, finish_reason, logprobs_of, message_of, total_usage
from .chat_request import ChatRequest, parse_chat_request, structured_params
from .completions import CompletionRequest, choice, completion_logprobs, finish_of, parse_completion_request, text_completion
from .completions import total_usage as completion_usage
from .errors import RequestError, renamed
from .models_chat import ChatCompletionRequest
from .openapi import answer_docs
from .request_metrics import answer_metrics
from .streaming import chat_chunks, completion_chunks
from .transport import Reader, SSEResponse, dumps, error_of, until_disconnected

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI

    from ..request.session import MMResult

#: The chat field an engine error names -> the completions field.
COMPLETION_PARAMS = {"messages": "prompt"}


def structured(body: Any, params: dict[str, str]) -> dict[str, str]:
    """``params`` naming ``structured_outputs`` where the engine names the ``response_format`` it became."""
    return {**params, **structured_params(body)}


def add_chat_routes(app: FastAPI, state: Any, *, submit: Callable[[ChatRequest], list[Any]], forget: Callable, end: Callable) -> None:
    """Register ``POST /v1/chat/completions`` and ``POST /v1/completions`` on ``app`` (``submit`` puts a request's
    rows in the scheduler; ``forget`` / ``end`` drop and cancel them)."""
    tokenizer = state.pipe.tokenizer
    special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())

    def logprobs(trace: list, req: ChatRequest) -> dict | None:
        return None if req.top_logprobs is None else logprobs_of(trace, tokenizer, req.top_logprobs, special)

    async def answer(
        request: Request, req: ChatRequest, prefix: str, whole: Callable, chunks: Callable, params: dict[str, str]
    ) -> Response:
        try:
            handles = submit(req)
        except RequestError as err:  # refused before it queued: named as this endpoint names the field
            raise renamed(err, params) from None
        loop = asyncio.get_running_loop()
        readers = [Reader(h, loop, state.metrics, lambda h=h: forget(h)) for h in handles]
        gone = asyncio.ensure_future(until_disconnected(request.receive))
        cid, created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            firsts = []
            for reader in readers:  # set-up errors (e.g. a prompt over the context window) still get a status
                first = await reader.get(gone)
                if first is None or first[0] == "error":
                    end(handles, gone)
                    if first is None:
                        return Response(status_code=499)
                    raise renamed(error_of(first[1]), params)
                firsts.append(first)
            stream = chunks(req, readers, firsts, gone, cid=cid, created=created, model=state.model, tokenizer=tokenizer, logprobs=logprobs)
            return SSEResponse(stream, on_close=lambda: end(handles, gone))
        try:
            results = []
            for reader in readers:  # the choices decode side by side; their results are read in order
                while True:
                    item = await reader.get(gone)
                    if item is None:  # the client went away: free the rows
                        for h in handles:
                            h.cancel()
                        return Response(status_code=499)
                    kind, value = item
                    if kind == "error":
                        for h in handles:
                            h.cancel()
                        raise renamed(error_of(value), params)
                    if kind == "result":
                        results.append(value)
                        break
            return Response(dumps(whole(results, req, cid, created)), media_type="application/json")
        finally:
            gone.cancel()

    def chat_completion(results: list[MMResult], req: ChatRequest, cid: str, created: int) -> dict:
        """The answer with one choice per result; usage adds the choices' completion tokens (the prompt once), and
        ``asymspec`` is the first choice's (``asymspec.choices`` holds every choice's when there are several)."""
        from openai.types.chat import ChatCompletion

        choices = [
            {
                "index": i,
                "message": {"refusal": None, **message_of(res, f"{cid}-{i}" if i else cid)},
                "logprobs": logprobs(res.trace, req),
                "finish_reason": finish_reason(res),
            }
            for i, res in enumerate(results)
        ]
        info = asymspec_object(results[0], tokenizer, req.request.return_trace)
        if len(results) > 1:
            info["choices"] = [asymspec_object(res, tokenizer, req.request.return_trace) for res in results]
        body = {"id": cid, "object": "chat.completion", "created": created, "model": state.model, "choices": choices}
        body.update(usage=total_usage(results), asymspec=info, metrics=answer_metrics(results))
        return ChatCompletion.model_validate(body).model_dump(mode="json", exclude_unset=True, warnings=False)

    def completion(results: list[MMResult], req: ChatRequest, cid: str, created: int) -> dict:
        """A ``text_completion`` with one choice per result (the answer's text, its tokens' log-probabilities when
        asked), the usage and the ``asymspec`` object of the first choice."""
        choices = []
        for i, res in enumerate(results):
            lp = logprobs(res.trace, req)
            choices.append(choice(i, res.text, finish_of(res), None if lp is None else completion_logprobs(lp["content"])))
        info = asymspec_object(results[0], tokenizer, req.request.return_trace)
        usage = completion_usage(results)
        return text_completion(cid, created, state.model, choices, usage=usage, asymspec=info, metrics=answer_metrics(results))

    @app.post("/v1/chat/completions", responses=answer_docs("ChatCompletion"))
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """A chat completion (OpenAI's chat completions API; the ``asymspec`` object sets the method and its options)."""
        req = await asyncio.to_thread(
            lambda: parse_chat_request(
                body,
                allow_local_images=state.allow_local_images,
                max_images=state.max_images,
                base=state.base_config,
                compression=state.compression,
            )
        )
        return await answer(request, req, "chatcmpl", chat_completion, chat_chunks, structured(body, {}))

    @app.post("/v1/completions", responses=answer_docs("Completion"))
    async def completions(request: Request, body: CompletionRequest) -> Response:
        """A text completion: the prompt answered as one user message without an image."""
        params = structured(body, COMPLETION_PARAMS)
        req = await asyncio.to_thread(lambda: renamed_parse(body, params))
        return await answer(request, req, "cmpl", completion, completion_chunks, params)

    def renamed_parse(body: CompletionRequest, params: dict[str, str]) -> ChatRequest:
        try:
            return parse_completion_request(body, base=state.base_config)
        except RequestError as err:
            raise renamed(err, params) from None
