"""Occlusion on the drafter's full view: the next-token logits ``a`` at one position of an answer with image regions
replaced by a baseline in the cached vision features, many masks per forward.

The vision features (the tower's output, merged patches and deepstack layers alike) are computed once per image;
a mask replaces the rows of its region's merged tokens by the baseline in every one of them. The prompt text before
the first image is the same under every mask, so its KV is computed once and repeated over the batch; each row then
reads the rest of the prompt and the committed answer tokens with its masked features.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vision_cache.features import VisionFeatures
from vision_cache.positions import mrope_positions

from ..engines.pieces import PrefillChunk, vision_inputs

#: How a masked region's features are replaced: ``mean``, the mean feature of its image (a region that looks like
#: "nothing in particular" of this image), or ``zero`` (the features' origin, far from anything the tower emits).
BASELINES = ("mean", "zero")


@dataclass(frozen=True)
class Mask:
    """One occlusion: the merged-token indices ``tokens`` of image ``image_index`` (empty: nothing masked)."""

    image_index: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class FullViewInput:
    """The drafter's full view up to one position: ``ids`` ``[L]``, ``positions`` ``[3, L]`` (M-RoPE) and the
    index of the first image pad ``first_pad`` (the text before it is the same under every mask)."""

    ids: torch.Tensor
    positions: torch.Tensor
    first_pad: int


def full_view_input(
    prompt_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, answer_ids: Sequence[int], image_grid_thw: torch.Tensor, merge: int
) -> FullViewInput:
    """The full view's prompt ``prompt_ids`` ``[L0]`` (``mm_token_type_ids`` ``[L0]``, 1 at image pads) followed by the
    committed ``answer_ids`` (text, so their positions continue the prompt's as a decode forward gives them)."""
    tail = torch.as_tensor(list(answer_ids), dtype=torch.long)
    ids = torch.cat([prompt_ids.reshape(-1).long(), tail])
    types = torch.cat([mm_token_type_ids.reshape(-1)[: prompt_ids.numel()].long(), torch.zeros_like(tail)])
    positions, _ = mrope_positions(types, image_grid_thw, merge)
    pads = (types == 1).nonzero()
    if not pads.numel():
        raise ValueError("the full view's prompt has no image pads")
    return FullViewInput(ids, positions, int(pads[0]))


def baseline_rows(features: VisionFeatures, baseline: str) -> list[tuple[torch.Tensor, ...]]:
    """Per image, the row that replaces a masked token: ``(embeds row, deepstack rows...)``, each ``[hidden]``."""
    if baseline not in BASELINES:
        raise ValueError(f"unknown masking baseline {baseline!r}; choose one of {BASELINES}")
    out = []
    for i, embeds in enumerate(features.embeds):
        layers = (embeds, *(layer[i] for layer in features.deepstack))
        out.append(tuple(x.mean(0) if baseline == "mean" else torch.zeros_like(x[0]) for x in layers))
    return out


def masked_features(features: VisionFeatures, mask: Mask, fill: list[tuple[torch.Tensor, ...]]) -> VisionFeatures:
    """``features`` with the rows of ``mask`` replaced by image ``mask.image_index``'s ``fill`` rows (a copy; the
    cached features are never written)."""
    idx = torch.as_tensor(mask.tokens, dtype=torch.long)

    def hide(x: torch.Tensor, image: int, row: torch.Tensor) -> torch.Tensor:
        if image != mask.image_index or not idx.numel():
            return x
        x = x.clone()
        x[idx.to(x.device)] = row.to(x.dtype)
        return x

    rows = fill[mask.image_index] if fill else ()
    embeds = tuple(hide(e, i, rows[0] if rows else e[0]) for i, e in enumerate(features.embeds))
    deep = tuple(
        tuple(hide(x, i, rows[1 + d] if rows else x[0]) for i, x in enumerate(layer)) for d, layer in enumerate(features.deepstack)
    )
    return VisionFeatures(embeds, deep, features.image_grid_thw, features.key)


def prefix_cache(model, view: FullViewInput, device: torch.device) -> object:
    """A fresh ``DynamicCache`` holding the KV of ``view``'s text before its first image (empty when there is none):
    the part of the full view that no mask changes."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if view.first_pad:
        model(
            input_ids=view.ids[None, : view.first_pad].to(device),
            position_ids=view.positions[:, None, : view.first_pad].to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return cache


@torch.no_grad()
def occluded_logits(
    model,
    view: FullViewInput,
    features: VisionFeatures,
    masks: Sequence[Mask],
    baseline: str = "mean",
    batch: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The drafter's next-token logits ``[len(masks), V]`` (float32) after ``view`` with each mask applied, ``batch``
    masks per forward. The text before the first image is forwarded once and its KV repeated over each batch.
    ``progress(done, total)`` is called before the first forward and after each batch with the masks done so far;
    an exception it raises stops the work there (how a caller cancels)."""
    from transformers import DynamicCache

    device = model.get_input_embeddings().weight.device
    fill = baseline_rows(features, baseline)
    prefix = prefix_cache(model, view, device) if view.first_pad else None
    tail_ids = view.ids[view.first_pad :].to(device)
    tail_pos = view.positions[:, view.first_pad :].to(device)
    out = []
    if progress is not None:
        progress(0, len(masks))
    for start in range(0, len(masks), batch):
        group = masks[start : start + batch]
        rows = []
        for mask in group:
            f = masked_features(features, mask, fill)
            rows.append(PrefillChunk(tail_ids, None, torch.cat(f.embeds), tuple(torch.cat(layer) for layer in f.deepstack)))
        cache = None
        if prefix is not None:
            cache = copy.deepcopy(prefix)
            cache.batch_repeat_interleave(len(group))
        else:
            cache = DynamicCache(config=model.config)
        logits = model(
            input_ids=tail_ids.expand(len(group), -1),
            position_ids=tail_pos.unsqueeze(1).expand(3, len(group), -1),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **vision_inputs(rows),
        ).logits
        out.append(logits[:, -1].float().cpu())
        if progress is not None:
            progress(start + len(group), len(masks))
    return torch.cat(out)
