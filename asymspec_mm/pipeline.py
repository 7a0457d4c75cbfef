"""Loading, prompts and the user-facing API: :class:`AsymSpecPipeline` and :func:`mm_generate`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from captioning.view import CompressedView

from .decode import METHODS, AsymSpecConfig, Counters, TokenEvent, asymspec_steps, greedy_steps, sd_steps
from .engines import TextEngine, VLEngine
from .errors import ContextOverflowError, EmptyQuestionError, UnknownOptionError, VocabularyMismatchError
from .prompts import Prompts, build_prompts
from .vllm_engine import logit_width

BACKENDS = ("transformers", "vllm")

log = logging.getLogger("asymspec_mm")

__all__ = ["AsymSpecPipeline", "MMResult", "Prompts", "mm_generate", "check_vocabularies", "resolve_device"]


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

    def as_dict(self) -> dict:
        """JSON-ready summary (no tensors)."""
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "method": self.method,
            "config": self.config.as_dict(),
            "stats": self.stats,
            "view": {"caption": self.view.caption, "ocr_text": self.view.ocr_text},
            "trace": [ev.as_dict() for ev in self.trace],
        }


def resolve_device(device: str | torch.device | None, dtype: torch.dtype | str | None) -> tuple[torch.device, torch.dtype]:
    """Auto: cuda + bf16 when a GPU is there, else cpu + fp32."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(dtype, str):
        dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
                 "fp32": torch.float32, "float32": torch.float32, "auto": None}[dtype]
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, dtype


def check_vocabularies(drafter_tokenizer, verifier_tokenizer, drafter_logits: int, verifier_logits: int) -> None:
    """Drafter and verifier must share one output vocabulary: same logit width, same token at every shared id.

    Raises :class:`VocabularyMismatchError` naming the first mismatching ids.
    """
    if drafter_logits != verifier_logits:
        raise VocabularyMismatchError(
            f"the drafter has {drafter_logits} output logits and the verifier {verifier_logits}: AsymSpec needs one "
            "shared vocabulary (e.g. Qwen3-VL + Qwen3). Pick a pair from the same tokenizer family."
        )
    n = min(len(drafter_tokenizer), len(verifier_tokenizer))
    d_tokens = drafter_tokenizer.convert_ids_to_tokens(list(range(n)))
    v_tokens = verifier_tokenizer.convert_ids_to_tokens(list(range(n)))
    bad = [i for i, (x, y) in enumerate(zip(d_tokens, v_tokens)) if x != y]
    if bad:
        shown = ", ".join(f"id {i}: drafter {d_tokens[i]!r} vs verifier {v_tokens[i]!r}" for i in bad[:5])
        raise VocabularyMismatchError(
            f"drafter and verifier tokenizers differ at {len(bad)} of {n} shared ids (first: {shown}). "
            "AsymSpec fuses logits id by id, so both models must use the same tokenizer."
        )


