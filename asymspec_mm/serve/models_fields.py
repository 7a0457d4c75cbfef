"""What the pydantic request models of the three endpoints share: the base models, refusals with the server's
one-line messages, the sampling and AsymSpec fields, the fields accepted as hints or refused unless neutral
(:func:`field_support` says which), and the check of every string in a body. How a refusal becomes OpenAI's error
object (a 400 naming the field) is :mod:`.validation_errors`'.

A field's type documents it in the server's ``/openapi.json``; a ``BeforeValidator`` in front of the type gives
its refusal the server's own words (``temperature=3 must be >= 0 and <= 2 (0 decodes greedily)``), so pydantic's
generic messages appear only where no field-specific one is written (``messages[0].role is required``). A message
may start with ``{param}``: the field's path (``messages[2].content[1].type``), filled in from the error's
location, or from its ``param`` context where the path is not the location (a string deep inside ``tools``).
"""

import json
import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from ..base.checks import is_int, is_number
from ..base.config import CHOICES, METHODS, RANGES, SEED_LIMIT, range_error
from ..base.unicode_check import find_bad_text, invalid_text_message

#: The AsymSpec options a request may set under ``"asymspec"``.
ASYMSPEC_OPTIONS = ("method", "k", "beta", "gamma", "gate", "delta", "bonus", "caption", "ocr", "return_trace", "compression")
MAX_STOP = 4
"""Stop strings one request may give, as OpenAI's API allows (the Python API takes any number)."""
#: Choices one request may ask for (``n``); each is a row of the batch.
MAX_CHOICES = 8
MAX_MESSAGES = 2048
"""Messages (chat) or input items (Responses) one request may hold: rendering a conversation costs time before the
context window is checked, so an endless one is refused at once (100,000 messages took 40 s to find too long)."""
MAX_TOOLS = 128
"""Tools one request may offer (OpenAI's limit)."""


# ---------------------------------------------------------------------------------------------- refusals
def refuse(message: str, code: str = "invalid_value", param: str | None = None, suffix: str = "") -> PydanticCustomError:
    """A validation error with the server's message (``{param}`` at its start: the field's path) and OpenAI's
    error ``code``; ``param`` names the field where the error's location does not (a path elsewhere), ``suffix`` a
    field below the location (``.type``)."""
    ctx: dict[str, Any] = {"own": True, "suffix": suffix}
    if param is not None:
        ctx["param"] = param
    return PydanticCustomError(code, message, ctx)


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


def shown(v: Any) -> str:
    """``v`` as JSON, at most 40 characters (a value a message quotes)."""
    return json.dumps(v)[:40]


