"""The fields a router or gateway adds to the bodies it forwards (vLLM's and SGLang's sampling and output extras):
accepted at their neutral values, refused with code ``unsupported`` naming the field when they would change the
answer, as mixins of the endpoints' request models. A field the server does not know and that is not listed here
stays a 400 (``unknown_field``).

vllm-router 0.1.17 and SGLang's gateway (``sglang-router`` 0.3.2) parse a chat or completions body into their own
request type and serialise that type again, defaults included, so every body they forward carries fields the client
never sent (``no_stop_trim: false``, ``skip_special_tokens: true``, ...; on the Responses API, SGLang's gateway adds
``priority``, ``min_p`` and ``repetition_penalty``). The bodies they really send are kept under
``tests/data/router_bodies/``; :data:`ROUTER_FIELDS` says which router adds which field.

SGLang's gateway also drops fields it has no slot for (chat: ``asymspec``, ``structured_outputs``; Responses:
``asymspec``, ``seed``) but forwards some objects verbatim (chat: ``chat_template_kwargs``; Responses:
``metadata``). :data:`CARRIERS` names the object that carries each dropped field through the gateway, and
:func:`adopt_carried` reads it from there exactly as from the top level.
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from ..base.checks import is_number
from .models_fields import OpenAIModel, hint, refuse, unsupported

#: field -> the routers that add it to every body they forward (others are vLLM's and SGLang's sampling extras a
#: client of theirs may send at the neutral value). docs/serving.md's "Fields routers add" table lists the same.
ROUTER_FIELDS: dict[str, str] = {
    "no_stop_trim": "vllm-router, sglang-router",
    "skip_special_tokens": "vllm-router, sglang-router",
    "return_hidden_states": "vllm-router, sglang-router",
    "continue_final_message": "vllm-router, sglang-router",
    "separate_reasoning": "vllm-router, sglang-router",
    "stream_reasoning": "vllm-router, sglang-router",
    "include_reasoning": "vllm-router",
    "priority": "sglang-router (Responses)",
    "min_p": "sglang-router (Responses)",
    "repetition_penalty": "sglang-router (Responses)",
    "min_tokens": "",
    "stop_token_ids": "",
    "include_stop_str_in_output": "",
}
#: The key of a field's JSON schema marking it as one of :data:`ROUTER_FIELDS`.
ROUTER_MARK = "x-asymspec-router-field"


def _is(value: Any) -> Any:
    return lambda v: v is value


def _number_is(value: float) -> Any:
    return lambda v: is_number(v) and v == value


def _router(kind: Any) -> Any:
    """``kind`` (a :func:`hint` or :func:`unsupported` type) marked as a router's field in ``/openapi.json``."""
    return Annotated[kind, Field(json_schema_extra={ROUTER_MARK: True})]


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _priority(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: The neutral values' types, as ``/openapi.json`` states them.
Zero = Annotated[float, Field(ge=0, le=0)]
One = Annotated[float, Field(ge=1, le=1)]
NoTokenIds = Annotated[list[int], Field(max_length=0)]
NoMinTokens = Annotated[int, Field(ge=0, le=0)]


class SamplingExtras(OpenAIModel):
    """vLLM's and SGLang's sampling extras every endpoint takes at their neutral value, and SGLang's and vLLM's
    scheduling ``priority`` (a hint: the server schedules first come, first served)."""

    min_p: _router(unsupported(_number_is(0), "0: min-p sampling is not supported", "min_p", Zero)) = None
    repetition_penalty: _router(unsupported(_number_is(1), "1: penalties are not supported", "repetition_penalty", One)) = None
    priority: _router(hint(_priority, "an integer (requests are served first come, first served)", "priority", int)) = None


class DecodeExtras(SamplingExtras):
    """The output extras of chat and text completions (vLLM's and SGLang's), each at the value that decodes, stops
    and detokenises exactly as this server does."""

    no_stop_trim: _router(unsupported(_is(False), "false: a stop string is always cut from the answer", "no_stop_trim", Literal[False])) = (
        None
    )
    skip_special_tokens: _router(
        unsupported(_is(True), "true: special tokens are always left out of the text", "skip_special_tokens", Literal[True])
    ) = None
    return_hidden_states: _router(
        unsupported(_is(False), "false: hidden states are not returned", "return_hidden_states", Literal[False])
    ) = None
    min_tokens: _router(unsupported(_number_is(0), "0: a minimum answer length is not supported", "min_tokens", NoMinTokens)) = None
    stop_token_ids: _router(
        unsupported(lambda v: v == [], "[]: stop with stop strings (or the model's end of answer)", "stop_token_ids", NoTokenIds)
    ) = None
    include_stop_str_in_output: _router(
        unsupported(_is(False), "false: a stop string is always cut from the answer", "include_stop_str_in_output", Literal[False])
    ) = None


class ChatExtras(OpenAIModel):
    """The chat-only extras: ``continue_final_message`` (refused unless false) and the reasoning switches (hints:
    the server has no reasoning parser, so a thinking answer keeps its thinking in ``content`` either way)."""

    continue_final_message: _router(
        unsupported(
            _is(False),
            "false: the answer is a new assistant message, not the continuation of the last one",
            "continue_final_message",
            Literal[False],
        )
    ) = None
    separate_reasoning: _router(
        hint(_is_bool, "a boolean (no reasoning parser: thinking stays in content)", "separate_reasoning", bool)
    ) = None
    stream_reasoning: _router(hint(_is_bool, "a boolean (no reasoning parser: thinking stays in content)", "stream_reasoning", bool)) = None
    include_reasoning: _router(hint(_is_bool, "a boolean (no reasoning parser: thinking stays in content)", "include_reasoning", bool)) = (
        None
    )


def router_fields(model: type[OpenAIModel]) -> set[str]:
    """The fields of request model ``model`` that are :data:`ROUTER_FIELDS`."""
    return {
        info.alias or name
        for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(ROUTER_MARK)
    }


# ---------------------------------------------------------------------------------------------- carriers
#: endpoint -> {field SGLang's gateway (sglang-router 0.3.2) drops: the object it forwards verbatim that carries the
#: field through it}. docs/serving.md's field lists and docs/deployment.md say the same.
CARRIERS: dict[str, dict[str, str]] = {
    "/v1/chat/completions": {"asymspec": "chat_template_kwargs", "structured_outputs": "chat_template_kwargs"},
    "/v1/responses": {"asymspec": "metadata", "seed": "metadata"},
}


def adopt_carried(req: OpenAIModel, endpoint: str) -> dict[str, str]:
    """Each field of :data:`CARRIERS` [``endpoint``] that its carrier object on the validated ``req`` holds, set on
    ``req`` itself (the carrier's value was validated by the same type as the top-level field's, so it is read the
    same way). Returns field -> the path the client sent it by (``chat_template_kwargs.asymspec``), which names the
    field in a later refusal. A field sent both ways with different values is refused naming both."""
    came: dict[str, str] = {}
    for name, carrier in CARRIERS[endpoint].items():
        held = getattr(req, carrier, None)
        value = None if held is None else getattr(held, name, None)
        if value is None:
            continue
        path = f"{carrier}.{name}"
        own = getattr(req, name)
        if own is not None and own != value:
            raise refuse(f"{name} and {path} differ: send one of them ({path} reaches the server through SGLang's gateway)", param=path)
        setattr(req, name, value)
        came[name] = path
    return came
