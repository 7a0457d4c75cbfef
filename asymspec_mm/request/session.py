"""One request between set-up and answer: :class:`Session` (prepared, prefilled streams),
:class:`GenerationStream` (its steps as they are committed, then the :class:`MMResult`) and
:func:`session_result` (the result of a decoded session, for the single-row loop and the batch decoder alike)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from captioning.view import CompressedView

from ..base.config import AsymSpecConfig
from ..decode import Counters, StopFn, TokenEvent
from ..decode.rows import DRAFTER_STREAMS
from ..engines import Engine
from .prompts import Prompts
from .record import RequestRecord
from .request import Request


@dataclass
class MMResult:
    """One answer and its provenance: ``trace`` has one :class:`TokenEvent` per emitted token."""

    text: str
    token_ids: list[int]
    trace: list[TokenEvent]
    stats: dict[str, Any]
    prompts: Prompts
    view: CompressedView
    method: str = "asymspec"
    config: AsymSpecConfig = field(default_factory=AsymSpecConfig)
    #: the calls the answer makes when the request offered tools (OpenAI's shape, :mod:`asymspec_mm.request.tools`), else None
    tool_calls: list[dict[str, Any]] | None = None
    #: the message's content when the answer calls tools: the text before the first call (None if there is none)
    content: str | None = None
    #: why the loaded pair cannot answer this request (the tiny preset outside MiniVista:
    #: :func:`~asymspec_mm.request.domain.request_warnings`), one line each; empty when it can
    warnings: list[str] = field(default_factory=list)
    #: the checked :class:`~asymspec_mm.request.request.Request` it answers (the same object the edge built)
    request: Request | None = field(default=None, repr=False, compare=False)

    @property
    def cut_by_budget(self) -> bool:
        """Whether the token budget ended the answer (not the model's end-of-turn token or a stop string)."""
        return self.stats.get("stopped_by") == "max_new_tokens"

    @property
    def finish_reason(self) -> str:
        """OpenAI's reason: ``length`` when the token budget ended the answer (also when calls were read before the
        cut: a call it cut is not among them, and the model may have meant more), else ``tool_calls`` when the
        answer calls tools, else ``stop`` (EOS or a stop string)."""
        if self.cut_by_budget:
            return "length"
        return "tool_calls" if self.tool_calls else "stop"

    def as_dict(self) -> dict:
        """JSON-ready summary (no tensors)."""
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "tool_calls": self.tool_calls,
            "warnings": self.warnings,
            "method": self.method,
            "config": self.config.as_dict(),
            "stats": self.stats,
            "view": {"caption": self.view.caption, "ocr_text": self.view.ocr_text},
            "trace": [ev.as_dict() for ev in self.trace],
        }

    def __repr__(self) -> str:
        return (
            f"MMResult(text={self.text!r}, method={self.method!r}, new_tokens={len(self.token_ids)}, "
            f"steps={self.stats.get('steps')}, acceptance_rate={self.stats.get('acceptance_rate')})"
        )


