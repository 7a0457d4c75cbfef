"""``POST /v1/chat/completions`` bodies: parsed and checked into a :class:`ChatRequest`, or refused with a
:class:`~asymspec_mm.serve.errors.RequestError` whose one-line message names the field and the problem.

The conversation is the whole history, as ``pipe.chat`` takes it: ``system`` / ``developer``, ``user`` messages
with text parts and any number of ``image_url`` parts (data URLs, or files under ``--allow-local-images``; at most
``max_images`` in the request), ``assistant`` messages with text and ``tool_calls``, ``tool`` messages (text and
images) answering them by ``tool_call_id``; the last message is the user's (with text) or a tool's. ``tools`` with
``tool_choice`` ``auto`` are rendered by the templates and the answer read for calls; under ``none`` the model does
not call a tool (the tools stay out of the prompt: :func:`~asymspec_mm.requests.tools.prompt_tools`). Each
image is loaded here, so a bad one is refused before anything is queued; the answer equals ``pipe.chat`` of the
same messages. ``chat_template_kwargs`` takes ``enable_thinking`` (default false, as the paper's harness). OpenAI
fields the server cannot honour are refused unless they hold their neutral value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.config import CHOICES, METHODS, AsymSpecConfig, range_error
from ..base.errors import UnknownOptionError
from ..base.unicode_check import find_bad_text, invalid_text_message
from ..requests.request import Request
from .errors import bad_request
from .images import load_request_image
from .sampling_fields import choice_count, sampling_fields

#: The AsymSpec options a request may set under ``"asymspec"``.
ASYMSPEC_OPTIONS = ("method", "k", "beta", "gamma", "gate", "delta", "bonus", "caption", "ocr", "return_trace")

#: Fields of OpenAI's schema that are read (the rest of it is refused unless neutral, see ``_NEUTRAL``).
_USED = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "logprobs",
    "top_logprobs",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "response_format",
    "asymspec",
)

MAX_STOP = 4
"""Stop strings one request may give, as OpenAI's API allows (the Python API takes any number)."""

DEFAULT_MAX_IMAGES = 8
"""Images one request may hold unless the server says otherwise (``serve --max-images``)."""

