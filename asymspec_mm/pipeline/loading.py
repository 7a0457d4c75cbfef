"""How an :class:`~asymspec_mm.pipeline.facade.AsymSpecPipeline` is built from checkpoints: its classmethods
:meth:`~PipelineLoading.from_pretrained` and :meth:`~PipelineLoading.from_preset` (:class:`PipelineLoading`, a base of
the pipeline: the checks that run before any model loads, the loading itself, the named pairs) and the OCR worker
processes its constructor may start (:func:`ocr_worker_engine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import torch

from ..base.chatter import quiet_loading
from ..base.checks import is_int
from ..base.errors import UnknownOptionError
from ..engines.loading import check_backends, check_checkpoint, load_models

__all__ = ["OCR_WORKER_THREADS", "PipelineLoading", "ocr_worker_engine"]

#: Compute threads of each OCR worker process (``ocr_workers``): one, so OCR leaves the models' threads their cores
#: (BENCHMARKS.md, "OCR beside the loop").
OCR_WORKER_THREADS = 1

#: The class a loading classmethod builds: the pipeline (or a subclass of it).
Pipeline = TypeVar("Pipeline", bound="PipelineLoading")


class PipelineLoading:
    """The pipeline's loading classmethods (``cls`` is :class:`~asymspec_mm.pipeline.facade.AsymSpecPipeline`, or a
    subclass): each checks what it can before any model loads, then builds the pipeline with the loaded models."""

    @classmethod
    def from_pretrained(
        cls: type[Pipeline],
        drafter: str | Path = "Qwen/Qwen3-VL-2B-Instruct",
        verifier: str | Path = "Qwen/Qwen3-32B",
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        *,
        device_map: Any = None,
        verifier_device_map: Any = None,
        trust_remote_code: bool = False,
        local_files_only: bool | None = None,
        verifier_backend: str = "transformers",
        vllm_kwargs: dict | None = None,
        drafter_backend: str = "transformers",
        drafter_vllm_kwargs: dict | None = None,
        sd_drafter: str | Path | None = None,
        **kwargs,
    ) -> Pipeline:
        """Load both models with ``from_pretrained`` (hub id or local directory).

        Auto device/dtype: cuda + bf16 when available, else cpu + fp32. ``verifier_device_map``
        (e.g. ``"auto"``) spreads a large verifier over several GPUs; ``device_map`` does so for the
        drafter. ``trust_remote_code`` stays off unless asked.

        ``verifier_backend="vllm"`` serves the verifier with vLLM (see VLLM.md): ``vllm_kwargs`` go to
        ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``,
        ``distributed_executor_backend="ray"``, ...; prefix caching is always on).
        ``drafter_backend="vllm"`` serves the drafter's streams with one more ``vllm.LLM``
        (``drafter_vllm_kwargs``): the compressed (text-only) stream and the full-view stream, whose
        prompt carries the image (vLLM runs its own vision tower); with
        ``drafter_vllm_kwargs={"limit_mm_per_prompt": {"image": 0, "video": 0}}`` only the compressed
        stream. Captions (and their vision-feature cache) stay on the transformers drafter.

        ``ocr_workers=N`` (N >= 1) reads the images' text in N worker processes instead of the thread that sets
        the request up (:class:`~captioning.ocr.workers.ProcessOCREngine`: the same items; OCR then takes no turn on
        the interpreter lock the decoding thread needs, and one compute thread a worker leaves the models' threads
        their cores); :meth:`close` stops them. ``0`` (the default) reads in-process: nothing to start, and a script needs no
        ``if __name__ == "__main__":`` guard (spawned workers re-import the main module).

        ``sd_drafter`` (hub id or local directory of a text causal LM sharing the verifier's vocabulary, e.g.
        ``Qwen/Qwen3-1.7B``, the paper's SD baseline) drafts for ``method="sd"`` instead of the VL drafter on
        the compressed view: on transformers, with the drafter's dtype and device rules, reading the
        verifier's prompt (the same user text and chat template).
        """
        check_backends(verifier_backend, drafter_backend, verifier_device_map, vllm_kwargs, drafter_vllm_kwargs)
        from captioning.ocr.items import check_ocr_layout

        check_ocr_layout(kwargs.get("ocr_layout", "plain"))  # before any model loads
        for ref, role in ((drafter, "drafter"), (verifier, "verifier"), (sd_drafter, "SD drafter")):
            if ref is not None and isinstance(ref, (str, Path)):
                check_checkpoint(ref, role)
        with quiet_loading():  # transformers' per-shard bars: shown with verbose logging only (chatter.py)
            models = load_models(
                drafter,
                verifier,
                device,
                dtype,
                device_map=device_map,
                verifier_device_map=verifier_device_map,
                trust_remote_code=trust_remote_code,
                local_files_only=local_files_only,
                verifier_backend=verifier_backend,
                vllm_kwargs=vllm_kwargs,
                drafter_backend=drafter_backend,
                drafter_vllm_kwargs=drafter_vllm_kwargs,
                sd_drafter=sd_drafter,
            )
        return cls(**models, **kwargs)

    @classmethod
    def from_preset(cls: type[Pipeline], name: str = "tiny", **kwargs) -> Pipeline:
        """A named pair from :mod:`asymspec_mm.pipeline.presets` (``tiny`` ships with the package and runs offline);
        ``kwargs`` go to :meth:`from_pretrained` (e.g. ``sd_drafter="Qwen/Qwen3-1.7B"`` with ``qwen3``)."""
        from .presets import resolve_preset

        preset = resolve_preset(name)
        opts = {**preset.pipeline_kwargs, **kwargs}
        pipe = cls.from_pretrained(drafter=preset.drafter, verifier=preset.verifier, **opts)
        pipe.name = preset.name
        return pipe


def ocr_worker_engine(ocr: str | Any, workers: int) -> Any:
    """The :class:`~captioning.ocr.workers.ProcessOCREngine` that reads with the engine named ``ocr`` in ``workers``
    processes, or ``None`` when ``workers`` is 0 or the engine is ``"none"``.

    Raises:
        UnknownOptionError: ``workers`` is not an integer >= 0, or ``ocr`` is an engine object (workers build their
            engine by name; wrap a custom engine's factory in ``ProcessOCREngine`` yourself).
    """
    if not is_int(workers, minimum=0):
        raise UnknownOptionError(f"ocr_workers={workers!r} must be an integer >= 0 (0 reads in-process)")
    if not workers or (isinstance(ocr, str) and ocr.strip().lower() == "none"):
        return None
    if not isinstance(ocr, str):
        raise UnknownOptionError(
            f"ocr_workers={workers} needs an OCR engine name, not the engine {ocr!r}: pass ocr='rapidocr' (or 'easyocr', "
            "'auto'), or ocr=ProcessOCREngine(factory, workers) with a picklable factory of your engine"
        )
    from captioning.ocr.workers import ProcessOCREngine

    return ProcessOCREngine(ocr, workers, threads=OCR_WORKER_THREADS)
