"""The RapidOCR engine (PP-OCR models on ONNX Runtime, shipped inside its wheel: works offline)."""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from captioning.errors import OCRUnavailableError
from vision_cache.checks import is_int

from .base import OCREngine
from .items import OCRItem

__all__ = ["RapidOCREngine", "route_rapidocr_logs"]

#: Where RapidOCR's own log lines go, at INFO: library chatter, shown with INFO logging on (``asymspec-mm -v``).
log = logging.getLogger("captioning.ocr.rapidocr")

_ORT = "EngineConfig.onnxruntime."  # RapidOCR's ONNX Runtime settings


class _Relay(logging.Handler):
    """Re-logs a RapidOCR record's message on :data:`log` at INFO."""

    def emit(self, record: logging.LogRecord) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info("RapidOCR: %s", record.getMessage())


def route_rapidocr_logs() -> None:
    """RapidOCR's logger through the standard logging at INFO instead of its coloured console handler: its
    warnings ("The text detection result is empty" on every image without text) would break a progress bar and
    fill a server's log. Idempotent."""
    rapid = logging.getLogger("RapidOCR")
    if not any(isinstance(h, _Relay) for h in rapid.handlers):
        rapid.handlers = [_Relay()]  # with a handler in place, RapidOCR adds no console handler of its own
    rapid.propagate = False


def rapidocr_problems() -> list[str]:
    """Why RapidOCR cannot run offline here (empty list: it can)."""
    problems = []
    spec = importlib.util.find_spec("rapidocr")
    if spec is None or not spec.submodule_search_locations:
        problems.append("the rapidocr package (3.x) is not installed")
    else:
        models = Path(next(iter(spec.submodule_search_locations))) / "models"
        # RapidOCR 3.x ships det/cls/rec ONNX models inside the wheel; without them it would
        # try to download, which must not happen implicitly.
        for kind in ("det", "cls", "rec"):
            if not list(models.glob(f"*{kind}*.onnx")):
                problems.append(f"no {kind} model (*{kind}*.onnx) in {models}")
    if importlib.util.find_spec("onnxruntime") is None:
        problems.append("onnxruntime is not installed")
    return problems


class RapidOCREngine(OCREngine):
    """RapidOCR 3.x (PP-OCR models on ONNX Runtime); its models ship in the wheel.

    Args:
        params: extra RapidOCR settings in its dotted form, e.g. ``{"Global.text_score": 0.6}``.
        threads: ONNX Runtime threads per model call (intra-op; one inter-op), unless ``params`` sets them;
            ``None``: ONNX Runtime's default, one per core.

    Raises:
        OCRUnavailableError: rapidocr or onnxruntime is missing, or the wheel lacks its models.
    """

    name = "rapidocr"

    def __init__(self, params: Mapping[str, Any] | None = None, threads: int | None = None) -> None:
        problems = rapidocr_problems()
        if problems:
            raise OCRUnavailableError(
                f"RapidOCR is not usable: {'; '.join(problems)}. Install it with "
                '`pip install "asymspec-mm[ocr]"` (rapidocr>=3 and onnxruntime).'
            )
        # RapidOCR logs every call at INFO level; warnings are enough inside a pipeline.
        self.params: dict[str, Any] = {"Global.log_level": "warning"}
        if threads is not None:
            if not is_int(threads, minimum=1):
                raise ValueError(f"threads={threads!r} must be an integer >= 1 or None")
            self.params.update({_ORT + "intra_op_num_threads": threads, _ORT + "inter_op_num_threads": 1})
        self.params.update(params or {})
        self._engine: Any = None
        self._lock = threading.Lock()

    def _get_engine(self) -> Any:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    from rapidocr import RapidOCR

                    self._engine = RapidOCR(params=dict(self.params))
                    route_rapidocr_logs()
        return self._engine

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        engine = self._get_engine()
        with self._lock:  # RapidOCR.__call__ updates instance state (update_params); keep calls apart
            output = engine(image)
        boxes = getattr(output, "boxes", None)
        texts = getattr(output, "txts", None)
        scores = getattr(output, "scores", None)
        if boxes is None or texts is None:
            return []
        if scores is None:
            scores = [1.0] * len(texts)
        return [OCRItem(box=box.tolist(), text=text, confidence=score) for box, text, score in zip(boxes, texts, scores, strict=True)]
