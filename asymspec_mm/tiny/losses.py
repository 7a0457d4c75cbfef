"""The tiny pair's training losses: weighted answer-token cross-entropy, the drafter's flat target at
``mixed``'s computed numbers, the colour words at the image positions (read at every layer through
:class:`LayerTap`), and the vision-token probe."""

from __future__ import annotations

import math
from typing import Any

import torch

from .data import N_ATTR_CLASSES, N_COLOR_CLASSES, N_SIDE_CLASSES, PAD_LABEL


class LayerTap:
    """Forward hooks that keep the outputs of the drafter's text decoder layers during one forward."""

    def __init__(self, model):
        lm = model.model.language_model
        self.model, self.out = model, []
        self.handles = [layer.register_forward_hook(self._keep) for layer in lm.layers[:-1]]  # the last one is the logits

    def _keep(self, module, args, output) -> None:
        self.out.append(output[0] if isinstance(output, tuple) else output)

    def clear(self) -> None:
        """Drop the kept outputs (before a forward whose layers the next loss reads)."""
        self.out = []


def image_position_loss(logits: torch.Tensor, batch: dict[str, Any], tap: LayerTap | None = None) -> torch.Tensor:
    """Cross-entropy of the drafter's own LM head at the image-token positions (logits ``[B, L, V]``,
    ``batch["img_labels"]`` ``[B, L]``, -100 elsewhere) against the colour word each token shows, on the
    final logits and (``tap``) on every earlier layer's output read through the final norm and the LM
    head. Those positions' logits are otherwise unused; the loss makes the text
    model carry the colour at the image positions, from the first layers on, in the form the answer
    needs (the word's embedding), which the answer position then only has to copy by attention.
    Without it the text model never read colour (it read bar heights, shapes and positions)."""
    labels = batch.get("img_labels")
    if labels is None or not bool((labels != PAD_LABEL).any()):
        return logits.sum() * 0.0
    mask = labels != PAD_LABEL
    target = labels[mask]
    losses = [torch.nn.functional.cross_entropy(logits[mask].float(), target)]
    if tap is not None:
        lm = tap.model.model.language_model
        for h in tap.out:
            losses.append(torch.nn.functional.cross_entropy(tap.model.lm_head(lm.norm(h[mask])).float(), target))
        tap.clear()
    return torch.stack(losses).mean()


def probe_loss(probe: torch.nn.Linear, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a linear probe on merged vision tokens ``feats`` ``[N, hidden]`` against
    ``targets`` ``[N, 3]`` (colour class, attribute class, side class; -100 ignored), summed over the three.
    A throwaway head: it trains the tower to put colour, bar value / shape kind and the side of the scene
    into the very token the text model attends to."""
    logits = probe(feats)  # [N, N_PROBE_CLASSES]
    loss = logits.sum() * 0.0
    start = 0
    for k, n in enumerate((N_COLOR_CLASSES, N_ATTR_CLASSES, N_SIDE_CLASSES)):
        if bool((targets[:, k] != PAD_LABEL).any()):
            loss = loss + torch.nn.functional.cross_entropy(logits[:, start : start + n], targets[:, k], ignore_index=PAD_LABEL)
        start += n
    return loss


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over answer tokens (logits ``[B, L, V]``, labels ``[B, L]``, -100 off the answer;
    the prediction for position p is read at p - 1); ``weights`` ([B, L], aligned with labels) reweights tokens."""
    if weights is None:
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=PAD_LABEL
        )
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=PAD_LABEL, reduction="none"
    )
    w = weights[:, 1:].reshape(-1) * (labels[:, 1:].reshape(-1) != PAD_LABEL)
    return (ce * w).sum() / w.sum()


def flat_loss(logits: torch.Tensor, flat: tuple[list[int], list[int], list[list[int]]]) -> torch.Tensor:
    """Mean KL(uniform over the candidates || model) at the label positions ``flat`` = (rows, positions,
    candidate ids) of a batch (logits ``[B, L, V]``; the prediction for position p is read at p - 1);
    0 where the model puts all its mass evenly on the candidates. A zero tensor when there are none."""
    rows, pos, cand = flat
    if not rows:
        return logits.new_zeros((), dtype=torch.float32)
    logp = torch.log_softmax(logits[rows, [q - 1 for q in pos]].float(), dim=-1)  # [N, V]
    return torch.stack([-logp[n, c].mean() - math.log(len(c)) for n, c in enumerate(cand)]).mean()