def _load_kwargs(dtype: torch.dtype, device: torch.device, device_map: Any, trust_remote_code: bool) -> dict:
    kw: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if device_map is not None:
        kw["device_map"] = device_map
    return kw


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
        captioner: str | Any = "drafter",
        name: str = "custom",
        check_vocab: bool = True,
        drafter_comp: Any = None,
        drafter_full: Any = None,
    ):
        from .captioner import DrafterCaptioner
        from vision_cache.features import VisionEncoder

        self.drafter = drafter.eval()
        self.processor = processor
        self.verifier = verifier.eval()
        self.verifier_tokenizer = verifier_tokenizer
        # optional: a model serving the drafter's compressed stream (a VLLMModel); default the drafter itself
        self.drafter_comp = drafter_comp
        # optional: a model serving the full-view (image) stream (a VLLMModel that takes images); default the drafter
        self.drafter_full = drafter_full
        self.tokenizer = processor.tokenizer
        self.device = device or next(drafter.parameters()).device
        self.name = name
        if check_vocab:
            check_vocabularies(
                self.tokenizer, verifier_tokenizer,
                logit_width(drafter), logit_width(verifier),
            )
        self.encoder = VisionEncoder(drafter, cache_bytes=vision_cache_bytes, model_key=str(getattr(drafter, "name_or_path", "")))
        from vision_cache.store import FeatureStore

        # KV cache of the drafter's full-view prompt up to and including the image, reused across
        # questions about the same image (0 disables).
        self.prefix_store = FeatureStore(max_bytes=prefix_cache_bytes)
        self.captioner = DrafterCaptioner(drafter, processor, self.encoder) if captioner == "drafter" else captioner
        self._ocr_spec = ocr
        self._ocr_engine = None if isinstance(ocr, str) else ocr
        self._lock = threading.RLock()
        self.eos_ids = self._eos_ids()

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
        **kwargs,
    ) -> "AsymSpecPipeline":
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
        """
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        for opt, value in (("verifier_backend", verifier_backend), ("drafter_backend", drafter_backend)):
            if value not in BACKENDS:
                raise UnknownOptionError(f"{opt}={value!r} is not valid; choose one of {', '.join(BACKENDS)}")
        if verifier_backend == "vllm" and verifier_device_map is not None:
            raise UnknownOptionError("verifier_device_map applies to the transformers backend; with "
                                     "verifier_backend='vllm' use vllm_kwargs={'tensor_parallel_size': N}")
        if vllm_kwargs and verifier_backend != "vllm":
            raise UnknownOptionError("vllm_kwargs is set but verifier_backend is not 'vllm'")
        if drafter_vllm_kwargs and drafter_backend != "vllm":
            raise UnknownOptionError("drafter_vllm_kwargs is set but drafter_backend is not 'vllm'")
        dev, dt = resolve_device(device, dtype)
        extra = {} if local_files_only is None else {"local_files_only": local_files_only}
        processor = AutoProcessor.from_pretrained(str(drafter), trust_remote_code=trust_remote_code, **extra)
        d_model = AutoModelForImageTextToText.from_pretrained(str(drafter), **_load_kwargs(dt, dev, device_map, trust_remote_code), **extra)
        if device_map is None:
            d_model.to(dev)
        v_tok = AutoTokenizer.from_pretrained(str(verifier), trust_remote_code=trust_remote_code, **extra)
        if verifier_backend == "vllm":
            from .vllm_engine import VLLMModel

            v_kw = {"dtype": dt, **(vllm_kwargs or {})}  # a dtype in vllm_kwargs wins over the pipeline's
            v_model = VLLMModel.from_pretrained(verifier, trust_remote_code=trust_remote_code, **extra, **v_kw)
        else:
            v_model = AutoModelForCausalLM.from_pretrained(str(verifier), **_load_kwargs(dt, dev, verifier_device_map, trust_remote_code), **extra)
            if verifier_device_map is None:
                v_model.to(dev)
        comp = None
        if drafter_backend == "vllm":
            from .vllm_engine import VLLMModel

            comp_kw = {"dtype": dt, "limit_mm_per_prompt": {"image": 1, "video": 0}, **(drafter_vllm_kwargs or {})}
            comp = VLLMModel.from_pretrained(drafter, trust_remote_code=trust_remote_code, **extra, **comp_kw)
        full = comp if comp is not None and getattr(comp, "accepts_images", False) else None
        return cls(d_model, processor, v_model, v_tok, device=dev, name=f"{drafter} + {verifier}", drafter_comp=comp,
                   drafter_full=full, **kwargs)

    @classmethod
    def from_preset(cls, name: str = "tiny", **kwargs) -> "AsymSpecPipeline":
        """A named pair from :mod:`asymspec_mm.presets` (``tiny`` ships with the package and runs offline)."""
        from .presets import resolve_preset

        preset = resolve_preset(name)
        opts = {**preset.pipeline_kwargs, **kwargs}
        pipe = cls.from_pretrained(drafter=preset.drafter, verifier=preset.verifier, **opts)
        pipe.name = preset.name
        return pipe

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for tok in (self.tokenizer, self.verifier_tokenizer):
            for t in ("<|im_end|>", "<|endoftext|>"):
                i = tok.convert_tokens_to_ids(t)
                if isinstance(i, int) and i >= 0 and i != tok.unk_token_id:
                    ids.add(i)
            if tok.eos_token_id is not None:
                ids.add(tok.eos_token_id)
        for model in (self.drafter, self.verifier):
            gen = getattr(model, "generation_config", None)
            eos = getattr(gen, "eos_token_id", None) if gen is not None else None
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return ids

    @property
    def ocr_engine(self):
        """The OCR engine, created on first use (``auto`` picks EasyOCR, else RapidOCR)."""
        if self._ocr_engine is None and self._ocr_spec is not None:
            from captioning.ocr import get_ocr_engine

            self._ocr_engine = get_ocr_engine(self._ocr_spec)
        return self._ocr_engine

    # ------------------------------------------------------------------ requests
    def compressed_view(self, image, caption: str | None = None, ocr: str | bool | None = None, timings: dict | None = None) -> CompressedView:
        """What the verifier will read about ``image`` (caption/OCR produced when ``None``)."""
        from captioning.captioner import compress
        from vision_cache.image import load_image

        image = load_image(image)
        with self._lock:
            return compress(
                image, captioner=self.captioner, ocr_engine=self.ocr_engine if ocr is None else None,
                caption=caption, ocr=ocr, timings=timings,
            )

    def generate(self, image, question: str, **kwargs) -> MMResult:
        """Answer ``question`` about ``image``: ``caption``, ``ocr``, ``method``, ``config`` as in :meth:`stream`;
        other keywords set config fields (e.g. ``k=2, bonus="gated"``)."""
        stream = self.stream(image, question, **kwargs)
        while True:
            try:
                next(stream)
            except StopIteration as stop:
                return stop.value

    def stream(
        self,
        image,
        question: str,
        caption: str | None = None,
        ocr: str | bool | None = None,
        method: str = "asymspec",
        config: AsymSpecConfig | None = None,
        **overrides,
    ) -> Iterator[list[TokenEvent]]:
        """Answer ``question`` about ``image``, yielding the events of each step as they are committed; the
        :class:`MMResult` is the generator's return value.

        ``caption``/``ocr``: ``None`` produce them, a string is used as is, ``ocr=False`` skips OCR.
        ``method``: asymspec | floor | drafter | sd. ``overrides`` set fields of ``config``.
        """
        from vision_cache.image import image_content_hash, load_image

        cfg = (config or AsymSpecConfig()).with_(**overrides).validated() if overrides else (config or AsymSpecConfig()).validated()
        if method not in METHODS:
            raise UnknownOptionError(f"method={method!r} is not valid; choose one of {', '.join(METHODS)}")
        if not isinstance(question, str) or not question.strip():
            raise EmptyQuestionError("the question is empty: ask something about the image, e.g. 'What is the largest value?'")
        t_start = time.perf_counter()
        img = load_image(image)
        with self._lock:
            timings: dict[str, float] = {}
            tower_before = self.encoder.tower_calls
            hits_before = self.encoder.store.stats()["hits"]
            from captioning.captioner import compress

            view = compress(
                img, captioner=self.captioner, ocr_engine=self.ocr_engine if ocr is None else None,
                caption=caption, ocr=ocr, image_hash=image_content_hash(img), timings=timings,
            )
            prompts = build_prompts(self.processor, self.verifier_tokenizer, img, view.render(), question.strip(), cfg.drafter_view)
            self._check_context(prompts, cfg, method)
            t_prefill = time.perf_counter()
            streams, steps = self._start(method, prompts, cfg, img)
            prefill_s = time.perf_counter() - t_prefill
            counters = Counters(cfg.k, streams)
            stop_fn = self._stop_fn(cfg.stop_strings) if cfg.stop_strings else None
            gen = self._loop(method, streams, steps, cfg, stop_fn, counters)
            trace: list[TokenEvent] = []
            for events in gen:
                for ev in events:
                    ev.text = self.tokenizer.decode([ev.token_id])
                trace.extend(events)
                yield events
            stats = counters.as_dict()
            stats.update(
                stopped_by=getattr(counters, "stopped_by", "max_new_tokens"),
                vision_calls=self.encoder.tower_calls - tower_before,
                vision_cache_hits=self.encoder.store.stats()["hits"] - hits_before,
                prefix_cache_hit=bool(getattr(streams.get("drafter_full"), "prefix_hit", False)),
                caption_s=timings.get("caption_s", 0.0),
                ocr_s=timings.get("ocr_s", 0.0),
                prefill_s=prefill_s,
                wall_s=time.perf_counter() - t_start,
                steered=sum(ev.steered for ev in trace),
                fused=sum(ev.source == "fused" for ev in trace),
            )
        token_ids = [ev.token_id for ev in trace]
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        for s in cfg.stop_strings:
            if s and s in text:
                text = text[: text.index(s)]
        return MMResult(text=text, token_ids=token_ids, trace=trace, stats=stats, prompts=prompts, view=view, method=method, config=cfg)

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
        checks += [("drafter (full view)", prompts.drafter_full_ids.shape[1], d_cfg, self.drafter_full),
                   ("drafter (compressed view)", prompts.drafter_comp_ids.shape[1], d_cfg, self.drafter_comp)]
        for name, length, conf, served in checks:
            limit = getattr(conf, "max_position_embeddings", None)
            served_len = getattr(served, "max_model_len", None)  # vLLM: one position goes to its sampled token
            if served_len:
                limit = min(limit or served_len, served_len - 1)
            if limit and length + need > limit:
                raise ContextOverflowError(
                    f"the {name} prompt has {length} tokens; with max_new_tokens={cfg.max_new_tokens} and K={cfg.k} it "
                    f"needs {length + need} positions but the model's context window is {limit}. Shorten the question "
                    "or the caption/OCR text, or lower max_new_tokens."
                )

    def _start(self, method: str, p: Prompts, cfg: AsymSpecConfig, image=None):
        """Prefill the streams the method needs (each caches ``prompt[:-1]``) and return them with their pending tokens."""
        streams: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        if method in ("asymspec", "drafter") and self.drafter_full is not None:
            # on vLLM: the prompt carries the image itself (vLLM runs its vision tower; its prefix cache keeps the KV)
            full = self.drafter_full.vision_engine("drafter_full")
            full.prefill(p.drafter_full_ids[0, :-1], [image])
            streams["drafter_full"], pending["drafter_full"] = full, p.drafter_full_ids[0, -1:].to(full.device)
        elif method in ("asymspec", "drafter"):
            features, _ = self.encoder.encode(p.pixel_values, p.image_grid_thw)
            full = VLEngine(self.drafter, name="drafter_full")
            full.prefill(p.drafter_full_ids[0, :-1], p.mm_token_type_ids[0, :-1], features,
                         prefix_store=self.prefix_store, prefix_key=features.key)
            streams["drafter_full"], pending["drafter_full"] = full, p.drafter_full_ids[0, -1:].to(full.device)
        if method in ("asymspec", "sd"):
            comp = self.drafter_comp.engine("drafter_comp") if self.drafter_comp is not None else VLEngine(self.drafter, name="drafter_comp")
            comp.prefill(p.drafter_comp_ids[0, :-1])
            streams["drafter_comp"], pending["drafter_comp"] = comp, p.drafter_comp_ids[0, -1:].to(comp.device)
        if method in ("asymspec", "sd", "floor"):
            ver = self._verifier_engine()
            ver.prefill(p.verifier_ids[0, :-1])
            streams["verifier"], pending["verifier"] = ver, p.verifier_ids[0, -1:].to(ver.device)
        return streams, pending

    def _verifier_engine(self, name: str = "verifier"):
        """A fresh verifier stream: on vLLM when the verifier is served there, else a TextEngine."""
        if hasattr(self.verifier, "engine"):
            return self.verifier.engine(name)
        return TextEngine(self.verifier, name=name)

    def _loop(self, method, streams, pending, cfg, stop_fn, counters):
        eos = self.eos_ids
        if method == "asymspec":
            return asymspec_steps(streams["drafter_full"], streams["drafter_comp"], streams["verifier"],
                                  (pending["drafter_full"], pending["drafter_comp"], pending["verifier"]),
                                  cfg, eos, stop_fn, counters)
        if method == "sd":
            return sd_steps(streams["drafter_comp"], streams["verifier"], (pending["drafter_comp"], pending["verifier"]),
                            cfg, eos, stop_fn, counters)
        if method == "floor":
            return greedy_steps(streams["verifier"], pending["verifier"], cfg, eos, stop_fn, counters, is_verifier=True)
        return greedy_steps(streams["drafter_full"], pending["drafter_full"], cfg, eos, stop_fn, counters, is_verifier=False)

    def _stop_fn(self, stop_strings: tuple[str, ...]):
        tok = self.tokenizer
        longest = max(len(s) for s in stop_strings)

        def stop(tokens: list[int]) -> bool:
            tail = tok.decode(tokens[-(longest + 8):], skip_special_tokens=True)
            return any(s in tail for s in stop_strings)

        return stop


_DEFAULT: AsymSpecPipeline | None = None
_DEFAULT_LOCK = threading.Lock()


def mm_generate(image, question: str, *, preset: str = "auto", **kwargs) -> MMResult:
    """Answer a question about an image with a lazily created default pipeline (``auto`` preset).

    kwargs go to :meth:`AsymSpecPipeline.generate` (caption, ocr, method, config, or config fields).
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = AsymSpecPipeline.from_preset(preset)
    return _DEFAULT.generate(image, question, **kwargs)
