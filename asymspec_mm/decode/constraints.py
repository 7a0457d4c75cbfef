"""Constrained rows in the decoder: what a row's output constraint must do, and how its masks meet the logits.

A row may carry a :class:`Constraint` (a grammar: :class:`asymspec_mm.request.grammar.GrammarConstraint`). The decoder asks
it for the allowed tokens at every position it computes logits for, in order along the step's tentative path
(each draft is pushed as it is made), and settles it once the step's tokens are committed. A forbidden token's
logit becomes :data:`FORBIDDEN`, the same finite value in every stream, so the drafter's contrast ``a - b`` is 0
there, softmaxes and the JSD stay finite, and no argmax (draft, fused or bonus token) can pick it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..base.vocab_bridge import FORBIDDEN as VOCAB_FORBIDDEN

#: The logit of a token the constraint forbids: far below any real logit, finite so that differences are 0 (the same
#: value a cross-family row gives the tokens outside the map, :mod:`asymspec_mm.base.vocab_bridge`).
FORBIDDEN = VOCAB_FORBIDDEN


class Constraint(Protocol):
    """A row's output constraint: ``mask()`` the allowed tokens ``[V]`` bool at the current tentative state,
    ``push(token)`` a draft, ``settle(committed)`` the step (drafts taken back, the committed tokens accepted)."""

    def mask(self) -> torch.Tensor: ...

    def push(self, token: int) -> None: ...

    def settle(self, committed: Sequence[int]) -> None: ...


def apply_masks(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[..., V]`` with the tokens ``allowed`` ``[..., V']`` (bool, ``V' <= V``; the logits may be wider
    than the tokenizer) does not allow set to :data:`FORBIDDEN`."""
    width = logits.shape[-1]
    if allowed.shape[-1] < width:
        pad = torch.zeros(*allowed.shape[:-1], width - allowed.shape[-1], dtype=torch.bool)
        allowed = torch.cat([allowed, pad], dim=-1)
    return logits.masked_fill(~allowed.to(logits.device), FORBIDDEN)


def step_masks(masks: dict[int, list[torch.Tensor]], n_rows: int, positions: int, width: int) -> torch.Tensor:
    """``[R, positions, width]`` bool: row ``j``'s recorded masks (``masks[j]``, one per position), everything allowed
    for unconstrained rows."""
    out = torch.ones(n_rows, positions, width, dtype=torch.bool)
    for j, row_masks in masks.items():
        for i, m in enumerate(row_masks[:positions]):
            out[j, i, : m.shape[-1]] = m
            out[j, i, m.shape[-1] :] = False
    return out
