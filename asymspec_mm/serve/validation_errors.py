"""pydantic's validation errors as the server's refusals: :func:`request_error` turns the errors of a request body
the request models refused into OpenAI's error object, a 400 with a one-line message naming the field (the unknown
top-level fields first, all of them named; else the first error). A refusal written by a model's check
(:func:`~asymspec_mm.serve.models_fields.refuse`) keeps its words, ``{param}`` filled in with the field's path; one of
pydantic's own error types is worded by :data:`WORDS`, the way the server words its refusals
(``messages[0].role is required``, ``n must be an integer, got "2"``).
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import RequestError, bad_request
from .models_fields import ASYMSPEC_OPTIONS, field_value, shown, type_of

#: What an unknown key below the top level is told, by the object it is in.
UNKNOWN_IN = {
    "asymspec": lambda names: (
        f"unknown AsymSpec option(s) {', '.join(names)}; the options are {', '.join(ASYMSPEC_OPTIONS)}",
        "unknown_option",
    ),
    "chat_template_kwargs": lambda names: (
        f"chat_template_kwargs.{names[0]} is not supported; it takes enable_thinking, asymspec and structured_outputs",
        "unsupported",
    ),
    "text": lambda names: (f"text.{names[0]} is not supported; text takes format and verbosity", "unknown_field"),
    "stream_options": lambda names: (
        f"stream_options.{names[0]} is not supported; stream_options takes include_usage and include_obfuscation",
        "unknown_field",
    ),
}
# the carriers of the extension through SGLang's gateway (models_router.CARRIERS) refuse an unknown option naming where
for _carrier in ("chat_template_kwargs.asymspec", "metadata.asymspec"):
    UNKNOWN_IN[_carrier] = lambda names, where=_carrier: (
        f"unknown AsymSpec option(s) {', '.join(names)} in {where}; the options are {', '.join(ASYMSPEC_OPTIONS)}",
        "unknown_option",
    )
_LABEL = re.compile(r"^~|^[a-z-]+\[.*\]$|^(str|int|float|bool|dict|list|none)$")


def param_of(loc: tuple[Any, ...]) -> str | None:
    """The request field of an error location: ``("body", "messages", 0, "~user", "content")`` ->
    ``messages[0].content`` (the body, and the union branches' tags, left out)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _LABEL.match(str(part)):
            out += f".{part}" if out else str(part)
    return out or None


#: What a required field is told when it is missing.
REQUIRED = {
    "messages": "a non-empty list ending with a user message",
    "prompt": "the text to answer",
    "input": "a string, or a list of message / function_call / function_call_output items",
}
#: pydantic's own error types, worded as the server words its refusals: (param, input, ctx) -> message.
WORDS: dict[str, Callable[[str, Any, dict], str | tuple[str, str]]] = {
    "missing": lambda p, v, c: f"{p} is required" + (f": {REQUIRED[p]}" if p in REQUIRED else ""),
    "string_type": lambda p, v, c: f"{p} must be a string, got {shown(v)}",
    "bool_type": lambda p, v, c: f"{p} must be true or false, got {shown(v)}",
    "int_type": lambda p, v, c: f"{p} must be an integer, got {shown(v)}",
    "float_type": lambda p, v, c: f"{p} must be a number, got {shown(v)}",
    "finite_number": lambda p, v, c: f"{p} must be a finite number (NaN and infinities are refused)",
    "list_type": lambda p, v, c: f"{p} must be a list, got {shown(v)}",
    "dict_type": lambda p, v, c: f"{p} must be an object, got {shown(v)}",
    "model_type": lambda p, v, c: f"{p} must be an object, got {shown(v)}",
    "model_attributes_type": lambda p, v, c: f"{p} must be an object, got {shown(v)}",
    "literal_error": lambda p, v, c: f"{field_value(p, v)} is not valid; expected {c.get('expected')}",
    "greater_than_equal": lambda p, v, c: f"{field_value(p, v)} must be >= {c.get('ge')}",
    "greater_than": lambda p, v, c: f"{field_value(p, v)} must be > {c.get('gt')}",
    "less_than_equal": lambda p, v, c: f"{field_value(p, v)} must be <= {c.get('le')}",
    "less_than": lambda p, v, c: f"{field_value(p, v)} must be < {c.get('lt')}",
    "too_short": lambda p, v, c: f"{p} must hold at least {c.get('min_length')} item(s)",
    "too_long": lambda p, v, c: f"{p} holds more than {c.get('max_length')} items",
    "string_too_long": lambda p, v, c: f"{p} is longer than {c.get('max_length')} characters",
    "union_tag_invalid": lambda p, v, c: (
        f"{p}.{c.get('discriminator', '').strip(chr(39))} is {c.get('tag')!r}; expected one of {c.get('expected_tags')}"
    ),
    "union_tag_not_found": lambda p, v, c: f"{p} needs {c.get('discriminator')}",
    "recursion_loop": lambda p, v, c: f"{p} is nested too deeply",
    "content_parts": lambda p, v, c: f"{p} must be a string or a list of content parts",
    # the unions of the request models (models_chat, models_responses): their branch is picked by a key
    "part_type": lambda p, v, c: (
        (f"{p} has type {type_of(v)!r}; messages hold 'text' parts and, in user messages, 'image_url' parts", f"{p}.type")
        if type_of(v)
        else f"{p} must be an object with a 'type' ('text' or 'image_url')"
    ),
    "role": lambda p, v, c: (
        (f"{p} has role {v.get('role')!r}; use 'system', 'developer', 'user', 'assistant' or 'tool'", f"{p}.role")
        if isinstance(v, Mapping)
        else f"{p} must be an object with 'role' and 'content'"
    ),
    "image_url": lambda p, v, c: f'{p} must be {{"url": "data:image/png;base64,..."}} or the URL as a string',
    "tool_type": lambda p, v, c: (
        f"{p} has type {type_of(v)!r}; this server runs function tools only (the client runs them)",
        f"{p}.type" if type_of(v) else p,
    ),
    "input_part_type": lambda p, v, c: (
        f"{p} has type {type_of(v)!r}; content parts are input_text, input_image (user) and output_text (assistant)",
        f"{p}.type",
    ),
    "input_item": lambda p, v, c: _input_item(p, v),
    "input_shape": lambda p, v, c: f"{p} must be a string or a list of input items (message, function_call, function_call_output)",
    "responses_tool_choice": lambda p, v, c: (
        f'{field_value(p, v)} is not supported; use "auto", "none", "required" or {{"type": "function", "name": ...}}'
    ),
    "text_format": lambda p, v, c: (
        f'{field_value(p, v)} is not {{"type": "text"}}, {{"type": "json_object"}} or '
        '{"type": "json_schema", "name": ..., "schema": {...}}'
    ),
    "tool_choice": lambda p, v, c: f"{field_value(p, v)} is not one of none, auto, required or a named function",
    "response_format": lambda p, v, c: (
        f'{field_value(p, v)} is not text, json_object or {{"type": "json_schema", "json_schema": {{"name": ..., "schema": {{...}}}}}}'
    ),
    "json_invalid": lambda p, v, c: f"the request body is not valid JSON ({c.get('error')})",
}
#: The code of each of pydantic's error types where it is not ``invalid_value``.
CODES = {
    "json_invalid": "invalid_json",
    "tool_type": "unsupported",
    "tool_choice": "unsupported",
    "response_format": "unsupported",
    "responses_tool_choice": "unsupported",
}


def _input_item(p: str, v: Any) -> str | tuple[str, str, str]:
    """The refusal of a Responses input item of no kind the server reads."""
    if not isinstance(v, Mapping):
        return f"{p} must be an object (a message, function_call or function_call_output item)"
    kind = v.get("type", "message" if "role" in v else None)
    if kind == "message":
        return f"{p} has role {shown(v.get('role'))}; use 'user', 'system', 'developer' or 'assistant'", f"{p}.role", "invalid_value"
    more = " (item references need the items themselves: send them)" if kind == "item_reference" else ""
    return f"{p} has type {shown(kind)}; input items are message, function_call and function_call_output{more}", f"{p}.type", "unsupported"


def _worded(err: Mapping[str, Any]) -> tuple[str, str | None, str]:
    """``(message, param, code)`` of one pydantic error."""
    ctx = dict(err.get("ctx") or {})
    param = ctx.get("param") or param_of(tuple(err.get("loc", ())))
    kind = err["type"]
    if ctx.get("own"):
        message = str(err["msg"]).replace("{param}", param or "the request body", 1)
        return message, (param + ctx["suffix"]) if param and ctx.get("suffix") else param, kind
    code = CODES.get(kind, "invalid_value")
    words = WORDS.get(kind)
    if words is not None:
        message = words(param or "the request body", err.get("input"), ctx)
        if isinstance(message, tuple):  # the message, a field below the one the location names, and its code
            message, param, *rest = message
            code = rest[0] if rest else code
    else:
        message = f"{param or 'the request body'}: {err.get('msg', kind)}"
    return message.replace("\n", " "), param, code


def request_error(errors: list[Mapping[str, Any]]) -> RequestError:
    """The 400 of a request pydantic refused: the unknown top-level fields first (all of them named, code
    ``unknown_field``), else the first error, in the server's words (:data:`WORDS`) naming the field."""
    top = [e for e in errors if e["type"] == "extra_forbidden" and len(_path(e)) == 1]
    if top:
        names = [str(_path(e)[0]) for e in top]
        return bad_request(
            f'unknown request field(s) {", ".join(names)}; AsymSpec options go under "asymspec" ({", ".join(ASYMSPEC_OPTIONS)})',
            names[0],
            "unknown_field",
        )
    err = errors[0]
    if err["type"] == "extra_forbidden":
        path = _path(err)
        parent, names = (
            param_of(tuple(path[:-1])),
            [str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and _path(e)[:-1] == path[:-1]],
        )
        words = UNKNOWN_IN.get(parent or "")
        if words is not None:
            message, code = words(names)
        else:
            message, code = f"{param_of(tuple(path))} is not a field of {parent or 'the request'}; remove it", "unknown_field"
        return bad_request(message, param_of(tuple(path)), code)
    if err["type"] in ("model_attributes_type", "model_type", "dict_type") and not _path(err):
        return bad_request(f"the request body must be a JSON object, not {_json_kind(err.get('input'))}", None, "invalid_json")
    message, param, code = _worded(err)
    return bad_request(message, param, code)


def _path(err: Mapping[str, Any]) -> list[Any]:
    """The error's location without ``body`` and union tags."""
    loc = list(err.get("loc", ()))
    loc = loc[1:] if loc and loc[0] == "body" else loc
    return [p for p in loc if isinstance(p, int) or not _LABEL.match(str(p))]


def _json_kind(v: Any) -> str:
    return {list: "list", str: "str", int: "int", float: "float", bool: "bool", type(None): "null", bytes: "JSON"}.get(
        type(v), type(v).__name__
    )
