"""What a prompt's prefill is made of, on any engine: :class:`StreamPrompt` (one stream's prompt, how far it got),
its :class:`PrefillChunk` pieces, the :class:`RowContext` a row's KV travels in, and where a prefill starts when
an earlier request's KV is stored for reuse (:func:`start_context`, :func:`remember`; see :mod:`.prefix_kv`).

Single-row engines (:mod:`.single`) prefill a prompt as one piece; the batched, chunked prefill
(:mod:`asymspec_mm.core.prefill`) as several pieces of several prompts per forward. Both start from the same
stored prefix and store the same context afterwards, so a request reuses the same KV whichever path it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vision_cache.features import VisionFeatures
from vision_cache.positions import mrope_positions

from .prefix_kv import PrefixKV, cache_layers, new_cache, reuse_key


@dataclass(frozen=True)
class PrefillChunk:
    """A piece of one row's prompt for :meth:`~.rows.BatchEngine.prefill` (or a single-row engine's prefill).

    ids: ``[n]``; positions: ``[3, n]`` M-RoPE positions (a piece of a prompt with an image), ``None``: the row's
    length + i + rope delta, as :meth:`~.rows.BatchEngine.extend`; image_embeds ``[m, hidden]`` and deepstack (one
    ``[m, hidden]`` per deepstack layer): the vision embeddings of the ``m`` image pads among ``ids``, in order.
    """

    ids: torch.Tensor
    positions: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    deepstack: tuple[torch.Tensor, ...] = ()


@dataclass
class RowContext:
    """One row's KV outside any batch: ``cache`` (a ``DynamicCache`` of ``[1, H, length, D]`` per layer, ``None`` when
    empty), its rope delta and counters. What :meth:`~.rows.BatchEngine.join` (and any row storage) takes from a
    single-row engine."""

    cache: Any
    length: int
    rope_delta: int = 0
    tokens_forwarded: int = 0
    forward_calls: int = 0

    def release(self) -> None:
        self.cache = None


def vision_inputs(chunks: list[PrefillChunk]) -> dict[str, Any]:
    """``mm_encoder_outputs`` for the image pads of ``chunks`` (in batch order: the model fills the pads of the
    flattened batch in order); empty when no chunk has any."""
    with_images = [c for c in chunks if c.image_embeds is not None and c.image_embeds.shape[0]]
    if not with_images:
        return {}
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    out = BaseModelOutputWithDeepstackFeatures(pooler_output=(torch.cat([c.image_embeds for c in with_images]),))
    out.deepstack_features = [(torch.cat(layer),) for layer in zip(*(c.deepstack for c in with_images))]
    return {"mm_encoder_outputs": {"image": out}}


def prefix_split(mm_token_type_ids: torch.Tensor, length: int) -> int:
    """How many tokens of a full-view prompt of ``length`` run through its last image and that image's
    ``<|vision_end|>`` (0 without an image): a request that reuses at least this much skipped every image.
    ``mm_token_type_ids``: ``[>= length]``, 1 at image pads."""
    image_at = (mm_token_type_ids.reshape(-1)[:length] == 1).nonzero()
    return min(length, int(image_at[-1]) + 2) if image_at.numel() else 0


@dataclass
class StreamPrompt:
    """One stream's prompt to prefill, and how far it got.

    ids: ``[L]``; positions: ``[3, L]`` (the full view's M-RoPE positions; ``None`` on a text stream); image_embeds
    ``[P, hidden]`` / deepstack (``[P, hidden]`` per layer): the embeddings of the prompt's ``P`` image pads, in order;
    pads_before: ``[L + 1]``, image pads among ``ids[:i]``; key: the reuse key ``[L]`` (``None``: no reuse);
    image_end: :func:`prefix_split` of the prompt. ``done``: tokens prefilled so far (or reused), ``cached``: reused.
    """

    ids: torch.Tensor
    positions: torch.Tensor | None = None
    rope_delta: int = 0
    image_embeds: torch.Tensor | None = None
    deepstack: tuple[torch.Tensor, ...] = ()
    pads_before: torch.Tensor | None = None
    key: torch.Tensor | None = None
    image_end: int = 0
    done: int = 0
    cached: int = 0

    @property
    def left(self) -> int:
        return int(self.ids.numel()) - self.done

    @property
    def images_reused(self) -> bool:
        """Whether the reused prefix covers every image of the prompt (the prompt has one)."""
        return 0 < self.image_end <= self.cached

    def piece(self, n: int) -> PrefillChunk:
        """The next ``n`` tokens as a :class:`PrefillChunk` (with their positions and image embeddings)."""
        a, b = self.done, self.done + n
        if self.positions is None:
            return PrefillChunk(self.ids[a:b])
        p, q = int(self.pads_before[a]), int(self.pads_before[b])
        deep = tuple(layer[p:q] for layer in self.deepstack)
        return PrefillChunk(self.ids[a:b], self.positions[:, a:b], self.image_embeds[p:q], deep)


def resumed_prompt(prompt: StreamPrompt, tail: torch.Tensor) -> StreamPrompt:
    """``prompt`` followed by ``tail`` ``[n]``, the tokens a stream had cached after it (a preempted row's context,
    prefilled anew): text positions continue the prompt's (length + i + rope delta on every axis, as a decode
    forward gives them), the reuse key grows by the tokens themselves, and nothing is prefilled yet."""
    tail = tail.reshape(-1).to(prompt.ids.device, torch.long)
    n, length = int(tail.numel()), int(prompt.ids.numel())
    ids = torch.cat([prompt.ids, tail])
    key = None if prompt.key is None else torch.cat([prompt.key, tail.to(prompt.key.device)])
    if prompt.positions is None:
        return StreamPrompt(ids, key=key)
    extra = (length + prompt.rope_delta + torch.arange(n)).to(prompt.positions).unsqueeze(0).expand(3, n)
    pads = torch.cat([prompt.pads_before, prompt.pads_before[-1:].expand(n)])
    positions = torch.cat([prompt.positions, extra], dim=1)
    return StreamPrompt(ids, positions, prompt.rope_delta, prompt.image_embeds, prompt.deepstack, pads, key, prompt.image_end)


def text_prompt(ids: torch.Tensor, *, reuse: bool = True) -> StreamPrompt:
    """A text stream's prompt: ``ids`` ``[L]`` (its reuse key is the ids themselves)."""
    ids = ids.reshape(-1)
    return StreamPrompt(ids, key=reuse_key(ids) if reuse else None)


