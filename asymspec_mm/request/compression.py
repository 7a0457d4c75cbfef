"""Online per-turn compression of a conversation's text for the verifier's view.

An agent's context grows every turn (tool outputs, retrieved documents, earlier answers); the verifier reads a
compressed view of it while the drafter's full view reads it whole. :class:`Compression` says how: a compressor
(:mod:`asymspec_mm.request.compressors`, by name, or any callable ``text -> str``), its rate or limit, the roles
it applies to, and ``keep_last_turns``: the last messages stay verbatim, every older message of those roles is
compressed. A message is compressed once, cached by its content (:class:`CompressedTurns`, bounded), so it renders
the same way in every later request: the verifier's prompt of turn n+1 starts with turn n's up to the message that
has just aged out, and its prefix KV is reused across turns.

The paper's agent setting (Appendix B, GAIA and SimpleQA): ``Compression("llmlingua2", rate=0.3,
keep_last_turns=2)``, everything older compressed, the system prompt included.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..base.errors import UnknownOptionError
from .compressors import COMPRESSORS, SUMMARY_MODELS, CompressorContext, RoleCompressor
from .conversation import Turn

#: The messages a compression applies to by default (``developer`` messages are ``system`` ones).
COMPRESSIBLE_ROLES = ("system", "user", "assistant", "tool")
#: ``roles`` may also name ``tools``: the offered tools' definitions (descriptions compressed; ``signature``: dropped).
TOOLS = "tools"
UNITS = ("tokens", "chars")
KEEPS = ("head", "tail", "both")
#: The settings' fields as a request spells them (the server's ``asymspec.compression``, the CLI's ``--compression``).
FIELDS = ("method", "rate", "limit", "unit", "keep", "keep_last_turns", "roles", "model", "summarizer")


class CompressionError(UnknownOptionError):
    """A compression setting the toolkit cannot use; ``param``: the field (``compression.rate``)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Compression:
    """How the verifier's view of a conversation is compressed, turn by turn.

    ``method``: a compressor's name (``truncate``, ``question-only``, ``signature``, ``summary``, ``llmlingua2``, or
    one :func:`~asymspec_mm.request.compressors.register_compressor` added) or a callable ``text -> str``.
    ``rate``: LLMLingua-2's fraction of words kept, in (0, 1] (default 0.3). ``limit``, ``unit``, ``keep``:
    truncation's length (default 1,500), in ``tokens`` of the verifier or ``chars``, keeping the ``head``, the
    ``tail`` or ``both``. ``keep_last_turns``: the last messages left verbatim (default 2, the paper's
    ``keep_last_k``). ``roles``: which messages are compressed (default all: tool outputs, user messages with their
    documents, earlier assistant answers and the system prompt). ``model``: LLMLingua-2's classifier (a hub id in
    the local cache, or a directory). ``summarizer``: who writes the ``summary`` method's summaries: ``"verifier"``
    (the default) or ``"drafter"``, a model the pipeline holds, or a callable ``text -> summary``.
    """

    method: str | Callable[[str], str]
    rate: float | None = None
    limit: int | None = None
    unit: str = "tokens"
    keep: str = "head"
    keep_last_turns: int = 2
    roles: tuple[str, ...] = COMPRESSIBLE_ROLES
    model: str | None = None
    summarizer: Callable[[str], str] | str | None = None

    @classmethod
    def of(cls, value: Any, field: str = "compression") -> Compression | None:
        """A :class:`Compression` from what a caller gives: one already, a method's name (``"llmlingua2"``), a
        callable, a dict of its fields, or ``"name,key=value,..."`` (the CLI's form); None stays None. Checked."""
        if value is None or isinstance(value, Compression):
            return value.checked(field) if value is not None else None
        if callable(value):
            return cls(value).checked(field)
        if isinstance(value, str):
            return cls(**_parse_spec(value, field)).checked(field)
        if isinstance(value, Mapping):
            unknown = [k for k in value if k not in FIELDS]
            if unknown:
                raise CompressionError(
                    f"{field}.{unknown[0]} is not a compression setting; use {', '.join(FIELDS)}", f"{field}.{unknown[0]}"
                )
            if "method" not in value:
                raise CompressionError(f"{field}.method is required (one of {', '.join(COMPRESSORS)})", f"{field}.method")
            given = dict(value)
            if isinstance(given.get("roles"), list):
                given["roles"] = tuple(given["roles"])
            return cls(**given).checked(field)
        raise CompressionError(f"{field} must be a compressor's name, a callable or an object of settings", field)

    def checked(self, field: str = "compression") -> Compression:
        """Itself, each setting checked: a bad one raises :class:`CompressionError` naming ``field.name``."""
        at = lambda name: f"{field}.{name}"  # noqa: E731
        if not callable(self.method) and not (isinstance(self.method, str) and self.method in COMPRESSORS):
            raise CompressionError(
                f"{at('method')}={self.method!r} is not a compressor; choose one of {', '.join(COMPRESSORS)} (or pass a callable)",
                at("method"),
            )
        if self.rate is not None and not (_is_number(self.rate) and math.isfinite(self.rate) and 0 < self.rate <= 1):
            raise CompressionError(f"{at('rate')}={self.rate!r} must be a number in (0, 1]: the fraction of words kept", at("rate"))
        if self.limit is not None and (not _is_int(self.limit) or self.limit < 1):
            raise CompressionError(f"{at('limit')}={self.limit!r} must be an integer >= 1", at("limit"))
        if not _is_int(self.keep_last_turns) or self.keep_last_turns < 0:
            raise CompressionError(
                f"{at('keep_last_turns')}={self.keep_last_turns!r} must be an integer >= 0 (the last messages left verbatim)",
                at("keep_last_turns"),
            )
        if self.unit not in UNITS:
            raise CompressionError(f"{at('unit')}={self.unit!r} is not one of {', '.join(UNITS)}", at("unit"))
        if self.keep not in KEEPS:
            raise CompressionError(f"{at('keep')}={self.keep!r} is not one of {', '.join(KEEPS)}", at("keep"))
        roles = ("system" if r == "developer" else r for r in self.roles) if isinstance(self.roles, (tuple, list)) else None
        roles = tuple(roles) if roles is not None else ()
        if not roles or any(r not in (*COMPRESSIBLE_ROLES, TOOLS) for r in roles):
            raise CompressionError(f"{at('roles')}={self.roles!r} must be a list of {', '.join((*COMPRESSIBLE_ROLES, TOOLS))}", at("roles"))
        if self.model is not None and not isinstance(self.model, str):
            raise CompressionError(f"{at('model')} must be a string: a hub id in the local cache or a directory", at("model"))
        if self.summarizer is not None and not callable(self.summarizer) and self.summarizer not in SUMMARY_MODELS:
            raise CompressionError(
                f"{at('summarizer')}={self.summarizer!r} must be a model the pipeline holds ({', '.join(SUMMARY_MODELS)}) "
                "or a callable text -> summary",
                at("summarizer"),
            )
        if self.method == "llmlingua2":
            from .llmlingua2 import DEFAULT_MODEL, missing_model_message, model_is_local

            model = self.model or DEFAULT_MODEL
            if not isinstance(model, str) or not model_is_local(model):
                raise CompressionError(missing_model_message(str(model), at("model")), at("model"))
        return dataclasses.replace(self, roles=roles)

    @property
    def key(self) -> tuple:
        """What decides a compressed text besides the text itself (the cache's key): the method and its settings."""
        return (self.method, self.rate, self.limit, self.unit, self.keep, self.model, self.summarizer)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _parse_spec(spec: str, field: str) -> dict[str, Any]:
    """``"llmlingua2,rate=0.3,keep_last_turns=2"`` (or a JSON object) as settings."""
    import json

    if spec.lstrip().startswith("{"):
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise CompressionError(f"{field} is not valid JSON ({exc.msg})", field) from None
        if not isinstance(data, dict):
            raise CompressionError(f"{field} must be a JSON object", field)
        return data
    method, *pairs = [p.strip() for p in spec.split(",")]
    out: dict[str, Any] = {"method": method}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or key not in FIELDS:
            raise CompressionError(f"{field}.{key}: {pair!r} is not key=value with a key of {', '.join(FIELDS[1:])}", f"{field}.{key}")
        out[key] = tuple(raw.split("+")) if key == "roles" else _number(raw)
    return out


