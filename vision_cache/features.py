"""Vision features computed once per image and reused by every forward that needs them.

The drafter's full-view prefill, the captioner and later requests about the same image all read
one :class:`VisionFeatures`; the vision tower runs once per distinct (image, processor settings,
model), and not at all on a cache hit.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from .store import FeatureStore

DEFAULT_CACHE_BYTES = 256 * 2**20


@dataclass
class VisionFeatures:
    """Output of one vision-tower pass over the images of one prompt.

    embeds: one tensor ``[n_tokens_i, hidden]`` per image (merged patches, what replaces the image
    pads); deepstack: per deepstack layer, one tensor per image ``[n_tokens_i, hidden]``;
    image_grid_thw: ``[n_images, 3]`` patch grids before merging.
    """

    embeds: tuple[torch.Tensor, ...]
    deepstack: tuple[tuple[torch.Tensor, ...], ...]
    image_grid_thw: torch.Tensor
    key: str = ""  # content key in the encoder's cache (prefix KV reuse keys on it too)

    @property
    def num_tokens(self) -> int:
        return sum(e.shape[0] for e in self.embeds)


class VisionEncoder:
    """Runs a Qwen3-VL model's vision tower, with a cross-request cache of its outputs.

    Thread-safe: the underlying :class:`FeatureStore` computes each key once even when several
    requests ask for the same image at the same time. :meth:`thread_counts` are the tower passes and cache
    hits of the calling context alone (a thread's, and the calls it hands to another thread in a copy of its
    context, as a set-up hands the tower's call to the engine loop), so a request counts its own while others run.
    """

    def __init__(self, model, cache_bytes: int = DEFAULT_CACHE_BYTES, model_key: str = ""):
        self.model = model
        self.store = FeatureStore(max_bytes=cache_bytes)
        self.model_key = model_key
        self._lock = threading.Lock()
        self._counts: ContextVar[list[int] | None] = ContextVar(f"vision_counts_{id(self)}", default=None)
        self.tower_calls = 0

    def _cell(self) -> list[int]:
        """The calling context's ``[tower passes, cache hits]`` (made on first use; a copied context shares it)."""
        cell = self._counts.get()
        if cell is None:
            cell = [0, 0]
            self._counts.set(cell)
        return cell

    def thread_counts(self) -> tuple[int, int]:
        """``(tower passes, cache hits)`` made in the calling context so far."""
        tower, hits = self._cell()
        return tower, hits

    def key(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> str:
        """Content key: the preprocessed pixels already encode the image and the processor settings."""
        h = hashlib.sha256()
        h.update(self.model_key.encode())
        h.update(str(tuple(pixel_values.shape)).encode() + str(pixel_values.dtype).encode())
        h.update(pixel_values.detach().float().cpu().contiguous().numpy().tobytes())
        h.update(image_grid_thw.cpu().numpy().tobytes())
        return h.hexdigest()

    @torch.no_grad()
    def encode_uncached(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> VisionFeatures:
        """One pass of the vision tower (counted in ``tower_calls``)."""
        with self._lock:
            self.tower_calls += 1
        self._cell()[0] += 1
        device = self.model.model.visual.device if hasattr(self.model.model.visual, "device") else None
        out = self.model.model.get_image_features(
            pixel_values.to(device) if device is not None else pixel_values,
            image_grid_thw.to(device) if device is not None else image_grid_thw,
            return_dict=True,
        )
        return VisionFeatures(
            embeds=tuple(e.detach() for e in out.pooler_output),
            deepstack=tuple(tuple(f.detach() for f in layer) for layer in (out.deepstack_features or [])),
            image_grid_thw=image_grid_thw.detach().cpu(),
        )

    def encode(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, run: Callable | None = None) -> tuple[VisionFeatures, bool]:
        """Features for these pixels (``[patches, dim]`` of ``n`` images, ``image_grid_thw`` ``[n, 3]``), and whether
        they all came from the cache. Each image is encoded and cached on its own (the tower attends within an
        image), so an image shown again with others, as in a conversation's later turns, is not encoded again and
        gets the very same features. ``run(fn)`` runs a tower pass (a cache miss) where it must run: an engine loop
        that owns the models (the cache itself is read here); default: here."""
        if image_grid_thw.shape[0] > 1:
            counts = [int(t * h * w) for t, h, w in image_grid_thw.tolist()]
            parts = [self.encode(px, grid, run) for px, grid in zip(pixel_values.split(counts), image_grid_thw.split(1))]
            feats = VisionFeatures(
                embeds=tuple(e for f, _ in parts for e in f.embeds),
                deepstack=tuple(tuple(x for f, _ in parts for x in f.deepstack[i]) for i in range(len(parts[0][0].deepstack))),
                image_grid_thw=image_grid_thw.detach().cpu(),
                key="+".join(f.key for f, _ in parts),
            )
            return feats, all(hit for _, hit in parts)
        before = self.thread_counts()[0]
        key = self.key(pixel_values, image_grid_thw)
        compute = lambda: self.encode_uncached(pixel_values, image_grid_thw)  # noqa: E731
        feats = self.store.get_or_compute(key, compute if run is None else lambda: run(compute))
        feats.key = key
        hit = self.thread_counts()[0] == before  # no tower pass on this thread: cached (or computed by another)
        if hit:
            self._cell()[1] += 1
        return feats, hit

    def stats(self) -> dict:
        return {"tower_calls": self.tower_calls, **self.store.stats()}
