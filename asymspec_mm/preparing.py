"""Setting a request up: :class:`RequestPreparer` turns (image, question) into a :class:`~asymspec_mm.session.Session`.

Set-up is the compressed view (caption and OCR), the three prompts, the context-window check and each stream's
start: prefilled here, or left in ``Session.to_prefill`` for the batched, chunked prefill of
:mod:`asymspec_mm.batch.prefill`. Which model serves a stream and which prompt it reads is the
:class:`~asymspec_mm.models.ModelSet`'s to say; this module only asks.

:class:`ServingPipeline` is what batched serving (:mod:`asymspec_mm.batch`, the admission benchmark) needs of a
pipeline, so those modules depend on this protocol rather than on the user-facing facade that composes them
(:class:`~asymspec_mm.pipeline.AsymSpecPipeline` is one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from captioning.view import CompressedView

from .config import AsymSpecConfig, check_method, resolve_config
from .decode import StopFn
from .engines import EngineFactory, PromptImages, TransformersEngines, model_device
from .engines.prefix_kv import reuse_key
from .errors import ContextOverflowError
from .model_calls import model_runner
from .models import ModelSet
from .prompts import DEFAULT_STYLE, Prompts, PromptStyle, render_prompts, tokenize_prompts
from .questions import check_question
from .session import Session
from .tiny.domain import warn_request
from .unicode_check import chat_text_fields, check_text_fields

if TYPE_CHECKING:
    from .conversation import TextCompressor
    from .decode import Counters, TokenEvent
    from .locks import FairRLock
    from .session import MMResult


class ServingPipeline(Protocol):
    """What decoding prepared sessions on shared models needs: the models' lock, the drafter's tokenizer (token
    texts), the KV kept for reuse, which model serves each stream, set-up, and a decoded session's result."""

    @property
    def models_lock(self) -> FairRLock: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def prefix_kv(self) -> Any: ...

    def stream_models(self, method: str) -> dict[str, Any]: ...

    def prepare(
        self,
        image: Any,
        question: str,
        caption: str | None = ...,
        ocr: str | bool | None = ...,
        method: str = ...,
        config: AsymSpecConfig | None = ...,
        *,
        engines: EngineFactory | None = ...,
        ignore_eos: bool = ...,
        max_caption_chars: int | None = ...,
        on_phase: Callable[[str], None] | None = ...,
        prompt_style: PromptStyle | None = ...,
        prefill: bool = ...,
        **overrides: Any,
    ) -> Session: ...

    def prepare_chat(
        self,
        messages: Any,
        caption: Any = ...,
        ocr: Any = ...,
        method: str = ...,
        config: AsymSpecConfig | None = ...,
        *,
        engines: EngineFactory | None = ...,
        ignore_eos: bool = ...,
        text_compressor: TextCompressor | None = ...,
        enable_thinking: bool = ...,
        tools: Any = ...,
        tool_choice: Any = ...,
        response_format: Any = ...,
        prefill: bool = ...,
        **overrides: Any,
    ) -> Session: ...

    def result_of(self, session: Session, counters: Counters, trace: list[TokenEvent]) -> MMResult: ...


