"""``POST /v1/chat/completions`` bodies: a validated :class:`~asymspec_mm.serve.models_chat.ChatCompletionRequest`
turned into a :class:`ChatRequest` (the engine's :class:`~asymspec_mm.request.request.Request`, checked once), or
refused with a :class:`~asymspec_mm.serve.errors.RequestError` whose one-line message names the field.

The conversation is the whole history, as ``pipe.chat`` takes it: ``system`` / ``developer``, ``user`` messages
with text parts and any number of ``image_url`` parts (data URLs, or files under ``--allow-local-images``; at most
``max_images`` in the request), ``assistant`` messages with text and ``tool_calls``, ``tool`` messages (text and
images) answering them by ``tool_call_id``; the last message is the user's (with text) or a tool's. ``tools`` with
``tool_choice`` ``auto`` are rendered by the templates and the answer read for calls; under ``none`` the model does
not call a tool (the tools stay out of the prompt: :func:`~asymspec_mm.request.tools.prompt_tools`). Each
image is loaded here, so a bad one is refused before anything is queued; the answer equals ``pipe.chat`` of the
same messages. ``chat_template_kwargs`` takes ``enable_thinking`` (default false, as the paper's harness;
``reasoning_effort`` other than ``none`` turns it on). vLLM's ``structured_outputs`` becomes the request's
``response_format`` (``json``: a JSON schema; ``regex``, ``choice``, ``grammar``). The OpenAI fields the server
cannot honour are refused unless they hold their neutral value (:mod:`.request_fields`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..base.config import AsymSpecConfig
from ..base.errors import UnknownOptionError
from ..request.request import Request
from .errors import RequestError, bad_request, renamed, renamed_param
from .images import load_request_image
from .models_chat import ChatCompletionRequest, ImagePart, RefusalPart
from .models_endpoint import StructuredOutputs
from .models_fields import sampling_fields
from .validation_errors import request_error

DEFAULT_MAX_IMAGES = 8
"""Images one request may hold unless the server says otherwise (``serve --max-images``)."""
#: What the tiny pair's out-of-domain warning (``asymspec.warnings``) advises an HTTP client: what it can send (the
#: message text), and what only the server's operator can change (the pair it serves).
DOMAIN_ADVICE = (
    "send a MiniVista question in MathVista's layout in the message text ('Hint: ...', then 'Question: ...', then "
    "'Choices: (A) ...'; the bundled examples in asymspec_mm/examples_data show it), or ask the server's operator "
    "to serve a real pair (asymspec-mm serve --preset qwen3)"
)
#: The engine's ``response_format`` paths -> vLLM's ``structured_outputs`` where a request sent that instead.
STRUCTURED_PARAMS = {
    "response_format.json_schema.schema": "structured_outputs.json",
    "response_format.json_schema": "structured_outputs.json",
    "response_format": "structured_outputs",
}


@dataclass
class ChatRequest:
    """One checked chat request: the engine's :class:`~asymspec_mm.request.request.Request` (checked, ``messages``
    as ``pipe.chat`` takes them, each image part ``{"type": "image", "image": i}`` naming the ``i``-th image the
    server decoded into ``Request.images``; never changed after its check), and what only the HTTP answer
    reads (streaming, the model name echoed, ``n`` choices, logprobs)."""

    request: Request
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    n: int = 1
    top_logprobs: int | None = None  # None: no logprobs; else how many top tokens each carries

    @property
    def config(self) -> AsymSpecConfig:
        return self.request.config or AsymSpecConfig()


def validated(model: type, data: Any) -> Any:
    """``data`` (a parsed JSON body) validated by the pydantic ``model``, or the 400 naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc.errors(include_url=False)) from None


