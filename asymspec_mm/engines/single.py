"""One KV-cached model stream each: the only thing the decoding loop talks to.

An engine owns one cache over one context. ``prefill`` consumes a prompt, ``extend`` appends
tokens and returns their next-token logits, ``truncate`` rolls the cache back after a rejection
(cache cropping, never a re-prefill), ``length`` is the number of cached tokens. The loop sees only
logits, so a backend (transformers here, vLLM elsewhere) is an implementation detail.

Two engines may share one model: the drafter serves both the full view (:class:`VLEngine` with an
image) and the compressed view (:class:`VLEngine` without one), each with its own cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vision_cache.features import VisionFeatures
from vision_cache.positions import extension_positions

from .pieces import PrefillChunk, StreamPrompt, image_prompt, remember, start_context, text_prompt, vision_inputs


class Engine(Protocol):
    """The stream interface of the decoding loop."""

    name: str
    tokens_forwarded: int
    forward_calls: int

    @property
    def length(self) -> int: ...

    def prefill(self, ids: torch.Tensor) -> None:
        """Cache ``ids`` ``[L]`` (image-capable engines: ``prefill(ids, images: PromptImages | None = None)``)."""

    def extend(self, ids: torch.Tensor) -> torch.Tensor: ...

    def truncate(self, length: int) -> None: ...


@dataclass(frozen=True)
class PromptImages:
    """The images of a prompt in the forms both backends take: PIL images (vLLM runs its own vision tower on
    them) and the processor's tensors (the transformers engine encodes those, through the feature cache).

    mm_token_type_ids: ``[L]`` over the whole prompt, 1 at image pads; pixel_values / image_grid_thw as the
    Qwen3-VL processor returns them; image_keys: each image's content key, in order (what KV reuse knows it by);
    features: their vision features when the caller encoded them already (a prefill, one model call of a loop, then runs
    no tower and waits on no cache slot).
    """

    images: list[Any]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    mm_token_type_ids: torch.Tensor | None = None
    image_keys: tuple[str, ...] = ()
    features: VisionFeatures | None = None


class EngineFactory(Protocol):
    """How a pipeline builds its streams: a text stream and an image-capable stream of a model (``prefix_kv``: a
    :class:`~.prefix_kv.PrefixKV` the stream's prefill starts from and stores its prompt in)."""

    def text(self, model, name: str, *, prefix_kv=None) -> Engine: ...

    def vision(self, model, name: str, *, encoder=None, prefix_kv=None) -> Engine: ...


class TransformersEngines:
    """The default factory: :class:`TextEngine` and :class:`VLEngine` on growing DynamicCaches."""

    def text(self, model, name: str, *, prefix_kv=None) -> TextEngine:
        return TextEngine(model, name, prefix_kv=prefix_kv)

    def vision(self, model, name: str, *, encoder=None, prefix_kv=None) -> VLEngine:
        return VLEngine(model, name, encoder=encoder, prefix_kv=prefix_kv)


@dataclass(frozen=True)
class StaticEngines:
    """Static KV caches (and optionally a compiled one-token decode): the opt-in GPU fast path."""

    headroom: int = 1024
    compile_decode: bool = False
    compile_mode: str = "reduce-overhead"

    def text(self, model, name: str, *, prefix_kv=None) -> StaticTextEngine:
        return StaticTextEngine(model, name, self.headroom, self.compile_decode, self.compile_mode, prefix_kv=prefix_kv)

    def vision(self, model, name: str, *, encoder=None, prefix_kv=None) -> StaticVLEngine:
        return StaticVLEngine(model, name, self.headroom, self.compile_decode, self.compile_mode, encoder=encoder, prefix_kv=prefix_kv)


def _new_cache(config):
    from transformers import DynamicCache

    return DynamicCache(config=config)


def model_device(model) -> torch.device:
    """Device of the input embeddings (where input ids must go, also under a device_map)."""
    return model.get_input_embeddings().weight.device


class TextEngine:
    """A causal LM over text (Qwen3 and any ``AutoModelForCausalLM``) with a DynamicCache.

    With ``prefix_kv`` (a :class:`~.prefix_kv.PrefixKV`) a prefill starts from the longest stored prefix of its
    prompt and stores the prompt afterwards; ``cached_tokens`` says how many tokens the last prefill reused.
    """

    def __init__(self, model, name: str = "verifier", *, prefix_kv=None):
        self.model = model
        self.name = name
        self.device = model_device(model)
        self.cache = None
        self.prefix_kv = prefix_kv
        self.cached_tokens = 0
        self.tokens_forwarded = 0
        self.forward_calls = 0

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def _positions(self, n: int) -> torch.Tensor:
        """Position ids of the next ``n`` tokens: ``[1, n]`` (1D RoPE)."""
        return torch.arange(self.length, self.length + n, device=self.device).unsqueeze(0)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        n = ids.shape[-1]
        position_ids = self._positions(n)
        out = self.model(
            input_ids=ids.view(1, -1).to(self.device),
            position_ids=position_ids,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        self.tokens_forwarded += n
        self.forward_calls += 1
        return out.logits[0]

    def prefill(self, ids: torch.Tensor) -> None:
        """Cache ``ids`` (``[1, L]`` or ``[L]``); no logits are kept (the loop forwards the last token later)."""
        self.prefill_prompt(text_prompt(ids, reuse=self.prefix_kv is not None))

    def prefill_prompt(self, prompt: StreamPrompt) -> None:
        """Cache ``prompt`` as one piece after its longest stored prefix, then store it for later requests."""
        start = start_context(self.prefix_kv, self.model, prompt)
        self.cache = start.cache if start.cache is not None else _new_cache(self.model.config)
        self.cached_tokens = prompt.cached
        if prompt.left:
            self._forward_piece(prompt.piece(prompt.left))
        remember(self.prefix_kv, self.model, prompt.key, self.cache, prompt.done + prompt.left)

    def _forward_piece(self, chunk: PrefillChunk) -> None:
        self._forward(chunk.ids, keep=1)

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """Append ``ids`` ``[n]`` and return their next-token logits ``[n, V]``."""
        return self._forward(ids, keep=0)

    def adopt_cache(self, cache) -> None:
        """Take ``cache`` (a filled ``DynamicCache``) as this stream's context, as if a prompt of its length had been
        prefilled at positions 0..n-1 (decode-cost measurements use random keys/values of a chosen length)."""
        self.cache = cache
        if hasattr(self, "rope_delta"):
            self.rope_delta = 0

    def release(self) -> None:
        """Drop the cache (its tokens now live elsewhere, e.g. in a batch); the engine is empty afterwards."""
        self.cache = None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached tokens."""
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5: a negative count removes that many tokens


class VLEngine(TextEngine):
    """A Qwen3-VL model stream with explicit 3D M-RoPE positions.

    With ``features`` the prompt's image pads are replaced by cached vision embeddings (the tower
    is not called); without, it is a text-only stream of the same model (rope delta 0).
    """

    def __init__(self, model, name: str = "drafter_full", *, encoder=None, prefix_kv=None):
        super().__init__(model, name, prefix_kv=prefix_kv)
        self.rope_delta = 0
        self.merge = model.config.vision_config.spatial_merge_size
        self.encoder = encoder  # a vision_cache.features.VisionEncoder: the tower runs once per distinct image
        self.prefix_hit = False

    def prefill(self, ids: torch.Tensor, images: PromptImages | None = None) -> None:
        """Cache ``ids`` ``[L]``; with ``images`` the pads take the images' vision embeddings (encoded once per
        distinct set of images by the engine's encoder)."""
        if images is None:
            return self.prefill_features(ids)
        if self.encoder is None:
            raise ValueError(f"{self.name}: an image prompt needs an engine built with encoder=")
        features = images.features
        if features is None:
            features, _ = self.encoder.encode(images.pixel_values, images.image_grid_thw)
        self.prefill_features(ids, images.mm_token_type_ids, features, images.image_keys)

    def prefill_features(
        self,
        ids: torch.Tensor,
        mm_token_type_ids: torch.Tensor | None = None,
        features: VisionFeatures | None = None,
        image_keys: tuple[str, ...] | list[str] = (),
    ) -> None:
        """Cache ``ids`` ``[L]``; with ``features``, the image pads (1s of ``mm_token_type_ids`` ``[>= L]``) take the
        cached vision embeddings. With the engine's ``prefix_kv`` and each image's content key (``image_keys``), the
        longest stored prefix of the prompt is reused (``prefix_hit``: it covered every image)."""
        reuse = self.prefix_kv is not None
        if features is None:
            prompt = text_prompt(ids, reuse=reuse)
        else:
            prompt = image_prompt(ids, mm_token_type_ids, features, self.merge, image_keys=image_keys, reuse=reuse)
        self.rope_delta = prompt.rope_delta
        self.prefill_prompt(prompt)
        self.prefix_hit = prompt.images_reused

    @torch.no_grad()
    def _forward_piece(self, chunk: PrefillChunk) -> None:
        if chunk.positions is None:
            return self._forward(chunk.ids, keep=1)
        self.model(
            input_ids=chunk.ids.view(1, -1).to(self.device),
            position_ids=chunk.positions.unsqueeze(1).to(self.device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
            **vision_inputs([chunk]),
        )
        self.tokens_forwarded += chunk.ids.numel()
        self.forward_calls += 1

    def _positions(self, n: int) -> torch.Tensor:
        """``[3, 1, n]``: every token after the prompt is text, at index + rope delta on all three axes."""
        return extension_positions(self.length, n, self.rope_delta, self.device).unsqueeze(1)


# ---------------------------------------------------------------------------------------------
# Opt-in fast path for GPUs (gpt-fast style): static KV caches and a compiled one-token decode.
# UNTESTED ON GPU: written and checked on CPU only (static caches: token-for-token against the
# dynamic engines on the tiny pair; compile: falls back to eager when it cannot compile).
# ---------------------------------------------------------------------------------------------


class _StaticCacheMixin:
    """A preallocated ``StaticCache`` instead of a growing ``DynamicCache``, lengths tracked on the host.

    Prefill runs as usual into a DynamicCache (including the VL prefix store) and is then copied once
    into a StaticCache of ``prompt + headroom`` positions; decode-phase forwards write in place, and a
    rejection rolls back by moving the write position (``crop`` on a static layer touches no data). With
    ``compile_decode`` the one- and two-token forwards (the drafter's drafting steps) run through
    ``torch.compile(mode=compile_mode)``; on CUDA ``reduce-overhead`` captures it in a CUDA graph. Any
    compile failure falls back to eager once, with a warning.
    """

    headroom: int
    compile_decode: bool
    compile_mode: str
    _static_len: int
    _static_max: int
    _decode_fn: object

    def __init__(
        self,
        model,
        name: str | None = None,
        headroom: int = 1024,
        compile_decode: bool = False,
        compile_mode: str = "reduce-overhead",
        **engine_kwargs: Any,
    ):
        """``engine_kwargs``: the dynamic engine's (``prefix_kv``, and ``encoder`` for the VL engine)."""
        super().__init__(model, *(() if name is None else (name,)), **engine_kwargs)  # type: ignore[call-arg]
        self._init_static(headroom, compile_decode, compile_mode)

    def _init_static(self, headroom: int, compile_decode: bool, compile_mode: str) -> None:
        self.headroom = headroom
        self.compile_decode = compile_decode
        self.compile_mode = compile_mode
        self._static_len = 0
        self._decode_fn = None

    def _is_static(self) -> bool:
        from transformers import StaticCache

        return isinstance(self.cache, StaticCache)

    @property
    def length(self) -> int:
        if self._is_static():
            return self._static_len
        return 0 if self.cache is None else self.cache.get_seq_length()

    def adopt_cache(self, cache) -> None:
        super().adopt_cache(cache)  # type: ignore[misc]
        self._to_static()

    def _to_static(self) -> None:
        from transformers import StaticCache

        dyn = self.cache
        n = dyn.get_seq_length()
        self._static_max = n + self.headroom
        static = StaticCache(config=self.model.config, max_cache_len=self._static_max)
        for i, layer in enumerate(dyn.layers):
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.numel():
                static.update(layer.keys, layer.values, i)
        self.cache = static
        self._static_len = n

    def _decode_model(self, n: int):
        # one token per drafting forward, two when a step's d_K rides along (decode.py); each shape compiles once
        if n > 2 or not self.compile_decode:
            return self.model
        if self._decode_fn is None:
            self._decode_fn = torch.compile(self.model, mode=self.compile_mode, dynamic=False)
        return self._decode_fn

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        if not self._is_static():  # prefill: the usual dynamic path
            return super()._forward(ids, keep)  # type: ignore[misc]
        n = ids.shape[-1]
        if self._static_len + n > self._static_max:
            raise RuntimeError(f"{self.name}: static cache full ({self._static_len} + {n} > {self._static_max}); raise headroom")
        kwargs = dict(
            input_ids=ids.view(1, -1).to(self.device),
            position_ids=self._positions(n),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        model = self._decode_model(n)
        try:
            out = model(**kwargs)
        except Exception as exc:  # noqa: BLE001 - compile problems must not break decoding
            if model is self.model:
                raise
            import warnings

            warnings.warn(f"{self.name}: compiled decode failed ({type(exc).__name__}: {exc}); using eager", stacklevel=2)
            self.compile_decode = False
            self._decode_fn = None
            out = self.model(**kwargs)
        self._static_len += n
        self.tokens_forwarded += n
        self.forward_calls += 1
        return out.logits[0]

    def truncate(self, length: int) -> None:
        if not self._is_static():
            return super().truncate(length)  # type: ignore[misc]
        drop = self._static_len - length
        if drop > 0:
            self.cache.crop(-drop)  # static layers: moves the write position back, no data touched
            self._static_len = length


class StaticTextEngine(_StaticCacheMixin, TextEngine):
    """:class:`TextEngine` on a static KV cache (opt-in GPU fast path; untested on GPU)."""

    def prefill(self, ids: torch.Tensor) -> None:
        super().prefill(ids)
        self._to_static()


class StaticVLEngine(_StaticCacheMixin, VLEngine):
    """:class:`VLEngine` on a static KV cache (opt-in GPU fast path; untested on GPU)."""

    def prefill_features(self, ids: torch.Tensor, *args, **kwargs) -> None:
        super().prefill_features(ids, *args, **kwargs)
        self._to_static()