class OpenAIModel(BaseModel):
    """A request object: unknown keys refused (each names itself), values kept as sent (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=True)


class LooseModel(OpenAIModel):
    """A nested object whose extra keys are ignored (OpenAI's message objects carry keys this server has no use for,
    e.g. a message's ``name``)."""

    model_config = ConfigDict(extra="ignore")


def checked_by(check: Callable[[Any], Any]) -> BeforeValidator:
    """A ``BeforeValidator`` that runs ``check`` on a value that is not null."""
    return BeforeValidator(lambda v: v if v is None else check(v))


def one_of(pick: Callable[[Any], str | None], branches: Mapping[str, Any], error: str) -> Any:
    """A union validated by the one branch that ``pick(value)`` names (``None``: the error type ``error``, worded by
    :func:`request_error`). Its branches' tags start with ``~``, so a field's path leaves them out."""
    members = tuple(Annotated[t, Tag("~" + k)] for k, t in branches.items())

    def tag(v: Any) -> str | None:
        key = pick(v)
        return "~" + key if key in branches else None

    return Annotated[Union[members], Discriminator(tag, custom_error_type=error, custom_error_message=error)]  # noqa: UP007


def type_of(v: Any) -> str | None:
    """The ``type`` of an object (OpenAI's tagged objects), or None."""
    return v.get("type") if isinstance(v, Mapping) and isinstance(v.get("type"), str) else None


def str_or_list(v: Any) -> str | None:
    return "string" if isinstance(v, str) else "list" if isinstance(v, list) else None


# ---------------------------------------------------------------------------------------------- field checks
def in_range(name: str, param: str) -> Callable[[Any], Any]:
    """A check of the config field ``name``'s range (:data:`~asymspec_mm.base.config.RANGES`) naming ``param``."""

    def check(v: Any) -> Any:
        if (problem := range_error(name, v, field_value(param, v))) is not None:
            raise refuse(problem)
        return v

    return check


def token_budget(param: str) -> Callable[[Any], Any]:
    """``max_tokens`` and its kin: an integer >= 1."""

    def check(v: Any) -> Any:
        if not is_int(v, 1):
            raise refuse(f"{param} must be an integer >= 1, got {shown(v)}")
        return in_range("max_new_tokens", param)(v)

    return check


def _temperature(v: Any) -> Any:
    if (problem := range_error("temperature", v, f"temperature={shown(v)}")) is not None:
        raise refuse(f"{problem} (0 decodes greedily)")
    return float(v)


def _top_p(v: Any) -> Any:
    if not is_number(v) or not 0 < v <= 1:
        raise refuse(f"top_p={shown(v)} must be a number > 0 and <= 1 (1 keeps every token)")
    return float(v)


def _top_k(v: Any) -> Any:
    if not is_int(v, -1):  # vLLM's -1 and 0 both mean off
        raise refuse(f"top_k={shown(v)} must be an integer >= 0 (0 or -1: off)")
    return v


def _seed(v: Any) -> Any:
    if not is_int(v, 0, SEED_LIMIT - 1):
        raise refuse(f"{{param}}={shown(v)} must be an integer >= 0 and < 2**63")  # seed, or metadata.seed (a carrier)
    return v


def _n(v: Any) -> Any:
    if not is_int(v, 1, MAX_CHOICES):
        raise refuse(f"n={shown(v)} must be an integer >= 1 and <= {MAX_CHOICES}")
    return v


def _stop(v: Any) -> Any:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise refuse("stop must be a string or a list of strings")
    if any(not s for s in items):
        raise refuse("stop strings must not be empty")
    if len(items) > MAX_STOP:
        raise refuse(f"stop has {len(items)} strings; at most {MAX_STOP} are allowed (as OpenAI's API): send fewer")
    return v


def _bool(name: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, bool):
            raise refuse(f"{name} must be true or false")
        return v

    return check


def _string(name: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, str):
            raise refuse(f"{name} must be a string")
        return v

    return check


Temperature = Annotated[Annotated[float, Field(ge=0, le=2)] | None, checked_by(_temperature)]
TopP = Annotated[Annotated[float, Field(gt=0, le=1)] | None, checked_by(_top_p)]
TopK = Annotated[Annotated[int, Field(ge=-1)] | None, checked_by(_top_k)]
Seed = Annotated[Annotated[int, Field(ge=0, lt=SEED_LIMIT)] | None, checked_by(_seed)]
Choices = Annotated[Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None, checked_by(_n)]
Stop = Annotated[str | Annotated[list[str], Field(max_length=MAX_STOP)] | None, checked_by(_stop)]
ModelName = Annotated[str | None, checked_by(_string("model"))]


def budget(name: str) -> Any:
    """The type of a token budget field named ``name``."""
    return Annotated[Annotated[int, Field(ge=1)] | None, checked_by(token_budget(name))]


def flag(name: str) -> Any:
    """The type of a boolean field named ``name``."""
    return Annotated[bool | None, checked_by(_bool(name))]


class StreamOptions(OpenAIModel):
    """``stream_options``: ``include_usage`` (a last chunk with the usage), ``include_obfuscation`` (a hint: nothing is
    obfuscated) and vLLM's ``continuous_usage_stats`` (a hint)."""

    include_usage: flag("stream_options.include_usage") = None
    include_obfuscation: flag("stream_options.include_obfuscation") = None
    continuous_usage_stats: flag("stream_options.continuous_usage_stats") = None


def sampling_fields(req: Any) -> dict[str, Any]:
    """The config fields a validated request's ``temperature``, ``top_p``, ``top_k`` and ``seed`` set (absent or
    null: not set; ``top_k`` -1 is 0, off)."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "seed"):
        if getattr(req, name, None) is not None:
            out[name] = getattr(req, name)
    if getattr(req, "top_k", None) is not None:
        out["top_k"] = max(0, req.top_k)
    return out


# ---------------------------------------------------------------------------------------------- asymspec
#: A refusal's placeholder for the field's path as the client sent it: ``asymspec.k``, or
#: ``chat_template_kwargs.asymspec.k`` where the extension came through a carrier (:mod:`.models_router`).
PARAM = "{param}"


def _choice(name: str) -> Callable[[Any], Any]:
    options = METHODS if name == "method" else CHOICES[name]

    def check(v: Any) -> Any:
        if v not in options:
            raise refuse(f"{field_value(PARAM, v)} is not valid; choose one of {', '.join(options)}")
        return v

    return check


def _k(v: Any) -> Any:
    if not is_int(v, 1):
        raise refuse(f"{PARAM} must be an integer >= 1, got {shown(v)}")
    return in_range("k", PARAM)(v)


def _fraction(name: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not is_number(v):
            raise refuse(f"{PARAM} must be a number, got {shown(v)}")
        if not math.isfinite(v):
            raise refuse(f"{PARAM}={v} must be a finite number (NaN and infinities are refused)")
        return in_range(name, PARAM)(float(v))

    return check


def _strings(v: Any, allow_false: bool = False) -> bool:
    ok = lambda x: isinstance(x, str) or (allow_false and x is False)
    return isinstance(v, str) or (isinstance(v, list) and all(ok(x) for x in v))


def _caption(v: Any) -> Any:
    if not _strings(v):
        raise refuse(f"{PARAM} must be a string (the caption the verifier reads; a list: one per image) or null (the drafter captions)")
    return v


def _ocr(v: Any) -> Any:
    if v is not False and not _strings(v, allow_false=True):
        raise refuse(f"{PARAM} must be a string (the OCR text; a list: one per image), false (no OCR) or null (the server's OCR engine)")
    return v


def _compression(v: Any) -> Any:
    """``asymspec.compression``: a compressor's name or an object of settings, checked as the engine checks it
    (:class:`~asymspec_mm.request.compression.Compression`); ``false`` turns the server's default off."""
    from ..request.compression import Compression, CompressionError

    if v is False:
        return v
    if not isinstance(v, (str, dict)):
        raise refuse(f"{PARAM} must be a compressor's name, an object of settings or false (none)")
    try:  # {param}: the path as sent (asymspec.compression, or chat_template_kwargs.asymspec.compression)
        Compression.of(v, PARAM)
    except CompressionError as exc:
        raise refuse(str(exc), suffix=(exc.param or PARAM).removeprefix(PARAM)) from None
    return v


def _range(name: str) -> dict[str, float]:
    low, high = RANGES[name].bounds()
    return {"ge": low, **({"le": high} if high is not None else {})}


class AsymSpecOptions(OpenAIModel):
    """The ``asymspec`` extension object: the method and its settings, the compressed view, the trace."""

    method: Annotated[Literal[METHODS] | None, checked_by(_choice("method"))] = None  # type: ignore[valid-type]
    k: Annotated[Annotated[int, Field(**_range("k"))] | None, checked_by(_k)] = None
    beta: Annotated[Annotated[float, Field(**_range("beta"))] | None, checked_by(_fraction("beta"))] = None
    gamma: Annotated[Annotated[float, Field(**_range("gamma"))] | None, checked_by(_fraction("gamma"))] = None
    gate: Annotated[Literal[CHOICES["gate"]] | None, checked_by(_choice("gate"))] = None  # type: ignore[valid-type]
    delta: Annotated[Literal[CHOICES["delta"]] | None, checked_by(_choice("delta"))] = None  # type: ignore[valid-type]
    bonus: Annotated[Literal[CHOICES["bonus"]] | None, checked_by(_choice("bonus"))] = None  # type: ignore[valid-type]
    caption: Annotated[str | list[str] | None, checked_by(_caption)] = None
    ocr: Annotated[str | Literal[False] | list[str | Literal[False]] | None, checked_by(_ocr)] = None
    return_trace: flag(PARAM) = None
    compression: Annotated[str | Literal[False] | dict[str, Any] | None, checked_by(_compression)] = None

    def config_fields(self) -> dict[str, Any]:
        """The settings it gives (the config's fields it sets)."""
        return {name: getattr(self, name) for name in ("k", "beta", "gamma", "gate", "delta", "bonus") if getattr(self, name) is not None}


# ---------------------------------------------------------------------------------------------- hints, refusals
#: The key of a field's JSON schema (in ``/openapi.json`` too) saying how the server treats it: ``hint`` (accepted,
#: no effect on the answer) or ``unsupported`` (refused unless neutral); absent: the server reads it.
SUPPORT = "x-asymspec-support"


def field_support(model: type[BaseModel]) -> dict[str, str]:
    """Each field of a request model (by its name in the body) -> ``supported``, ``hint`` or ``unsupported``."""
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        out[info.alias or name] = str(extra.get(SUPPORT, "supported"))
    return out


def hint(what: Callable[[Any], bool], why: str, name: str, annotation: Any = Any) -> Any:
    """The type of a field accepted as a hint (no effect on the answer): ``annotation`` documents it, ``what`` checks
    its value (``why`` says what it must be)."""

    def check(v: Any) -> Any:
        if not what(v):
            raise refuse(f"{field_value(name, v)} must be {why}")
        return v

    return Annotated[annotation | None, checked_by(check), Field(json_schema_extra={SUPPORT: "hint"})]


def unsupported(neutral: Callable[[Any], bool], why: str, name: str, annotation: Any = None) -> Any:
    """The type of an OpenAI field the server cannot honour: accepted while it holds its neutral value (``why`` says
    which; ``annotation`` is the type of the neutral values other than null, as ``/openapi.json`` states them), else
    refused with code ``unsupported`` naming it."""

    def check(v: Any) -> Any:
        if not neutral(v):
            raise refuse(f"{field_value(name, v)} is not supported; it must be absent or {why}", "unsupported")
        return v

    kind = None if annotation is None else annotation | None
    return Annotated[kind, checked_by(check), Field(json_schema_extra={SUPPORT: "unsupported", "x-neutral": why})]


#: The neutral values of OpenAI's fields the server cannot honour, as types.
NoPenalty = Annotated[float, Field(ge=0, le=0)]
NoLogitBias = Annotated[dict[str, int], Field(max_length=0)]


def no_penalty(v: Any) -> bool:
    return is_number(v) and v == 0


class RequestModel(OpenAIModel):
    """A request body: before any field is read, a check that every string in the body is valid Unicode (a lone surrogate such as
    ``"\\ud800"`` is a 400 naming its field, code ``invalid_text``)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and (bad := find_bad_text(data)) is not None:
            raise refuse(invalid_text_message(*bad), "invalid_text", bad[0])
        return data