def _parts(content: Any, images: list[tuple[str, str]], param: str) -> list[dict[str, Any]]:
    """A message's validated content as text parts and image parts holding their index in ``images`` (each image's
    ``(url, param)``, appended here in order)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart):
            images.append((part.url, f"{param}[{j}].image_url"))
            parts.append({"type": "image", "image": len(images) - 1})
        else:  # a text part, or an earlier answer's refusal (read as its text)
            parts.append({"type": "text", "text": part.refusal if isinstance(part, RefusalPart) else part.text})
    return parts


def conversation(req: ChatCompletionRequest, max_images: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The messages as ``pipe.chat`` takes them (image parts holding their index in the refs) and every image's
    ``(url, param)``, in order; a tool message must answer an earlier call, the last message must be the user's
    (with text) or a tool's, and the request holds at most ``max_images`` images."""
    from ..request.conversation import ConversationError, tool_call

    out: list[dict[str, Any]] = []
    images: list[tuple[str, str]] = []
    for i, msg in enumerate(req.messages):
        p = f"messages[{i}]"
        message: dict[str, Any] = {"role": msg.role, "content": _parts(msg.content, images, f"{p}.content")}
        if len(images) > max_images:
            raise bad_request(
                f"the request has more than {max_images} images (the server's --max-images); send fewer or raise the limit",
                images[max_images][1],
                "too_many_images",
            )
        if msg.role == "assistant" and msg.tool_calls:
            try:
                message["tool_calls"] = [tool_call(c.model_dump(), f"{p}.tool_calls[{j}]") for j, c in enumerate(msg.tool_calls)]
            except ConversationError as exc:
                raise bad_request(str(exc), exc.param or f"{p}.tool_calls") from None
        if msg.role == "tool":
            known = {c["id"] for m in out for c in m.get("tool_calls", ())}
            if msg.tool_call_id not in known:
                raise bad_request(
                    f"{p}.tool_call_id={json.dumps(msg.tool_call_id)[:40]} names no earlier assistant tool call "
                    f"({', '.join(sorted(known)) or 'there is none'}): a tool message answers one",
                    f"{p}.tool_call_id",
                    "unknown_tool_call_id",
                )
            message["tool_call_id"] = msg.tool_call_id
        out.append(message)
    last = out[-1]
    if last["role"] not in ("user", "tool"):
        raise bad_request(
            f"messages[{len(out) - 1}] is the last message but neither the user's nor a tool's: end with the turn to answer", "messages"
        )
    if last["role"] == "user" and not "".join(part["text"] for part in last["content"] if part["type"] == "text").strip():
        raise bad_request(
            "the last user message's text is empty: ask a question about the image, e.g. 'What is the largest value?'",
            f"messages[{len(out) - 1}].content",
            "empty_question",
        )
    return out, images


def response_format_of(req: Any) -> dict[str, Any] | None:
    """The engine's ``response_format`` of a chat or completion request: its ``response_format`` (OpenAI's kinds),
    or its ``structured_outputs`` as the engine's kinds (``json`` -> ``json_schema``; ``regex``, ``choice``,
    ``grammar`` as themselves)."""
    so: StructuredOutputs | None = getattr(req, "structured_outputs", None)
    if so is not None:
        if so.json_ is not None:
            schema = so.json_
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as exc:
                    raise bad_request(f"structured_outputs.json is not valid JSON ({exc.msg})", "structured_outputs.json") from None
                if not isinstance(schema, dict):
                    raise bad_request("structured_outputs.json must be a JSON schema object", "structured_outputs.json")
            return {"type": "json_schema", "json_schema": {"name": "structured_outputs", "schema": schema}}
        kind = next(k for k in ("regex", "choice", "grammar") if getattr(so, k) is not None)
        return {"type": kind, kind: getattr(so, kind)}
    fmt = getattr(req, "response_format", None)
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    spec = fmt.json_schema
    out = {"name": spec.name, "schema": spec.schema_}
    out.update({k: v for k, v in (("description", spec.description), ("strict", spec.strict)) if v is not None})
    return {"type": "json_schema", "json_schema": out}


def checked(request: Request, params: dict[str, str] | None = None) -> Request:
    """``request`` checked; a tool, tool choice or response format the toolkit cannot use is a 400 naming it (by the
    endpoint's name for it: ``params`` maps the engine's field to it)."""
    from ..request.tools import ToolError

    params = params or {}
    try:
        return request.checked()
    except ToolError as exc:
        code = exc.code or ("unsupported" if exc.param in ("tool_choice", "response_format") else "invalid_value")
        raise renamed(bad_request(str(exc), exc.param, code), params) from None
    except UnknownOptionError as exc:
        raise renamed(bad_request(str(exc), getattr(exc, "param", None)), params) from None


def config_of(req: Any, base: AsymSpecConfig | None, budget: int | None, top_logprobs: int | None = None) -> AsymSpecConfig:
    """The decoding settings of a validated request: ``base`` (the server's) with the request's budget, stop strings,
    sampling fields and AsymSpec settings."""
    base = base or AsymSpecConfig()
    stop = getattr(req, "stop", None)
    fields: dict[str, Any] = {"stop_strings": tuple(dict.fromkeys([stop] if isinstance(stop, str) else stop or ()))}
    if budget is not None:
        fields["max_new_tokens"] = budget
    fields.update(sampling_fields(req))
    if top_logprobs:
        fields["trace_top"] = max(top_logprobs, base.trace_top)
    if req.asymspec is not None:
        fields.update(req.asymspec.config_fields())
    try:
        return base.with_(**fields).validated()
    except UnknownOptionError as exc:
        raise bad_request(str(exc), "asymspec") from None


def load_images(request: Request, refs: list[tuple[str, str]], allow_local_images: Path | None) -> Request:
    """The checked ``request`` with every image of ``refs`` decoded into :attr:`Request.images` (its image parts name
    them by index); ``request`` itself is left unchanged. A bad image is a 400 naming it."""
    return request.with_images(load_request_image(url, allow_local_images, param) for url, param in refs)


