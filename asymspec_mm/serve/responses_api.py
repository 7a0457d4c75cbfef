"""``POST /v1/responses`` bodies (OpenAI's Responses API): a validated
:class:`~asymspec_mm.serve.models_responses.CreateResponseRequest` turned into a :class:`ResponsesRequest` holding the
engine's :class:`~asymspec_mm.request.request.Request`, or refused with a 400 whose one-line message names the field
(``input[2].content[0].image_url``, ``text.format``, ...).

``input`` (a string, or a list of items) becomes the chat conversation the toolkit reads (``pipe.chat``'s
messages): ``message`` items (``user`` / ``system`` / ``developer`` with ``input_text`` and, for the user,
``input_image`` parts; ``assistant`` with ``output_text``), ``function_call`` items (a call the model made: an
assistant message's ``tool_calls``; consecutive calls join one message) and ``function_call_output`` items (a
``tool`` message answering its ``call_id``); ``reasoning`` items are skipped (the model writes none). ``instructions``
is a system message before them all. Images load exactly as chat completions' (:mod:`.images`: data URLs, or files
under ``--allow-local-images``). Function ``tools`` in the Responses shape (``{"type": "function", "name", ...}``),
``tool_choice`` and ``text.format`` are turned into their chat shapes (``tools``, ``tool_choice``,
``response_format``). With ``previous_response_id`` the conversation of a stored response (:mod:`.responses_output`)
comes first. The sampling fields and the ``asymspec`` object are read as in chat completions (:mod:`.chat_request`);
``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` asks for the output text's log-probabilities.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.config import AsymSpecConfig
from ..request.request import Request
from .chat_request import DEFAULT_MAX_IMAGES, DOMAIN_ADVICE, asymspec_fields, check_per_image, checked, config_of, load_images, validated
from .errors import RequestError, bad_request, renamed
from .models_responses import CreateResponseRequest, FunctionCallItem, InputImage, ReasoningItem


@dataclass
class ResponsesRequest:
    """One checked Responses request: the engine's :class:`~asymspec_mm.request.request.Request` (its ``messages``
    as ``pipe.chat`` takes them, its images decoded into ``Request.images``), the conversation to store (``history``: the messages without
    ``instructions``, images as their URLs), and what only the HTTP answer reads (streaming, storing, log-probabilities,
    the echoed fields)."""

    request: Request
    history: list[dict[str, Any]]
    stream: bool = False
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)
    top_logprobs: int | None = None  # None: no logprobs; else how many top tokens each carries

    @property
    def config(self) -> AsymSpecConfig:
        return self.request.config or AsymSpecConfig()


# ---------------------------------------------------------------------------------------------- input items
def _parts(content: Any, p: str) -> list[dict[str, Any]]:
    """A validated content (a string or parts) as text parts and ``{"type": "image_url", "url", "param"}`` parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    for j, part in enumerate(content):
        if isinstance(part, InputImage):
            out.append({"type": "image_url", "url": part.image_url, "param": f"{p}[{j}].image_url"})
        else:
            out.append({"type": "text", "text": part.text if part.type != "refusal" else part.refusal})
    return out


def _call_of(item: FunctionCallItem, p: str) -> dict[str, Any]:
    """A ``function_call`` item as a chat tool call (arguments parsed to an object)."""
    from ..request.conversation import ConversationError, tool_call

    call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
    try:
        return tool_call(call, p)
    except ConversationError as exc:
        raise bad_request(str(exc).replace(f"{p}.function.", f"{p}."), f"{p}.arguments") from None


