"""Tests of vision_cache.store.FeatureStore: byte budget, LRU order, counters, concurrency."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from vision_cache.store import DEFAULT_MAX_BYTES, FeatureStore, tensor_nbytes


def _t(nbytes: int) -> torch.Tensor:
    """A float32 tensor of exactly ``nbytes`` bytes."""
    assert nbytes % 4 == 0
    return torch.zeros(nbytes // 4, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# sizing
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Features:
    embeds: torch.Tensor
    grid: torch.Tensor
    name: str = "x"


class _Holder:
    def __init__(self) -> None:
        self.a = torch.zeros(10, dtype=torch.float16)
        self.b = [torch.zeros(3, dtype=torch.int64)]


class _Slotted:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = torch.zeros(5, dtype=torch.uint8)


def test_tensor_nbytes_walks_containers() -> None:
    t = torch.zeros(4, 8, dtype=torch.float32)  # 128 bytes
    assert tensor_nbytes(t) == 128
    assert tensor_nbytes([t, (torch.zeros(2, dtype=torch.bfloat16),)]) == 128 + 4
    assert tensor_nbytes({"pixel": t, "meta": {"grid": torch.zeros(3, dtype=torch.int64)}}) == 128 + 24
    assert tensor_nbytes(_Features(embeds=t, grid=torch.zeros(1, 3, dtype=torch.int64))) == 128 + 24
    assert tensor_nbytes(_Holder()) == 20 + 24
    assert tensor_nbytes(_Slotted()) == 5
    assert tensor_nbytes([t, t, {"again": t}]) == 128  # the same tensor counts once
    assert tensor_nbytes(np.zeros(10, dtype=np.float64)) == 80
    assert tensor_nbytes(["text", 3, None, b"bytes"]) == 0
    cyc: list[object] = [t]
    cyc.append(cyc)  # reference cycles terminate
    assert tensor_nbytes(cyc) == 128
    deep: object = t
    for _ in range(5000):  # no recursion limit
        deep = [deep]
    assert tensor_nbytes(deep) == 128


# ---------------------------------------------------------------------------------------------
# budget and LRU
# ---------------------------------------------------------------------------------------------


def test_defaults_and_validation() -> None:
    assert FeatureStore().max_bytes == DEFAULT_MAX_BYTES == 256 * 2**20
    with pytest.raises(ValueError):
        FeatureStore(max_bytes=-1)
    store = FeatureStore(max_bytes=100, size_fn=lambda v: -5)
    with pytest.raises(ValueError):
        store.put("k", 1)


def test_budget_respected_under_many_entries() -> None:
    budget = 10_000
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=budget)
    sizes = [4 * ((i * 37) % 600 + 1) for i in range(500)]  # 4..2400 bytes
    for i, size in enumerate(sizes):
        assert store.put(f"k{i}", _t(size))
        stats = store.stats()
        assert stats["bytes"] <= budget
        # The stored total equals the sum of the sizes of the entries still present.
        present = [j for j in range(i + 1) if f"k{j}" in store]
        assert stats["bytes"] == sum(sizes[j] for j in present)
        assert stats["entries"] == len(present) == len(store)
        # Survivors are always the most recent suffix (pure insertion order here).
        assert present == list(range(i + 1 - len(present), i + 1))
    stats = store.stats()
    assert stats["evictions"] == 500 - stats["entries"]
    assert stats["evictions"] > 400
    assert stats["max_bytes"] == budget


def test_lru_order_honoured() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=300)
    for k in "abc":
        store.put(k, _t(100))
    assert store.get("a") is not None  # a becomes most recent: order b, c, a
    store.put("d", _t(100))  # evicts b (least recently used)
    assert "b" not in store and {"a", "c", "d"} <= {k for k in "abcd" if k in store}
    store.get_or_compute("c", lambda: pytest.fail("c is cached"))  # order a, d, c
    store.put("e", _t(200))  # needs two slots: evicts a then d
    assert [k for k in "abcde" if k in store] == ["c", "e"]
    assert store.stats()["evictions"] == 3
    assert store.stats()["bytes"] == 300


def test_contains_does_not_touch_recency_or_counts() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=200)
    store.put("a", _t(100))
    store.put("b", _t(100))
    assert "a" in store  # must not refresh a
    store.put("c", _t(100))
    assert "a" not in store and "b" in store
    assert store.stats()["hits"] == 0 and store.stats()["misses"] == 0


def test_hit_miss_counts_exact() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=1000)
    assert store.get("x") is None
    store.put("x", _t(40))
    assert torch.equal(store.get("x"), _t(40))  # type: ignore[arg-type]
    calls = Counter[str]()

    def make(key: str) -> torch.Tensor:
        calls[key] += 1
        return _t(40)

    for _ in range(3):
        store.get_or_compute("y", lambda: make("y"))
    store.get_or_compute("x", lambda: make("x"))
    assert calls == Counter({"y": 1})
    assert store.stats() == {
        "hits": 1 + 2 + 1,
        "misses": 1 + 1,
        "bytes": 80,
        "entries": 2,
        "evictions": 0,
        "max_bytes": 1000,
    }
    store.clear()
    assert store.stats() == {"hits": 0, "misses": 0, "bytes": 0, "entries": 0, "evictions": 0, "max_bytes": 1000}
    assert store.get("x") is None


def test_replacing_a_key_updates_bytes() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=1000)
    store.put("k", _t(400))
    store.put("k", _t(100))
    assert store.stats()["bytes"] == 100 and len(store) == 1
    assert store.discard("k") and not store.discard("k")
    assert store.stats()["bytes"] == 0


def test_max_bytes_zero_disables() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=0)
    runs = 0

    def make() -> torch.Tensor:
        nonlocal runs
        runs += 1
        return _t(4)

    results = [store.get_or_compute("k", make) for _ in range(5)]
    assert runs == 5
    assert all(torch.equal(r, _t(4)) for r in results)
    assert not store.put("k", _t(4))
    assert store.get("k") is None
    assert store.stats() == {"hits": 0, "misses": 6, "bytes": 0, "entries": 0, "evictions": 0, "max_bytes": 0}


def test_oversize_value_returned_not_stored() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=100)
    store.put("small", _t(60))
    big = _t(104)
    assert store.get_or_compute("big", lambda: big) is big
    assert "big" not in store and "small" in store  # nothing evicted for a value that cannot fit
    assert not store.put("big", big)
    stats = store.stats()
    assert stats["bytes"] == 60 and stats["evictions"] == 0
    # A stale smaller value under the same key is dropped when an oversize one replaces it.
    assert store.put("small", _t(200)) is False
    assert "small" not in store and store.stats()["bytes"] == 0


def test_custom_size_fn() -> None:
    store: FeatureStore[str] = FeatureStore(max_bytes=10, size_fn=len)
    store.put("a", "12345")
    store.put("b", "123456")  # 11 > 10: a goes
    assert "a" not in store and store.get("b") == "123456"


def test_failed_compute_not_cached() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=1000)

    def boom() -> torch.Tensor:
        raise RuntimeError("encoder failed")

    with pytest.raises(RuntimeError, match="encoder failed"):
        store.get_or_compute("k", boom)
    assert "k" not in store
    assert torch.equal(store.get_or_compute("k", lambda: _t(8)), _t(8))  # retried, not poisoned


def test_recursive_compute_detected() -> None:
    store: FeatureStore[int] = FeatureStore(max_bytes=1000, size_fn=lambda v: 1)
    with pytest.raises(RuntimeError, match="recursively"):
        store.get_or_compute("k", lambda: store.get_or_compute("k", lambda: 1))
    assert store.get_or_compute("k", lambda: 2) == 2  # the store is usable afterwards


# ---------------------------------------------------------------------------------------------
# concurrency
# ---------------------------------------------------------------------------------------------


def test_concurrent_get_or_compute_runs_once_per_key() -> None:
    n_threads, calls_per_thread = 8, 200
    keys = [f"img{i}" for i in range(4)]
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=1 << 20)
    runs: Counter[str] = Counter()
    runs_lock = threading.Lock()
    start = threading.Barrier(n_threads)
    results: dict[str, set[int]] = {k: set() for k in keys}
    results_lock = threading.Lock()
    errors: list[BaseException] = []

    def compute(key: str) -> torch.Tensor:
        with runs_lock:
            runs[key] += 1
        time.sleep(0.05)  # long enough that the other threads pile up on the same key
        return torch.full((256,), float(keys.index(key)))

    def worker(tid: int) -> None:
        try:
            start.wait()
            for i in range(calls_per_thread):
                key = keys[(i + tid) % len(keys)]
                value = store.get_or_compute(key, lambda key=key: compute(key))
                assert float(value[0]) == keys.index(key)
                with results_lock:
                    results[key].add(id(value))
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert runs == Counter({k: 1 for k in keys})  # exactly once per key
    assert all(len(ids) == 1 for ids in results.values())  # everyone got the very same object
    stats = store.stats()
    assert stats["hits"] + stats["misses"] == n_threads * calls_per_thread
    assert stats["misses"] == len(keys)
    assert stats["entries"] == len(keys) and stats["bytes"] == len(keys) * 256 * 4


def test_concurrent_waiters_share_a_failure() -> None:
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=1 << 20)
    runs = 0
    runs_lock = threading.Lock()
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def failing() -> torch.Tensor:
        nonlocal runs
        with runs_lock:
            runs += 1
        # fail once the five other callers wait on this run (each counts a hit as it finds it in flight): a caller
        # that came after the failure would run it again (failures are not cached), however the threads are scheduled
        deadline = time.monotonic() + 120
        while store.stats()["hits"] < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        raise ValueError("bad image")

    def worker() -> None:
        start.wait()
        try:
            store.get_or_compute("k", failing)
            outcomes.append("ok")
        except ValueError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert outcomes == ["bad image"] * 6
    assert runs == 1  # one failing run shared by all concurrent callers
    assert "k" not in store


def test_concurrent_mixed_traffic_keeps_budget() -> None:
    budget = 64 * 1024
    store: FeatureStore[torch.Tensor] = FeatureStore(max_bytes=budget)
    start = threading.Barrier(8)
    over_budget: list[int] = []
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            rng = np.random.default_rng(tid)
            start.wait()
            for _ in range(400):
                k = int(rng.integers(0, 64))
                size = 4 * (k + 1) * 64  # 256 .. 16384 bytes, fixed per key
                op = int(rng.integers(0, 3))
                if op == 0:
                    store.put(f"k{k}", _t(size))
                elif op == 1:
                    got = store.get(f"k{k}")
                    assert got is None or got.numel() * 4 == size
                else:
                    got = store.get_or_compute(f"k{k}", lambda size=size: _t(size))
                    assert got.numel() * 4 == size
                b = store.stats()["bytes"]
                if b > budget:
                    over_budget.append(b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert not over_budget
    stats = store.stats()
    assert stats["bytes"] <= budget and stats["evictions"] > 0