def asymspec_fields(opts: Any, compression: Any = None) -> dict[str, Any]:
    """The engine :class:`Request`'s fields an ``asymspec`` extension object sets (``opts`` None: the defaults);
    ``compression`` the server's default (``serve --compression``), which ``asymspec.compression`` replaces
    (``false``: none)."""
    asked = opts.compression if opts else None
    return {
        "method": (opts.method if opts else None) or "asymspec",
        "caption": opts.caption if opts else None,
        "ocr": opts.ocr if opts else None,
        "return_trace": bool(opts and opts.return_trace),
        "compression": compression if asked is None else (None if asked is False else asked),
    }


#: What one entry of a per-image ``asymspec`` list is.
_PER_IMAGE = {"caption": "caption", "ocr": "OCR text (or false for none)"}


def check_per_image(opts: Any, n_images: int) -> None:
    """An ``asymspec.caption`` / ``asymspec.ocr`` that does not fit the request's ``n_images`` images is a 400 naming
    it (before anything is queued): a string is for a request with one image, a list holds one entry per image;
    null (and ``false`` for OCR) fits any request."""
    for name, entry in _PER_IMAGE.items():
        value = getattr(opts, name, None) if opts is not None else None
        if value is None or value is False:
            continue
        images = f"{n_images} image{'s' if n_images != 1 else ''}" if n_images else "no image"
        if isinstance(value, str) and n_images != 1:
            fix = f"send a list with one {entry} per image, in order" if n_images else "leave it out"
            message = f"asymspec.{name} is a string, which fits a request with one image, but this request has {images}: {fix}"
        elif isinstance(value, list) and len(value) != n_images:
            fix = f"send one {entry} per image, in order" if n_images else "leave it out"
            message = f"asymspec.{name} is a list of {len(value)} but this request has {images}: {fix}"
        else:
            continue
        raise bad_request(message, f"asymspec.{name}", "invalid_value")


def decode_request(request: Request, req: Any, top_logprobs: int | None) -> ChatRequest:
    """The :class:`ChatRequest` of a checked engine ``request`` and the validated chat or text completion ``req`` it
    came from (what only the HTTP answer reads: streaming, usage chunk, model name, choices)."""
    return ChatRequest(
        request=request,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        model=req.model,
        n=req.n or 1,
        top_logprobs=top_logprobs,
    )


def parse_chat_request(
    data: dict | ChatCompletionRequest,
    *,
    allow_local_images: Path | None = None,
    base: AsymSpecConfig | None = None,
    max_images: int = DEFAULT_MAX_IMAGES,
    compression: Any = None,
) -> ChatRequest:
    """The :class:`ChatRequest` of a body (a parsed JSON object, validated here, or the validated model) with its
    images loaded (see the module docstring); ``compression`` the server's default."""
    req = data if isinstance(data, ChatCompletionRequest) else validated(ChatCompletionRequest, data)
    try:
        return _chat_request(req, allow_local_images, base, max_images, compression)
    except RequestError as err:  # a field a carrier brought is named as the client sent it
        raise renamed(err, req.carried) from None


def structured_params(req: Any) -> dict[str, str]:
    """The engine's ``response_format`` paths -> the request's ``structured_outputs`` as the client sent it (top
    level, or in a carrier: ``chat_template_kwargs.structured_outputs``); empty when the request has none."""
    if getattr(req, "structured_outputs", None) is None:
        return {}
    return {k: renamed_param(v, req.carried) or v for k, v in STRUCTURED_PARAMS.items()}


def _chat_request(
    req: ChatCompletionRequest, allow_local_images: Path | None, base: AsymSpecConfig | None, max_images: int, compression: Any
) -> ChatRequest:
    top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
    config = config_of(req, base, req.budget, top_logprobs)
    messages, refs = conversation(req, max_images)
    check_per_image(req.asymspec, len(refs))
    request = Request(
        messages=messages,
        config=config,
        **asymspec_fields(req.asymspec, compression),
        enable_thinking=req.enable_thinking,
        tools=[t.model_dump(exclude_none=True) for t in req.tools] if req.tools is not None else None,
        tool_choice=req.tool_choice if isinstance(req.tool_choice, (str, type(None))) else req.tool_choice.model_dump(),
        response_format=response_format_of(req),
        ignore_eos=bool(req.ignore_eos),
        domain_advice=DOMAIN_ADVICE,
    )
    # before the images load: a bad tool costs no decoding
    request = checked(request, STRUCTURED_PARAMS if req.structured_outputs is not None else {})
    return decode_request(load_images(request, refs, allow_local_images), req, top_logprobs)