def stop_fn(tokenizer: Any, stop_strings: tuple[str, ...]) -> StopFn:
    """Whether the tokens so far end in one of ``stop_strings``: only the tail is decoded (a stop string spans at
    most its length in tokens, plus a few for tokens that decode to nothing), so a step costs the same late in a
    long answer as early."""
    longest = max(len(s) for s in stop_strings)

    def stop(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-(longest + 8) :], skip_special_tokens=True)
        return any(s in tail for s in stop_strings)

    return stop


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
        # the captioner takes the models' lock per model call, so rows decoding elsewhere step between its tokens
        self.captioner = (
            DrafterCaptioner(models.drafter, models.processor, models.encoder, lock=models.lock) if captioner == "drafter" else captioner
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

    def prepare(
        self,
        image: Any,
        question: str,
        caption: str | None = None,
        ocr: str | bool | None = None,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        *,
        engines: EngineFactory | None = None,
        ignore_eos: bool = False,
        max_caption_chars: int | None = None,
        on_phase: Callable[[str], None] | None = None,
        prompt_style: PromptStyle | None = None,
        prefill: bool = True,
        **overrides: Any,
    ) -> Session:
        """Set a request up: the compressed view, the three prompts, the prefilled streams ``method`` needs.

        ``caption``/``ocr``: ``None`` produce them, a string is used as is, ``ocr=False`` skips OCR.
        ``method``: asymspec | floor | drafter | sd. ``overrides`` set fields of ``config``. ``engines``
        builds the streams (default: the preparer's factory); ``ignore_eos`` decodes to the token budget;
        ``max_caption_chars`` replaces the caption budget (the paper harness' 1,600 characters);
        ``prompt_style`` the preparer's layout of the prompt texts (:class:`~asymspec_mm.prompts.PromptStyle`).
        ``on_phase(name)`` is called as each long part of the set-up starts: ``"ocr_engine"`` (first use),
        ``"caption"``, ``"ocr"``, ``"prefill"``. ``prefill=False`` stops before prefill where a stream's model is a
        transformers one: the session's ``to_prefill`` holds those streams' prompts (vision features encoded) for
        the batched, chunked prefill of :mod:`asymspec_mm.batch.prefill`; streams served elsewhere (vLLM) are
        prefilled as usual.
        """
        from vision_cache.image import load_image

        m = self.models
        cfg = resolve_config(config, overrides)
        check_method(method)
        question = check_question(question)
        check_text_fields({"caption": caption, "ocr": ocr})
        t_start = time.perf_counter()
        img = load_image(image)
        warnings = warn_request(self.name, question, [img.size])  # logged before the slow part of the set-up
        budget = {} if max_caption_chars is None else {"max_caption_chars": max_caption_chars}
        # The models' lock is held around each model call only (each caption token, the prefills), never across
        # OCR or tokenizing, so a request set up on one thread lets rows decoding on another step in between.
        timings: dict[str, float] = {}
        tower_before, hits_before = m.encoder.thread_counts()
        if ocr is None and self._ocr_engine is None and on_phase is not None:
            on_phase("ocr_engine")
        with self._ocr_start:
            ocr_engine = self.ocr_engine if ocr is None else None
        view = self._compress(img, caption, ocr, ocr_engine, timings, on_phase=on_phase, **budget)
        style = prompt_style or self.prompt_style
        texts = style.user_texts(view, question.strip(), cfg.drafter_view, method)
        prompts = render_prompts(m.processor, m.verifier_tokenizer, img, texts, style.drafter_thinking_off)
        vision = (tower_before, hits_before)
        session = self._set_up(
            method, cfg, prompts, [img], view, timings, ocr_engine, ocr, vision, t_start, engines, ignore_eos, prefill, on_phase
        )
        session.warnings = warnings
        return session

    def prepare_chat(
        self,
        messages: Any,
        caption: Any = None,
        ocr: Any = None,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        *,
        engines: EngineFactory | None = None,
        ignore_eos: bool = False,
        text_compressor: TextCompressor | None = None,
        enable_thinking: bool = False,
        tools: Any = None,
        tool_choice: Any = None,
        response_format: Any = None,
        prefill: bool = True,
        **overrides: Any,
    ) -> Session:
        """Set a conversation up (OpenAI-format ``messages``, see :mod:`asymspec_mm.conversation`): each image's
        compressed view, the two views rendered by the real templates, the streams as :meth:`prepare` makes them.

        ``caption`` / ``ocr``: ``None`` produce them for every image (``ocr=False``: none), a string for the only
        image, or a list with one per image. ``text_compressor`` shortens long text parts in the compressed view
        (e.g. :func:`~asymspec_mm.conversation.truncate`); ``enable_thinking`` goes to the verifier's template (off by
        default, as the paper's harness). ``tools`` (OpenAI function tools) are rendered by both templates and the
        answer is read for calls (``res.tool_calls``, :mod:`asymspec_mm.tools`), except under ``tool_choice="none"``:
        the tools stay out of the prompt and ``<tool_call>`` stops the answer (:func:`~asymspec_mm.tools.prompt_tools`);
        ``tool_choice`` ``required`` / a named function and ``response_format`` ``json_object`` / ``json_schema``
        constrain the answer with a grammar (:mod:`asymspec_mm.grammar`). The session's ``view`` is the last
        image's."""
        from vision_cache.image import load_image

        from .conversation import parse_messages, per_image, task_text, view_messages, view_texts
        from .tools import answer_stop_strings, check_response_format, check_tool_choice, check_tools, prompt_tools

        m = self.models
        cfg = resolve_config(config, overrides)
        check_method(method)
        check_text_fields(chat_text_fields(messages, caption, ocr, tools, tool_choice, response_format))
        offered = check_tools(tools)
        choice = check_tool_choice(tool_choice, offered)
        cfg = cfg.with_(stop_strings=answer_stop_strings(cfg.stop_strings, offered, choice))
        check_response_format(response_format)
        t_start = time.perf_counter()
        turns = parse_messages(messages)
        images = [load_image(part.source) for turn in turns for part in turn.images]
        warnings = warn_request(self.name, task_text(turns), [img.size for img in images])
        captions, ocrs = per_image(caption, len(images), "caption"), per_image(ocr, len(images), "ocr")
        timings: dict[str, float] = {}
        vision = m.encoder.thread_counts()
        with self._ocr_start:
            ocr_engine = self.ocr_engine if any(o is None for o in ocrs) else None
        views = []
        for img, cap, text in zip(images, captions, ocrs):
            spent: dict[str, float] = {}
            views.append(self._compress(img, cap, text, ocr_engine if text is None else None, spent))
            for key, seconds in spent.items():
                timings[key] = timings.get(key, 0.0) + seconds
        vm = view_messages(
            turns, {i + 1: v.render() for i, v in enumerate(views)}, drafter_view=cfg.drafter_view, text_compressor=text_compressor
        )
        prompts = tokenize_prompts(
            m.processor,
            m.verifier_tokenizer,
            images,
            view_texts(m.processor, m.verifier_tokenizer, vm, enable_thinking=enable_thinking, tools=prompt_tools(offered, choice)),
        )
        view = views[-1] if views else CompressedView()
        given = None if any(o is None for o in ocrs) else (ocrs[0] if ocrs else False)
        session = self._set_up(
            method, cfg, prompts, images, view, timings, ocr_engine, given, vision, t_start, engines, ignore_eos, prefill, None
        )
        session.stats["images"] = len(images)
        session.warnings = warnings
        session.tools, session.read_tool_calls = offered, bool(offered) and choice != "none"
        compiled = m.grammars.compile(offered, choice, response_format) if choice not in ("none", "auto") or response_format else None
        if compiled is not None:
            from .grammar import GrammarConstraint

            session.constraint = GrammarConstraint(compiled, m.grammars.vocab_size)
        return session

    def _set_up(
        self,
        method: str,
        cfg: AsymSpecConfig,
        prompts: Prompts,
        images: list,
        view: CompressedView,
        timings: dict[str, float],
        ocr_engine: Any,
        ocr: Any,
        vision: tuple[int, int],
        t_start: float,
        engines: EngineFactory | None,
        ignore_eos: bool,
        prefill: bool,
        on_phase: Callable[[str], None] | None,
    ) -> Session:
        """The set-up after the prompts (one request or a conversation): the context check, the streams (prefilled,
        or their prompts staged with ``prefill=False``), the set-up's statistics and the :class:`Session`."""
        from vision_cache.image import image_content_hash

        m = self.models
        self._check_context(prompts, cfg, method)
        if on_phase is not None:
            on_phase("prefill")
        t_prefill = time.perf_counter()
        staged = m.staged_streams(method) if not prefill else ()
        image_keys = tuple(image_content_hash(img) for img in images)
        streams, pending = self._start(method, prompts, images, image_keys, engines or self.engines, skip=staged)
        to_prefill = self._stream_prompts(method, prompts, image_keys, staged)
        prefill_s = time.perf_counter() - t_prefill
        tower_after, hits_after = m.encoder.thread_counts()
        stats = dict(
            vision_calls=tower_after - vision[0],
            vision_cache_hits=hits_after - vision[1],
            prefix_cache_hit=bool(getattr(streams.get("drafter_full"), "prefix_hit", False)),
            cached_tokens={name: int(getattr(e, "cached_tokens", 0)) for name, e in streams.items()},
            caption_s=timings.get("caption_s", 0.0),
            ocr_s=timings.get("ocr_s", 0.0),
            ocr_engine=getattr(ocr_engine, "name", "given") if ocr is None or isinstance(ocr, str) else "off",
            prefill_s=prefill_s,
        )
        stops = stop_fn(m.tokenizer, cfg.stop_strings) if cfg.stop_strings else None
        session = Session(
            method,
            cfg,
            prompts,
            view,
            streams,
            pending,
            set() if ignore_eos else m.eos_ids,
            stops,
            prefill_s,
            t_start,
            stats,
            to_prefill,
        )
        session.reuse_keys = self._reuse_keys(method, prompts, image_keys)
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
        """The :class:`~asymspec_mm.batch.prefill.StreamPrompt` of each stream in ``names`` (each ``prompt[:-1]``); the
        full view's image goes through the vision cache now (the tower's call runs in the serving loop when there is
        one, :mod:`asymspec_mm.model_calls`)."""
        if not names:
            return {}
        from .engines.pieces import image_prompt, text_prompt

        m = self.models
        ids = m.stream_ids(method, p)
        reuse = m.prefix_kv.max_bytes > 0
        text_only = p.pixel_values is None  # a conversation without images: the full view is text too
        out = {name: text_prompt(ids[name][0, :-1], reuse=reuse) for name in names if name != "drafter_full" or text_only}
        if "drafter_full" in names and not text_only:
            features, _ = m.encoder.encode(p.pixel_values, p.image_grid_thw, run=model_runner(m.lock))
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

        Each stream's prefill takes the models' lock on its own, so rows decoding on another thread step between
        them rather than after the whole set-up."""
        m = self.models
        models, ids = m.stream_models(method), m.stream_ids(method, p)
        streams: dict[str, Any] = {}
        for name, model in models.items():
            if name in skip:
                continue
            args: tuple = (ids[name][0, :-1],)
            if name == "drafter_full":
                served = m.drafter_full is not None  # on vLLM, which runs its own tower; its prefix cache keeps the KV
                engine = (
                    m.drafter_full.vision_engine(name) if served else engines.vision(model, name, encoder=m.encoder, prefix_kv=m.prefix_kv)
                )
                if images:  # a conversation without images reads the full view as text
                    # the features first, never under the lock (the feature cache may wait on the serving loop)
                    features = None if served else m.encoder.encode(p.pixel_values, p.image_grid_thw, run=model_runner(m.lock))[0]
                    args += (PromptImages(list(images), p.pixel_values, p.image_grid_thw, p.mm_token_type_ids[0], image_keys, features),)
            elif name == "verifier":
                engine = m.verifier_engine(engines)
            elif hasattr(model, "engine"):  # a served model (vLLM)
                engine = model.engine(name)
            elif model is m.drafter:
                engine = engines.vision(model, name, prefix_kv=m.prefix_kv)  # the drafter's text-only stream (rope delta 0)
            else:
                engine = engines.text(model, name, prefix_kv=m.prefix_kv)
            with m.lock:
                engine.prefill(*args)
            streams[name] = engine
        devices = {name: streams[name].device if name in streams else model_device(x) for name, x in models.items()}
        return streams, {name: ids[name][0, -1:].to(devices[name]) for name in models}
