"""Setting a request up: :class:`RequestPreparer` turns a :class:`~asymspec_mm.request.request.Request` into a
:class:`~asymspec_mm.request.session.Session`.

Set-up is the compressed view (caption and OCR), the three prompts, the context-window check and each stream's
start: prefilled here, or left in ``Session.to_prefill`` for the batched, chunked prefill of
:mod:`asymspec_mm.core.prefill`. Which model serves a stream and which prompt it reads is the
:class:`~asymspec_mm.request.models.ModelSet`'s to say; this module only asks.

:class:`ServingPipeline` is what batched serving (:mod:`asymspec_mm.core`, the admission benchmark) needs of a
pipeline, so those modules depend on this protocol rather than on the user-facing facade that composes them
(:class:`~asymspec_mm.pipeline.facade.AsymSpecPipeline` is one).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from captioning.view import CompressedView

from ..base.config import AsymSpecConfig
from ..base.errors import ContextOverflowError, UnknownOptionError
from ..decode import StopFn
from ..engines import EngineFactory, PromptImages, TransformersEngines, model_device
from ..engines.model_calls import model_runner, run_model
from ..engines.prefix_kv import reuse_key
from .domain import warn_request
from .models import ModelSet
from .prompts import DEFAULT_STYLE, Prompts, PromptStyle, render_prompts, tokenize_prompts
from .record import RequestRecord
from .request import Request
from .session import Session

if TYPE_CHECKING:
    from ..decode import Counters, TokenEvent
    from .session import MMResult


class ServingPipeline(Protocol):
    """What decoding prepared sessions on shared models needs: the drafter's tokenizer (token texts), the KV kept for
    reuse, which model serves each stream, set-up, and a decoded session's result."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def prefix_kv(self) -> Any: ...

    def stream_models(self, method: str) -> dict[str, Any]: ...

    def set_up(
        self,
        request: Request,
        *,
        engines: EngineFactory | None = ...,
        prefill: bool | None = ...,
        on_phase: Callable[[str], None] | None = ...,
        record: RequestRecord | None = ...,
    ) -> Session: ...

    def result_of(self, session: Session, counters: Counters, trace: list[TokenEvent], *, text: bool = ...) -> MMResult: ...


def stop_fn(tokenizer: Any, stop_strings: tuple[str, ...]) -> StopFn:
    """Whether the tokens so far end in one of ``stop_strings``: only the tail is decoded (a stop string spans at
    most its length in tokens, plus a few for tokens that decode to nothing), so a step costs the same late in a
    long answer as early."""
    longest = max(len(s) for s in stop_strings)

    def stop(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-(longest + 8) :], skip_special_tokens=True)
        return any(s in tail for s in stop_strings)

    return stop


@dataclass
class _Rendered:
    """A request's prompts and what rendering them measured, for :meth:`RequestPreparer._start_session`."""

    prompts: Prompts
    images: list
    view: CompressedView  # the (last) image's compressed view
    timings: dict[str, float]  # caption_s / ocr_s spent
    ocr_stat: str  # stats["ocr_engine"]: the engine that read the images, "given" or "off"
    warnings: list[str]
    stats: dict[str, Any] = field(default_factory=dict)  # what rendering measured for res.stats (compression)


def _ocr_stat(ocr_engine: Any, ocr: Any) -> str:
    """What read the text in the images: the OCR engine's name, ``"given"`` (the caller's text) or ``"off"``."""
    return getattr(ocr_engine, "name", "given") if ocr is None or isinstance(ocr, str) else "off"