@dataclass
class Session:
    """A request set up (and prefilled, unless made with ``prepare(..., prefill=False)``), ready for
    :meth:`AsymSpecPipeline.run` or a batch decoder.

    streams: the prefilled engines the method needs, keyed ``drafter_full`` / ``drafter_comp`` /
    ``verifier``; each caches ``prompt[:-1]`` and ``pending[name]`` ``[1]`` is the token its first
    forward starts with (also for the streams in ``to_prefill``). record: the request's
    :class:`~asymspec_mm.request.record.RequestRecord` (when its set-up began, what set-up and prefill measured: an
    engine loop's record of the request, or one of its own set up without a loop); the session holds what set-up
    made, the model-side objects, and changes nothing of it while it is decoded.
    """

    #: what it answers (:class:`~asymspec_mm.core.request_state.RequestKind`'s value): a caller's request, its answer
    #: an :class:`MMResult` (a caption's or completion's :class:`~asymspec_mm.engines.model_calls.TokenRequest` names
    #: its own)
    kind: ClassVar[str] = "answer"

    request: Request
    prompts: Prompts
    view: CompressedView
    streams: dict[str, Engine]
    pending: dict[str, torch.Tensor]
    eos_ids: set[int]
    stop_fn: StopFn | None
    record: RequestRecord = field(repr=False)
    #: streams set up but not prefilled (``prepare(..., prefill=False)``): their prompts, for batched chunked
    #: prefill (:class:`~asymspec_mm.core.prefill.ChunkedPrefill`, which prefills copies: these stay as set up);
    #: ``streams`` holds the others
    to_prefill: dict[str, Any] = field(default_factory=dict)
    #: each transformers stream's whole prompt as a reuse key ``[L]`` (:func:`~asymspec_mm.engines.prefix_kv.reuse_key`):
    #: what the stream's context is stored under once the answer is known (:func:`remember_answer`)
    reuse_keys: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the grammar the answer follows (forced tool calls, JSON: :class:`~asymspec_mm.request.grammar.GrammarConstraint`)
    constraint: Any = None
    #: the request's warnings (:attr:`MMResult.warnings`), found and logged as it was set up
    warnings: list[str] = field(default_factory=list)
    #: a cross-family pair's :class:`~asymspec_mm.base.vocab_bridge.VocabBridge` when the method decodes with the
    #: drafter (its tokens are then the verifier's ids, the drafter's streams fed the drafter's); None otherwise
    vocab: Any = None

    @property
    def stats(self) -> dict[str, Any]:
        """What set-up and prefill measured of the request (its record's :attr:`~RequestRecord.stats`)."""
        return self.record.stats

    @property
    def method(self) -> str:
        """The request's method (asymspec | floor | drafter | sd)."""
        return self.request.method or "asymspec"

    @property
    def config(self) -> AsymSpecConfig:
        """The request's settings, as checked (its seed and the stop strings its tools need included)."""
        return self.request.config or AsymSpecConfig()

    def fed_ids(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """The answer's token ids ``[n]`` as stream ``name`` reads them (a cross-family drafter stream: the drafter's)."""
        return ids if self.vocab is None or name not in DRAFTER_STREAMS else self.vocab.drafter_ids(ids)


def remember_answer(prefix_kv: Any, models: dict[str, Any], session: Session, token_ids: list[int], contexts: dict[str, Any]) -> None:
    """Store each stream's context after its answer, for the next turn of the conversation.

    ``models``: stream -> model; ``contexts``: stream -> a single-row engine (its ``cache`` and ``length``) or a
    ``(length, kv(start, stop))`` pair whose ``kv`` gathers positions ``start .. stop-1`` (a batched row: only what
    is not stored yet is gathered). A stream's first ``L + n - 1`` positions (prompt ``L``, answer ``n``) hold exactly
    the prompt and the answer but its last token: every one of them was forwarded and kept; whatever a stream holds
    past them (drafts of a step that ended the answer) is not stored.
    """
    from ..engines.prefix_kv import cache_layers

    if prefix_kv is None:
        return
    answer = torch.tensor(token_ids, dtype=torch.long)
    for name, key in session.reuse_keys.items():
        context = contexts.get(name)
        if context is None:
            continue
        length, kv = context if isinstance(context, tuple) else (int(context.length), None)
        if kv is None and getattr(context, "cache", None) is None:
            continue
        full = torch.cat([key, session.fed_ids(name, answer)])[: min(length, key.numel() + len(token_ids) - 1)]
        space = prefix_kv.space(models[name])
        start = prefix_kv.stored(space, full)
        if start >= full.numel():
            continue
        layers = kv(start, full.numel()) if kv is not None else [(k[:, :, start:], v[:, :, start:]) for k, v in cache_layers(context.cache)]
        prefix_kv.insert(space, full, layers, offset=start)


class GenerationStream(Iterator[list[TokenEvent]]):
    """The committed steps of one request: iterating yields each step's :class:`TokenEvent` list (their
    ``text`` filled in); once exhausted, :attr:`result` holds the :class:`MMResult`."""

    def __init__(self, steps: Iterator[list[TokenEvent]], finish: Callable[[], MMResult]):
        self._steps = steps
        self._finish = finish
        self._result: MMResult | None = None

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> list[TokenEvent]:
        if self._result is not None:
            raise StopIteration(self._result)
        try:
            return next(self._steps)
        except StopIteration:
            self._result = self._finish()
            raise StopIteration(self._result) from None  # .value: the result, as a generator's return value

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> MMResult:
        """The answer; decodes whatever steps are left first."""
        for _ in self:
            pass
        assert self._result is not None
        return self._result

    def texts(self) -> Iterator[str]:
        """The answer's text as it grows, one piece per step (as transformers' ``TextIteratorStreamer``)."""
        for events in self:
            piece = "".join(ev.text for ev in events)
            if piece:
                yield piece

    def close(self) -> None:
        """Stop decoding early (the result is then not available)."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()


def session_result(
    session: Session, counters: Counters, trace: list[TokenEvent], tokenizer: Any, sd_drafter_name: str, *, text: bool = True
) -> MMResult:
    """The :class:`MMResult` of a decoded session: its trace (the answer's text decoded by ``tokenizer``, cut at
    the first stop string: :func:`with_answer_text`), the counters' statistics and set-up's; an SD answer names its
    drafter (``sd_drafter_name``). ``text=False`` leaves the text, and the tool calls read from it, to
    :func:`with_answer_text` on another thread (an engine loop's output side)."""
    stats = counters.as_dict()
    stats.update(
        session.record.stats,
        wall_s=time.perf_counter() - session.record.t_start,
        steered=sum(ev.steered for ev in trace),
        fused=sum(ev.source == "fused" for ev in trace),
    )
    if session.method == "sd":
        stats["sd_drafter"] = sd_drafter_name
    result = MMResult(
        text="",
        token_ids=[ev.token_id for ev in trace],
        trace=trace,
        stats=stats,
        prompts=session.prompts,
        view=session.view,
        method=session.method,
        config=session.config,
        warnings=list(session.warnings),
        request=session.request,
    )
    return with_answer_text(result, tokenizer) if text else result


def with_answer_text(result: MMResult, tokenizer: Any) -> MMResult:
    """``result`` with its text: its token ids decoded by ``tokenizer``, cut at the first stop string, and the tool
    calls its request reads parsed from it (``tool_calls``, ``content``). Returns ``result`` itself."""
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    for s in result.config.stop_strings:
        if s and s in text:
            text = text[: text.index(s)]
    result.text, result.content = text, text
    if result.request is not None and result.request.reads_tool_calls:
        from .tools import parse_tool_calls

        parsed = parse_tool_calls(text, finished=result.stats.get("stopped_by") != "max_new_tokens")
        result.tool_calls, result.content = parsed.tool_calls, parsed.content
        if parsed.problem:
            result.stats["tool_call_problem"] = parsed.problem
    return result