def _number(raw: str) -> Any:
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


class CompressedTurns:
    """A bounded cache of compressed texts by (settings, role, text): a message compressed once renders the same
    way in every later request (least recently used first out past ``size`` entries)."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._items: OrderedDict[tuple, str] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple, make: Callable[[], str]) -> str:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
        value = make()  # outside the lock: a model call may take a while
        with self._lock:
            self.misses += 1
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every compressed text (the next request compresses its messages again)."""
        with self._lock:
            self._items.clear()


#: The process's cache of compressed messages (shared by every pipeline: the key holds the settings).
COMPRESSED = CompressedTurns()
#: Built compressors by settings and tokenizer (bounded: each request of a server may name its own settings).
_BUILT: OrderedDict[tuple, RoleCompressor] = OrderedDict()
_BUILT_SIZE = 64


def tokenizer_key(tokenizer: Any) -> tuple:
    """What tells two tokenizers apart in a cache key: its class, its source and its vocabulary's size."""
    if tokenizer is None:
        return ()
    return (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", None), len(tokenizer))


def summarizer_key(compression: Compression, summarize: Any) -> tuple:
    """What tells apart the summaries of two pipelines' models in a cache key (nothing for other compressors)."""
    if compression.method != "summary" or callable(compression.summarizer) or summarize is None:
        return ()
    return tuple(getattr(summarize, "key", (id(summarize),)))


def compressor_of(compression: Compression, tokenizer: Any = None, summarize: Any = None) -> RoleCompressor:
    """The ``(text, role) -> text`` compressor of ``compression`` (built once per settings, tokenizer and, for a
    summary by a model the pipeline holds, ``summarize``: :class:`~asymspec_mm.request.summarizer.ModelSummarizer`)."""
    if callable(compression.method):
        user = compression.method
        return lambda text, role: str(user(text))
    key = (compression.key, tokenizer_key(tokenizer), summarizer_key(compression, summarize))
    if key not in _BUILT:
        _BUILT[key] = COMPRESSORS[compression.method](compression, CompressorContext(tokenizer, summarize))
        while len(_BUILT) > _BUILT_SIZE:
            _BUILT.popitem(last=False)
    return _BUILT[key]


@dataclass(frozen=True)
class CompressedConversation:
    """The turns the verifier reads (older messages of the chosen roles compressed) and what it cost."""

    turns: list[Turn]
    indices: frozenset[int]  # the messages compressed
    seconds: float

    @property
    def compressed_messages(self) -> int:
        return len(self.indices)


def compress_turns(
    turns: Sequence[Turn], compression: Compression, tokenizer: Any = None, cache: CompressedTurns = COMPRESSED, summarize: Any = None
) -> CompressedConversation:
    """``turns`` with each text part of every message before the last ``keep_last_turns`` compressed (messages of
    ``compression.roles`` only; images stay as they are), each through ``cache``; ``summarize``: the pipeline's
    summaries by its own models (:func:`compressor_of`)."""
    compress = compressor_of(compression, tokenizer, summarize)
    skey = summarizer_key(compression, summarize)
    older = len(turns) - compression.keep_last_turns
    out, indices, t0 = [], set(), time.perf_counter()
    for i, turn in enumerate(turns):
        if i >= older or turn.role not in compression.roles or not turn.texts:
            out.append(turn)
            continue
        role = turn.role
        parts = tuple(
            cache.get((compression.key, tokenizer_key(tokenizer), *skey, role, p), lambda p=p, role=role: compress(p, role))
            if isinstance(p, str)
            else p
            for p in turn.parts
        )
        out.append(dataclasses.replace(turn, parts=parts))
        indices.add(i)
    return CompressedConversation(out, frozenset(indices), time.perf_counter() - t0)


def compression_stats(
    tokenizer: Any, full: Any, comp_tokens: int, squeezed: CompressedConversation, enable_thinking: bool, tools: Any
) -> dict[str, Any]:
    """``res.stats``' compression figures: ``compression_ratio`` = |x_full| / |x_comp| in verifier tokens (the
    paper's definition: the verifier's prompt of the uncompressed conversation, ``full`` the view messages, over
    the prompt it read, ``comp_tokens``; an image counts as its caption + OCR on both sides, so the ratio is the
    text compression's), ``compression_s`` (the compressor's seconds this request), ``compressed_messages`` and
    ``compressed_view``: each compressed message's index, role and text as the verifier read it."""
    from .tool_support import template_messages

    kw: dict[str, Any] = {"tools": list(tools)} if tools else {}
    messages = template_messages(tokenizer, full.compressed)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking, **kw)
    full_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return {
        "compression_ratio": full_tokens / max(1, comp_tokens),
        "prompt_tokens_full": full_tokens,
        "compression_s": squeezed.seconds,
        "compressed_messages": squeezed.compressed_messages,
        "compressed_view": [
            {"index": i, "role": t.role, "text": "\n\n".join(t.texts)} for i, t in enumerate(squeezed.turns) if i in squeezed.indices
        ],
    }


