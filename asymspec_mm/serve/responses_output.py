"""The Responses API's answers: the ``response`` object (output items, usage, status) of a finished
:class:`~asymspec_mm.request.session.MMResult`, and the assistant message a stored conversation keeps
(:func:`answer_message`; the stores behind ``previous_response_id`` are in :mod:`.responses_store`).

An answer is a ``message`` item (its ``output_text``) or, when it calls tools, a ``message`` with the text before
the first call (none when there is none) and a ``function_call`` item per call (``call_id``, ``name``,
``arguments``: the JSON text the model wrote), read by :func:`~asymspec_mm.request.tools.parse_tool_calls` with
the response's id as the calls' id prefix, as chat completions read them. An answer cut by the token budget has
``status: "incomplete"`` and ``incomplete_details.reason: "max_output_tokens"``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..request.tools import parse_tool_calls
from .chat_answers import asymspec_object, logprobs_of, usage
from .request_metrics import answer_metrics

if TYPE_CHECKING:  # pragma: no cover
    from ..request.session import MMResult
    from .responses_api import ResponsesRequest


def answer_parts(res: MMResult, rid: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, calls)``: the answer's text and no calls, or with tool calls the text before the first call
    (``None`` when empty) and the calls in the chat shape, their ids drawn from the response id ``rid``."""
    if not res.tool_calls:
        return res.text, []
    parsed = parse_tool_calls(res.text, rid, finished=not res.cut_by_budget)
    return parsed.content, parsed.tool_calls


def message_id(rid: str) -> str:
    return "msg_" + rid.removeprefix("resp_")


def function_call_id(rid: str, index: int) -> str:
    return f"fc_{rid.removeprefix('resp_')}_{index}"


def message_item(item_id: str, text: str | None, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An assistant ``message`` item; ``text`` None: still empty (no content part yet)."""
    content = [] if text is None else [output_text(text, logprobs)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An ``output_text`` part; ``logprobs``: its tokens' (``include: ["message.output_text.logprobs"]``)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def answer_logprobs(trace: list[Any], tokenizer: Any, top: int | None) -> list[dict[str, Any]]:
    """The answer's tokens' log-probabilities as chat completions compute them
    (:func:`~asymspec_mm.serve.chat_answers.logprobs_of`: each token and its ``top`` alternatives; special tokens left
    out), or none when none were asked (``top`` None). With tool calls, the calls' tokens are among them."""
    if top is None:
        return []
    special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
    return logprobs_of(trace, tokenizer, top, special)["content"]


def function_item(item_id: str, call: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
    """A ``function_call`` item of a chat-shaped call (``arguments``: in place of the call's, e.g. ``""``)."""
    fn = call["function"]
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"] if arguments is None else arguments,
    }


def is_cut(res: MMResult) -> bool:
    """Whether the token budget ended the answer (``max_output_tokens``)."""
    return res.finish_reason == "length"


def output_items(res: MMResult, rid: str, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The ``output`` of a finished answer (module docstring); ``logprobs`` go with the message's text."""
    content, calls = answer_parts(res, rid)
    items = []
    if content is not None or not calls:
        items.append(message_item(message_id(rid), content or "", "incomplete" if is_cut(res) else "completed", logprobs))
    items += [function_item(function_call_id(rid, i), call, "completed") for i, call in enumerate(calls)]
    return items


def usage_of(res: MMResult) -> dict[str, Any]:
    """``usage``: chat completions' counts (:func:`~asymspec_mm.serve.chat_answers.usage`: ``input_tokens`` is the
    verifier's prompt, ``cached_tokens`` how much of it was reused from earlier requests) in the Responses names; no
    reasoning tokens, no billed cache writes."""
    counts = usage(res)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"], "cache_write_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def response_object(
    rid: str,
    created: int,
    model: str,
    req: ResponsesRequest,
    res: MMResult | None = None,
    *,
    status: str | None = None,
    tokenizer: Any = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object: of the finished answer ``res`` (``completed`` or ``incomplete``), or without one
    (``status`` ``in_progress`` or ``failed``) as the stream announces it. The request's fields are echoed with the
    values the answer was decoded with (temperature, top_p, the token budget); ``asymspec`` is the chat
    completions' extension object (stats, view, the trace when asked) and ``metrics`` vLLM's per-request acceptance
    (:mod:`~asymspec_mm.serve.request_metrics`), both on a finished answer only."""
    cfg = req.config
    if status is None:
        status = "incomplete" if res is not None and is_cut(res) else "completed"
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output_items(res, rid, answer_logprobs(res.trace, tokenizer, req.top_logprobs)) if res is not None else [],
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        **req.echo,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_output_tokens": cfg.max_new_tokens,
        "truncation": "disabled",
        "background": False,
        "service_tier": "default",
    }
    if res is not None:  # the document's usage is an object when present: absent until the answer is known
        body["usage"] = usage_of(res)
    if status in ("completed", "incomplete"):
        body["completed_at"] = int(time.time())
    if res is not None:
        body["asymspec"] = asymspec_object(res, tokenizer, req.request.return_trace)
        body["metrics"] = answer_metrics([res])  # vLLM's per-request acceptance, on the finished answer only
    return body


def answer_message(res: MMResult, rid: str) -> dict[str, Any]:
    """The answer as the assistant message a later turn's conversation holds (calls with parsed arguments)."""
    from ..request.conversation import tool_call

    content, calls = answer_parts(res, rid)
    msg: dict[str, Any] = {"role": "assistant", "content": [{"type": "text", "text": content}] if content else []}
    if calls:
        msg["tool_calls"] = [tool_call(c, f"output[{i}]") for i, c in enumerate(calls)]
    return msg
