"""``POST /v1/completions``: a plain text prompt answered as a chat request with one user message and no image
(the prompt rendered by the verifier's chat template, exactly as ``pipe.chat([{"role": "user", "content":
prompt}])``), one :class:`~asymspec_mm.request.request.Request` per request like every endpoint's.

:class:`CompletionRequest` is OpenAI's ``CreateCompletionRequest``: ``prompt`` (a string, or a list of one string),
``max_tokens`` (default 16, as OpenAI's), ``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` (1 to 8),
``stream`` / ``stream_options``, ``logprobs`` (0 to 5: the emitted tokens' log-probabilities and that many
alternatives, as chat completions compute them); ``user`` is a hint. Refused unless neutral: ``echo`` (false),
``best_of`` (null or ``n``), ``suffix`` (null), the penalties (0), ``logit_bias`` (empty); token-id prompts and more
than one prompt. The extensions are chat completions': ``top_k``, ``asymspec``, ``structured_outputs``.
"""

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ..base.checks import is_int
from ..base.config import AsymSpecConfig
from ..request.request import Request
from .chat_answers import usage
from .chat_request import (
    DOMAIN_ADVICE,
    STRUCTURED_PARAMS,
    ChatRequest,
    asymspec_fields,
    check_per_image,
    checked,
    config_of,
    decode_request,
    response_format_of,
)
from .models_endpoint import DecodeRequest
from .models_fields import (
    RequestModel,
    checked_by,
    refuse,
    unsupported,
)
from .models_router import DecodeExtras

if TYPE_CHECKING:  # pragma: no cover
    from ..request.session import MMResult

#: OpenAI's default budget of a text completion.
DEFAULT_COMPLETION_TOKENS = 16
#: Alternatives ``logprobs`` may ask for per token (OpenAI's limit).
MAX_LOGPROBS = 5


def _prompt(v: Any) -> Any:
    if isinstance(v, list):
        if v and all(is_int(x) for x in v) or any(isinstance(x, list) for x in v):
            raise refuse("prompt as token ids is not supported: send the prompt's text", "unsupported")
        if len(v) != 1 or not isinstance(v[0], str):
            raise refuse(
                f"prompt holds {len(v)} items; this server answers one prompt per request: send a string (or a list of one)",
                "unsupported",
            )
        v = v[0]
    if not isinstance(v, str):
        raise refuse("prompt must be a string (or a list of one string)")
    if not v.strip():
        raise refuse("prompt is empty: send the text to answer", "empty_question")
    return v


def _logprobs(v: Any) -> Any:
    if not is_int(v, 0, MAX_LOGPROBS):
        raise refuse(f"logprobs={v!r} must be an integer >= 0 and <= {MAX_LOGPROBS} (the alternatives shown per token)")
    return v


class _CompletionBody(RequestModel):
    """The body's own leading field, a base listed last so pydantic validates it first (a missing one is named before any other error)."""

    prompt: Annotated[str, checked_by(_prompt)]


class CompletionRequest(DecodeExtras, DecodeRequest, _CompletionBody):
    """A text completion request (OpenAI's ``CreateCompletionRequest``, the server's extensions, and the fields
    routers add: :mod:`.models_router`)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"model": "tiny", "prompt": "Which bar is the tallest?", "max_tokens": 16}]})

    logprobs: Annotated[Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None, checked_by(_logprobs)] = None
    echo: unsupported(lambda v: v is False, "false: the prompt is not repeated in the answer", "echo", Literal[False]) = None
    best_of: unsupported(lambda v: v == 1, "null or 1: each choice is its own row (use n)", "best_of", Literal[1]) = None
    suffix: unsupported(lambda v: False, "null: text insertion is not supported", "suffix") = None


def parse_completion_request(req: CompletionRequest, *, base: AsymSpecConfig | None = None) -> ChatRequest:
    """The :class:`~asymspec_mm.serve.chat_request.ChatRequest` of a validated completion request: one user message holding
    the prompt; ``top_logprobs`` is ``logprobs`` (None: none asked)."""
    config = config_of(req, base, req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_TOKENS, req.logprobs)
    check_per_image(req.asymspec, 0)  # the prompt is text alone
    request = Request(
        messages=[{"role": "user", "content": [{"type": "text", "text": req.prompt}]}],
        config=config,
        **asymspec_fields(req.asymspec),
        response_format=response_format_of(req),
        ignore_eos=bool(req.ignore_eos),
        domain_advice=DOMAIN_ADVICE,
    )
    params = {"messages": "prompt", **(STRUCTURED_PARAMS if req.structured_outputs is not None else {})}
    return decode_request(checked(request, params), req, req.logprobs)


# ---------------------------------------------------------------------------------------------- answers
def completion_logprobs(content: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """The chat ``logprobs.content`` entries (:func:`~asymspec_mm.serve.chat_answers.logprobs_of`) in the text
    completion's layout: ``tokens``, ``token_logprobs``, ``top_logprobs`` (token -> log-probability) and
    ``text_offset`` (each token's first character in the answer, from ``offset``)."""
    offsets, at = [], offset
    for entry in content:
        offsets.append(at)
        at += len(entry["token"])
    return {
        "tokens": [e["token"] for e in content],
        "token_logprobs": [e["logprob"] for e in content],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in content],
        "text_offset": offsets,
    }


def text_completion(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A ``text_completion`` object (a whole answer, or one chunk of a stream), built as the ``openai`` package's
    ``Completion``; a chunk before a choice's end has ``finish_reason: null``, as OpenAI streams it, which that type
    (and the OpenAPI document, which has no chunk schema for this endpoint) does not allow: such a chunk is sent as
    built."""
    from openai.types import Completion

    body = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices, **extra}
    if any(c["finish_reason"] is None for c in choices):
        return body
    return Completion.model_validate(body).model_dump(mode="json", exclude_unset=True, warnings=False)


def choice(index: int, text: str, finish: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def finish_of(res: "MMResult") -> str:
    """``length`` when the budget ended the answer, else ``stop``."""
    return "length" if res.finish_reason == "length" else "stop"


def total_usage(results: "list[MMResult]") -> dict[str, Any]:
    """The prompt once and every choice's completion tokens."""
    first = usage(results[0])
    extra = sum(len(res.token_ids) for res in results[1:])
    return {**first, "completion_tokens": first["completion_tokens"] + extra, "total_tokens": first["total_tokens"] + extra}
