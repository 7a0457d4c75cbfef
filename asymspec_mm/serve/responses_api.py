"""``POST /v1/responses`` bodies (OpenAI's Responses API): parsed and checked into a :class:`ResponsesRequest` holding
the engine's :class:`~asymspec_mm.requests.request.Request`, or refused with a 400 whose one-line message names the
field (``input[2].content[0].image_url``, ``text.format``, ...).

``input`` (a string, or a list of items) becomes the chat conversation the toolkit reads (``pipe.chat``'s
messages): ``message`` items (``user`` / ``system`` / ``developer`` with ``input_text`` and, for the user,
``input_image`` parts; ``assistant`` with ``output_text``), ``function_call`` items (a call the model made: an
assistant message's ``tool_calls``; consecutive calls join one message) and ``function_call_output`` items (a
``tool`` message answering its ``call_id``); ``reasoning`` items are skipped (the model writes none). ``instructions``
is a system message before them all. Images load exactly as chat completions' (:mod:`.images`: data URLs, or files
under ``--allow-local-images``). Function ``tools`` in the Responses shape (``{"type": "function", "name", ...}``),
``tool_choice`` and ``text.format`` are turned into their chat shapes (``tools``, ``tool_choice``,
``response_format``). With ``previous_response_id`` the conversation of a stored response (:mod:`.responses_output`)
comes first. The sampling fields and the ``asymspec`` object are read as in chat completions (:mod:`.schema`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.config import AsymSpecConfig
from ..base.errors import UnknownOptionError
from ..base.unicode_check import find_bad_text, invalid_text_message
from ..requests.request import Request
from .errors import bad_request
from .images import load_request_image
from .sampling_fields import sampling_fields
from .schema import ASYMSPEC_OPTIONS, DEFAULT_MAX_IMAGES, asymspec_options, field_value, in_range, positive_int

#: Fields that decide the answer (or how it is sent).
USED = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stream",
    "store",
    "previous_response_id",
    "asymspec",
)

#: Fields accepted as hints (checked, echoed where the response object has them, with no effect on the answer): field -> (test, what).
HINTS: dict[str, tuple[Any, str]] = {
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "safety_identifier": (lambda v: isinstance(v, str), "a string"),
    "prompt_cache_key": (lambda v: isinstance(v, str), "a string (the server reuses prompt KV on its own)"),
    "prompt_cache_retention": (lambda v: isinstance(v, str), "a string (the server reuses prompt KV on its own)"),
    "prompt_cache_options": (lambda v: isinstance(v, dict), "an object (the server reuses prompt KV on its own)"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean; the model may make several calls either way"),
    "service_tier": (lambda v: isinstance(v, str), "a string"),
    "max_tool_calls": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1 (it bounds built-in tools)"),
    "stream_options": (lambda v: isinstance(v, dict) and set(v) <= {"include_obfuscation"}, '{"include_obfuscation": ...}'),
}

#: OpenAI fields the server cannot honour, accepted only while they hold a neutral value: field -> (test, why).
NEUTRAL: dict[str, tuple[Any, str]] = {
    "background": (lambda v: v is False, "false: responses are answered in the request"),
    "truncation": (lambda v: v == "disabled", '"disabled": a conversation over the context window is refused, not cut'),
    "top_logprobs": (lambda v: v == 0 and not isinstance(v, bool), "0: log-probabilities are served by /v1/chat/completions"),
    "reasoning": (
        lambda v: isinstance(v, dict) and v.get("effort") in (None, "none") and v.get("summary") is None,
        'null or {"effort": "none"}: the answer is decoded without a thinking phase',
    ),
    "include": (
        lambda v: isinstance(v, list) and set(v) <= {"reasoning.encrypted_content"},
        'a list of nothing but "reasoning.encrypted_content" (no reasoning items are made)',
    ),
    "conversation": (lambda v: False, "null: the Conversations API is not served; send the history in input or use previous_response_id"),
    "prompt": (lambda v: False, "null: stored prompt templates are not served; send instructions and input"),
    "context_management": (lambda v: False, "null"),
    "background_options": (lambda v: False, "null"),
    "access_programs": (lambda v: False, "null"),
    "moderation": (lambda v: False, "null"),
    "image": (lambda v: False, "null"),
}

_SYSTEM_ROLES = ("system", "developer")
_ROLES = (*_SYSTEM_ROLES, "user", "assistant")


@dataclass
class ResponsesRequest:
    """One checked Responses request: the engine's :class:`~asymspec_mm.requests.request.Request` (its ``messages``
    as ``pipe.chat`` takes them, every image loaded), the conversation to store (``history``: the messages without
    ``instructions``, images as their URLs), and what only the HTTP answer reads (streaming, storing, the echoed
    fields)."""

    request: Request
    history: list[dict[str, Any]]
    stream: bool = False
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> AsymSpecConfig:
        return self.request.config or AsymSpecConfig()


# ---------------------------------------------------------------------------------------------- input items
def _text_of(part: Mapping, p: str, key: str = "text") -> str:
    if not isinstance(part.get(key), str):
        raise bad_request(f"{p}.{key} must be a string", f"{p}.{key}")
    return part[key]


def _image_url(part: Mapping, p: str) -> str:
    if part.get("file_id") is not None:
        raise bad_request(
            f"{p}.file_id: uploaded files are not served here; send the image as a data URL in image_url", f"{p}.file_id", "unsupported"
        )
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    if not isinstance(url, str) or not url.strip():
        raise bad_request(f"{p}.image_url must be a data URL ('data:image/png;base64,...')", f"{p}.image_url")
    return url


def _parts(content: Any, p: str, role: str) -> list[dict[str, Any]]:
    """A message's (or a function output's) content as text parts and ``{"type": "image_url", "url", "param"}``
    parts; images only where the chat messages take them (a user's message, a tool's output)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{p} must be a string or a list of content parts", p)
    out = []
    for j, part in enumerate(content):
        q = f"{p}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text"):
            out.append({"type": "text", "text": _text_of(part, q)})
        elif kind == "refusal":
            out.append({"type": "text", "text": _text_of(part, q, "refusal")})
        elif kind == "input_image":
            if role not in ("user", "tool"):
                raise bad_request(
                    f"{q}: images go in user messages and function_call_output items only; move it there", q, "image_not_in_user_message"
                )
            out.append({"type": "image_url", "url": _image_url(part, q), "param": f"{q}.image_url"})
        elif kind == "input_file":
            raise bad_request(
                f"{q}: files are not served here; send text as input_text and images as input_image", f"{q}.type", "unsupported"
            )
        else:
            raise bad_request(
                f"{q} has type {json.dumps(kind)[:40]}; content parts are input_text, input_image (user) and output_text (assistant)",
                f"{q}.type",
            )
    return out


