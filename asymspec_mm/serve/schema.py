"""``POST /v1/chat/completions`` bodies: parsed and checked into a :class:`ChatRequest`, or refused with a
:class:`~asymspec_mm.serve.errors.RequestError` whose one-line message names the field and the problem.

The conversation is one user message (text parts plus at most one ``image_url`` part); the user text is
the question the pipeline answers. System (and developer) messages are folded into the question, before the
user text and separated by a blank line, so agent frameworks that always send one keep working; earlier
turns (assistant or tool messages, a second user message) are refused: the pipeline answers one question
about one image. OpenAI fields the server cannot honour are refused unless they hold their neutral value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import CHOICES, METHODS, AsymSpecConfig, range_error
from ..errors import UnknownOptionError
from .errors import bad_request
from .images import load_request_image

#: The AsymSpec options a request may set under ``"asymspec"``.
ASYMSPEC_OPTIONS = ("method", "k", "beta", "gamma", "gate", "delta", "bonus", "caption", "ocr", "return_trace")

#: Fields of OpenAI's schema that are read (the rest of it is refused unless neutral, see ``_NEUTRAL``).
_USED = ("model", "messages", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "n", "temperature", "asymspec")

#: OpenAI fields accepted when they hold a value that changes nothing under greedy decoding: field -> (test, why).
_NEUTRAL: dict[str, tuple[Any, str]] = {
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]; greedy decoding ignores it"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer; greedy decoding is deterministic"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "store": (lambda v: v is False, "false: nothing is stored"),
    "frequency_penalty": (lambda v: v == 0 and _is_number(v), "0: decoding is greedy, without penalties"),
    "presence_penalty": (lambda v: v == 0 and _is_number(v), "0: decoding is greedy, without penalties"),
    "logprobs": (lambda v: v is False, "false; ask for asymspec.return_trace to get per-token probabilities"),
    "top_logprobs": (lambda v: v == 0 and _is_number(v), "0; ask for asymspec.return_trace to get per-token probabilities"),
    "logit_bias": (lambda v: v == {}, "empty: logit biases are not supported"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}: structured output is not supported'),
    "tools": (lambda v: v == [], "empty: tool calling is not supported"),
    "tool_choice": (lambda v: v in ("none", "auto"), '"none" or "auto" (no tools): tool calling is not supported'),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean"),
}

_SYSTEM_ROLES = ("system", "developer")


@dataclass
class ChatRequest:
    """One checked chat request, ready for ``Scheduler.submit``."""

    image: Any  # an RGB PIL image
    question: str
    method: str
    config: AsymSpecConfig
    caption: str | None = None
    ocr: str | bool | None = None
    return_trace: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    options: dict = field(default_factory=dict)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any, param: str) -> float:
    if not _is_number(v):
        raise bad_request(f"{param} must be a number, got {json.dumps(v)[:40]}", param)
    if not math.isfinite(v):
        raise bad_request(f"{param}={v} must be a finite number (NaN and infinities are refused)", param)
    return float(v)


def _positive_int(v: Any, param: str) -> int:
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


def _in_range(name: str, v: Any, param: str) -> Any:
    """``v`` when the config field ``name``'s range (:data:`~asymspec_mm.config.RANGES`) holds it, else a 400 naming
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