#: OpenAI fields accepted only while they hold a neutral value: field -> (test, why).
_NEUTRAL: dict[str, tuple[Any, str]] = {
    "user": (lambda v: isinstance(v, str), "a string"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "store": (lambda v: v is False, "false: nothing is stored"),
    "frequency_penalty": (lambda v: v == 0 and is_number(v), "0: penalties are not supported"),
    "presence_penalty": (lambda v: v == 0 and is_number(v), "0: penalties are not supported"),
    "logit_bias": (lambda v: v == {}, "empty: logit biases are not supported"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean; the model may make several calls either way"),
}

_SYSTEM_ROLES = ("system", "developer")


@dataclass
class ChatRequest:
    """One checked chat request: the engine's :class:`~asymspec_mm.requests.request.Request` (checked, ``messages``
    as ``pipe.chat`` takes them, every image loaded into an ``{"type": "image"}`` part), and what only the HTTP answer
    reads (streaming, the model name echoed, ``n`` choices, logprobs)."""

    request: Request
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    options: dict = field(default_factory=dict)
    n: int = 1
    top_logprobs: int | None = None  # None: no logprobs; else how many top tokens each carries

    @property
    def config(self) -> AsymSpecConfig:
        return self.request.config or AsymSpecConfig()


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any, param: str) -> float:
    if not is_number(v):
        raise bad_request(f"{param} must be a number, got {json.dumps(v)[:40]}", param)
    if not math.isfinite(v):
        raise bad_request(f"{param}={v} must be a finite number (NaN and infinities are refused)", param)
    return float(v)


def positive_int(v: Any, param: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise bad_request(f"{param} must be an integer >= 1, got {json.dumps(v)[:40]}", param)
    return v


def field_value(name: str, v: Any, limit: int = 60) -> str:
    """``name=<v as JSON>`` when that JSON is at most ``limit`` characters, else ``name`` and what ``v`` is
    (``tools (a list of 3 items)``): a message never shows JSON cut in the middle of a word."""
    text = json.dumps(v)
    if len(text) <= limit:
        return f"{name}={text}"
    if isinstance(v, list):
        what = f"a list of {len(v)} item{'s' if len(v) != 1 else ''}"
    elif isinstance(v, dict):
        what = f"an object with {len(v)} key{'s' if len(v) != 1 else ''}"
    elif isinstance(v, str):
        what = f"a string of {len(v)} characters"
    else:
        what = f"{len(text)} characters of JSON"
    return f"{name} ({what})"


def in_range(name: str, v: Any, param: str) -> Any:
    """``v`` when the config field ``name``'s range (:data:`~asymspec_mm.base.config.RANGES`) holds it, else a 400 naming
    ``param``, the value and the range."""
    if (problem := range_error(name, v, field_value(param, v))) is not None:
        raise bad_request(problem, param)
    return v


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object (NaN and infinities parse, to be refused by the field they are in)."""
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 JSON", None, "invalid_json") from None
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", None, "invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(data).__name__}", None, "invalid_json")
    return data


def _parts_of(content: Any, param: str, *, images: list | None) -> list[dict[str, Any]]:
    """A message's content (a string or a list of parts) as text parts and, in place, ``(url, param)`` image refs
    collected in ``images`` (``None``: no image allowed in this message)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or a list of content parts", param)
    parts = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{p} must be an object with a 'type' ('text' or 'image_url')", p)
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{p}.text must be a string", f"{p}.text")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            if images is None:
                raise bad_request(f"{p}: images go in user messages only; move it to a user message", p, "image_not_in_user_message")
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            images.append((url, f"{p}.image_url"))
            parts.append({"type": "image", "image": len(images) - 1})
        else:
            raise bad_request(f"{p} has type {kind!r}; messages hold 'text' parts and, in user messages, 'image_url' parts", f"{p}.type")
    return parts


def _conversation(messages: Any, max_images: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The messages as ``pipe.chat`` takes them (image parts holding their index in the refs) and every image's
    ``(url, param)``, in order."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list ending with a user message", "messages")
    out, images = [], []
    for i, msg in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"{p} must be an object with 'role' and 'content'", p)
        role = msg.get("role")
        if role not in (*_SYSTEM_ROLES, "user", "assistant", "tool"):
            raise bad_request(f"{p} has role {role!r}; use 'system', 'developer', 'user', 'assistant' or 'tool'", f"{p}.role")
        parts = _parts_of(msg.get("content"), f"{p}.content", images=images if role in ("user", "tool") else None)
        if len(images) > max_images:
            raise bad_request(
                f"the request has more than {max_images} images (the server's --max-images); send fewer or raise the limit",
                images[max_images][1],
                "too_many_images",
            )
        message: dict[str, Any] = {"role": role, "content": parts}
        if role == "assistant" and msg.get("tool_calls"):
            message["tool_calls"] = _tool_calls(msg["tool_calls"], f"{p}.tool_calls")
        if role == "tool":
            known = {c["id"] for m in out for c in m.get("tool_calls", ())}
            if msg.get("tool_call_id") not in known:
                raise bad_request(
                    f"{p}.tool_call_id={json.dumps(msg.get('tool_call_id'))[:40]} names no earlier assistant tool call "
                    f"({', '.join(sorted(known)) or 'there is none'}): a tool message answers one",
                    f"{p}.tool_call_id",
                    "unknown_tool_call_id",
                )
            message["tool_call_id"] = msg["tool_call_id"]
        out.append(message)
    if out[-1]["role"] not in ("user", "tool"):
        raise bad_request(
            f"messages[{len(out) - 1}] is the last message but neither the user's nor a tool's: end with the turn to answer", "messages"
        )
    return out, images


def _tool_calls(v: Any, param: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, checked (arguments: a JSON string or an object)."""
    from ..requests.conversation import ConversationError, tool_call

    if not isinstance(v, list):
        raise bad_request(f"{param} must be a list of tool calls", param)
    try:
        return [tool_call(c, f"{param}[{j}]") for j, c in enumerate(v)]
    except ConversationError as exc:
        raise bad_request(str(exc), param) from None


def _checked(request: Request) -> Request:
    """``request`` checked; a tool, tool choice or response format the toolkit cannot use is a 400 naming it."""
    from ..requests.tools import ToolError

    try:
        return request.checked()
    except ToolError as exc:
        code = "unsupported" if exc.param in ("tool_choice", "response_format") else "invalid_value"
        raise bad_request(str(exc), exc.param, code) from None


def _template_kwargs(v: Any) -> bool:
    """``enable_thinking`` of ``chat_template_kwargs`` (the only key the templates are given)."""
    if v is None:
        return False
    if not isinstance(v, dict):
        raise bad_request('chat_template_kwargs must be an object, e.g. {"enable_thinking": false}', "chat_template_kwargs")
    unknown = sorted(set(v) - {"enable_thinking"})
    if unknown:
        raise bad_request(
            f"chat_template_kwargs.{unknown[0]} is not supported; only enable_thinking is", f"chat_template_kwargs.{unknown[0]}"
        )
    thinking = v.get("enable_thinking", False)
    if not isinstance(thinking, bool):
        raise bad_request("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs.enable_thinking")
    return thinking


def asymspec_options(raw: Any) -> tuple[str, dict, dict]:
    """(method, config fields, other options) of the ``asymspec`` object."""
    if raw is None:
        return "asymspec", {}, {}
    if not isinstance(raw, dict):
        raise bad_request("asymspec must be an object of AsymSpec options", "asymspec")
    unknown = sorted(set(raw) - set(ASYMSPEC_OPTIONS))
    if unknown:
        raise bad_request(
            f"unknown AsymSpec option(s) {', '.join(unknown)}; the options are {', '.join(ASYMSPEC_OPTIONS)}",
            f"asymspec.{unknown[0]}",
            "unknown_option",
        )
    method, cfg, other = "asymspec", {}, {}
    for name, v in raw.items():
        p = f"asymspec.{name}"
        if v is None and name not in ("caption", "ocr"):
            continue  # null: the default
        if name == "method":
            if v not in METHODS:
                raise bad_request(f"{field_value(p, v)} is not valid; choose one of {', '.join(METHODS)}", p)
            method = v
        elif name == "k":
            cfg["k"] = in_range("k", positive_int(v, p), p)
        elif name in ("beta", "gamma"):
            cfg[name] = in_range(name, _finite(v, p), p)
        elif name in CHOICES:
            if v not in CHOICES[name]:
                raise bad_request(f"{field_value(p, v)} is not valid; choose one of {', '.join(CHOICES[name])}", p)
            cfg[name] = v
        elif name == "caption":
            if v is not None and not _strings(v):
                raise bad_request(
                    f"{p} must be a string (the caption the verifier reads; a list: one per image) or null (the drafter captions)", p
                )
            other[name] = v
        elif name == "ocr":
            if v is not None and v is not False and not _strings(v, allow_false=True):
                raise bad_request(
                    f"{p} must be a string (the OCR text; a list: one per image), false (no OCR) or null (the server's OCR engine)", p
                )
            other[name] = v
        elif name == "return_trace":
            if not isinstance(v, bool):
                raise bad_request(f"{p} must be true or false", p)
            other[name] = v
    return method, cfg, other


def _strings(v: Any, allow_false: bool = False) -> bool:
    """Whether ``v`` is a string or a list of them (``allow_false``: of strings or false)."""
    ok = lambda x: isinstance(x, str) or (allow_false and x is False)  # noqa: E731
    return isinstance(v, str) or (isinstance(v, list) and all(ok(x) for x in v))


def _logprobs(data: dict) -> int | None:
    """``top_logprobs`` (0 to 20) when ``logprobs`` is true, else None; a 400 naming the field for bad values."""
    want, top = data.get("logprobs"), data.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise bad_request("logprobs must be true or false", "logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise bad_request(f"top_logprobs={json.dumps(top)[:40]} must be an integer >= 0 and <= 20", "top_logprobs")
        if not want and top:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    return (top or 0) if want else None


def _stop_strings(v: Any) -> tuple[str, ...]:
    """``stop`` (a string or up to :data:`MAX_STOP` non-empty strings) as the config's ``stop_strings``."""
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if any(not s for s in items):
        raise bad_request("stop strings must not be empty", "stop")
    if len(items) > MAX_STOP:
        raise bad_request(f"stop has {len(items)} strings; at most {MAX_STOP} are allowed (as OpenAI's API): send fewer", "stop")
    return tuple(dict.fromkeys(items))


def parse_chat_request(
    data: dict, *, allow_local_images: Path | None = None, base: AsymSpecConfig | None = None, max_images: int = DEFAULT_MAX_IMAGES
) -> ChatRequest:
    """Check an already-parsed body (see :func:`parse_json`) and load its images (see the module docstring)."""
    unknown = sorted(set(data) - set(_USED) - set(_NEUTRAL))
    if unknown:
        raise bad_request(
            f'unknown request field(s) {", ".join(unknown)}; AsymSpec options go under "asymspec" ({", ".join(ASYMSPEC_OPTIONS)})',
            unknown[0],
            "unknown_field",
        )
    for name, (ok, why) in _NEUTRAL.items():
        if data.get(name) is not None and not ok(data[name]):
            raise bad_request(f"{field_value(name, data[name])} is not supported; it must be absent or {why}", name, "unsupported")
    if (bad := find_bad_text(data)) is not None:  # the whole body at once: every field a tokenizer or a log may read
        raise bad_request(invalid_text_message(*bad), bad[0], "invalid_text")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    n = choice_count(data)
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    include_usage = False
    opts = data.get("stream_options")
    if opts is not None:
        if not stream:
            raise bad_request("stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
            raise bad_request('stream_options must be {"include_usage": true|false}', "stream_options")
        include_usage = bool(opts.get("include_usage"))
    fields: dict[str, Any] = {}
    for name in ("max_completion_tokens", "max_tokens"):
        if data.get(name) is not None:
            fields["max_new_tokens"] = in_range("max_new_tokens", positive_int(data[name], name), name)
            break
    fields["stop_strings"] = _stop_strings(data.get("stop"))
    fields.update(sampling_fields(data))
    top_logprobs = _logprobs(data)
    if top_logprobs:
        fields["trace_top"] = max(top_logprobs, (base or AsymSpecConfig()).trace_top)
    method, cfg_fields, other = asymspec_options(data.get("asymspec"))
    try:
        config = (base or AsymSpecConfig()).with_(**fields, **cfg_fields).validated()
    except UnknownOptionError as exc:
        raise bad_request(str(exc), "asymspec") from None
    messages, refs = _conversation(data.get("messages"), max_images)
    last = messages[-1]
    if last["role"] == "user" and not "".join(part["text"] for part in last["content"] if part["type"] == "text").strip():
        raise bad_request(
            "the last user message's text is empty: ask a question about the image, e.g. 'What is the largest value?'",
            f"messages[{len(messages) - 1}].content",
            "empty_question",
        )
    request = Request(
        messages=messages,
        method=method,
        config=config,
        caption=other.get("caption"),
        ocr=other.get("ocr"),
        enable_thinking=_template_kwargs(data.get("chat_template_kwargs")),
        tools=data.get("tools"),
        tool_choice=data.get("tool_choice"),
        response_format=data.get("response_format"),
        return_trace=other.get("return_trace", False),
    )
    request = _checked(request)  # before the images load: a bad tool costs no decoding
    loaded = [load_request_image(url, allow_local_images, param) for url, param in refs]
    for msg in messages:
        msg["content"] = [{"type": "image", "image": loaded[part["image"]]} if part["type"] == "image" else part for part in msg["content"]]
    return ChatRequest(
        request=request,
        stream=bool(stream),
        include_usage=include_usage,
        model=model,
        options={**cfg_fields, "method": method},
        n=n,
        top_logprobs=top_logprobs,
    )
