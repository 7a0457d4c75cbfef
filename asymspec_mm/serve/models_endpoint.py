"""The base request models the endpoints' models derive from, so each endpoint declares only its own fields:
:class:`EndpointRequest` (every endpoint: the model, streaming, sampling, the ``asymspec`` extension, the ``user``
hint, and the check that ``stream_options`` comes with ``stream``) and :class:`DecodeRequest` (chat completions and
text completions: the budget, stop strings, choices, ``structured_outputs``, ``ignore_eos``, and OpenAI's and vLLM's
fields refused unless neutral). vLLM's :class:`StructuredOutputs` lives here, as both of those endpoints take it.

pydantic puts a base model's fields before a subclass's: the body's field order in ``/openapi.json`` is the base's
first, and of several invalid fields the base's is the one named.
"""

from typing import Annotated, Any

from pydantic import Field, PrivateAttr, model_validator

from .models_fields import (
    AsymSpecOptions,
    Choices,
    ModelName,
    NoLogitBias,
    NoPenalty,
    OpenAIModel,
    RequestModel,
    Seed,
    Stop,
    StreamOptions,
    Temperature,
    TopK,
    TopP,
    budget,
    flag,
    hint,
    no_penalty,
    refuse,
    unsupported,
)


class StructuredOutputs(OpenAIModel):
    """vLLM's ``structured_outputs``: exactly one of ``json`` (a JSON schema, as an object or its text), ``regex``,
    ``choice`` (the answer is one of the strings) or ``grammar`` (EBNF, as xgrammar compiles it)."""

    json_: dict[str, Any] | Annotated[str, Field(min_length=1)] | None = Field(None, alias="json")
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one(self) -> "StructuredOutputs":
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, "json_" if k == "json" else k) is not None]
        if len(given) != 1:
            # {param}: the path as sent (structured_outputs, or chat_template_kwargs.structured_outputs)
            raise refuse(
                f"{{param}} must hold exactly one of json, regex, choice or grammar, not {len(given)} ({', '.join(given) or 'none'})"
            )
        return self


class EndpointRequest(RequestModel):
    """The fields every endpoint reads the same way. ``stream_options`` is each endpoint's own type (the Responses
    API's takes fewer keys), so the subclass declares it; the check here reads it by name."""

    model: ModelName = None
    stream: flag("stream") = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    seed: Seed = None
    asymspec: AsymSpecOptions | None = None
    user: hint(lambda v: isinstance(v, str), "a string", "user", str) = None
    #: field -> the path it was sent by where a carrier brought it (:func:`~.models_router.adopt_carried`)
    _carried: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def carried(self) -> dict[str, str]:
        """Field -> the path the client sent it by, for the fields a carrier object brought (``asymspec`` ->
        ``chat_template_kwargs.asymspec``): what renames a refusal's ``param`` after validation."""
        return dict(self._carried)

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "EndpointRequest":
        # pydantic runs a base's after-validator before the subclass's, so this refusal keeps its precedence
        if getattr(self, "stream_options", None) is not None and not self.stream:
            raise refuse("stream_options is only allowed with stream=true", param="stream_options")
        return self


class DecodeRequest(EndpointRequest):
    """The fields chat completions and text completions share: the budget (``max_tokens``), stop strings, ``n``,
    ``stream_options``, vLLM's ``structured_outputs`` and ``ignore_eos``; refused unless neutral: the penalties,
    ``logit_bias`` and vLLM's older ``guided_*`` fields (pointing at ``structured_outputs``)."""

    max_tokens: budget("max_tokens") = None
    stop: Stop = None
    stream_options: StreamOptions | None = None
    n: Choices = None
    structured_outputs: StructuredOutputs | None = None
    ignore_eos: flag("ignore_eos") = None
    # refused unless neutral
    frequency_penalty: unsupported(no_penalty, "0: penalties are not supported", "frequency_penalty", NoPenalty) = None
    presence_penalty: unsupported(no_penalty, "0: penalties are not supported", "presence_penalty", NoPenalty) = None
    logit_bias: unsupported(lambda v: v == {}, "empty: logit biases are not supported", "logit_bias", NoLogitBias) = None
    # vLLM's older structured-output fields
    guided_json: unsupported(lambda v: False, 'null: send structured_outputs={"json": ...}', "guided_json") = None
    guided_regex: unsupported(lambda v: False, 'null: send structured_outputs={"regex": ...}', "guided_regex") = None
    guided_choice: unsupported(lambda v: False, 'null: send structured_outputs={"choice": [...]}', "guided_choice") = None
    guided_grammar: unsupported(lambda v: False, 'null: send structured_outputs={"grammar": ...}', "guided_grammar") = None