def image_prompt(
    ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    features: VisionFeatures,
    merge: int,
    *,
    image_keys: list[str] | tuple[str, ...] = (),
    reuse: bool = True,
) -> StreamPrompt:
    """The full view's prompt ``ids`` ``[L]`` about ``features`` (``mm_token_type_ids`` ``[>= L]``, 1 at image pads;
    ``merge``: the vision config's spatial merge size). ``image_keys``: each image's content key, in order (what
    its pads are in the reuse key; without them the prompt is not reused)."""
    ids = ids.reshape(-1)
    types = mm_token_type_ids.reshape(-1)[: ids.numel()]
    positions, delta = mrope_positions(types, features.image_grid_thw, merge)
    pads_before = torch.cat([torch.zeros(1, dtype=torch.long), (types == 1).long().cumsum(0)])
    n_images = int(features.image_grid_thw.shape[0])
    key = reuse_key(ids, types, image_keys) if reuse and len(image_keys) >= n_images else None
    return StreamPrompt(
        ids,
        positions,
        delta,
        torch.cat(features.embeds),
        tuple(torch.cat(layer) for layer in features.deepstack),
        pads_before,
        key,
        prefix_split(types, ids.numel()),
    )


def start_context(prefix_kv: PrefixKV | None, model: Any, prompt: StreamPrompt) -> RowContext:
    """Where ``prompt``'s prefill on ``model`` starts: the stored KV of its longest stored prefix (``prompt.done``
    and ``prompt.cached`` say how much), else an empty context."""
    if prefix_kv is None or prompt.key is None:
        return RowContext(None, 0, prompt.rope_delta)
    hit = prefix_kv.match(prefix_kv.space(model), prompt.key)
    if not hit.length:
        return RowContext(None, 0, prompt.rope_delta)
    prompt.done = prompt.cached = hit.length
    return RowContext(new_cache(model.config, hit.layers), hit.length, prompt.rope_delta)


def remember(prefix_kv: PrefixKV | None, model: Any, key: torch.Tensor | None, cache: Any, length: int) -> int:
    """Store the first ``length`` positions of a single-row ``cache`` on ``model`` under ``key[:length]`` for later
    requests (nothing without a cache or a key); returns the tokens newly stored."""
    if prefix_kv is None or key is None or cache is None or length <= 0:
        return 0
    return prefix_kv.insert(prefix_kv.space(model), key[:length], cache_layers(cache))