def input_messages(req: CreateResponseRequest, param: str = "input") -> list[dict[str, Any]]:
    """``input`` as chat messages whose image parts are ``{"type": "image_url", "url", "param"}`` (see the module
    docstring); not checked as a conversation yet."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": [{"type": "text", "text": req.input}]}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        p = f"{param}[{i}]"
        if isinstance(item, ReasoningItem):
            continue  # the model's hidden reasoning from another server: this model writes none and reads none
        if item.type == "message":
            out.append({"role": item.role, "content": _parts(item.content, f"{p}.content")})
        elif item.type == "function_call":
            call = _call_of(item, p)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the calls of one answer: one assistant message
            else:
                out.append({"role": "assistant", "content": [], "tool_calls": [call]})
        else:
            out.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _parts(item.output, f"{p}.output"), "param": f"{p}.call_id"}
            )
    return out


def check_conversation(messages: list[dict[str, Any]], max_images: int) -> list[tuple[str, str]]:
    """Check the whole conversation (stored history, instructions and input): every function output answers an
    earlier call, the last message is the user's (with text) or a function output, at most ``max_images`` images;
    every image's ``(url, param)``, in order."""
    known: set[str] = set()
    images: list[tuple[str, str]] = []
    for msg in messages:
        known.update(c["id"] for c in msg.get("tool_calls", ()))
        if msg["role"] == "tool" and msg["tool_call_id"] not in known:
            raise bad_request(
                f"a function_call_output's call_id={json.dumps(msg['tool_call_id'])[:40]} names no earlier function_call "
                f"({', '.join(sorted(known)) or 'there is none'}): send the function_call item before its output",
                msg.get("param", "input"),
                "unknown_tool_call_id",
            )
        images.extend((part["url"], part["param"]) for part in msg["content"] if part["type"] == "image_url")
    if len(images) > max_images:
        raise bad_request(
            f"the conversation has more than {max_images} images (the server's --max-images); send fewer or raise the limit",
            images[max_images][1],
            "too_many_images",
        )
    if not messages:  # every input item was one the conversation skips (reasoning)
        raise bad_request(
            "input holds no message to answer (reasoning items are not read): send the user's message or a function_call_output",
            "input",
        )
    last = messages[-1]
    if last["role"] not in ("user", "tool"):
        raise bad_request(
            f"the conversation ends with {'an' if last['role'] == 'assistant' else 'a'} {last['role']} message: end with the "
            "user's message or a function_call_output to answer",
            "input",
        )
    if last["role"] == "user" and not "".join(p["text"] for p in last["content"] if p["type"] == "text").strip():
        raise bad_request(
            "the last user message's text is empty: ask a question about the image, e.g. 'What is the largest value?'",
            "input",
            "empty_question",
        )
    return images


# ---------------------------------------------------------------------------------------------- tools, format
def chat_tools(req: CreateResponseRequest) -> list[dict[str, Any]] | None:
    """Responses function tools as the chat tools the toolkit takes."""
    if req.tools is None:
        return None
    return [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in req.tools]


def chat_tool_choice(req: CreateResponseRequest, tools: list[dict[str, Any]] | None) -> Any:
    """``tool_choice`` (``auto``, ``none``, ``required`` or ``{"type": "function", "name"}``) in the chat shape."""
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice  # the engine's check names a choice that needs tools
    names = [t["function"].get("name") for t in tools or ()]
    if choice.name not in names:
        raise bad_request(
            f"tool_choice={json.dumps(choice.model_dump())[:60]} must name one of the offered tools ({', '.join(map(str, names)) or 'none is offered'})",
            "tool_choice",
        )
    return {"type": "function", "function": {"name": choice.name}}


def response_format_of(req: CreateResponseRequest) -> dict[str, Any] | None:
    """``text.format`` as the chat ``response_format`` (``text``: none; ``json_object``; ``json_schema``)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    spec = {
        "name": fmt.name,
        "schema": fmt.schema_,
        **{k: v for k, v in (("description", fmt.description), ("strict", fmt.strict)) if v is not None},
    }
    return {"type": "json_schema", "json_schema": spec}


#: The chat field an engine error names -> the Responses field (a path's head is renamed: ``response_format.regex``
#: -> ``text.format.regex``; see :func:`~asymspec_mm.serve.errors.renamed_param`).
PARAMS = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "messages": "input",
}
#: A chat tool's path (``tools[0].function.parameters``) and the Responses one (``tools[0].parameters``).
_CHAT_TOOL = re.compile(r"\b(tools\[\d+\])\.function\.")


def responses_error(err: RequestError) -> RequestError:
    """An engine (chat-shaped) error named by the Responses fields: ``max_output_tokens``, ``input``,
    ``text.format.schema``, ``tools[0].parameters``, in its param and its message."""
    err = renamed(err, PARAMS)
    err.message = _CHAT_TOOL.sub(r"\1.", err.message.replace("response_format", "text.format"))
    if err.param is not None:
        err.param = _CHAT_TOOL.sub(r"\1.", err.param)
    return err


# ---------------------------------------------------------------------------------------------- the body
def parse_responses_request(
    data: dict | CreateResponseRequest,
    *,
    stored: Callable[[str], list[dict[str, Any]]] | None = None,
    allow_local_images: Path | None = None,
    base: AsymSpecConfig | None = None,
    max_images: int = DEFAULT_MAX_IMAGES,
    compression: Any = None,
) -> ResponsesRequest:
    """The :class:`ResponsesRequest` of a body (a parsed JSON object, validated here, or the validated model) with
    its images loaded; ``stored`` gives the conversation a ``previous_response_id`` names, or raises the 400 naming
    the field (None: no store); ``compression`` the server's default."""
    req = data if isinstance(data, CreateResponseRequest) else validated(CreateResponseRequest, data)
    try:
        return _responses_request(req, stored, allow_local_images, base, max_images, compression)
    except RequestError as err:  # a field a carrier brought is named as the client sent it
        raise renamed(err, req.carried) from None


