"""Where a model's KV lives: every engine of the toolkit, in one package.

- :mod:`.single`: one KV-cached stream each (the :class:`Engine` protocol, :class:`TextEngine`, :class:`VLEngine`,
  their static-cache variants, :class:`PromptImages`, the :class:`EngineFactory` protocol and its
  :class:`TransformersEngines` / :class:`StaticEngines`); what ``pipe.prepare`` prefills a single request on.
- :mod:`.prefix_kv`: :class:`PrefixKV`, KV reuse across requests (a radix tree of prompt keys per model);
  :mod:`.pieces`: a prompt's prefill pieces and where a prefill starts from it.
- :mod:`.rows`: :class:`~.rows.BatchEngine`, rows of one model in one growing KV cache (holes, compaction,
  ragged prefill pieces), :class:`~.rows.RowContext` (one row's KV between storages) and its KV bound.
- :mod:`.block_pool` / :mod:`.paged_kv` / :mod:`.paged_rows`: :class:`~.paged_rows.PagedBatchEngine`, rows in
  fixed-size KV blocks with a block table each (no padding, rollbacks free blocks, prefixes shared by reference).
- :mod:`.static_rows`: :class:`~.static_rows.StaticBatchEngine`, rows in preallocated slots (the GPU fast path,
  compiled fixed-shape forwards) and :func:`~.static_rows.static_batch_engines`.
- :mod:`.vllm` / :mod:`.vllm_rows`: the same stream protocol and row storage served by vLLM (:mod:`.vllm_calls`: their
  ``LLM.generate`` calls).

The decoder (:class:`asymspec_mm.decode.RowDecoder`) steps any of them through the ``RowEngine`` protocol;
:class:`RowStorages` is the one place that picks a row storage for a model (custom factories replace it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .pieces import prefix_split
from .prefix_kv import PrefixKV
from .single import (
    Engine,
    EngineFactory,
    PromptImages,
    StaticEngines,
    StaticTextEngine,
    StaticVLEngine,
    TextEngine,
    TransformersEngines,
    VLEngine,
    model_device,
)

__all__ = [
    "Engine",
    "EngineFactory",
    "PromptImages",
    "StaticEngines",
    "StaticTextEngine",
    "StaticVLEngine",
    "TextEngine",
    "TransformersEngines",
    "VLEngine",
    "RowStorages",
    "default_row_storage",
    "model_device",
    "PrefixKV",
    "prefix_split",
]


def default_row_storage(model, name: str) -> Any:
    """The row storage of one stream when no factory is given: vLLM rows when ``model`` is served there, else a
    :class:`~.rows.BatchEngine` on the transformers model."""
    from .vllm import VLLMModel

    if isinstance(model, VLLMModel):
        from .vllm_rows import VLLMBatchEngine

        return VLLMBatchEngine(model, name)
    from .rows import BatchEngine

    return BatchEngine(model, name)


class RowStorages:
    """The batch-engine factory a decoder uses when none is given: ``(model, stream name) -> row storage``, vLLM rows
    when ``model`` is served there, else ``kind``: ``"paged"`` (default; :class:`~.paged_rows.PagedBatchEngine`, one
    block pool per model shared by its streams and by the batched prefill's :meth:`staging` storages, so a prefilled
    row joins without a copy) or ``"padded"`` (:class:`~.rows.BatchEngine`, one padded cache per stream).
    ``block_size``: tokens per KV block, ``layout``: the pools' layout (paged: ``"segments"`` or ``"contiguous"``;
    default: by each model's number of layers), ``per_stream``: a pool per stream rather than per model (paged).
    ``wrap``: each decode storage built goes through it, e.g. into the bench's timing proxy
    (:class:`~asymspec_mm.base.timing.TimedStorage`); the staging storages do not."""

    def __init__(
        self,
        kind: str = "paged",
        *,
        block_size: int = 16,
        layout: str | None = None,
        per_stream: bool = False,
        wrap: Callable[[Any], Any] | None = None,
    ):
        if kind not in ("paged", "padded"):
            raise ValueError(f"kind={kind!r}: use 'paged' or 'padded'")
        from .paged_rows import PagedStorages

        self.kind, self.wrap = kind, wrap
        self._paged = PagedStorages(block_size=block_size, layout=layout, per_stream=per_stream)

    def __call__(self, model, name: str) -> Any:
        from .vllm import VLLMModel

        if isinstance(model, VLLMModel) or self.kind == "padded":
            storage = default_row_storage(model, name)
        else:
            storage = self._paged(model, name)
        return storage if self.wrap is None else self.wrap(storage)

    def staging(self, model, name: str) -> Any:
        """The batched prefill's storage of one stream (paged: on the decode storages' pool)."""
        if self.kind == "padded":
            from .rows import BatchEngine

            return BatchEngine(model, name, compact_at=0.0)
        return self._paged.staging(model, name)
