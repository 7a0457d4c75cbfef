"""Tests of vision_cache.store.LRUCache, the one LRU the OCR, caption and feature caches build on."""

from __future__ import annotations

import threading

import pytest

from captioning.captioner import CaptionCache
from captioning.ocr import OCRCache
from vision_cache.store import FeatureStore, LRUCache


def test_evicts_least_recently_used_by_count() -> None:
    lru: LRUCache[str, int] = LRUCache(max_entries=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent, "b" the least
    lru.put("c", 3)
    assert "b" not in lru and "a" in lru and "c" in lru
    assert len(lru) == 2 and lru.evictions == 1


def test_evicts_least_recently_used_by_bytes() -> None:
    lru: LRUCache[str, str] = LRUCache(max_bytes=10)
    lru.put("a", "x", nbytes=4)
    lru.put("b", "y", nbytes=4)
    lru.get("a")
    lru.put("c", "z", nbytes=4)  # 12 > 10: the least recent ("b") goes
    assert "b" not in lru and lru.nbytes == 8
    lru.put("d", "w", nbytes=10)  # needs the whole budget: both others go
    assert len(lru) == 1 and "d" in lru and lru.nbytes == 10 and lru.evictions == 3


def test_both_bounds_hold_together() -> None:
    lru: LRUCache[int, int] = LRUCache(max_entries=3, max_bytes=100)
    for i in range(3):
        lru.put(i, i, nbytes=10)
    lru.put(3, 3, nbytes=10)  # over the count bound only
    assert sorted(k for k in range(4) if k in lru) == [1, 2, 3]
    lru.put(4, 4, nbytes=85)  # 115 bytes: the two least recent go, down to 95
    assert [k for k in range(5) if k in lru] == [3, 4] and lru.nbytes == 95 and lru.evictions == 3


def test_hit_and_miss_counts_exact() -> None:
    lru: LRUCache[str, int] = LRUCache(max_entries=4)
    assert lru.get("a") is None
    lru.put("a", 1)
    assert lru.get("a") == 1 and lru.get("a") == 1
    assert lru.get("b", -1) == -1
    assert "a" in lru and "b" not in lru  # membership is not a lookup
    assert lru.get("a", record=False) == 1 and lru.get("z", record=False) is None
    lru.record(hit=True)
    lru.record(hit=False)
    assert (lru.hits, lru.misses) == (3, 3)
    assert lru.stats() == {"hits": 3, "misses": 3, "bytes": 0, "entries": 1, "evictions": 0}
    lru.clear()
    assert lru.stats() == {"hits": 0, "misses": 0, "bytes": 0, "entries": 0, "evictions": 0}


def test_stored_none_is_a_hit_with_a_sentinel_default() -> None:
    lru: LRUCache[str, None] = LRUCache()
    missing = object()
    lru.put("k", None)
    assert lru.get("k", missing) is None and lru.get("other", missing) is missing
    assert (lru.hits, lru.misses) == (1, 1)


def test_replace_discard_and_oversize() -> None:
    lru: LRUCache[str, str] = LRUCache(max_bytes=10)
    lru.put("k", "old", nbytes=6)
    lru.put("k", "new", nbytes=3)  # replacing is not an eviction
    assert lru.get("k") == "new" and lru.nbytes == 3 and lru.evictions == 0
    assert lru.put("k", "huge", nbytes=11) is False  # too big alone: the stale value goes too
    assert "k" not in lru and lru.nbytes == 0
    lru.put("j", "v", nbytes=5)
    assert lru.discard("j") is True and lru.discard("j") is False and lru.nbytes == 0


def test_zero_bounds_store_nothing_and_validation() -> None:
    assert LRUCache(max_entries=0).put("k", 1) is False
    assert LRUCache(max_bytes=0).put("k", 1, nbytes=0) is False
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            LRUCache(max_entries=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            LRUCache(max_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LRUCache().put("k", 1, nbytes=-1)


def test_concurrent_use_keeps_bounds_and_counts() -> None:
    lru: LRUCache[int, int] = LRUCache(max_entries=16, max_bytes=100)
    lookups_per_thread = 500

    def worker(seed: int) -> None:
        for i in range(lookups_per_thread):
            key = (seed * 7 + i) % 40
            if lru.get(key) is None:
                lru.put(key, key, nbytes=key % 9)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = lru.stats()
    assert stats["hits"] + stats["misses"] == 8 * lookups_per_thread
    assert stats["entries"] <= 16 and stats["bytes"] <= 100


def test_the_three_caches_build_on_it() -> None:
    assert isinstance(CaptionCache(), LRUCache) and CaptionCache().max_entries == 512
    assert isinstance(OCRCache()._lru, LRUCache) and OCRCache().max_entries == 4096
    assert isinstance(FeatureStore()._lru, LRUCache)