def _responses_request(
    req: CreateResponseRequest,
    stored: Callable[[str], list[dict[str, Any]]] | None,
    allow_local_images: Path | None,
    base: AsymSpecConfig | None,
    max_images: int,
    compression: Any,
) -> ResponsesRequest:
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        if stored is None:
            raise bad_request("previous_response_id needs a response store; send the whole conversation in input", "previous_response_id")
        history = stored(req.previous_response_id)
    config = config_of(req, base, req.max_output_tokens, req.logprobs)
    conversation = [*history, *input_messages(req)]
    system = [{"role": "system", "content": [{"type": "text", "text": req.instructions}]}] if req.instructions else []
    refs = check_conversation(system + conversation, max_images)
    check_per_image(req.asymspec, len(refs))
    tools = chat_tools(req)
    order = iter(range(len(refs)))  # image parts hold their index in refs until the images load
    messages = [
        {
            **{k: v for k, v in m.items() if k != "param"},
            "content": [{"type": "image", "image": next(order)} if p["type"] == "image_url" else p for p in m["content"]],
        }
        for m in system + conversation
    ]
    request = Request(
        messages=messages,
        config=config,
        **asymspec_fields(req.asymspec, compression),
        tools=tools,
        tool_choice=chat_tool_choice(req, tools),
        response_format=response_format_of(req),
        domain_advice=DOMAIN_ADVICE,
    )
    try:
        request = checked(request)  # before the images load: a bad tool costs no decoding
    except RequestError as err:
        raise responses_error(err) from None
    request = load_images(request, refs, allow_local_images)
    echo = {
        "instructions": req.instructions,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "tool_choice": _choice_echo(req.tool_choice, tools),
        "text": _text_echo(req),
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_logprobs": req.top_logprobs,
        "previous_response_id": req.previous_response_id,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "metadata": None if req.metadata is None else req.metadata.model_dump(exclude_unset=True),
        "store": req.store is not False,
    }
    if req.user is not None:
        echo["user"] = req.user
    kept = [stored_message(m) for m in conversation]
    return ResponsesRequest(
        request=request, history=kept, stream=bool(req.stream), store=echo["store"], echo=echo, top_logprobs=req.logprobs
    )


def stored_message(msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` as a stored response keeps it: an image that fails to load in a later turn is named by that turn's
    ``previous_response_id``."""
    parts = [{**p, "param": "previous_response_id"} if p["type"] == "image_url" else p for p in msg["content"]]
    return {**{k: v for k, v in msg.items() if k != "param"}, "content": parts}


def _choice_echo(choice: Any, tools: list | None) -> Any:
    if choice is None:
        return "auto" if tools else "none"
    return choice if isinstance(choice, str) else choice.model_dump()


def _text_echo(req: CreateResponseRequest) -> dict[str, Any]:
    """``text`` as the response echoes it: the format (``text`` when absent; a schema's default name filled in)."""
    text = req.text
    fmt = text.format.model_dump(by_alias=True, exclude_none=True) if text is not None and text.format is not None else {"type": "text"}
    out: dict[str, Any] = {"format": fmt}
    if text is not None and text.verbosity is not None:
        out["verbosity"] = text.verbosity
    return out
