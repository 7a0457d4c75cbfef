"""Thread-safe LRU caches: the generic :class:`LRUCache` and the vision feature store on it.

:class:`LRUCache` is the one least-recently-used map of the toolkit, bounded by entry count
and/or total byte size, with hit/miss/eviction counters; the OCR result cache and the caption
cache of :mod:`captioning` build on it as well.

:class:`FeatureStore` maps string keys (typically an image content hash plus preprocessing
settings) to arbitrary values whose size is measured in bytes, by default the bytes of every
torch tensor (and numpy array) reachable from the value. The total stays within ``max_bytes``
by evicting least-recently-used entries. :meth:`FeatureStore.get_or_compute` runs the producer
at most once per missing key even when many threads ask for it at the same time: later callers
wait for the first one's result instead of encoding the same image again.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar, overload

from .checks import is_int

__all__ = ["DEFAULT_MAX_BYTES", "FeatureStore", "LRUCache", "tensor_nbytes"]

#: Default byte budget: 256 MiB.
DEFAULT_MAX_BYTES: int = 256 * 2**20

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")

# Types that never hold tensors; skipping them keeps the size walk cheap and stops it from
# wandering into modules, classes or functions reachable from an object's __dict__.
_ATOMIC_TYPES: tuple[type, ...] = (
    str,
    bytes,
    bytearray,
    memoryview,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
)


def tensor_nbytes(value: Any) -> int:
    """Sum ``numel() * element_size()`` over every torch tensor reachable from ``value``.

    Walks tensors, mappings (keys and values), lists/tuples/sets, dataclasses and any object with
    a ``__dict__`` or ``__slots__``. Numpy arrays count their ``nbytes`` too, so features kept as
    arrays are not mistaken for free. Each object is visited once (by identity), so a tensor
    referenced twice, or a reference cycle, is counted once and terminates.
    """
    # Look torch/numpy up lazily: if they were never imported, no value can contain their arrays,
    # and this module stays importable without paying for torch.
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    tensor_type = getattr(torch, "Tensor", None)
    ndarray_type = getattr(np, "ndarray", None)

    total = 0
    seen: set[int] = set()
    stack: list[Any] = [value]
    # Iterative walk: deeply nested values must not hit the recursion limit.
    while stack:
        obj = stack.pop()
        if isinstance(obj, _ATOMIC_TYPES):
            continue
        oid = id(obj)
        if oid in seen:
            continue
        seen.add(oid)
        if tensor_type is not None and isinstance(obj, tensor_type):
            total += int(obj.numel()) * int(obj.element_size())
            continue
        if ndarray_type is not None and isinstance(obj, ndarray_type):
            total += int(obj.nbytes)
            continue
        if isinstance(obj, Mapping):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
            continue
        if dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name, None) for f in dataclasses.fields(obj))
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            stack.extend(attrs.values())
        for klass in type(obj).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            if isinstance(slots, str):
                slots = (slots,)
            for name in slots:
                if name not in ("__dict__", "__weakref__"):
                    stack.append(getattr(obj, name, None))
    return total


def _check_limit(name: str, value: int | None) -> int | None:
    """``value`` if it is ``None`` or a non-negative int, else a ``ValueError``."""
    if value is not None and not is_int(value, minimum=0):
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    return value


class LRUCache(Generic[K, V]):
    """Thread-safe least-recently-used map bounded by entry count and/or total byte size.

    Args:
        max_entries: Entries kept; ``None`` sets no count limit, ``0`` stores nothing.
        max_bytes: Bound on the sum of the sizes passed to :meth:`put`; ``None`` sets no byte
            limit, ``0`` stores nothing.

    When a :meth:`put` goes over either bound, least-recently-used entries are evicted until both
    hold again. Counting: ``hits`` and ``misses`` count :meth:`get` lookups (and the outcomes
    passed to :meth:`record`); ``evictions`` counts entries dropped to make room, not replaced
    or discarded ones.
    """

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        self._max_entries = _check_limit("max_entries", max_entries)
        self._max_bytes = _check_limit("max_bytes", max_bytes)
        self._lock = threading.Lock()
        # OrderedDict order is recency: first = least recently used, last = most recent.
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @property
    def max_entries(self) -> int | None:
        """The entry bound this cache was created with."""
        return self._max_entries

    @property
    def max_bytes(self) -> int | None:
        """The byte bound this cache was created with."""
        return self._max_bytes

    @property
    def hits(self) -> int:
        """Lookups that found a value."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that found nothing."""
        return self._misses

    @property
    def evictions(self) -> int:
        """Entries dropped to stay within the bounds."""
        return self._evictions

    @property
    def nbytes(self) -> int:
        """Sum of the sizes of the stored entries."""
        return self._bytes

    def __len__(self) -> int:
        """Number of stored entries."""
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored; does not count as a hit/miss nor refresh recency."""
        with self._lock:
            return key in self._entries

    @overload
    def get(self, key: K, default: None = None, *, record: bool = True) -> V | None: ...

    @overload
    def get(self, key: K, default: D, *, record: bool = True) -> V | D: ...

    def get(self, key: K, default: Any = None, *, record: bool = True) -> Any:
        """The value under ``key`` (marked most recently used), or ``default``.

        ``record=False`` leaves the hit/miss counters alone, for callers that decide how to count
        the lookup themselves (see :meth:`record`).
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if record:
                    self._misses += 1
                return default
            self._entries.move_to_end(key)
            if record:
                self._hits += 1
            return entry[0]

    def record(self, hit: bool) -> None:
        """Count one lookup that was answered without :meth:`get` (e.g. by a shared computation)."""
        with self._lock:
            if hit:
                self._hits += 1
            else:
                self._misses += 1

    def put(self, key: K, value: V, nbytes: int = 0) -> bool:
        """Store ``value`` (of size ``nbytes``) under ``key``, evicting LRU entries to stay in bounds.

        Returns:
            True if stored. False when a bound is 0 or the value alone exceeds ``max_bytes``; any
            older value under ``key`` is then dropped, since it is stale.

        Raises:
            ValueError: ``nbytes`` is not a non-negative int.
        """
        if not is_int(nbytes, minimum=0):
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if self._max_entries == 0 or self._max_bytes == 0:
                return False
            if self._max_bytes is not None and nbytes > self._max_bytes:
                return False
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._over_bounds():
                _, (_, evicted_size) = self._entries.popitem(last=False)
                self._bytes -= evicted_size
                self._evictions += 1
            return True

    def discard(self, key: K) -> bool:
        """Remove ``key`` if stored; returns whether it was."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._bytes -= entry[1]
            return True

    def clear(self) -> None:
        """Drop all entries and reset the counters."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._hits = 0
            self._misses = 0
            self._evictions = 0

    def stats(self) -> dict[str, int]:
        """Snapshot of ``hits, misses, bytes, entries, evictions``."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "bytes": self._bytes,
                "entries": len(self._entries),
                "evictions": self._evictions,
            }

    def _over_bounds(self) -> bool:
        """Whether the entries exceed a bound (called with the lock held)."""
        if self._max_entries is not None and len(self._entries) > self._max_entries:
            return True
        return self._max_bytes is not None and self._bytes > self._max_bytes


# Marks "not stored" in lookups, since a stored value may itself be None.
_MISSING: Any = object()


class _Pending:
    """One in-flight computation that concurrent callers of the same key wait on."""

    __slots__ = ("done", "value", "error", "owner")

    def __init__(self, owner: int) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.owner = owner


class FeatureStore(Generic[V]):
    """Thread-safe LRU cache bounded by the total byte size of its values.

    Args:
        max_bytes: Byte budget. The sum of stored sizes never exceeds it; least-recently-used
            entries are evicted to make room. ``0`` disables storing: every
            :meth:`get_or_compute` call computes (hit/miss counts are still kept).
        size_fn: Returns a value's size in bytes; defaults to :func:`tensor_nbytes`.

    Counting: ``hits`` counts lookups answered without running a producer (including callers of
    :meth:`get_or_compute` that waited for another thread's in-flight computation); ``misses``
    counts lookups that found nothing (for :meth:`get_or_compute`, each producer run). So
    ``hits + misses`` equals the number of :meth:`get` and :meth:`get_or_compute` calls.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, size_fn: Callable[[Any], int] | None = None) -> None:
        if not is_int(max_bytes, minimum=0):
            raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
        self._max_bytes = max_bytes
        self._size_fn: Callable[[Any], int] = size_fn if size_fn is not None else tensor_nbytes
        self._lru: LRUCache[str, V] = LRUCache(max_bytes=max_bytes)
        # Guards the in-flight table together with the LRU lookups and stores that must be atomic
        # with it; the LRU's own lock is only ever taken inside this one.
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}

    # -- properties ------------------------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        """The byte budget this store was created with."""
        return self._max_bytes

    def __len__(self) -> int:
        """Number of stored entries."""
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored; does not count as a hit/miss nor refresh recency."""
        return key in self._lru

    # -- core operations ---------------------------------------------------------------------

    def get(self, key: str) -> V | None:
        """Return the value stored under ``key`` (marking it most recently used), or ``None``."""
        return self._lru.get(key)

    def put(self, key: str, value: V) -> bool:
        """Store ``value`` under ``key``, evicting LRU entries to stay within budget.

        Returns:
            True if stored. False when caching is disabled or the value alone exceeds
            ``max_bytes``; any older value under ``key`` is then dropped, since it is stale.
        """
        return self._lru.put(key, value, self._measure(value))

    def get_or_compute(self, key: str, fn: Callable[[], V]) -> V:
        """Return the cached value for ``key``, or compute it with ``fn()`` and cache it.

        Concurrent callers asking for the same missing key share one ``fn`` run: the first
        runs it, the others wait and receive the same result object (or the same exception;
        failures are not cached, so a later call retries). With ``max_bytes == 0`` every call
        runs ``fn``.

        Raises:
            RuntimeError: ``fn`` itself asks for the same key (it would wait on itself forever).
            Exception: Whatever ``fn`` raises.
        """
        if self._max_bytes == 0:
            self._lru.record(hit=False)
            return fn()
        me = threading.get_ident()
        pending: _Pending | None = None
        with self._lock:
            value = self._lru.get(key, _MISSING, record=False)
            if value is not _MISSING:
                self._lru.record(hit=True)
                return value  # type: ignore[no-any-return]
            waiting = self._pending.get(key)
            if waiting is not None:
                if waiting.owner == me:
                    raise RuntimeError(f"FeatureStore.get_or_compute({key!r}) called recursively from its own producer")
                self._lru.record(hit=True)
            else:
                self._lru.record(hit=False)
                pending = _Pending(me)
                self._pending[key] = pending

        if waiting is not None:
            waiting.done.wait()
            if waiting.error is not None:
                raise waiting.error
            return waiting.value  # type: ignore[no-any-return]

        assert pending is not None
        try:
            value = fn()
            size = self._measure(value)
        except BaseException as exc:
            with self._lock:
                self._pending.pop(key, None)
            pending.error = exc
            pending.done.set()
            raise
        with self._lock:
            # Store before clearing the in-flight marker (both under the lock) so a new caller
            # sees either the pending computation or the stored value, never a gap to recompute.
            self._lru.put(key, value, size)
            self._pending.pop(key, None)
        pending.value = value
        pending.done.set()
        return value

    def discard(self, key: str) -> bool:
        """Remove ``key`` if stored; returns whether it was."""
        return self._lru.discard(key)

    def stats(self) -> dict[str, int]:
        """Snapshot of ``hits, misses, bytes, entries, evictions, max_bytes``."""
        return {**self._lru.stats(), "max_bytes": self._max_bytes}

    def clear(self) -> None:
        """Drop all entries and reset the counters (in-flight computations still finish)."""
        self._lru.clear()

    # -- internals ---------------------------------------------------------------------------

    def _measure(self, value: Any) -> int:
        """Size of ``value`` via ``size_fn``, validated (done outside the lock: it may be slow)."""
        size = self._size_fn(value)
        if not is_int(size, minimum=0):
            raise ValueError(f"size_fn must return a non-negative int, got {size!r}")
        return size