def compress_tools(
    tools: Sequence[Mapping[str, Any]],
    compression: Compression,
    tokenizer: Any = None,
    cache: CompressedTurns = COMPRESSED,
    summarize: Any = None,
) -> list[dict[str, Any]]:
    """The offered tools as the verifier's template renders them when ``compression.roles`` names ``tools`` (else
    as they are): ``signature`` keeps each function's name and its parameters' names, types and ``required`` (no
    descriptions: the API-Bank setting); any other compressor compresses each description (role ``tools``)."""
    if TOOLS not in compression.roles:
        return list(tools)
    compress = compressor_of(compression, tokenizer, summarize)
    skey = summarizer_key(compression, summarize)
    out = []
    for tool in tools:
        fn = dict(tool["function"])
        if compression.method == "signature":
            fn.pop("description", None)
            fn["parameters"] = _typed_only(fn.get("parameters"))
        elif isinstance(fn.get("description"), str):
            text = fn["description"]
            fn["description"] = cache.get(
                (compression.key, tokenizer_key(tokenizer), *skey, TOOLS, text), lambda t=text: compress(t, TOOLS)
            )
        out.append({**tool, "function": fn})
    return out


def _typed_only(schema: Any) -> Any:
    """A parameters schema with only its properties' types (and ``required``)."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("properties"), Mapping):
        return schema
    props = {k: {"type": v["type"]} if isinstance(v, Mapping) and "type" in v else {} for k, v in schema["properties"].items()}
    return {"type": schema.get("type", "object"), "properties": props, **({"required": schema["required"]} if "required" in schema else {})}
