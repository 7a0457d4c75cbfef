"""The OCR result cache, keyed by engine and image content.

OCR is slow on CPU (about a second per image) and the same image is read again whenever a
problem is re-run with another method or setting, so results are worth keeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from PIL import Image

from vision_cache.hashing import image_content_hash
from vision_cache.store import LRUCache

from .items import OCRItem

if TYPE_CHECKING:
    from .base import OCREngine

__all__ = ["OCRCache", "DEFAULT_OCR_CACHE"]


class OCRCache:
    """Thread-safe LRU cache of OCR results keyed by ``(engine.cache_key, image hash)``.

    The image hash is :func:`vision_cache.hashing.image_content_hash`, the key the vision
    feature path uses too. Concurrent misses on one key may both compute; the results are
    identical, so the second write is harmless, and holding a lock during OCR would serialize
    unrelated images.

    Args:
        max_entries: entries kept before the least recently used is evicted; ``None`` keeps all.
    """

    def __init__(self, max_entries: int | None = 4096) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries}")
        self._lru: LRUCache[tuple[str, str], tuple[OCRItem, ...]] = LRUCache(max_entries=max_entries)

    @property
    def max_entries(self) -> int | None:
        """Entries kept before the least recently used is evicted (``None``: no limit)."""
        return self._lru.max_entries

    @property
    def hits(self) -> int:
        """Lookups served from the cache."""
        return self._lru.hits

    @property
    def misses(self) -> int:
        """Lookups that found nothing."""
        return self._lru.misses

    @staticmethod
    def key(engine: OCREngine, image: Image.Image) -> tuple[str, str]:
        """The cache key of ``image`` read by ``engine``."""
        return (engine.cache_key, image_content_hash(image))

    def get(self, key: tuple[str, str]) -> list[OCRItem] | None:
        """The cached items for ``key`` (a fresh list), or ``None``."""
        items = self._lru.get(key)
        return None if items is None else list(items)

    def put(self, key: tuple[str, str], items: Iterable[OCRItem]) -> None:
        """Store ``items`` under ``key``, evicting the least recently used entry if full."""
        self._lru.put(key, tuple(items))

    def read(self, engine: OCREngine, image: Image.Image) -> list[OCRItem]:
        """``engine.read(image)``, served from the cache when this image was read before."""
        key = self.key(engine, image)
        cached = self.get(key)
        if cached is not None:
            return cached
        items = engine.read(image)
        self.put(key, items)
        return list(items)

    def clear(self) -> None:
        """Drop all results and reset the counters."""
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)


DEFAULT_OCR_CACHE = OCRCache()
