"""``POST /v1/responses``' request body as pydantic models: :class:`CreateResponseRequest`, every field of OpenAI's
``CreateResponse`` declared (read, accepted as a hint, or refused unless neutral; :mod:`.request_fields`), and the
extensions ``top_k``, ``seed`` and ``asymspec``.

``input`` is a string or a list of items: ``message`` items (``user`` / ``system`` / ``developer`` with
``input_text`` and, for the user, ``input_image`` parts; ``assistant`` with ``output_text`` or ``refusal``),
``function_call`` and ``function_call_output`` items, and ``reasoning`` items (skipped). Keys of an item the server
has no use for (an item's ``id`` and ``status``, an image's ``detail``) are ignored. How the items become the chat
conversation is :mod:`.responses_api`'s.
"""

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ..base.checks import is_int
from .models_endpoint import EndpointRequest
from .models_fields import (
    MAX_MESSAGES,
    MAX_TOOLS,
    SUPPORT,
    AsymSpecOptions,
    LooseModel,
    OpenAIModel,
    RequestModel,
    Seed,
    budget,
    checked_by,
    flag,
    hint,
    one_of,
    refuse,
    str_or_list,
    type_of,
    unsupported,
)
from .models_router import SamplingExtras, adopt_carried

#: What ``include`` may ask for: nothing is made for the reasoning items, and the answer's log-probabilities.
INCLUDABLE = ("reasoning.encrypted_content", "message.output_text.logprobs")


# ---------------------------------------------------------------------------------------------- content parts
class InputText(LooseModel):
    type: Literal["input_text", "output_text"]
    text: str


class Refusal(LooseModel):
    type: Literal["refusal"]
    refusal: str


def _image_url(v: Any) -> Any:
    url = v.get("url") if isinstance(v, Mapping) else v
    if not isinstance(url, str) or not url.strip():
        raise refuse("{param} must be a data URL ('data:image/png;base64,...')")
    return url


class InputImage(LooseModel):
    """An image part: ``image_url`` a data URL, or a file under ``--allow-local-images`` (``detail`` is a hint)."""

    type: Literal["input_image"]
    image_url: Annotated[str | None, checked_by(_image_url)] = None
    file_id: unsupported(lambda v: False, "null: there is no Files API; send the image as a data URL in image_url", "{param}") = None

    @model_validator(mode="after")
    def _has_url(self) -> "InputImage":
        if self.image_url is None:
            raise refuse("{param}.image_url must be a data URL ('data:image/png;base64,...')")
        return self


class ImageNotHere(LooseModel):
    """An ``input_image`` where images do not go (a system or assistant message)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        raise refuse("{param}: images go in user messages and function_call_output items only; move it there", "image_not_in_user_message")


class FilePart(LooseModel):
    """An ``input_file`` part: refused (there is no Files API)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        raise refuse("{param}: files are not served here; send text as input_text and images as input_image", "unsupported", suffix=".type")


_TEXTS = {"input_text": InputText, "output_text": InputText, "refusal": Refusal, "input_file": FilePart}
UserPart = one_of(type_of, {**_TEXTS, "input_image": InputImage}, "input_part_type")
OtherPart = one_of(type_of, {**_TEXTS, "input_image": ImageNotHere}, "input_part_type")


def _content(part: Any) -> Any:
    return one_of(str_or_list, {"string": str, "list": list[part]}, "content_parts")


# ---------------------------------------------------------------------------------------------- input items
class UserMessageItem(LooseModel):
    type: Literal["message"] = "message"
    role: Literal["user"]
    content: _content(UserPart)  # type: ignore[valid-type]


class OtherMessageItem(LooseModel):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "assistant"]
    content: _content(OtherPart)  # type: ignore[valid-type]


class FunctionCallItem(LooseModel):
    """A call the model made: its ``call_id``, ``name`` and ``arguments`` (the JSON text)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(LooseModel):
    """The client's answer to a call: ``call_id`` and ``output`` (a string, or text and image parts)."""

    type: Literal["function_call_output"]
    call_id: str
    output: _content(UserPart)  # type: ignore[valid-type]


class ReasoningItem(LooseModel):
    """Another model's hidden reasoning: skipped (this model writes none and reads none)."""

    type: Literal["reasoning"]


