"""The user-facing API: :class:`AsymSpecPipeline` and :func:`mm_generate`.

The pipeline is a facade over two parts: :class:`~asymspec_mm.request.models.ModelSet` (the loaded models, their lock and
caches, which model and prompt serve each stream) and :class:`~asymspec_mm.request.preparing.RequestPreparer` (caption, OCR,
prompts, context check, stream start). It adds loading (:meth:`AsymSpecPipeline.from_pretrained`,
:meth:`~AsymSpecPipeline.from_preset`, from its base :class:`~asymspec_mm.pipeline.loading.PipelineLoading`), single-row decoding (:meth:`~AsymSpecPipeline.run`) and the conveniences
(``generate``, ``stream``, ``generate_batch``, ``scheduler``, ``complete``). Nothing below imports this module:
batched serving types against :class:`~asymspec_mm.request.preparing.ServingPipeline`, which the facade satisfies.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

from captioning.view import CompressedView

from ..base.config import AsymSpecConfig
from ..base.errors import AsymSpecError
from ..core.direct import on_core, session_steps
from ..core.loop_client import DIRECT_OPTIONS, direct_loop, handle_stream, home_loop, loop_handle, loop_scope, model_call, serving_loop
from ..decode import Counters, TokenEvent, steps_for
from ..decode.loops import Timer
from ..engines import EngineFactory
from ..engines.loading import MIN_VOCAB_OVERLAP, check_vocabularies, resolve_device
from ..engines.model_calls import ModelLoop, using_loop
from ..engines.prefix_kv import DEFAULT_PREFIX_KV_BYTES
from ..request.models import ModelSet
from ..request.preparing import RequestPreparer, ServingPipeline
from ..request.prompts import Prompts, PromptStyle
from ..request.request import Request, request_of
from ..request.session import GenerationStream, MMResult, Session, remember_answer, session_result
from .loading import PipelineLoading, ocr_worker_engine

__all__ = [
    "AsymSpecPipeline",
    "GenerationStream",
    "MMResult",
    "Prompts",
    "ServingPipeline",
    "Session",
    "mm_generate",
    "check_vocabularies",
    "resolve_device",
]


class _Part:
    """An attribute of one of the pipeline's parts (``models`` or ``preparer``), read and written through the
    facade: ``pipe.eos_ids = ...`` or ``pipe.captioner = ...`` change what the parts use, as they did when these
    were the pipeline's own attributes."""

    def __init__(self, part: str, doc: str):
        self.part = part
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class AsymSpecPipeline(PipelineLoading):
    """A drafter (Qwen3-VL) and a verifier (text LM) ready to answer questions about images.

    Models load once; each request gets fresh KV caches. One pipeline serves several threads: while a scheduler
    runs on it (:meth:`scheduler`) every model call goes through its loop, else through the pipeline's direct loop,
    whose turns its callers drive (concurrent requests are rows of one batch: :mod:`asymspec_mm.core.direct_loop`).
    """

    drafter = _Part("models", "The VL drafter (transformers): the full view, the compressed view, the captions.")
    processor = _Part("models", "The drafter's processor (its tokenizer renders and tokenizes the drafter's prompts).")
    tokenizer = _Part(
        "models",
        "The tokenizer of the answers' ids (token texts and answers are decoded with it): the drafter's, or for a "
        "cross-family pair the verifier's.",
    )
    verifier = _Part("models", "The text-only verifier (transformers or a served model).")
    verifier_tokenizer = _Part("models", "The verifier's tokenizer (the drafter's vocabulary, or another: a cross-family pair).")
    vocab_map = _Part("models", "A cross-family pair's map between the two vocabularies (``None``: one vocabulary).")
    drafter_comp = _Part("models", "A served model for the drafter's compressed stream, or ``None`` (the drafter).")
    drafter_full = _Part("models", "A served model for the drafter's full-view stream, or ``None`` (the drafter).")
    sd_drafter = _Part("models", "SD's own text drafter, or ``None`` (the VL drafter on the compressed view).")
    device = _Part("models", "The drafter's device.")
    encoder = _Part("models", "The vision encoder with its feature cache (the tower runs once per distinct image).")
    prefix_kv = _Part("models", "The KV of earlier prompts and answers, reused by requests that start the same way.")
    eos_ids = _Part("models", "The ids that end an answer (a request with ``ignore_eos`` uses none).")
    captioner = _Part("preparer", "Writes the compressed view's caption (default: the drafter).")
    engines = _Part("preparer", "The factory of single-row engines requests are prefilled on.")
    ocr_layout = _Part("preparer", "How the OCR engine's items become the OCR text.")
    prompt_style = _Part("preparer", "How (view, question) become the prompts' texts.")
    name = _Part("preparer", "The pair's preset name (``tiny``, ``qwen3``; ``custom`` for other pairs): which warnings apply.")

    def __init__(
        self,
        drafter,
        processor,
        verifier,
        verifier_tokenizer,
        *,
        device: torch.device | None = None,
        vision_cache_bytes: int = 256 * 2**20,
        prefix_cache_bytes: int = DEFAULT_PREFIX_KV_BYTES,
        ocr: str | Any = "auto",
        ocr_layout: str = "plain",
        ocr_workers: int = 0,
        captioner: str | Any = "drafter",
        name: str = "custom",
        check_vocab: bool = True,
        drafter_comp: Any = None,
        drafter_full: Any = None,
        engines: EngineFactory | None = None,
        prompt_style: PromptStyle | None = None,
        sd_drafter: Any = None,
        sd_drafter_tokenizer: Any = None,
        min_vocab_overlap: float = MIN_VOCAB_OVERLAP,
    ):
        self.models = ModelSet(
            drafter,
            processor,
            verifier,
            verifier_tokenizer,
            device=device,
            vision_cache_bytes=vision_cache_bytes,
            prefix_cache_bytes=prefix_cache_bytes,
            check_vocab=check_vocab,
            drafter_comp=drafter_comp,
            drafter_full=drafter_full,
            sd_drafter=sd_drafter,
            sd_drafter_tokenizer=sd_drafter_tokenizer,
            min_vocab_overlap=min_vocab_overlap,
            home_loop=functools.partial(_home_loop, weakref.ref(self)),
        )
        #: the OCR worker processes' engine this pipeline made (``ocr_workers``), stopped by :meth:`close`
        self._ocr_pool = ocr_worker_engine(ocr, ocr_workers)
        self.preparer = RequestPreparer(
            self.models, ocr=self._ocr_pool or ocr, ocr_layout=ocr_layout, captioner=captioner, engines=engines, prompt_style=prompt_style
        )
        self.name = name

    def close(self) -> None:
        """Stop the OCR worker processes (``ocr_workers``), waiting for them to exit; nothing else needs closing.
        A later request starts them again. Also ``with AsymSpecPipeline.from_preset(...) as pipe: ...``."""
        if self._ocr_pool is not None:
            self._ocr_pool.close()

    def __enter__(self) -> AsymSpecPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def sd_drafter_name(self) -> str:
        """Which model drafts for SD: the separate text drafter's name or path, else the VL drafter's view."""
        return self.models.sd_drafter_name

    @property
    def ocr_engine(self) -> Any:
        """The OCR engine, created on first use (``auto`` picks EasyOCR, else RapidOCR)."""
        return self.preparer.ocr_engine

    def stream_models(self, method: str) -> dict[str, Any]:
        """Which model serves each of ``method``'s streams (see :meth:`ModelSet.stream_models`)."""
        return self.models.stream_models(method)

    def stream_ids(self, method: str, p: Prompts) -> dict[str, torch.Tensor]:
        """Each of ``method``'s streams' prompt ids ``[1, L]`` (see :meth:`ModelSet.stream_ids`)."""
        return self.models.stream_ids(method, p)

    def staged_streams(self, method: str) -> tuple[str, ...]:
        """The streams of ``method`` that batched chunked prefill can fill: those on a transformers model."""
        return self.models.staged_streams(method)

    # ------------------------------------------------------------------ requests
    def compressed_view(
        self, image, caption: str | None = None, ocr: str | bool | None = None, timings: dict | None = None
    ) -> CompressedView:
        """What the verifier will read about ``image`` (caption/OCR produced when ``None``)."""
        with loop_scope(self):  # the caption is a row of a running loop
            return self.preparer.compressed_view(image, caption, ocr, timings)

    def generate(self, image, question: str, **kwargs) -> MMResult:
        """Answer ``question`` about ``image``: keywords as in :meth:`prepare`."""
        return self.stream(image, question, **kwargs).result

    def chat(self, messages, **kwargs) -> MMResult:
        """Answer the last user message of a conversation (OpenAI-format ``messages``: system, user with any number
        of images, assistant): keywords as in :meth:`prepare_chat`. ``res.finish_reason`` says why it stopped."""
        return self.chat_stream(messages, **kwargs).result

    def chat_stream(self, messages, **kwargs) -> GenerationStream:
        """:meth:`prepare_chat` then :meth:`run`: iterate for each step's events, then read ``.result`` (a row of the
        running loop's batch when one runs, as :meth:`stream`)."""
        handle = loop_handle(self, kwargs, messages=messages)
        if handle is not None:
            return handle_stream(handle)
        return self._direct(kwargs, messages=messages) or self.run(self.prepare_chat(messages, **kwargs))

    def prepare_chat(
        self,
        messages,
        caption=None,
        ocr=None,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        *,
        engines=None,
        prefill: bool | None = None,
        **options,
    ) -> Session:
        """Set a conversation up: OpenAI-format ``messages`` (system/developer, user with any number of images,
        assistant with tool calls, tool), ``caption`` / ``ocr`` one per image (or a string for the only one).
        ``options``: any other :class:`~asymspec_mm.request.request.Request` field (``tools``, ``tool_choice``,
        ``response_format``, ``enable_thinking``, ``text_compressor``, ``ignore_eos``, ...) or
        :class:`AsymSpecConfig` field (``k=2``). The rest as :meth:`set_up`."""
        request = request_of(config, messages=messages, caption=caption, ocr=ocr, method=method, **options)
        return self.set_up(request, engines=engines, prefill=prefill)

    def generate_batch(
        self,
        requests,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        batch_size: int | None = None,
        *,
        kv_budget_bytes: int | None = None,
        on_step=None,
        prefill_chunk_tokens: int | None = None,
        batch_engines=None,
        **overrides,
    ) -> list[MMResult]:
        """Answer many requests (dicts with ``image``, ``question``, optional ``caption``, ``ocr``; or with
        ``messages``, a conversation; or :class:`~asymspec_mm.core.Request`), decoding up to ``batch_size`` of them
        together; results in input order, each equal to :meth:`generate` (:meth:`chat`) of that request alone; ``kv_budget_bytes`` bounds the rows by the
        KV memory they may reach (see :mod:`asymspec_mm.core`)."""
        from ..core.generate import generate_batch

        return generate_batch(
            self,
            requests,
            method,
            config,
            batch_size,
            kv_budget_bytes=kv_budget_bytes,
            on_step=on_step,
            prefill_chunk_tokens=prefill_chunk_tokens,
            batch_engines=batch_engines,
            **overrides,
        )

    def scheduler(
        self, max_batch_size: int = 16, max_queue: int | None = None, max_kv_bytes: int | None = None, *, batch_engines=None, **options
    ):
        """A continuous-batching :class:`~asymspec_mm.core.Scheduler` for concurrent callers of this pipeline:
        ``h = sched.submit(image, question, ...)``, ``h.result()``, ``for events in h``, ``h.cancel()``, ``sched.close()``.
        ``batch_engines(model, stream_name)`` builds each batch's engines (default: transformers or vLLM rows);
        ``options``: ``prefill_chunk_tokens`` (prompt tokens per batched prefill forward), ``token_budget`` (tokens a
        turn's forwards carry, decode first), ``max_stall`` (a turn's tower passes and prompt pieces cost at most this
        times its step, by measured costs; default off), ``on_step``. While it runs (until :meth:`~asymspec_mm.core.Scheduler.close`),
        :meth:`generate`, :meth:`chat`, :meth:`stream`, :meth:`complete` and every other model call of this pipeline
        made on another thread go through its loop."""
        from ..core.scheduler import Scheduler

        sched = Scheduler(
            self, max_batch_size=max_batch_size, max_queue=max_queue, max_kv_bytes=max_kv_bytes, batch_engines=batch_engines, **options
        )
        return sched

    def stream(self, image, question: str, **kwargs) -> GenerationStream:
        """:meth:`prepare` then :meth:`run`: iterate for each step's events, then read ``.result``. While a loop runs on
        the pipeline (:meth:`scheduler`), the request is a row of its batch instead (the same answer; set-up errors
        then raise while iterating)."""
        handle = loop_handle(self, kwargs, image=image, question=question)
        if handle is not None:
            return handle_stream(handle)
        return self._direct(kwargs, image=image, question=question) or self.run(self.prepare(image, question, **kwargs))

    def _direct(self, kwargs: dict[str, Any], **fields: Any) -> GenerationStream | None:
        """The request ``fields`` + ``kwargs`` set up here and decoded as a row of the pipeline's direct loop (the
        route a request takes in the loop: :mod:`asymspec_mm.core.direct`), or ``None`` where it keeps the
        single-row engines: the single-row set-up's options (``engines=``, ``prefill=``), or a stream served by
        something other than transformers or vLLM (:func:`~asymspec_mm.core.direct.on_core`). ``on_phase`` is told
        of the set-up's phases, as :meth:`set_up` tells them (the prompts' prefill then runs in the core's first
        turn)."""
        if not DIRECT_OPTIONS.isdisjoint(kwargs):
            return None
        opts = dict(kwargs)
        on_phase = opts.pop("on_phase", None)
        request = request_of(opts.pop("config", None), **fields, **opts).checked()
        if not on_core(self, request.method):
            return None
        if serving_loop(self) is not None:  # a loop started meanwhile: it runs the set-up's model calls
            return self.run(self.set_up(request, prefill=False, on_phase=on_phase))
        with using_loop(direct_loop(self)):  # the caption a row, the tower a call, of the pipeline's direct loop
            session = self.preparer.set_up(request, prefill=False, on_phase=on_phase)
        # on the core even when nothing is left to prefill (every stream served by vLLM, prefilled at set-up)
        steps, done = session_steps(self, session)
        return GenerationStream(steps, lambda: done[0])

    def prepare(
        self,
        image,
        question: str,
        caption: str | None = None,
        ocr: str | bool | None = None,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        *,
        engines=None,
        on_phase=None,
        prefill: bool | None = None,
        **options,
    ) -> Session:
        """Set one question about one image up. ``caption``/``ocr``: ``None`` produce them, a string is used as is,
        ``ocr=False`` skips OCR; ``method``: asymspec | floor | drafter | sd. ``options``: any other
        :class:`~asymspec_mm.request.request.Request` field (``ignore_eos``, ``max_caption_chars``, ``prompt_style``,
        ``seed``, ...) or :class:`AsymSpecConfig` field (``k=2``, ``max_new_tokens=64``). The rest as :meth:`set_up`."""
        request = request_of(config, image=image, question=question, caption=caption, ocr=ocr, method=method, **options)
        return self.set_up(request, engines=engines, on_phase=on_phase, prefill=prefill)

    @functools.wraps(RequestPreparer.set_up)
    def set_up(self, request: Request, **kwargs: Any) -> Session:
        # the preparer's signature and docstring (functools.wraps): one definition of the set-up's options; a running
        # loop runs its model calls (caption, tower, prefills). prefill=None: the engine core's route (prompts left to
        # its first turn) unless engines= names single-row engines or a stream is served by a model the core cannot
        # take (a served model of one's own), whose session keeps the single-row engines
        if kwargs.get("prefill") is None:
            request = request.checked()
            kwargs["prefill"] = kwargs.get("engines") is not None or not on_core(self, request.method)
        with loop_scope(self):
            return self.preparer.set_up(request, **kwargs)

    def run(self, session: Session, *, timer: Timer | None = None) -> GenerationStream:
        """Decode a prepared request. ``timer(name)`` (a context manager) wraps the loop's gate and trace. A session
        left to the engine core (``prepare``'s default, ``prefill=False``) decodes on it, as a row of the pipeline's
        direct loop (its prompts prefilled in the paged storages' forwards, as a request in a scheduler's loop:
        :mod:`asymspec_mm.core.direct`); a session prefilled on single-row engines (``prefill=True``, ``engines=``)
        decodes on those engines, the single-row reference route."""
        if session.to_prefill:
            steps, done = session_steps(self, session, timer)
            return GenerationStream(steps, lambda: done[0])
        counters = Counters(session.config.k, session.streams)
        steps = steps_for(
            session.method,
            session.streams,
            session.pending,
            session.config,
            session.eos_ids,
            session.stop_fn,
            counters,
            timer,
            constraint=session.constraint,
            vocab=session.vocab,
        )
        trace: list[TokenEvent] = []

        def decoded_steps():
            while True:
                # each step a model call of the loop that runs the pipeline's models (a scheduler's, else the direct loop's turn)
                events = model_call(self, lambda: next(steps, None))
                if events is None:
                    return
                for ev in events:
                    ev.text = self.tokenizer.decode([ev.token_id])
                trace.extend(events)
                yield events

        def finish() -> MMResult:
            result = self.result_of(session, counters, trace)
            remember_answer(self.prefix_kv, self.stream_models(session.method), session, result.token_ids, session.streams)
            return result

        return GenerationStream(decoded_steps(), finish)

    def result_of(self, session: Session, counters: Counters, trace: list[TokenEvent], *, text: bool = True) -> MMResult:
        """The :class:`MMResult` of a decoded session: its trace, the counters' statistics and set-up's (``text=False``:
        its text left to :func:`~asymspec_mm.request.session.with_answer_text`, an engine loop's output side)."""
        return session_result(session, counters, trace, self.tokenizer, self.sd_drafter_name, text=text)

    def attribute(self, result: MMResult, position: int, method: str = "occlusion", grid: int = 8, **options: Any):
        """Which image regions the drafter's steering of the token at ``position`` of ``result`` came from: an
        :class:`~asymspec_mm.attribution.Attribution` (``options``: ``baseline``, ``batch``; see
        :func:`asymspec_mm.attribution.attribute`)."""
        from ..attribution import attribute

        return attribute(self, result, position, method, grid, **options)

    def complete(self, prompt: str, max_new_tokens: int = 64) -> str:
        """Greedy text completion by the verifier alone (a one-turn chat, thinking off).

        Used for MathVista's LLM answer extraction, so no external API is needed. While a loop runs on the pipeline
        (:meth:`scheduler`) it is a row of the loop's batch (:mod:`asymspec_mm.core.loop_client`).
        """
        from .completion import complete

        return complete(self, prompt, max_new_tokens)


_DEFAULTS: dict[str, AsymSpecPipeline] = {}
_DEFAULT_LOCK = threading.Lock()


def mm_generate(image, question: str, *, preset: str = "auto", **kwargs) -> MMResult:
    """Answer a question about an image with a lazily created pipeline of ``preset`` (one per preset, kept).

    kwargs go to :meth:`AsymSpecPipeline.generate` (caption, ocr, method, config, or config fields).
    """
    with _DEFAULT_LOCK:
        if preset not in _DEFAULTS:
            _DEFAULTS[preset] = AsymSpecPipeline.from_preset(preset)
        pipe = _DEFAULTS[preset]
    return pipe.generate(image, question, **kwargs)


def _home_loop(pipe_ref: weakref.ref) -> ModelLoop:
    """The loop a pipeline's model calls made outside any loop's scope run in (:func:`~asymspec_mm.core.loop_client.home_loop`);
    the pipeline held weakly, as its loops' registry holds it."""
    pipe = pipe_ref()
    if pipe is None:  # pragma: no cover - its models' caller holds the pipeline
        raise AsymSpecError("the pipeline of these models is gone")
    return home_loop(pipe)
