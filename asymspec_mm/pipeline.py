"""Loading, prompts and the user-facing API: :class:`AsymSpecPipeline` and :func:`mm_generate`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from captioning.view import CompressedView

from .config import AsymSpecConfig, check_method, resolve_config
from .decode import Counters, TokenEvent, greedy_steps, steps_for
from .decode.loops import Timer
from .decode.rows import STREAMS_OF
from .engines import EngineFactory, PromptImages, TransformersEngines, model_device
from .engines.vllm import logit_width
from .errors import ContextOverflowError, EmptyQuestionError
from .loading import check_backends, check_checkpoint, check_vocabularies, eos_ids, load_models, resolve_device
from .locks import FairRLock
from .prompts import DEFAULT_STYLE, Prompts, PromptStyle, render_prompts
from .questions import check_question
from .session import GenerationStream, MMResult, Session

log = logging.getLogger("asymspec_mm")

__all__ = ["AsymSpecPipeline", "GenerationStream", "MMResult", "Prompts", "Session", "mm_generate", "check_vocabularies", "resolve_device"]


class AsymSpecPipeline:
    """A drafter (Qwen3-VL) and a verifier (text LM) ready to answer questions about images.

    Models load once; each request gets fresh KV caches. Requests are serialised by a lock (the
    models are shared), so one pipeline can serve several threads.
    """

    def __init__(
        self,
        drafter,
        processor,
        verifier,
        verifier_tokenizer,
        *,
        device: torch.device | None = None,
        vision_cache_bytes: int = 256 * 2**20,
        prefix_cache_bytes: int = 256 * 2**20,
        ocr: str | Any = "auto",
        ocr_layout: str = "plain",
        captioner: str | Any = "drafter",
        name: str = "custom",
        check_vocab: bool = True,
        drafter_comp: Any = None,
        drafter_full: Any = None,
        engines: EngineFactory | None = None,
        prompt_style: PromptStyle | None = None,
        sd_drafter: Any = None,
        sd_drafter_tokenizer: Any = None,
    ):
        from vision_cache.features import VisionEncoder

        from .captioner import DrafterCaptioner

        self.drafter = drafter.eval()
        self.processor = processor
        self.verifier = verifier.eval()
        self.verifier_tokenizer = verifier_tokenizer
        # optional: a model serving the drafter's compressed stream (a VLLMModel); default the drafter itself
        self.drafter_comp = drafter_comp
        # optional: a model serving the full-view (image) stream (a VLLMModel that takes images); default the drafter
        self.drafter_full = drafter_full
        # optional: the SD baseline's own text drafter (a causal LM sharing the verifier's vocabulary and reading
        # the verifier's prompt); default: the VL drafter on the compressed view
        self.sd_drafter = sd_drafter.eval() if sd_drafter is not None else None
        self.tokenizer = processor.tokenizer
        self.device = device or next(drafter.parameters()).device
        self.name = name
        if check_vocab:
            check_vocabularies(
                self.tokenizer,
                verifier_tokenizer,
                logit_width(drafter),
                logit_width(verifier),
            )
            if sd_drafter is not None:
                sd_tok = sd_drafter_tokenizer or verifier_tokenizer
                check_vocabularies(sd_tok, verifier_tokenizer, logit_width(sd_drafter), logit_width(verifier), "SD drafter")
        self._lock = FairRLock()  # the models: one model call at a time across threads, in arrival order
        self._ocr_start = threading.Lock()  # the OCR engine is created once, on first use
        self.encoder = VisionEncoder(drafter, cache_bytes=vision_cache_bytes, model_key=str(getattr(drafter, "name_or_path", "")))
        from vision_cache.store import FeatureStore

        # KV cache of the drafter's full-view prompt up to and including the image, reused across
        # questions about the same image (0 disables).
        self.prefix_store = FeatureStore(max_bytes=prefix_cache_bytes)
        self.captioner = DrafterCaptioner(drafter, processor, self.encoder, lock=self._lock) if captioner == "drafter" else captioner
        self._ocr_spec = ocr
        self._ocr_engine = None if isinstance(ocr, str) else ocr
        from captioning.ocr.items import check_ocr_layout

        # how the engine's items become the OCR text (the tiny preset: one line, as MiniVista trained it)
        self.ocr_layout = check_ocr_layout(ocr_layout)
        self.eos_ids = eos_ids((self.tokenizer, verifier_tokenizer), (self.drafter, self.verifier))
        self.engines: EngineFactory = engines or TransformersEngines()
        # how (view, question) become the prompts' texts; a request may bring its own (prepare(prompt_style=...))
        self.prompt_style: PromptStyle = prompt_style or DEFAULT_STYLE

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        drafter: str | Path = "Qwen/Qwen3-VL-2B-Instruct",
        verifier: str | Path = "Qwen/Qwen3-32B",
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        *,
        device_map: Any = None,
        verifier_device_map: Any = None,
        trust_remote_code: bool = False,
        local_files_only: bool | None = None,
        verifier_backend: str = "transformers",
        vllm_kwargs: dict | None = None,
        drafter_backend: str = "transformers",
        drafter_vllm_kwargs: dict | None = None,
        sd_drafter: str | Path | None = None,
        **kwargs,
    ) -> AsymSpecPipeline:
        """Load both models with ``from_pretrained`` (hub id or local directory).

        Auto device/dtype: cuda + bf16 when available, else cpu + fp32. ``verifier_device_map``
        (e.g. ``"auto"``) spreads a large verifier over several GPUs; ``device_map`` does so for the
        drafter. ``trust_remote_code`` stays off unless asked.

        ``verifier_backend="vllm"`` serves the verifier with vLLM (see VLLM.md): ``vllm_kwargs`` go to
        ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``,
        ``distributed_executor_backend="ray"``, ...; prefix caching is always on).
        ``drafter_backend="vllm"`` serves the drafter's streams with one more ``vllm.LLM``
        (``drafter_vllm_kwargs``): the compressed (text-only) stream and the full-view stream, whose
        prompt carries the image (vLLM runs its own vision tower); with
        ``drafter_vllm_kwargs={"limit_mm_per_prompt": {"image": 0, "video": 0}}`` only the compressed
        stream. Captions (and their vision-feature cache) stay on the transformers drafter.

        ``sd_drafter`` (hub id or local directory of a text causal LM sharing the verifier's vocabulary, e.g.
        ``Qwen/Qwen3-1.7B``, the paper's SD baseline) drafts for ``method="sd"`` instead of the VL drafter on
        the compressed view: on transformers, with the drafter's dtype and device rules, reading the
        verifier's prompt (the same user text and chat template).
        """
        check_backends(verifier_backend, drafter_backend, verifier_device_map, vllm_kwargs, drafter_vllm_kwargs)
        from captioning.ocr.items import check_ocr_layout

        check_ocr_layout(kwargs.get("ocr_layout", "plain"))  # before any model loads
        for ref, role in ((drafter, "drafter"), (verifier, "verifier"), (sd_drafter, "SD drafter")):
            if ref is not None and isinstance(ref, (str, Path)):
                check_checkpoint(ref, role)
        models = load_models(
            drafter,
            verifier,
            device,
            dtype,
            device_map=device_map,
            verifier_device_map=verifier_device_map,
            trust_remote_code=trust_remote_code,
            local_files_only=local_files_only,
            verifier_backend=verifier_backend,
            vllm_kwargs=vllm_kwargs,
            drafter_backend=drafter_backend,
            drafter_vllm_kwargs=drafter_vllm_kwargs,
            sd_drafter=sd_drafter,
        )
        return cls(**models, **kwargs)

    @classmethod
    def from_preset(cls, name: str = "tiny", **kwargs) -> AsymSpecPipeline:
        """A named pair from :mod:`asymspec_mm.presets` (``tiny`` ships with the package and runs offline);
        ``kwargs`` go to :meth:`from_pretrained` (e.g. ``sd_drafter="Qwen/Qwen3-1.7B"`` with ``qwen3``)."""
        from .presets import resolve_preset

        preset = resolve_preset(name)
        opts = {**preset.pipeline_kwargs, **kwargs}
        pipe = cls.from_pretrained(drafter=preset.drafter, verifier=preset.verifier, **opts)
        pipe.name = preset.name
        return pipe

    @property
    def models_lock(self) -> FairRLock:
        """The lock held around every model call (re-entrant, first come first served): whoever decodes on this
        pipeline's models from another thread holds it around each call."""
        return self._lock

    @property
    def sd_drafter_name(self) -> str:
        """Which model drafts for SD: the separate text drafter's name or path, else the VL drafter's view."""
        if self.sd_drafter is None:
            return "drafter (compressed view)"
        return str(getattr(self.sd_drafter, "name_or_path", "") or "custom text drafter")

    @property
    def ocr_engine(self):
        """The OCR engine, created on first use (``auto`` picks EasyOCR, else RapidOCR)."""
        if self._ocr_engine is None and self._ocr_spec is not None:
            from captioning.ocr import get_ocr_engine

            self._ocr_engine = get_ocr_engine(self._ocr_spec)
        return self._ocr_engine

    # ------------------------------------------------------------------ requests
    def compressed_view(
        self, image, caption: str | None = None, ocr: str | bool | None = None, timings: dict | None = None
    ) -> CompressedView:
        """What the verifier will read about ``image`` (caption/OCR produced when ``None``)."""
        from captioning.captioner import compress
        from vision_cache.image import load_image

        image = load_image(image)
        with self._ocr_start:
            ocr_engine = self.ocr_engine if ocr is None else None
        # the captioner takes the models' lock per model call itself
        return compress(
            image, captioner=self.captioner, ocr_engine=ocr_engine, caption=caption, ocr=ocr, ocr_layout=self.ocr_layout, timings=timings
        )

    def generate(self, image, question: str, **kwargs) -> MMResult:
        """Answer ``question`` about ``image``: keywords as in :meth:`prepare`."""
        return self.stream(image, question, **kwargs).result

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
        """Answer many requests (dicts with ``image``, ``question``, optional ``caption``, ``ocr``, or
        :class:`~asymspec_mm.batch.Request`), decoding up to ``batch_size`` of them together; results in input
        order, each equal to :meth:`generate` of that request alone; ``kv_budget_bytes`` bounds the rows by the
        KV memory they may reach (see :mod:`asymspec_mm.batch`)."""
        from .batch.generate import generate_batch

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
        """A continuous-batching :class:`~asymspec_mm.batch.Scheduler` for concurrent callers of this pipeline:
        ``h = sched.submit(image, question, ...)``, ``h.result()``, ``for events in h``, ``h.cancel()``, ``sched.close()``.
        ``batch_engines(model, stream_name)`` builds each batch's engines (default: transformers or vLLM rows);
        ``options``: ``prefill_chunk_tokens`` (prompt tokens per batched prefill forward), ``on_step``."""
        from .batch.scheduler import Scheduler

        return Scheduler(
            self, max_batch_size=max_batch_size, max_queue=max_queue, max_kv_bytes=max_kv_bytes, batch_engines=batch_engines, **options
        )

    def stream(self, image, question: str, **kwargs) -> GenerationStream:
        """:meth:`prepare` then :meth:`run`: iterate for each step's events, then read ``.result``."""
        return self.run(self.prepare(image, question, **kwargs))

    def prepare(
        self,
        image,
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
        **overrides,
    ) -> Session:
        """Set a request up: the compressed view, the three prompts, the prefilled streams ``method`` needs.

        ``caption``/``ocr``: ``None`` produce them, a string is used as is, ``ocr=False`` skips OCR.
        ``method``: asymspec | floor | drafter | sd. ``overrides`` set fields of ``config``. ``engines``
        builds the streams (default: the pipeline's factory); ``ignore_eos`` decodes to the token budget;
        ``max_caption_chars`` replaces the caption budget (the paper harness' 1,600 characters);
        ``prompt_style`` the pipeline's layout of the prompt texts (:class:`~asymspec_mm.prompts.PromptStyle`).
        ``on_phase(name)`` is called as each long part of the set-up starts: ``"ocr_engine"`` (first use),
        ``"caption"``, ``"ocr"``, ``"prefill"``. ``prefill=False`` stops before prefill where a stream's model is a
        transformers one: the session's ``to_prefill`` holds those streams' prompts (vision features encoded) for
        the batched, chunked prefill of :mod:`asymspec_mm.batch.prefill`; streams served elsewhere (vLLM) are
        prefilled as usual.
        """
        from captioning.captioner import compress
        from vision_cache.image import image_content_hash, load_image

        cfg = resolve_config(config, overrides)
        check_method(method)
        question = check_question(question)
        t_start = time.perf_counter()
        img = load_image(image)
        budget = {} if max_caption_chars is None else {"max_caption_chars": max_caption_chars}
        # The models' lock is held around each model call only (each caption token, the prefills), never across
        # OCR or tokenizing, so a request set up on one thread lets rows decoding on another step in between.
        timings: dict[str, float] = {}
        tower_before, hits_before = self.encoder.thread_counts()
        if ocr is None and self._ocr_engine is None and on_phase is not None:
            on_phase("ocr_engine")
        with self._ocr_start:
            ocr_engine = self.ocr_engine if ocr is None else None
        view = compress(
            img,
            captioner=self.captioner,
            ocr_engine=ocr_engine,
            caption=caption,
            ocr=ocr,
            ocr_layout=self.ocr_layout,
            image_hash=image_content_hash(img),
            timings=timings,
            on_phase=on_phase,
            **budget,
        )
        style = prompt_style or self.prompt_style
        texts = style.user_texts(view, question.strip(), cfg.drafter_view, method)
        prompts = render_prompts(self.processor, self.verifier_tokenizer, img, texts, style.drafter_thinking_off)
        self._check_context(prompts, cfg, method)
        if on_phase is not None:
            on_phase("prefill")
        t_prefill = time.perf_counter()
        staged = self.staged_streams(method) if not prefill else ()
        streams, pending = self._start(method, prompts, img, engines or self.engines, skip=staged)
        to_prefill = self._stream_prompts(method, prompts, staged)
        prefill_s = time.perf_counter() - t_prefill
        tower_after, hits_after = self.encoder.thread_counts()
        stats = dict(
            vision_calls=tower_after - tower_before,
            vision_cache_hits=hits_after - hits_before,
            prefix_cache_hit=bool(getattr(streams.get("drafter_full"), "prefix_hit", False)),
            caption_s=timings.get("caption_s", 0.0),
            ocr_s=timings.get("ocr_s", 0.0),
            ocr_engine=getattr(ocr_engine, "name", "given") if ocr is None or isinstance(ocr, str) else "off",
            prefill_s=prefill_s,
        )
        stop_fn = self._stop_fn(cfg.stop_strings) if cfg.stop_strings else None
        return Session(
            method,
            cfg,
            prompts,
            view,
            streams,
            pending,
            set() if ignore_eos else self.eos_ids,
            stop_fn,
            prefill_s,
            t_start,
            stats,
            to_prefill,
        )

    def run(self, session: Session, *, timer: Timer | None = None) -> GenerationStream:
        """Decode a prepared request. ``timer(name)`` (a context manager) wraps the loop's gate and trace."""
        counters = Counters(session.config.k, session.streams)
        steps = steps_for(
            session.method, session.streams, session.pending, session.config, session.eos_ids, session.stop_fn, counters, timer
        )
        trace: list[TokenEvent] = []

        def decoded_steps():
            while True:
                with self._lock:  # the models are shared: one step at a time across requests
                    events = next(steps, None)
                if events is None:
                    return
                for ev in events:
                    ev.text = self.tokenizer.decode([ev.token_id])
                trace.extend(events)
                yield events

        return GenerationStream(decoded_steps(), lambda: self.result_of(session, counters, trace))

    def result_of(self, session: Session, counters: Counters, trace: list[TokenEvent]) -> MMResult:
        """The :class:`MMResult` of a decoded session: its trace, the counters' statistics and set-up's."""
        stats = counters.as_dict()
        stats.update(
            session.stats,
            wall_s=time.perf_counter() - session.t_start,
            steered=sum(ev.steered for ev in trace),
            fused=sum(ev.source == "fused" for ev in trace),
        )
        if session.method == "sd":
            stats["sd_drafter"] = self.sd_drafter_name
        token_ids = [ev.token_id for ev in trace]
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        for s in session.config.stop_strings:
            if s and s in text:
                text = text[: text.index(s)]
        return MMResult(
            text=text,
            token_ids=token_ids,
            trace=trace,
            stats=stats,
            prompts=session.prompts,
            view=session.view,
            method=session.method,
            config=session.config,
        )

    def complete(self, prompt: str, max_new_tokens: int = 64) -> str:
        """Greedy text completion by the verifier alone (a one-turn chat, thinking off).

        Used for MathVista's LLM answer extraction, so no external API is needed.
        """
        if not prompt.strip():
            raise EmptyQuestionError("the completion prompt is empty")
        text = self.verifier_tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = torch.tensor(self.verifier_tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        limit = getattr(self.verifier.config, "max_position_embeddings", None)
        if limit and ids.numel() + max_new_tokens > limit:
            raise ContextOverflowError(f"the extraction prompt has {ids.numel()} tokens; the verifier's window is {limit}")
        with self._lock:
            engine = self._verifier_engine()
            engine.prefill(ids[:-1])
            cfg = AsymSpecConfig(max_new_tokens=max_new_tokens, trace_top=0)
            tokens = [ev.token_id for events in greedy_steps(engine, ids[-1:], cfg, self.eos_ids) for ev in events]
        return self.verifier_tokenizer.decode(tokens, skip_special_tokens=True).strip()

    # ------------------------------------------------------------------ internals
    def _check_context(self, prompts: Prompts, cfg: AsymSpecConfig, method: str) -> None:
        """Prompt + new tokens (+ K+1 speculative positions) must fit each model's context window."""
        need = cfg.max_new_tokens + cfg.k + 1
        checks = [("verifier", prompts.verifier_ids.shape[1], self.verifier.config, self.verifier)]
        d_cfg = self.drafter.config.get_text_config()
        checks += [
            ("drafter (full view)", prompts.drafter_full_ids.shape[1], d_cfg, self.drafter_full),
            ("drafter (compressed view)", prompts.drafter_comp_ids.shape[1], d_cfg, self.drafter_comp),
        ]
        if method == "sd" and self.sd_drafter is not None:  # it reads the verifier's prompt
            checks.append(("SD drafter", prompts.verifier_ids.shape[1], self.sd_drafter.config, None))
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

    def stream_models(self, method: str) -> dict[str, Any]:
        """Which model serves each of ``method``'s streams (the one place that decides it): the drafter on both views
        unless a served model replaces a view, the verifier, and for SD the pipeline's own text drafter if it has one."""
        models = {
            "drafter_full": self.drafter_full or self.drafter,
            "drafter_comp": self.drafter_comp or self.drafter,
            "verifier": self.verifier,
        }
        if method == "sd" and self.sd_drafter is not None:
            models["drafter_comp"] = self.sd_drafter
        return {name: models[name] for name in STREAMS_OF[method]}

    def stream_ids(self, method: str, p: Prompts) -> dict[str, torch.Tensor]:
        """Each of ``method``'s streams' prompt ids ``[1, L]`` (the SD text drafter reads the verifier's prompt)."""
        ids = {"drafter_full": p.drafter_full_ids, "drafter_comp": p.drafter_comp_ids, "verifier": p.verifier_ids}
        if method == "sd" and self.sd_drafter is not None:
            ids["drafter_comp"] = p.verifier_ids
        return {name: ids[name] for name in STREAMS_OF[method]}

    def staged_streams(self, method: str) -> tuple[str, ...]:
        """The streams of ``method`` that batched chunked prefill can fill: those on a transformers model."""
        return tuple(name for name, model in self.stream_models(method).items() if isinstance(model, torch.nn.Module))

    def _stream_prompts(self, method: str, p: Prompts, names: tuple[str, ...]) -> dict[str, Any]:
        """The :class:`~asymspec_mm.batch.prefill.StreamPrompt` of each stream in ``names`` (each ``prompt[:-1]``); the
        full view's image goes through the vision cache now (the tower runs on the set-up thread)."""
        if not names:
            return {}
        from .batch.prefill import image_prompt, text_prompt

        ids = self.stream_ids(method, p)
        out = {name: text_prompt(ids[name][0, :-1]) for name in names if name != "drafter_full"}
        if "drafter_full" in names:
            with self._lock:
                features, _ = self.encoder.encode(p.pixel_values, p.image_grid_thw)
            merge = self.drafter.config.vision_config.spatial_merge_size
            reuse = self.prefix_store is not None
            out["drafter_full"] = image_prompt(ids["drafter_full"][0, :-1], p.mm_token_type_ids[0], features, merge, reuse=reuse)
        return out

    def _start(self, method: str, p: Prompts, image, engines: EngineFactory, skip: tuple[str, ...] = ()) -> tuple[dict, dict]:
        """Prefill the streams ``method`` needs but ``skip`` (each caches ``prompt[:-1]``); return them and every
        stream's pending token.

        Each stream's prefill takes the models' lock on its own, so rows decoding on another thread step between
        them rather than after the whole set-up."""
        models, ids = self.stream_models(method), self.stream_ids(method, p)
        streams: dict[str, Any] = {}
        for name, model in models.items():
            if name in skip:
                continue
            args: tuple = (ids[name][0, :-1],)
            if name == "drafter_full":
                if self.drafter_full is not None:  # on vLLM, which runs its own tower; its prefix cache keeps the KV
                    engine = self.drafter_full.vision_engine(name)
                else:
                    engine = engines.vision(model, name, encoder=self.encoder, prefix_store=self.prefix_store)
                args += (PromptImages([image], p.pixel_values, p.image_grid_thw, p.mm_token_type_ids[0]),)
            elif name == "verifier":
                engine = self._verifier_engine(engines)
            elif hasattr(model, "engine"):  # a served model (vLLM)
                engine = model.engine(name)
            elif model is self.drafter:
                engine = engines.vision(model, name)  # the drafter's text-only stream (rope delta 0)
            else:
                engine = engines.text(model, name)
            with self._lock:
                engine.prefill(*args)
            streams[name] = engine
        devices = {name: streams[name].device if name in streams else model_device(m) for name, m in models.items()}
        return streams, {name: ids[name][0, -1:].to(devices[name]) for name in models}

    def _verifier_engine(self, engines: EngineFactory | None = None, name: str = "verifier"):
        """A fresh verifier stream: on vLLM when the verifier is served there, else from the engine factory."""
        if hasattr(self.verifier, "engine"):
            return self.verifier.engine(name)
        return (engines or self.engines).text(self.verifier, name)

    def _stop_fn(self, stop_strings: tuple[str, ...]):
        tok = self.tokenizer
        longest = max(len(s) for s in stop_strings)

        def stop(tokens: list[int]) -> bool:
            tail = tok.decode(tokens[-(longest + 8) :], skip_special_tokens=True)
            return any(s in tail for s in stop_strings)

        return stop


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