def _text_of(content: Any, param: str, *, images: list | None) -> str:
    """The text of a message's content (a string or a list of parts); ``image_url`` parts go to ``images``
    (``None``: no image allowed in this message)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or a list of content parts", param)
    texts = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{p} must be an object with a 'type' ('text' or 'image_url')", p)
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{p}.text must be a string", f"{p}.text")
            texts.append(part["text"])
        elif kind == "image_url":
            if images is None:
                raise bad_request(f"{p}: images are read only from the user message", p)
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            images.append((url, f"{p}.image_url"))
        else:
            raise bad_request(f"{p} has type {kind!r}; a user message holds 'text' parts and at most one 'image_url' part", f"{p}.type")
    return "\n".join(texts)


def _conversation(messages: Any) -> tuple[str, str, tuple[str, str], str]:
    """(system text, user text, (image url, its param), the user content's param) of ``messages``."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list holding one user message", "messages")
    system, user, images, user_param = [], None, [], "messages"
    for i, msg in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"{p} must be an object with 'role' and 'content'", p)
        role = msg.get("role")
        if role in _SYSTEM_ROLES:
            system.append(_text_of(msg.get("content"), f"{p}.content", images=None).strip())
        elif role == "user":
            if user is not None:
                raise bad_request(
                    f"{p} is a second user message; the server answers one question about one image per request", p, "multi_turn"
                )
            user_param = f"{p}.content"
            user = _text_of(msg.get("content"), user_param, images=images)
        elif role in ("assistant", "tool", "function"):
            raise bad_request(
                f"{p} has role {role!r}: earlier turns are not supported; send one user message (text and an image)", p, "multi_turn"
            )
        else:
            raise bad_request(f"{p} has role {role!r}; use 'system' or 'user'", f"{p}.role")
    if user is None:
        raise bad_request("messages hold no user message; send one with the question and an image", "messages")
    if len(images) > 1:
        raise bad_request(f"the user message has {len(images)} images; send at most one image_url part", images[1][1], "too_many_images")
    if not images:
        raise bad_request(
            "the user message has no image: AsymSpec answers a question about an image; add an image_url part with a data URL",
            user_param,
            "missing_image",
        )
    return "\n\n".join(s for s in system if s), user.strip(), images[0], user_param


def _asymspec_options(raw: Any) -> tuple[str, dict, dict]:
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
            cfg["k"] = _in_range("k", _positive_int(v, p), p)
        elif name in ("beta", "gamma"):
            cfg[name] = _in_range(name, _finite(v, p), p)
        elif name in CHOICES:
            if v not in CHOICES[name]:
                raise bad_request(f"{field_value(p, v)} is not valid; choose one of {', '.join(CHOICES[name])}", p)
            cfg[name] = v
        elif name == "caption":
            if v is not None and not isinstance(v, str):
                raise bad_request(f"{p} must be a string (the caption the verifier reads) or null (the drafter captions)", p)
            other[name] = v
        elif name == "ocr":
            if v is not None and v is not False and not isinstance(v, str):
                raise bad_request(f"{p} must be a string (the OCR text), false (no OCR) or null (the server's OCR engine)", p)
            other[name] = v
        elif name == "return_trace":
            if not isinstance(v, bool):
                raise bad_request(f"{p} must be true or false", p)
            other[name] = v
    return method, cfg, other


def _stop_strings(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if any(not s for s in items):
        raise bad_request("stop strings must not be empty", "stop")
    return tuple(dict.fromkeys(items))


def parse_chat_request(data: dict, *, allow_local_images: Path | None = None, base: AsymSpecConfig | None = None) -> ChatRequest:
    """Check an already-parsed body (see :func:`parse_json`) and load its image (see the module docstring)."""
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
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    t = data.get("temperature")
    if t is not None and (not _is_number(t) or t != 0):
        raise bad_request(
            f"temperature={json.dumps(t)[:40]} is not supported: AsymSpec decoding is greedy (the gate compares the "
            "models' argmax tokens); omit temperature or send 0",
            "temperature",
            "unsupported",
        )
    n = data.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(f"n={json.dumps(n)[:40]} is not supported: the server returns one choice (decoding is greedy); send n=1", "n")
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
            fields["max_new_tokens"] = _in_range("max_new_tokens", _positive_int(data[name], name), name)
            break
    fields["stop_strings"] = _stop_strings(data.get("stop"))
    method, cfg_fields, other = _asymspec_options(data.get("asymspec"))
    try:
        config = (base or AsymSpecConfig()).with_(**fields, **cfg_fields).validated()
    except UnknownOptionError as exc:
        raise bad_request(str(exc), "asymspec") from None
    system, user, (url, image_param), user_param = _conversation(data.get("messages"))
    if not user:
        raise bad_request(
            "the user message's text is empty: ask a question about the image, e.g. 'What is the largest value?'",
            user_param,
            "empty_question",
        )
    question = f"{system}\n\n{user}" if system else user
    image = load_request_image(url, allow_local_images, image_param)
    return ChatRequest(
        image=image,
        question=question,
        method=method,
        config=config,
        caption=other.get("caption"),
        ocr=other.get("ocr"),
        return_trace=other.get("return_trace", False),
        stream=bool(stream),
        include_usage=include_usage,
        model=model,
        options={**cfg_fields, "method": method},
    )