def _item_kind(v: Any) -> str | None:
    if not isinstance(v, Mapping):
        return None
    kind = v.get("type", "message" if "role" in v else None)
    if kind == "message":
        return "user" if v.get("role") == "user" else "other" if v.get("role") in ("system", "developer", "assistant") else "role"
    return kind


InputItem = one_of(
    _item_kind,
    {
        "user": UserMessageItem,
        "other": OtherMessageItem,
        "function_call": FunctionCallItem,
        "function_call_output": FunctionCallOutputItem,
        "reasoning": ReasoningItem,
    },
    "input_item",
)


def _input(v: Any) -> Any:
    if (isinstance(v, str) and not v) or (isinstance(v, list) and not v):
        raise refuse("input must be a non-empty string or list of items")
    if isinstance(v, list) and len(v) > MAX_MESSAGES:
        raise refuse(f"input holds {len(v)} items; at most {MAX_MESSAGES} are taken (the server's limit): send a shorter conversation")
    return v


def _tools(v: Any) -> Any:
    if isinstance(v, list) and len(v) > MAX_TOOLS:
        raise refuse(f"tools holds {len(v)} tools; at most {MAX_TOOLS} are taken (as OpenAI's API)")
    return v


# ---------------------------------------------------------------------------------------------- tools, format
class FunctionTool(LooseModel):
    """A function tool in the Responses shape (the client runs it; ``strict`` is a hint)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(LooseModel):
    type: Literal["function"]
    name: str


class FormatText(OpenAIModel):
    type: Literal["text"]


class FormatJSONObject(OpenAIModel):
    type: Literal["json_object"]


class FormatJSONSchema(LooseModel):
    type: Literal["json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class TextConfig(OpenAIModel):
    """``text``: the answer's ``format`` (text, a JSON object, a JSON schema) and ``verbosity`` (a hint)."""

    format: (
        one_of(type_of, {"text": FormatText, "json_object": FormatJSONObject, "json_schema": FormatJSONSchema}, "text_format") | None
    ) = None  # type: ignore[valid-type]
    verbosity: hint(
        lambda v: v in ("low", "medium", "high"), '"low", "medium" or "high"', "text.verbosity", Literal["low", "medium", "high"]
    ) = None


class ResponseMetadata(OpenAIModel):
    """``metadata``: OpenAI's string pairs (a hint: echoed, no effect on the answer), and the carriers of the fields
    SGLang's gateway drops from a Responses body but forwards here (:data:`~.models_router.CARRIERS`): ``asymspec``
    and ``seed``, read as the top-level fields."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, str]

    asymspec: AsymSpecOptions | None = None
    seed: Seed = None


class ResponseStreamOptions(OpenAIModel):
    include_obfuscation: flag("stream_options.include_obfuscation") = None


class NoReasoning(LooseModel):
    """``reasoning`` as the server takes it: no thinking phase."""

    effort: Literal["none"] | None = None
    summary: None = None


def _reasoning_neutral(v: Any) -> bool:
    return isinstance(v, dict) and v.get("effort") in (None, "none") and v.get("summary") is None


def _include(v: Any) -> Any:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise refuse("include must be a list of strings")
    if not set(v) <= set(INCLUDABLE):
        other = sorted(set(v) - set(INCLUDABLE))
        raise refuse(
            f"include {', '.join(map(repr, other))} is not supported; it takes {' and '.join(map(repr, INCLUDABLE))}", "unsupported"
        )
    return v


# ---------------------------------------------------------------------------------------------- the request
class _ResponseBody(RequestModel):
    """The body's own leading field, a base listed last so pydantic validates it first (a missing one is named before any other error)."""

    input: Annotated[
        one_of(str_or_list, {"string": str, "list": Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]}, "input_shape"),
        checked_by(_input),
    ]  # type: ignore[valid-type]