def _call_of(item: Mapping, p: str) -> dict[str, Any]:
    """A ``function_call`` item as a chat tool call (arguments parsed to an object)."""
    from ..requests.conversation import ConversationError, tool_call

    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"{p}.{key} must be a string", f"{p}.{key}")
    call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
    try:
        return tool_call(call, p)
    except ConversationError as exc:
        raise bad_request(str(exc).replace(f"{p}.function.", f"{p}."), f"{p}.arguments") from None


def input_messages(raw: Any, param: str = "input") -> list[dict[str, Any]]:
    """``input`` as chat messages whose image parts are ``{"type": "image_url", "url", "param"}`` (see the module
    docstring); not checked as a conversation yet."""
    if isinstance(raw, str):
        return [{"role": "user", "content": [{"type": "text", "text": raw}]}]
    if not isinstance(raw, list):
        raise bad_request(f"{param} must be a string or a list of input items", param)
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        p = f"{param}[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"{p} must be an object (a message, function_call or function_call_output item)", p)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"{p} has role {json.dumps(role)[:40]}; use 'user', 'system', 'developer' or 'assistant'", f"{p}.role")
            out.append({"role": role, "content": _parts(item.get("content"), f"{p}.content", role)})
        elif kind == "function_call":
            call = _call_of(item, p)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the calls of one answer: one assistant message
            else:
                out.append({"role": "assistant", "content": [], "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_request(f"{p}.call_id must be a string (the call_id of the function_call it answers)", f"{p}.call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _parts(item.get("output"), f"{p}.output", "tool")})
        elif kind == "reasoning":
            continue  # the model's hidden reasoning from another server: this model writes none and reads none
        else:
            raise bad_request(
                f"{p} has type {json.dumps(kind)[:40]}; input items are message, function_call and function_call_output"
                + (" (item references need the items themselves: send them)" if kind == "item_reference" else ""),
                f"{p}.type",
                "unsupported",
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
def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools as the chat tools the toolkit takes; other tool types are refused."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request('tools must be a list of {"type": "function", "name": ..., "parameters": {...}} objects', "tools")
    out = []
    for i, tool in enumerate(tools):
        p = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise bad_request(
                f"{p} has type {json.dumps(kind)[:40]}; this server runs function tools only "
                '({"type": "function", "name": ..., "parameters": {...}}): the client runs them',
                f"{p}.type",
                "unsupported",
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    """``tool_choice`` (``auto``, ``none``, ``required`` or ``{"type": "function", "name"}``) in the chat shape."""
    if choice is None or isinstance(choice, str):
        return choice  # the engine's check names a bad string
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        names = [t["function"].get("name") for t in tools or ()]
        if choice.get("name") not in names:
            raise bad_request(
                f"{field_value('tool_choice', choice)} must name one of the offered tools ({', '.join(map(str, names)) or 'none is offered'})",
                "tool_choice",
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(
        f'{field_value("tool_choice", choice)} is not supported; use "auto", "none", "required" or {{"type": "function", "name": ...}}',
        "tool_choice",
        "unsupported",
    )


def response_format_of(text: Any) -> Any:
    """``text.format`` as the chat ``response_format`` (``text``: none; ``json_object``; ``json_schema`` with its
    ``name`` and ``schema``); ``text.verbosity`` is a hint."""
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise bad_request('text must be an object, e.g. {"format": {"type": "text"}}', "text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise bad_request(f"text.{unknown[0]} is not supported; text takes format and verbosity", f"text.{unknown[0]}", "unknown_field")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), Mapping):
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": {"name": "response", **spec}}
    raise bad_request(
        f'{field_value("text.format", fmt)} is not {{"type": "text"}}, {{"type": "json_object"}} or '
        '{"type": "json_schema", "name": ..., "schema": {...}}',
        "text.format",
    )


#: The chat field an engine error names -> the Responses field.
PARAMS = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input"}


def _checked(request: Request) -> Request:
    from ..requests.tools import ToolError

    try:
        return request.checked()
    except ToolError as exc:
        param = PARAMS.get(exc.param, exc.param)
        code = "unsupported" if param in ("tool_choice", "text.format") else "invalid_value"
        message = str(exc).replace("response_format", "text.format").replace(".function.", ".")  # the Responses shapes
        raise bad_request(message, param, code) from None
    except UnknownOptionError as exc:
        raise bad_request(str(exc), PARAMS.get(getattr(exc, "param", None), getattr(exc, "param", None))) from None


# ---------------------------------------------------------------------------------------------- the body
def _check_fields(data: dict) -> None:
    unknown = sorted(set(data) - set(USED) - set(HINTS) - set(NEUTRAL))
    if unknown:
        raise bad_request(
            f'unknown request field(s) {", ".join(unknown)}; AsymSpec options go under "asymspec" ({", ".join(ASYMSPEC_OPTIONS)})',
            unknown[0],
            "unknown_field",
        )
    for table, refused in ((NEUTRAL, True), (HINTS, False)):
        for name, (ok, why) in table.items():
            if data.get(name) is not None and not ok(data[name]):
                what = "is not supported; it must be absent or" if refused else "must be"
                raise bad_request(f"{field_value(name, data[name])} {what} {why}", name, "unsupported" if refused else "invalid_value")
    if data.get("stream_options") is not None and not data.get("stream"):
        raise bad_request("stream_options is only allowed with stream=true", "stream_options")
    if (bad := find_bad_text(data)) is not None:  # the whole body: every field a tokenizer or a log may read
        raise bad_request(invalid_text_message(*bad), bad[0], "invalid_text")
    for name in ("model", "instructions", "previous_response_id"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise bad_request(f"{name} must be a string", name)
    for name in ("stream", "store"):
        if data.get(name) is not None and not isinstance(data[name], bool):
            raise bad_request(f"{name} must be true or false", name)


def parse_responses_request(
    data: dict,
    *,
    stored: Callable[[str], list[dict[str, Any]]] | None = None,
    allow_local_images: Path | None = None,
    base: AsymSpecConfig | None = None,
    max_images: int = DEFAULT_MAX_IMAGES,
) -> ResponsesRequest:
    """Check an already-parsed body (:func:`~asymspec_mm.serve.schema.parse_json`) and load its images; ``stored``
    gives the conversation a ``previous_response_id`` names, or raises the 400 naming the field (None: no store)."""
    _check_fields(data)
    history: list[dict[str, Any]] = []
    if data.get("previous_response_id") is not None:
        if stored is None:
            raise bad_request("previous_response_id needs a response store; send the whole conversation in input", "previous_response_id")
        history = stored(data["previous_response_id"])
    fields: dict[str, Any] = {}
    if data.get("max_output_tokens") is not None:
        fields["max_new_tokens"] = in_range(
            "max_new_tokens", positive_int(data["max_output_tokens"], "max_output_tokens"), "max_output_tokens"
        )
    fields.update(sampling_fields(data))
    method, cfg_fields, other = asymspec_options(data.get("asymspec"))
    try:
        config = (base or AsymSpecConfig()).with_(**fields, **cfg_fields).validated()
    except UnknownOptionError as exc:
        raise bad_request(str(exc), "asymspec") from None
    if data.get("input") is None:
        raise bad_request("input is required: a string, or a list of message / function_call / function_call_output items", "input")
    new = input_messages(data["input"])
    if not new:
        raise bad_request("input must be a non-empty string or list of items", "input")
    for i, msg in enumerate(new):  # where a function output's unknown call_id is named
        if msg["role"] == "tool":
            msg["param"] = f"input[{i}].call_id"
    conversation = [*history, *new]
    instructions = data.get("instructions")
    system = [{"role": "system", "content": [{"type": "text", "text": instructions}]}] if instructions else []
    refs = check_conversation(system + conversation, max_images)
    tools = chat_tools(data.get("tools"))
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
        method=method,
        config=config,
        caption=other.get("caption"),
        ocr=other.get("ocr"),
        tools=tools,
        tool_choice=chat_tool_choice(data.get("tool_choice"), tools),
        response_format=response_format_of(data.get("text")),
        return_trace=other.get("return_trace", False),
    )
    request = _checked(request)  # before the images load: a bad tool costs no decoding
    loaded = [load_request_image(url, allow_local_images, param) for url, param in refs]
    for msg in messages:
        msg["content"] = [{"type": "image", "image": loaded[part["image"]]} if part["type"] == "image" else part for part in msg["content"]]
    echo = {
        "instructions": instructions,
        "tools": data.get("tools") or [],
        "tool_choice": data.get("tool_choice") or ("auto" if tools else "none"),
        "text": _text_echo(data.get("text")),
        "max_output_tokens": data.get("max_output_tokens"),
        "temperature": data.get("temperature"),
        "top_p": data.get("top_p"),
        "previous_response_id": data.get("previous_response_id"),
        "parallel_tool_calls": data.get("parallel_tool_calls") is not False,
        "metadata": data.get("metadata"),
        "user": data.get("user"),
        "store": data.get("store") is not False,
    }
    kept = [stored_message(m) for m in conversation]
    return ResponsesRequest(request=request, history=kept, stream=bool(data.get("stream")), store=echo["store"], echo=echo)


def stored_message(msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` as a stored response keeps it: an image that fails to load in a later turn is named by that turn's
    ``previous_response_id``."""
    parts = [{**p, "param": "previous_response_id"} if p["type"] == "image_url" else p for p in msg["content"]]
    return {**{k: v for k, v in msg.items() if k != "param"}, "content": parts}


def _text_echo(text: dict | None) -> dict[str, Any]:
    """``text`` as the response echoes it: the format (``text`` when absent; a schema's default name filled in)."""
    fmt = dict((text or {}).get("format") or {"type": "text"})
    if fmt.get("type") == "json_schema":
        fmt.setdefault("name", "response")
    return {**(text or {}), "format": fmt}