class RequestPreparer:
    """Sets requests up on ``models``: the captioner (``"drafter"``: the drafter itself, else a captioner object),
    the OCR engine (a name, created on first use, or an engine), how the engine's items become the OCR text
    (``ocr_layout``), the prompts' layout (``prompt_style``) and the factory of single-row engines (``engines``)."""

    def __init__(
        self,
        models: ModelSet,
        *,
        ocr: str | Any = "auto",
        ocr_layout: str = "plain",
        captioner: str | Any = "drafter",
        engines: EngineFactory | None = None,
        prompt_style: PromptStyle | None = None,
    ):
        from captioning.ocr.items import check_ocr_layout

        from .captioner import DrafterCaptioner

        self.models = models
        self.name = "custom"  # the loaded pair's preset name (the facade's ``name``): which warnings apply
        # the captioner's model calls run in the loop serving the set-up (else the pipeline's), its caption a row of it
        self.captioner = (
            DrafterCaptioner(models.drafter, models.processor, models.encoder, home_loop=models.home_loop)
            if captioner == "drafter"
            else captioner
        )
        self._ocr_start = threading.Lock()  # the OCR engine is created once, on first use, whichever thread asks
        self._ocr_spec = ocr
        self._ocr_engine = None if isinstance(ocr, str) else ocr
        # how the engine's items become the OCR text (the tiny preset: one line, as MiniVista trained it)
        self.ocr_layout = check_ocr_layout(ocr_layout)
        self.engines: EngineFactory = engines or TransformersEngines()
        # how (view, question) become the prompts' texts; a request may bring its own (prepare(prompt_style=...))
        self.prompt_style: PromptStyle = prompt_style or DEFAULT_STYLE

    @property
    def ocr_engine(self) -> Any:
        """The OCR engine, created on first use (``auto`` picks EasyOCR, else RapidOCR)."""
        if self._ocr_engine is None and self._ocr_spec is not None:
            from captioning.ocr import get_ocr_engine

            self._ocr_engine = get_ocr_engine(self._ocr_spec)
        return self._ocr_engine

    def compressed_view(
        self, image: Any, caption: str | None = None, ocr: str | bool | None = None, timings: dict | None = None
    ) -> CompressedView:
        """What the verifier will read about ``image`` (caption/OCR produced when ``None``)."""
        from captioning.captioner import compress
        from vision_cache.image import load_image

        self.models.check_images(1)  # a text-only drafter writes no caption
        image = load_image(image)
        with self._ocr_start:
            ocr_engine = self.ocr_engine if ocr is None else None
        return compress(
            image, captioner=self.captioner, ocr_engine=ocr_engine, caption=caption, ocr=ocr, ocr_layout=self.ocr_layout, timings=timings
        )

    def _compress(self, img: Any, caption: Any, ocr: Any, ocr_engine: Any, timings: dict, **kwargs: Any) -> CompressedView:
        """The compressed view of a loaded image (cached by its content hash); ``kwargs``: ``on_phase``, the caption
        budget."""
        from captioning.captioner import compress
        from vision_cache.image import image_content_hash

        return compress(
            img,
            captioner=self.captioner,
            ocr_engine=ocr_engine,
            caption=caption,
            ocr=ocr,
            ocr_layout=self.ocr_layout,
            image_hash=image_content_hash(img),
            timings=timings,
            **kwargs,
        )

    def set_up(
        self,
        request: Request,
        *,
        engines: EngineFactory | None = None,
        prefill: bool | None = None,
        on_phase: Callable[[str], None] | None = None,
        record: RequestRecord | None = None,
    ) -> Session:
        """Set a request up (checked here unless it already is): the compressed view of each image, the three
        prompts, the context check, and the streams its method needs, prefilled.

        ``prefill``: ``False`` stops before prefill where a stream's model is a transformers one: the session's
        ``to_prefill`` holds those streams' prompts (vision features encoded) for the batched, chunked prefill of
        :mod:`asymspec_mm.core.prefill` (the engine core's first turn; ``pipe.run`` decodes such a session on the
        core); streams served elsewhere (vLLM) are prefilled as usual. ``True`` prefills every stream here on a
        single-row engine (the single-row reference route ``pipe.run`` then decodes on). ``None`` (the default):
        ``True`` where ``engines`` names a factory of single-row engines, else ``False``. ``engines`` builds those
        streams (default: the preparer's factory). ``on_phase(name)`` is called as each long part of a single
        question's set-up starts: ``"ocr_engine"`` (first use), ``"caption"``, ``"ocr"``, ``"prefill"``.
        ``record``: the request's :class:`~asymspec_mm.request.record.RequestRecord` (an engine loop's), where set-up
        writes when it began and what it measured; without one the session gets a record of its own.
        """
        request = self.check_tools(request)
        self._check_pair(request)
        record = record if record is not None else RequestRecord()
        record.t_start = time.perf_counter()
        vision = self.models.encoder.thread_counts()
        rendered = self._render_chat(request) if request.is_chat else self._render_question(request, on_phase)
        prefill = engines is not None if prefill is None else prefill
        return self._start_session(request, rendered, vision, record, engines, prefill, on_phase)

    @functools.cached_property
    def summarizer(self) -> Any:
        """The ``summary`` compressor's writer of summaries by the pipeline's own models (the verifier by default,
        or the drafter): :class:`~asymspec_mm.request.summarizer.ModelSummarizer` on this preparer's engines."""
        from .summarizer import ModelSummarizer

        return ModelSummarizer(self.models, self.engines)

    @functools.cached_property
    def verifier_tools_problem(self) -> str | None:
        """Why the verifier cannot take tools (:func:`~asymspec_mm.request.tool_support.template_tools_problem` of its
        tokenizer; decided once, from its chat template alone), or ``None`` when it can."""
        from .tool_support import template_tools_problem

        return template_tools_problem(self.models.verifier_tokenizer)

    def check_tools(self, request: Request) -> Request:
        """``request`` (checked) when the verifier can take the tools its prompt would carry and the grammar a forced
        tool call or a ``response_format`` asks for can be built; a one-line
        :class:`~asymspec_mm.request.tools.ToolError` naming the field otherwise (``tools``,
        ``tools[0].function.parameters``, ``response_format.json_schema.schema``, ...), before any model work: a
        scheduler and the server refuse at submission what the set-up would refuse later. The grammar built here
        rides on the returned copy (:attr:`~asymspec_mm.request.request.Request.grammar`): a later check of that copy
        and the set-up's compile reuse it, so a request's grammar is built once."""
        from .grammar import check_output_grammar
        from .tool_support import check_verifier_tools
        from .tools import prompt_tools

        request = request.checked()
        if request.is_chat and request.tools:
            check_verifier_tools(self.verifier_tools_problem, prompt_tools(request.tools, request.tool_choice))
        if request.is_chat and request.grammar is None:
            grammar = check_output_grammar(request.tools or [], request.tool_choice, request.response_format)
            if grammar is not None:
                request = dataclasses.replace(request, grammar=grammar)
        return request

    def _check_pair(self, req: Request) -> None:
        """Refuse what a cross-family pair cannot run: symmetric SD with the VL drafter (it keeps the verifier's argmax
        over its whole vocabulary, which the drafter cannot always read)."""
        m = self.models
        if m.vocab is not None and req.method == "sd" and m.sd_drafter is None:
            raise UnknownOptionError(
                "method \"sd\" needs a drafter of the verifier's vocabulary, and this cross-family pair's drafter has "
                'another: use method "floor" (the tokens SD would give), or load the pipeline with sd_drafter= a text '
                "model of the verifier's family",
                param="asymspec.method",
            )

    def _render_question(self, req: Request, on_phase: Callable[[str], None] | None) -> _Rendered:
        """One question about one image: its compressed view and the prompts laid out by the request's style."""
        from vision_cache.image import load_image

        m = self.models
        m.check_images(1)
        img = load_image(req.image)
        warnings = warn_request(self.name, req.question, [img.size], req.domain_advice)  # logged before the slow part of the set-up
        budget = {} if req.max_caption_chars is None else {"max_caption_chars": req.max_caption_chars}
        # Each model call (the caption's row, the tower, the prefills) runs in a loop, never OCR or tokenizing, so a
        # request set up on one thread lets rows decoding in that loop step in between.
        timings: dict[str, float] = {}
        if req.ocr is None and self._ocr_engine is None and on_phase is not None:
            on_phase("ocr_engine")
        with self._ocr_start:
            ocr_engine = self.ocr_engine if req.ocr is None else None
        view = self._compress(img, req.caption, req.ocr, ocr_engine, timings, on_phase=on_phase, **budget)
        style = req.prompt_style or self.prompt_style
        texts = style.user_texts(view, req.question.strip(), req.config.drafter_view, req.method)
        prompts = render_prompts(m.processor, m.verifier_tokenizer, img, texts, style.drafter_thinking_off)
        return _Rendered(prompts, [img], view, timings, _ocr_stat(ocr_engine, req.ocr), warnings)

    def _render_chat(self, req: Request) -> _Rendered:
        """A conversation (OpenAI-format ``messages``, see :mod:`asymspec_mm.request.conversation`): each image's
        compressed view, the two views rendered by the real templates (tools in them unless ``tool_choice`` is
        ``none``, :func:`~asymspec_mm.request.tools.prompt_tools`). The view kept is the last image's."""
        from vision_cache.image import load_image

        from .compression import compress_tools, compress_turns, compression_stats
        from .conversation import parse_messages, per_image, task_text, view_messages, view_texts
        from .tools import prompt_tools

        m = self.models
        turns = parse_messages(req.messages)
        m.check_images(sum(len(turn.images) for turn in turns))
        images = [load_image(req.image_of(part.source)) for turn in turns for part in turn.images]
        warnings = warn_request(self.name, task_text(turns), [img.size for img in images], req.domain_advice)
        captions, ocrs = per_image(req.caption, len(images), "caption"), per_image(req.ocr, len(images), "ocr")
        timings: dict[str, float] = {}
        with self._ocr_start:
            ocr_engine = self.ocr_engine if any(o is None for o in ocrs) else None
        views = []
        for img, cap, text in zip(images, captions, ocrs):
            spent: dict[str, float] = {}
            views.append(self._compress(img, cap, text, ocr_engine if text is None else None, spent))
            for key, seconds in spent.items():
                timings[key] = timings.get(key, 0.0) + seconds
        rendered_views = {i + 1: v.render() for i, v in enumerate(views)}
        summarize = self.summarizer
        squeezed = (
            compress_turns(turns, req.compression, m.verifier_tokenizer, summarize=summarize) if req.compression is not None else None
        )
        vm = view_messages(
            turns,
            rendered_views,
            drafter_view=req.config.drafter_view,
            text_compressor=req.text_compressor,
            verifier_turns=squeezed.turns if squeezed is not None else None,
        )
        tools = prompt_tools(req.tools, req.tool_choice)
        short_tools = (
            compress_tools(tools, req.compression, m.verifier_tokenizer, summarize=summarize)
            if req.compression is not None and tools
            else None
        )
        texts = view_texts(
            m.processor, m.verifier_tokenizer, vm, enable_thinking=req.enable_thinking, tools=tools, compressed_tools=short_tools
        )
        prompts = tokenize_prompts(m.processor, m.verifier_tokenizer, images, texts)
        given = None if any(o is None for o in ocrs) else (ocrs[0] if ocrs else False)
        stats = {}
        if squeezed is not None:
            full_vm = view_messages(turns, rendered_views, drafter_view=req.config.drafter_view, text_compressor=req.text_compressor)
            stats = compression_stats(m.verifier_tokenizer, full_vm, prompts.verifier_ids.shape[-1], squeezed, req.enable_thinking, tools)
        view = views[-1] if views else CompressedView()
        return _Rendered(prompts, images, view, timings, _ocr_stat(ocr_engine, given), warnings, stats)

    def _start_session(
        self,
        req: Request,
        r: _Rendered,
        vision: tuple[int, int],
        record: RequestRecord,
        engines: EngineFactory | None,
        prefill: bool,
        on_phase: Callable[[str], None] | None,
    ) -> Session:
        """After the prompts (either form): the context check, the streams (prefilled, or their prompts staged with
        ``prefill=False``), the set-up's statistics (on ``record``), the grammar the answer follows, and the
        :class:`Session`."""
        from vision_cache.image import image_content_hash

        m = self.models
        method, cfg = req.method, req.config
        self._check_context(r.prompts, cfg, method)
        if on_phase is not None:
            on_phase("prefill")
        t_prefill = time.perf_counter()
        staged = m.staged_streams(method) if not prefill else ()
        image_keys = tuple(image_content_hash(img) for img in r.images)
        streams, pending = self._start(method, r.prompts, r.images, image_keys, engines or self.engines, skip=staged)
        to_prefill = self._stream_prompts(method, r.prompts, image_keys, staged)
        prefill_s = time.perf_counter() - t_prefill
        tower_after, hits_after = m.encoder.thread_counts()
        stats = dict(
            vision_calls=tower_after - vision[0],
            vision_cache_hits=hits_after - vision[1],
            prefix_cache_hit=bool(getattr(streams.get("drafter_full"), "prefix_hit", False)),
            cached_tokens={name: int(getattr(e, "cached_tokens", 0)) for name, e in streams.items()},
            caption_s=r.timings.get("caption_s", 0.0),
            ocr_s=r.timings.get("ocr_s", 0.0),
            ocr_engine=r.ocr_stat,
            prefill_s=prefill_s,
        )
        if req.is_chat:
            stats["images"] = len(r.images)
        stats.update(r.stats)
        record.stats = stats
        stops = stop_fn(m.tokenizer, cfg.stop_strings) if cfg.stop_strings else None
        eos = set() if req.ignore_eos else m.eos_ids
        session = Session(req, r.prompts, r.view, streams, pending, eos, stops, record, to_prefill)
        session.reuse_keys = self._reuse_keys(method, r.prompts, image_keys)
        session.warnings = r.warnings
        session.vocab = m.vocab if method in ("asymspec", "drafter") else None  # Floor (and SD's own drafter): the verifier's ids alone
        forced = req.tool_choice not in (None, "none", "auto")
        if forced or req.response_format:
            from ..base.frozen import thawed
            from .grammar import GrammarConstraint

            options = thawed((req.tools, req.tool_choice, req.response_format))  # plain copies for xgrammar
            compiled = m.grammars.compile(*options, grammar=req.grammar)  # the grammar check_tools built
            if compiled is not None:
                session.constraint = GrammarConstraint(compiled, m.grammars.vocab_size)
        return session

    def _reuse_keys(self, method: str, p: Prompts, image_keys: tuple[str, ...]) -> dict[str, Any]:
        """Each transformers stream's whole prompt as a reuse key ``[L]`` (what its answer is stored under later);
        none when reuse is off."""
        m = self.models
        if not m.prefix_kv.max_bytes:
            return {}
        ids = m.stream_ids(method, p)
        keys = {}
        for name in m.staged_streams(method):
            images = name == "drafter_full" and p.mm_token_type_ids is not None and bool(image_keys)
            keys[name] = reuse_key(ids[name][0], p.mm_token_type_ids[0] if images else None, image_keys if images else ())
        return keys

    def _check_context(self, prompts: Prompts, cfg: AsymSpecConfig, method: str) -> None:
        """Prompt + new tokens (+ K+1 speculative positions) must fit each model's context window."""
        m = self.models
        need = cfg.max_new_tokens + cfg.k + 1
        checks = [("verifier", prompts.verifier_ids.shape[1], m.verifier.config, m.verifier)]
        d_cfg = m.drafter.config.get_text_config()
        checks += [
            ("drafter (full view)", prompts.drafter_full_ids.shape[1], d_cfg, m.drafter_full),
            ("drafter (compressed view)", prompts.drafter_comp_ids.shape[1], d_cfg, m.drafter_comp),
        ]
        if method == "sd" and m.sd_drafter is not None:  # it reads the verifier's prompt
            checks.append(("SD drafter", prompts.verifier_ids.shape[1], m.sd_drafter.config, None))
        for name, length, conf, served in checks:
            limit = getattr(conf, "max_position_embeddings", None)
            served_len = getattr(served, "max_model_len", None)  # vLLM: one position goes to its sampled token
            if served_len:
                limit = min(limit or served_len, served_len - 1)
            if limit and length + need > limit:
                raise ContextOverflowError(
                    f"the {name} prompt has {length} tokens; with max_new_tokens={cfg.max_new_tokens} and K={cfg.k} it "
                    f"needs {length + need} positions but the model's context window is {limit}. Shorten the question "
                    "or the caption/OCR text, or lower max_new_tokens.",
                    too_long="max_new_tokens" if length + cfg.k + 2 <= limit else "prompt",
                )

    def _stream_prompts(self, method: str, p: Prompts, image_keys: tuple[str, ...], names: tuple[str, ...]) -> dict[str, Any]:
        """The :class:`~asymspec_mm.core.prefill.StreamPrompt` of each stream in ``names`` (each ``prompt[:-1]``); the
        full view's image goes through the vision cache now (the tower's call runs in the serving loop when there is
        one, :mod:`asymspec_mm.engines.model_calls`)."""
        if not names:
            return {}
        from ..engines.pieces import image_prompt, text_prompt

        m = self.models
        ids = m.stream_ids(method, p)
        reuse = m.prefix_kv.max_bytes > 0
        text_only = p.pixel_values is None  # a conversation without images: the full view is text too
        out = {name: text_prompt(ids[name][0, :-1], reuse=reuse) for name in names if name != "drafter_full" or text_only}
        if "drafter_full" in names and not text_only:
            features, _ = m.encoder.encode(p.pixel_values, p.image_grid_thw, run=model_runner(m.home_loop))
            merge = m.drafter.config.vision_config.spatial_merge_size
            out["drafter_full"] = image_prompt(
                ids["drafter_full"][0, :-1], p.mm_token_type_ids[0], features, merge, image_keys=image_keys, reuse=reuse
            )
        return out

    def _start(
        self, method: str, p: Prompts, images: list, image_keys: tuple[str, ...], engines: EngineFactory, skip: tuple[str, ...] = ()
    ) -> tuple[dict, dict]:
        """Prefill the streams ``method`` needs but ``skip`` (each caches ``prompt[:-1]``); return them and every
        stream's pending token.

        Each stream's prefill is one model call of its own (in the loop serving the set-up, else the pipeline's), so
        rows decoding in that loop step between them rather than after the whole set-up."""
        m = self.models
        models, ids = m.stream_models(method), m.stream_ids(method, p)
        streams: dict[str, Any] = {}
        for name, model in models.items():
            if name in skip:
                continue
            args: tuple = (ids[name][0, :-1],)
            if name == "drafter_full":
                served = m.drafter_full is not None  # on vLLM, which runs its own tower; its prefix cache keeps the KV
                engine = m.drafter_full.vision_engine(name) if served else m.drafter_engine(engines, name, encoder=m.encoder)
                if images:  # a conversation without images reads the full view as text
                    # the features first, their tower pass a model call of its own (the feature cache may wait on the loop)
                    features = None if served else m.encoder.encode(p.pixel_values, p.image_grid_thw, run=model_runner(m.home_loop))[0]
                    args += (PromptImages(list(images), p.pixel_values, p.image_grid_thw, p.mm_token_type_ids[0], image_keys, features),)
            elif name == "verifier":
                engine = m.verifier_engine(engines)
            elif hasattr(model, "engine"):  # a served model (vLLM)
                engine = model.engine(name)
            elif model is m.drafter:
                engine = m.drafter_engine(engines, name)  # the drafter's text-only stream (a VL drafter's: rope delta 0)
            else:
                engine = engines.text(model, name, prefix_kv=m.prefix_kv)
            # in the loop serving this set-up (a vLLM-served stream's prefill too), else the pipeline's
            run_model(functools.partial(engine.prefill, *args), m.home_loop)
            streams[name] = engine
        devices = {name: streams[name].device if name in streams else model_device(x) for name, x in models.items()}
        return streams, {name: ids[name][0, -1:].to(devices[name]) for name in models}
