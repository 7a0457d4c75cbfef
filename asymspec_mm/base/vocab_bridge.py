"""The decoding side of a cross-family pair's :class:`~asymspec_mm.base.vocab_map.VocabMap`: the loop runs in the
verifier's ids, and this module carries the drafter's ids and logits into that space and restricts the verifier to the
tokens both models can say (docs/algorithm.md, "Two vocabularies").

Shapes: ``V_d`` and ``V_v`` are the drafter's and the verifier's logit widths (a model's logits may be wider than its
tokenizer: the extra ids are never in the map). ``S`` is the map's set of verifier ids that have a drafter id.

* :meth:`VocabBridge.verifier_order`: drafter logits ``[..., V_d]`` -> ``[..., V_v]``, each verifier id's column the
  logit of its drafter token, :data:`FORBIDDEN` outside ``S`` (so the drafter drafts inside ``S``, and ``a``, ``b`` and
  ``delta = a - b`` live on ``S`` in the verifier's order);
* :meth:`VocabBridge.restrict`: the verifier's logits ``[..., V_v]`` -> the same with :data:`FORBIDDEN` outside ``S``,
  and where its best token lies outside ``S`` (the positions where the verifier decides alone);
* :meth:`VocabBridge.drafter_ids`: verifier ids inside ``S`` -> the drafter's ids (what each drafter stream's cache
  is fed).

A token outside ``S`` gets the finite :data:`FORBIDDEN` logit, as a grammar's forbidden token does: softmax gives it
exactly 0 (so every distribution is renormalised over ``S``), ``a - b`` is 0 there and no argmax picks it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .vocab_map import VocabMap

#: The logit of a token a row may not emit (outside the tokens both vocabularies have, or forbidden by a grammar):
#: far below any real logit, finite so that differences and divergences stay finite.
FORBIDDEN = -1.0e9


class VocabBridge:
    """A :class:`VocabMap` as the tensors the decoder uses, for a drafter with logits ``[..., V_d]`` and a verifier
    with logits ``[..., V_v]`` (``drafter_width``, ``verifier_width``). Device copies are made once per device."""

    def __init__(self, vmap: VocabMap, drafter_width: int, verifier_width: int):
        self.map = vmap
        self.drafter_width, self.verifier_width = int(drafter_width), int(verifier_width)
        to_drafter = torch.full((self.verifier_width,), -1, dtype=torch.long)
        known = torch.tensor(vmap.to_drafter[: self.verifier_width], dtype=torch.long)
        to_drafter[: known.numel()] = known
        # a drafter id beyond the drafter's logits cannot be read from them: such a token is not usable
        to_drafter[to_drafter >= self.drafter_width] = -1
        self._host = (to_drafter, to_drafter >= 0, to_drafter.clamp_min(0))
        self._devices: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._drafter_of: list[int] = to_drafter.tolist()  # the host's lookup (one per emitted token)
        self.inside_ids: list[int] = [v for v, d in enumerate(self._drafter_of) if d >= 0]

    def _on(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(to_drafter ``[V_v]`` long, -1 outside; inside ``[V_v]`` bool; the drafter column of each verifier id,
        0 outside) on ``device``."""
        key = str(device)
        got = self._devices.get(key)
        if got is None:
            with self._lock:
                got = self._devices.setdefault(key, tuple(x.to(device) for x in self._host))
        return got

    @property
    def shared(self) -> int:
        """Verifier ids with a drafter id (usable tokens)."""
        return len(self.inside_ids)

    def inside(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[V_v]`` bool: the verifier ids with a drafter id."""
        return self._on(device)[1]

    def drafter_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Verifier ids ``[...]`` (inside the map) -> the drafter's ids ``[...]``, on ``ids``' device."""
        return self._on(ids.device)[0][ids]

    def drafter_id(self, token: int) -> int | None:
        """One verifier id's drafter id (host), or None outside the map."""
        d = self._drafter_of[token] if 0 <= token < self.verifier_width else -1
        return d if d >= 0 else None

    def verifier_order(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits ``[..., V_d]`` -> ``[..., V_v]`` float32: verifier id v holds the logit of its drafter token,
        :data:`FORBIDDEN` where v has none."""
        _, inside, columns = self._on(logits.device)
        return logits.float().index_select(-1, columns).masked_fill(~inside, FORBIDDEN)

    def restrict(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's logits ``[..., V_v]`` -> (the same, float32, :data:`FORBIDDEN` outside the map; ``alone``
        ``[...]`` bool: the position's best token over the whole vocabulary lies outside the map)."""
        _, inside, _ = self._on(t.device)
        t = t.float()
        return t.masked_fill(~inside, FORBIDDEN), ~inside[t.argmax(-1)]


def bridge_of(vmap: VocabMap | None, drafter_width: int, verifier_width: int) -> Any:
    """The :class:`VocabBridge` of a cross-family pair, or None for one vocabulary (no map: today's path)."""
    if vmap is None or vmap.same_vocabulary:
        return None
    return VocabBridge(vmap, drafter_width, verifier_width)
