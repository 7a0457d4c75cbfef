"""The built-in text compressors of the verifier's view, by name, and the registry that extends them.

A compressor turns one text part of a conversation (a tool's output, a document in a user message, an earlier
assistant answer, the system prompt) into the shorter text the verifier reads; the drafter's full view always
reads the original. Each is built by a factory from the :class:`~asymspec_mm.request.compression.Compression`
settings and a :class:`CompressorContext` (the verifier's tokenizer), and called as ``compress(text, role)``:

- ``truncate``: the first (``keep="head"``), last (``"tail"``) or first and last (``"both"``) ``limit`` tokens of
  the verifier's tokenizer (``unit="tokens"``, the paper's truncate-1,500) or characters (``unit="chars"``).
- ``question-only``: a user message keeps its last paragraph (where the question goes, after the documents);
  every other role's text is dropped.
- ``signature``: a tool's documentation reduced to its signature: JSON API descriptions (OpenAI function tools,
  API-Bank's ``input_parameters``) become ``name(arg: type, ...)``; in free text, the lines that read as calls.
- ``summary``: a summary written by a model the pipeline holds (``summarizer="verifier"``, the default, or
  ``"drafter"``: through the pipeline's own engines, :mod:`asymspec_mm.request.summarizer`) or by a callable
  ``text -> summary``.
- ``llmlingua2``: LLMLingua-2's token classifier keeps the ``rate`` most important words
  (:mod:`asymspec_mm.request.llmlingua2`).

:func:`register_compressor` adds a name; any callable ``text -> str`` is a compressor too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Compression(Protocol):
    """What a factory reads of a :class:`~asymspec_mm.request.compression.Compression` (a protocol, so that the
    setting's module can import this registry and not the other way round)."""

    rate: float | None
    limit: int | None
    unit: str
    keep: str
    model: str | None
    summarizer: Callable[[str], str] | str | None


#: A built compressor: ``(text, role) -> compressed text``.
RoleCompressor = Callable[[str, str], str]


@dataclass(frozen=True)
class CompressorContext:
    """What a factory may use: ``tokenizer`` the verifier's (token counts are the verifier's); ``summarize``, where
    the pipeline gives one, ``(model, text, max_new_tokens) -> summary`` by a model it holds (``"verifier"`` or ``"drafter"``,
    :class:`~asymspec_mm.request.summarizer.ModelSummarizer`)."""

    tokenizer: Any = None
    summarize: Any = None


#: The models the ``summary`` compressor may have write a summary, as ``summarizer=`` names them (default: the first).
SUMMARY_MODELS = ("verifier", "drafter")
#: The longest summary such a model writes, in its tokens, unless the setting's ``limit`` says otherwise.
SUMMARY_TOKENS = 128


#: name -> factory ``(compression, context) -> RoleCompressor``
COMPRESSORS: dict[str, Callable[[Compression, CompressorContext], RoleCompressor]] = {}


def register_compressor(name: str, factory: Callable[[Compression, CompressorContext], RoleCompressor]) -> None:
    """Make ``name`` a compressor method: ``factory(compression, context)`` returns ``(text, role) -> text``."""
    COMPRESSORS[name] = factory


# ---------------------------------------------------------------------------------------------- truncate
def _truncate(c: Compression, ctx: CompressorContext) -> RoleCompressor:
    limit = c.limit if c.limit is not None else 1500
    by_tokens = c.unit == "tokens" and ctx.tokenizer is not None

    def pieces(text: str) -> list[str]:
        if not by_tokens:
            return list(text)
        ids = ctx.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [ctx.tokenizer.decode([i]) for i in ids]

    def compress(text: str, role: str) -> str:
        units = pieces(text)
        if len(units) <= limit:
            return text
        cut = len(units) - limit
        what = "tokens" if by_tokens else "characters"
        if c.keep == "head":
            return "".join(units[:limit]) + f"\n[... {cut} {what} cut ...]"
        if c.keep == "tail":
            return f"[... {cut} {what} cut ...]\n" + "".join(units[cut:])
        head = limit - limit // 2
        return "".join(units[:head]) + f"\n[... {cut} {what} cut ...]\n" + "".join(units[len(units) - limit // 2 :])

    return compress


# ---------------------------------------------------------------------------------------------- question-only
def last_paragraph(text: str) -> str:
    """The text's last non-empty paragraph (blank-line separated)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return paragraphs[-1] if paragraphs else ""


def _question_only(c: Compression, ctx: CompressorContext) -> RoleCompressor:
    return lambda text, role: last_paragraph(text) if role == "user" else ""


# ---------------------------------------------------------------------------------------------- signature
def _param_types(params: Any) -> list[str]:
    """``name: type`` of a JSON schema's properties (OpenAI) or of API-Bank's ``input_parameters``."""
    if isinstance(params, Mapping) and isinstance(params.get("properties"), Mapping):
        params = params["properties"]
    if not isinstance(params, Mapping):
        return []
    out = []
    for name, spec in params.items():
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        out.append(f"{name}: {kind}" if isinstance(kind, str) else str(name))
    return out


def api_signature(api: Mapping[str, Any]) -> str | None:
    """``name(arg: type, ...)`` of one API description (an OpenAI function tool, its ``function``, or API-Bank's
    ``{"name", "description", "input_parameters"}``); None when it has no name."""
    fn = api.get("function") if isinstance(api.get("function"), Mapping) else api
    name = fn.get("name") or fn.get("apiCode")
    if not isinstance(name, str):
        return None
    params = fn.get("parameters", fn.get("input_parameters", {}))
    return f"{name}({', '.join(_param_types(params))})"


#: a line that reads as a call or a definition: ``name(...)`` or ``def name(...)``
_CALL_LINE = re.compile(r"^\s*(?:def\s+|async\s+def\s+)?[A-Za-z_][\w.]*\s*\(.*\)\s*(?:->.*)?:?\s*$")


def signature_of(text: str) -> str:
    """A tool's documentation as its signature(s): JSON API descriptions as ``name(arg: type, ...)``, one a line;
    free text as its lines that read as calls (none: its first line)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        data = None
    apis = data if isinstance(data, list) else [data] if isinstance(data, Mapping) else []
    sigs = [s for a in apis if isinstance(a, Mapping) and (s := api_signature(a))]
    if sigs:
        return "\n".join(sigs)
    lines = [line.strip().removeprefix("async ").removeprefix("def ").rstrip(":") for line in text.splitlines() if _CALL_LINE.match(line)]
    if lines:
        return "\n".join(lines)
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


def _signature(c: Compression, ctx: CompressorContext) -> RoleCompressor:
    return lambda text, role: signature_of(text)


# ---------------------------------------------------------------------------------------------- summary, llmlingua2
def _summary(c: Compression, ctx: CompressorContext) -> RoleCompressor:
    summarize = c.summarizer
    if callable(summarize):
        return lambda text, role: str(summarize(text))
    which = summarize or SUMMARY_MODELS[0]
    if ctx.summarize is None:
        from ..base.errors import UnknownOptionError

        raise UnknownOptionError(
            f"compression.summarizer={which!r} writes summaries with the pipeline's {which}, and none is at hand here: "
            "compress through a pipeline (pipe.chat(..., compression=...)), or pass a callable text -> summary",
            param="compression.summarizer",
        )
    budget = c.limit if c.limit is not None else SUMMARY_TOKENS
    return lambda text, role: ctx.summarize(which, text, budget)


def _llmlingua2(c: Compression, ctx: CompressorContext) -> RoleCompressor:
    from .llmlingua2 import DEFAULT_RATE, token_classifier

    classifier = token_classifier(c.model)
    rate = c.rate if c.rate is not None else DEFAULT_RATE
    return lambda text, role: classifier.compress(text, rate)


register_compressor("truncate", _truncate)
register_compressor("question-only", _question_only)
register_compressor("signature", _signature)
register_compressor("summary", _summary)
register_compressor("llmlingua2", _llmlingua2)
