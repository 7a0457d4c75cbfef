"""Gradient x input on the cached vision features: a one-forward, one-backward estimate of what occlusion measures.

Occlusion's score of a region is ``a[token](x) - a[token](x with the region's rows set to the baseline)``. Its
first-order Taylor estimate is ``sum over the region's rows and every feature layer of grad . (x - baseline)``, the
gradient of ``a[token]`` with respect to the features (the merged-patch embeddings and each deepstack layer) taken
once at the unmasked features. One forward and one backward of the full view replace a forward per region, so the
cost does not grow with the grid; how well the estimate ranks regions like occlusion does is measured by the
pointing game (docs/attribution.md).
"""

from __future__ import annotations

import torch

from vision_cache.features import VisionFeatures

from ..engines.pieces import PrefillChunk, vision_inputs
from .occlusion import FullViewInput, baseline_rows, prefix_cache


def token_gradient_scores(
    model, view: FullViewInput, features: VisionFeatures, token: int, baseline: str = "mean"
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(a, per_token)``: the drafter's unmasked next-token logits ``a`` ``[V]`` (float32) after ``view``, and per
    image ``[n_merged]``: each merged token's estimated drop of ``a[token]`` were it replaced by the ``baseline``
    row, ``sum_layers sum_hidden grad * (x - baseline)`` (float32, on the CPU)."""
    device = model.get_input_embeddings().weight.device
    fill = baseline_rows(features, baseline)
    with torch.no_grad():
        cache = prefix_cache(model, view, device)
    leaves = [[e.detach().clone().requires_grad_(True) for e in features.embeds]]
    leaves += [[x.detach().clone().requires_grad_(True) for x in layer] for layer in features.deepstack]
    tail_ids = view.ids[view.first_pad :].to(device)
    chunk = PrefillChunk(tail_ids, None, torch.cat(leaves[0]), tuple(torch.cat(layer) for layer in leaves[1:]))
    with torch.enable_grad():
        logits = model(
            input_ids=tail_ids[None],
            position_ids=view.positions[:, None, view.first_pad :].to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **vision_inputs([chunk]),
        ).logits[0, -1]
        flat = [x for layer in leaves for x in layer]
        grads = torch.autograd.grad(logits[token], flat, allow_unused=True)
    per_image = []
    n_images = len(features.embeds)
    for i in range(n_images):
        total = torch.zeros(features.embeds[i].shape[0], dtype=torch.float32)
        for d, layer in enumerate(leaves):
            g = grads[d * n_images + i]
            if g is None:  # a layer the logit does not read (the model skipped it)
                continue
            x = layer[i].detach()
            total += ((x - fill[i][d].to(x.dtype)) * g).float().sum(-1).cpu()
        per_image.append(total)
    return logits.detach().float().cpu(), per_image
