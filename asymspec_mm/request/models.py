"""The loaded models of a pipeline and what serves each stream of a request: :class:`ModelSet`.

A request decodes up to three streams (``drafter_full``, ``drafter_comp``, ``verifier``; which ones its method
needs: :data:`~asymspec_mm.decode.rows.STREAMS_OF`). This module is the one place that says which model serves
each stream and which prompt it reads, so single-row set-up (:mod:`asymspec_mm.request.preparing`), batched prefill and
batched decoding (:mod:`asymspec_mm.core`) cannot disagree about it. It also owns what the models share across
requests: the loop their calls made outside any loop run in, the vision-feature cache and the KV kept for reuse (:class:`~asymspec_mm.engines.PrefixKV`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..base.errors import UnknownOptionError
from ..base.vocab_bridge import bridge_of
from ..decode.rows import STREAMS_OF
from ..engines import Engine, EngineFactory
from ..engines.loading import MIN_VOCAB_OVERLAP, check_vocabularies, cross_family_eos, eos_ids
from ..engines.model_calls import HomeLoop
from ..engines.prefix_kv import DEFAULT_PREFIX_KV_BYTES, PrefixKV
from ..engines.text_processor import image_refusal, reads_images
from ..engines.vllm import logit_width
from .prompts import Prompts


class ModelSet:
    """A drafter (Qwen3-VL) and a verifier (text LM), with the optional models that replace one of the drafter's
    streams, loaded once and shared by every request.

    ``drafter_comp`` / ``drafter_full``: a served model (a :class:`~asymspec_mm.engines.vllm.VLLMModel`) for the
    drafter's compressed / full-view stream (default: the drafter itself). ``sd_drafter``: the SD baseline's own
    text drafter (a causal LM sharing the verifier's vocabulary and reading the verifier's prompt; default: the VL
    drafter on the compressed view).

    ``check_vocab`` compares the two vocabularies: one vocabulary decodes as it always has; two (a cross-family pair)
    get the map between them (:attr:`vocab_map`, :attr:`vocab`; refused when they overlap less than
    ``min_vocab_overlap`` of either vocabulary), and the answers are then the verifier's ids (:attr:`tokenizer` is the
    verifier's). Without ``check_vocab`` the pair is taken as one vocabulary, unchecked. ``home_loop`` (a
    pipeline's: :attr:`home_loop`) runs the model calls made outside every loop's scope.
    """

    def __init__(
        self,
        drafter: Any,
        processor: Any,
        verifier: Any,
        verifier_tokenizer: Any,
        *,
        device: torch.device | None = None,
        vision_cache_bytes: int = 256 * 2**20,
        prefix_cache_bytes: int = DEFAULT_PREFIX_KV_BYTES,
        check_vocab: bool = True,
        drafter_comp: Any = None,
        drafter_full: Any = None,
        sd_drafter: Any = None,
        sd_drafter_tokenizer: Any = None,
        min_vocab_overlap: float = MIN_VOCAB_OVERLAP,
        home_loop: HomeLoop | None = None,
    ):
        from vision_cache.features import VisionEncoder

        self.drafter = drafter.eval()
        self.processor = processor
        self.verifier = verifier.eval()
        self.verifier_tokenizer = verifier_tokenizer
        self.drafter_comp = drafter_comp
        self.drafter_full = drafter_full
        self.sd_drafter = sd_drafter.eval() if sd_drafter is not None else None
        #: whether the drafter reads images (a vision-language model); a text drafter's full view is the whole text
        self.reads_images = reads_images(drafter)
        #: the tokenizer of the answers' ids: the drafter's (one vocabulary), the verifier's (a cross-family pair)
        self.tokenizer = processor.tokenizer
        self.device = device or next(drafter.parameters()).device
        #: a cross-family pair's map between the vocabularies (None: one vocabulary) and its tensors for the decoder
        self.vocab_map = None
        if check_vocab:
            widths = logit_width(drafter), logit_width(verifier)
            self.vocab_map = check_vocabularies(
                processor.tokenizer, verifier_tokenizer, *widths, cross_family=True, min_overlap=min_vocab_overlap
            )
            if sd_drafter is not None:
                sd_tok = sd_drafter_tokenizer or verifier_tokenizer
                check_vocabularies(sd_tok, verifier_tokenizer, logit_width(sd_drafter), logit_width(verifier), "SD drafter")
        #: the loop that runs a model call made outside every loop's scope (the pipeline's: its scheduler, else its
        #: direct loop; ``None``: no pipeline, the call runs on the calling thread). One loop runs a pipeline's models
        #: at a time (asymspec_mm.core.loop_client), so no lock orders them.
        self.home_loop: HomeLoop | None = home_loop
        self.encoder = VisionEncoder(drafter, cache_bytes=vision_cache_bytes, model_key=str(getattr(drafter, "name_or_path", "")))
        # every stream's prompts (and finished answers), reused by any later request that starts the same way: the
        # next turn of a conversation, another question about an image (0 disables)
        self.prefix_kv = PrefixKV(prefix_cache_bytes)
        # read by each set-up, so replacing it on a live pipeline (``pipe.eos_ids = ...``) takes effect at the next request
        self.eos_ids: set[int] = eos_ids((self.tokenizer, verifier_tokenizer), (self.drafter, self.verifier))
        self.vocab = bridge_of(self.vocab_map, *widths) if self.vocab_map is not None else None
        if self.vocab is not None:
            self._cross_family(verifier_tokenizer)
        self._grammars = None

    def _cross_family(self, verifier_tokenizer: Any) -> None:
        """A pair of two vocabularies decodes in the verifier's ids: its tokenizer decodes the answers, and the ids that
        end one are the verifier's and the drafter's that have a verifier id. Served models are refused (their streams
        draft and score on vLLM, which this map does not reach)."""
        served = [
            name for name, m in (("verifier", self.verifier), ("drafter", self.drafter_comp or self.drafter_full)) if hasattr(m, "engine")
        ]
        if served:
            raise UnknownOptionError(
                f"a cross-family pair (two vocabularies) decodes on the transformers backend only; the {served[0]} is served "
                "by vLLM: load it with the transformers backend, or pair models of one vocabulary"
            )
        self.tokenizer = verifier_tokenizer
        self.eos_ids = cross_family_eos(
            self.vocab_map, eos_ids([self.processor.tokenizer], [self.drafter]), eos_ids([verifier_tokenizer], [self.verifier])
        )

    @property
    def grammars(self) -> Any:
        """The :class:`~asymspec_mm.request.grammar.GrammarCompiler` of the pair's vocabulary (made on first use: only forced
        tool calls and JSON answers need it)."""
        if self._grammars is None:
            from .grammar import GrammarCompiler

            self._grammars = GrammarCompiler(self.verifier_tokenizer, logit_width(self.verifier), sorted(self.eos_ids))
        return self._grammars

    @property
    def sd_drafter_name(self) -> str:
        """Which model drafts for SD: the separate text drafter's name or path, else the VL drafter's view."""
        if self.sd_drafter is None:
            return "drafter (compressed view)"
        return str(getattr(self.sd_drafter, "name_or_path", "") or "custom text drafter")

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

    def check_images(self, count: int) -> None:
        """Refuse ``count`` > 0 images when the drafter reads text only (one line naming the fix: a VL drafter)."""
        if count and not self.reads_images:
            from ..base.errors import TextDrafterImageError

            raise TextDrafterImageError(image_refusal(str(getattr(self.drafter, "name_or_path", "") or "a text model")))

    def drafter_engine(self, engines: EngineFactory, name: str, **kwargs: Any) -> Engine:
        """A fresh stream of the transformers drafter from ``engines``: a VL stream (M-RoPE positions; ``kwargs`` such
        as ``encoder``) for a vision-language drafter, a text stream for a text one."""
        if self.reads_images:
            return engines.vision(self.drafter, name, prefix_kv=self.prefix_kv, **kwargs)
        return engines.text(self.drafter, name, prefix_kv=self.prefix_kv)

    def verifier_engine(self, engines: EngineFactory, name: str = "verifier") -> Engine:
        """A fresh verifier stream: on vLLM when the verifier is served there, else from ``engines``."""
        if hasattr(self.verifier, "engine"):
            return self.verifier.engine(name)
        return engines.text(self.verifier, name, prefix_kv=self.prefix_kv)
