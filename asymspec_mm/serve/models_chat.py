"""``POST /v1/chat/completions``'s request body as pydantic models: :class:`ChatCompletionRequest`, every field of
OpenAI's ``CreateChatCompletionRequest`` declared (what the server reads, the hints it accepts and ignores, the
fields it refuses unless they hold their neutral value: :data:`~asymspec_mm.serve.request_fields.CHAT_FIELDS`),
plus the extensions ``top_k``, ``chat_template_kwargs``, ``asymspec`` and vLLM's ``structured_outputs``.

The messages are OpenAI's: ``system`` / ``developer`` and ``assistant`` messages with text parts, ``user`` and
``tool`` messages with text and ``image_url`` parts, an assistant's ``tool_calls``; keys a message may carry that
the server has no use for (``name``, ``refusal``, an image's ``detail``) are ignored. What needs the whole
conversation (a tool message answering an earlier call, the last message's role, the number of images) is checked
where the conversation is built (:mod:`.chat_request`).
"""

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ..base.checks import is_int
from .models_endpoint import DecodeRequest, StructuredOutputs
from .models_fields import (
    MAX_MESSAGES,
    MAX_TOOLS,
    AsymSpecOptions,
    LooseModel,
    OpenAIModel,
    RequestModel,
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
from .models_router import ChatExtras, DecodeExtras, adopt_carried

ROLES = ("system", "developer", "user", "assistant", "tool")


# ---------------------------------------------------------------------------------------------- content parts
class TextPart(LooseModel):
    type: Literal["text"]
    text: str


class ImageURL(LooseModel):
    """An image: a ``data:`` URL, or a file under ``--allow-local-images`` (``detail`` is a hint)."""

    url: str
    detail: str | None = None


class ImagePart(LooseModel):
    type: Literal["image_url"]
    image_url: one_of(
        lambda v: "object" if isinstance(v, Mapping) else "string" if isinstance(v, str) else None,
        {"object": ImageURL, "string": str},
        "image_url",
    )  # type: ignore[valid-type]

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


class ImageOutsideUser(LooseModel):
    """An ``image_url`` part where images do not go (a system or assistant message): refused naming the part."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        raise refuse("{param}: images go in user messages only; move it to a user message", "image_not_in_user_message")


class RefusalPart(LooseModel):
    type: Literal["refusal"]
    refusal: str


UserPart = one_of(type_of, {"text": TextPart, "image_url": ImagePart}, "part_type")
OtherPart = one_of(type_of, {"text": TextPart, "image_url": ImageOutsideUser}, "part_type")
AssistantPart = one_of(type_of, {"text": TextPart, "image_url": ImageOutsideUser, "refusal": RefusalPart}, "part_type")


def content_of(part: Any) -> Any:
    """The type of a message's ``content``: a string or a list of ``part`` (null where OpenAI allows it)."""
    return one_of(str_or_list, {"string": str, "list": list[part]}, "content_parts")


# ---------------------------------------------------------------------------------------------- messages
class CallFunction(LooseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(LooseModel):
    """An earlier assistant tool call (``arguments``: the JSON text, or the object)."""

    id: str
    type: Literal["function"] = "function"
    function: CallFunction


class SystemMessage(LooseModel):
    role: Literal["system", "developer"]
    content: content_of(OtherPart)  # type: ignore[valid-type]


class UserMessage(LooseModel):
    role: Literal["user"]
    content: content_of(UserPart)  # type: ignore[valid-type]


class AssistantMessage(LooseModel):
    role: Literal["assistant"]
    content: content_of(AssistantPart) | None = None  # type: ignore[valid-type]
    tool_calls: list[ToolCall] | None = None


class ToolMessage(LooseModel):
    role: Literal["tool"]
    content: content_of(UserPart)  # type: ignore[valid-type]
    tool_call_id: str


def _role(v: Any) -> str | None:
    return v.get("role") if isinstance(v, Mapping) and isinstance(v.get("role"), str) else None


Message = one_of(
    _role,
    {"system": SystemMessage, "developer": SystemMessage, "user": UserMessage, "assistant": AssistantMessage, "tool": ToolMessage},
    "role",
)


def _messages(v: Any) -> Any:
    if not isinstance(v, list) or not v:
        raise refuse("messages must be a non-empty list ending with a user message")
    if len(v) > MAX_MESSAGES:
        raise refuse(
            f"messages holds {len(v)} messages; at most {MAX_MESSAGES} are taken (the server's limit): send a shorter conversation"
        )
    return v


def _tools(v: Any) -> Any:
    if isinstance(v, list) and len(v) > MAX_TOOLS:
        raise refuse(f"tools holds {len(v)} tools; at most {MAX_TOOLS} are taken (as OpenAI's API)")
    return v


# ---------------------------------------------------------------------------------------------- tools, formats
class FunctionDefinition(LooseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(LooseModel):
    type: Literal["function"]
    function: FunctionDefinition


Tool = one_of(type_of, {"function": FunctionTool}, "tool_type")


class NamedFunction(LooseModel):
    name: str


class NamedToolChoice(LooseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = one_of(
    lambda v: "mode" if isinstance(v, str) else "function" if type_of(v) == "function" else None,
    {"mode": Literal["none", "auto", "required"], "function": NamedToolChoice},
    "tool_choice",
)


class FormatText(OpenAIModel):
    type: Literal["text"]


class FormatJSONObject(OpenAIModel):
    type: Literal["json_object"]


class JSONSchemaSpec(LooseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class FormatJSONSchema(OpenAIModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = one_of(type_of, {"text": FormatText, "json_object": FormatJSONObject, "json_schema": FormatJSONSchema}, "response_format")


class ChatTemplateKwargs(OpenAIModel):
    """What the chat template is given: ``enable_thinking`` (default false, as the paper's harness); and the carriers
    of the extensions SGLang's gateway drops from a chat body but forwards here (:data:`~.models_router.CARRIERS`):
    ``asymspec`` and ``structured_outputs``, read as the top-level fields."""

    enable_thinking: flag("chat_template_kwargs.enable_thinking") = None
    asymspec: AsymSpecOptions | None = None
    structured_outputs: StructuredOutputs | None = None


# ---------------------------------------------------------------------------------------------- the request
def _text_only(v: Any) -> bool:
    return v == ["text"]


class _ChatBody(RequestModel):
    """The body's own leading field, a base listed last so pydantic validates it first (a missing one is named before any other error)."""

    messages: Annotated[Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)], checked_by(_messages)]  # type: ignore[valid-type]


class ChatCompletionRequest(ChatExtras, DecodeExtras, DecodeRequest, _ChatBody):
    """A chat completion request (OpenAI's ``CreateChatCompletionRequest``, the server's extensions, and the fields
    routers add: :mod:`.models_router`, listed first so that their fields come after the endpoint's)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "tiny", "messages": [{"role": "user", "content": "Which bar is the tallest?"}], "max_tokens": 16}]
        }
    )

    max_completion_tokens: budget("max_completion_tokens") = None
    logprobs: flag("logprobs") = None
    top_logprobs: Annotated[Annotated[int, Field(ge=0, le=20)] | None, checked_by(lambda v: _top_logprobs(v))] = None
    tools: Annotated[Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None, checked_by(_tools)] = None  # type: ignore[valid-type]
    tool_choice: ToolChoice | None = None  # type: ignore[valid-type]
    response_format: ResponseFormat | None = None  # type: ignore[valid-type]
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    # hints: accepted, no effect on the answer
    parallel_tool_calls: hint(lambda v: isinstance(v, bool), "a boolean", "parallel_tool_calls", bool) = None
    metadata: hint(lambda v: isinstance(v, dict), "an object", "metadata", dict[str, str]) = None
    store: hint(lambda v: isinstance(v, bool), "a boolean (nothing is stored either way)", "store", bool) = None
    service_tier: hint(lambda v: isinstance(v, str), "a string", "service_tier", str) = None
    safety_identifier: hint(lambda v: isinstance(v, str), "a string", "safety_identifier", str) = None
    prompt_cache_key: hint(lambda v: isinstance(v, str), "a string", "prompt_cache_key", str) = None
    prompt_cache_retention: hint(lambda v: isinstance(v, str), "a string", "prompt_cache_retention", str) = None
    prompt_cache_options: hint(lambda v: isinstance(v, dict), "an object", "prompt_cache_options", dict[str, Any]) = None
    verbosity: hint(
        lambda v: v in ("low", "medium", "high"), '"low", "medium" or "high"', "verbosity", Literal["low", "medium", "high"]
    ) = None
    # refused unless neutral
    modalities: unsupported(
        _text_only, '["text"]: answers are text', "modalities", Annotated[list[Literal["text"]], Field(min_length=1, max_length=1)]
    ) = None
    audio: unsupported(lambda v: False, "null: answers are text, not audio", "audio") = None
    prediction: unsupported(lambda v: False, "null: predicted outputs are not supported", "prediction") = None
    web_search_options: unsupported(lambda v: False, "null: the server does not search the web", "web_search_options") = None
    moderation: unsupported(lambda v: False, "null: the server does not moderate", "moderation") = None
    functions: unsupported(lambda v: False, "null: send tools (functions is OpenAI's deprecated form)", "functions") = None
    function_call: unsupported(lambda v: False, "null: send tool_choice (function_call is OpenAI's deprecated form)", "function_call") = (
        None
    )

    @model_validator(mode="after")
    def _together(self) -> "ChatCompletionRequest":
        self._carried = adopt_carried(self, "/v1/chat/completions")
        if self.top_logprobs and not self.logprobs:
            raise refuse("top_logprobs needs logprobs=true", param="top_logprobs")
        if self.structured_outputs is not None and self.response_format is not None and self.response_format.type != "text":
            so = self._carried.get("structured_outputs", "structured_outputs")
            raise refuse(f"send either response_format or {so}, not both", param=so)
        thinking = None if self.chat_template_kwargs is None else self.chat_template_kwargs.enable_thinking
        if self.reasoning_effort is not None and thinking is not None and thinking != (self.reasoning_effort != "none"):
            raise refuse(
                f"reasoning_effort={self.reasoning_effort!r} contradicts chat_template_kwargs.enable_thinking={str(thinking).lower()}: send one",
                param="reasoning_effort",
            )
        return self

    @property
    def budget(self) -> int | None:
        """The token budget: ``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def enable_thinking(self) -> bool:
        """Whether the verifier's template thinks: ``chat_template_kwargs.enable_thinking``, else ``reasoning_effort``
        other than ``none`` (the effort itself is not graded), else false."""
        if self.chat_template_kwargs is not None and self.chat_template_kwargs.enable_thinking is not None:
            return self.chat_template_kwargs.enable_thinking
        return self.reasoning_effort not in (None, "none")


def _top_logprobs(v: Any) -> Any:
    if not is_int(v, 0, 20):
        raise refuse(f"top_logprobs={json.dumps(v)[:40]} must be an integer >= 0 and <= 20")
    return v