class CreateResponseRequest(SamplingExtras, EndpointRequest, _ResponseBody):
    """A Responses API request (OpenAI's ``CreateResponse``, the server's extensions, and the fields SGLang's gateway
    adds: :mod:`.models_router`)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "tiny", "input": "Which bar is the tallest?", "max_output_tokens": 16}]}
    )

    instructions: Annotated[str | None, checked_by(lambda v: v if isinstance(v, str) else _not_string("instructions"))] = None
    tools: Annotated[
        Annotated[list[one_of(type_of, {"function": FunctionTool}, "tool_type")], Field(max_length=MAX_TOOLS)] | None,  # type: ignore[valid-type]
        checked_by(_tools),
    ] = None
    tool_choice: (
        one_of(
            lambda v: "mode" if isinstance(v, str) else "function" if type_of(v) == "function" else None,
            {"mode": Literal["none", "auto", "required"], "function": NamedFunction},
            "responses_tool_choice",
        )
        | None
    ) = None  # type: ignore[valid-type]
    text: TextConfig | None = None
    max_output_tokens: budget("max_output_tokens") = None
    top_logprobs: Annotated[Annotated[int, Field(ge=0, le=20)] | None, checked_by(lambda v: _top_logprobs(v))] = None
    include: Annotated[list[Literal[INCLUDABLE]] | None, checked_by(_include)] = None
    store: flag("store") = None
    previous_response_id: Annotated[str | None, checked_by(lambda v: v if isinstance(v, str) else _not_string("previous_response_id"))] = (
        None
    )
    # hints: checked, echoed where the response has them, no effect on the answer
    metadata: Annotated[ResponseMetadata | None, Field(json_schema_extra={SUPPORT: "hint"})] = None
    safety_identifier: hint(lambda v: isinstance(v, str), "a string", "safety_identifier", str) = None
    prompt_cache_key: hint(lambda v: isinstance(v, str), "a string (the server reuses prompt KV on its own)", "prompt_cache_key", str) = (
        None
    )
    prompt_cache_retention: hint(
        lambda v: isinstance(v, str), "a string (the server reuses prompt KV on its own)", "prompt_cache_retention", str
    ) = None
    prompt_cache_options: hint(
        lambda v: isinstance(v, dict), "an object (the server reuses prompt KV on its own)", "prompt_cache_options", dict[str, Any]
    ) = None
    parallel_tool_calls: hint(
        lambda v: isinstance(v, bool), "a boolean; the model may make several calls either way", "parallel_tool_calls", bool
    ) = None
    service_tier: hint(lambda v: isinstance(v, str), "a string", "service_tier", str) = None
    max_tool_calls: hint(
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "an integer >= 1 (it bounds built-in tools)",
        "max_tool_calls",
        Annotated[int, Field(ge=1)],
    ) = None
    stream_options: ResponseStreamOptions | None = None
    # refused unless neutral
    background: unsupported(lambda v: v is False, "false: responses are answered in the request", "background", Literal[False]) = None
    truncation: unsupported(
        lambda v: v == "disabled",
        '"disabled": a conversation over the context window is refused, not cut',
        "truncation",
        Literal["disabled"],
    ) = None
    reasoning: unsupported(
        _reasoning_neutral, 'null or {"effort": "none"}: the answer is decoded without a thinking phase', "reasoning", NoReasoning
    ) = None
    conversation: unsupported(
        lambda v: False, "null: the Conversations API is not served; send the history in input or use previous_response_id", "conversation"
    ) = None
    prompt: unsupported(lambda v: False, "null: stored prompt templates are not served; send instructions and input", "prompt") = None
    context_management: unsupported(lambda v: False, "null", "context_management") = None
    moderation: unsupported(lambda v: False, "null: the server does not moderate", "moderation") = None

    @model_validator(mode="after")
    def _together(self) -> "CreateResponseRequest":
        self._carried = adopt_carried(self, "/v1/responses")
        if self.top_logprobs and "message.output_text.logprobs" not in (self.include or ()):
            raise refuse('top_logprobs needs include=["message.output_text.logprobs"]', param="top_logprobs")
        return self

    @property
    def logprobs(self) -> int | None:
        """How many alternatives each output token's log-probability carries, or None: none asked."""
        return (self.top_logprobs or 0) if "message.output_text.logprobs" in (self.include or ()) else None


def _not_string(name: str) -> Any:
    raise refuse(f"{name} must be a string")


def _top_logprobs(v: Any) -> Any:
    if not is_int(v, 0, 20):
        raise refuse(f"top_logprobs={v!r} must be an integer >= 0 and <= 20")
    return v
