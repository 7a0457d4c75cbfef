"""A thread-safe, byte-budgeted LRU cache for computed vision features.

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
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["DEFAULT_MAX_BYTES", "FeatureStore", "tensor_nbytes"]

#: Default byte budget: 256 MiB.
DEFAULT_MAX_BYTES: int = 256 * 2**20

V = TypeVar("V")

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
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
        self._max_bytes = max_bytes
        self._size_fn: Callable[[Any], int] = size_fn if size_fn is not None else tensor_nbytes
        self._lock = threading.Lock()
        # OrderedDict order is recency: first = least recently used, last = most recent.
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    # -- properties ------------------------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        """The byte budget this store was created with."""
        return self._max_bytes

    def __len__(self) -> int:
        """Number of stored entries."""
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored; does not count as a hit/miss nor refresh recency."""
        with self._lock:
            return key in self._entries

    # -- core operations ---------------------------------------------------------------------

    def get(self, key: str) -> V | None:
        """Return the value stored under ``key`` (marking it most recently used), or ``None``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: str, value: V) -> bool:
        """Store ``value`` under ``key``, evicting LRU entries to stay within budget.

        Returns:
            True if stored. False when caching is disabled or the value alone exceeds
            ``max_bytes``; any older value under ``key`` is then dropped, since it is stale.
        """
        size = self._measure(value)
        with self._lock:
            return self._store_locked(key, value, size)

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
        me = threading.get_ident()
        waiting: _Pending | None = None
        pending: _Pending | None = None
        with self._lock:
            if self._max_bytes == 0:
                self._misses += 1
            else:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    self._hits += 1
                    return entry[0]
                waiting = self._pending.get(key)
                if waiting is not None:
                    if waiting.owner == me:
                        raise RuntimeError(f"FeatureStore.get_or_compute({key!r}) called recursively from its own producer")
                    self._hits += 1
                else:
                    self._misses += 1
                    pending = _Pending(me)
                    self._pending[key] = pending

        if self._max_bytes == 0:
            return fn()
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
            self._store_locked(key, value, size)
            self._pending.pop(key, None)
        pending.value = value
        pending.done.set()
        return value

    def discard(self, key: str) -> bool:
        """Remove ``key`` if stored; returns whether it was."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._bytes -= entry[1]
            return True

    def stats(self) -> dict[str, int]:
        """Snapshot of ``hits, misses, bytes, entries, evictions, max_bytes``."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "bytes": self._bytes,
                "entries": len(self._entries),
                "evictions": self._evictions,
                "max_bytes": self._max_bytes,
            }

    def clear(self) -> None:
        """Drop all entries and reset the counters (in-flight computations still finish)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._hits = 0
            self._misses = 0
            self._evictions = 0

    # -- internals ---------------------------------------------------------------------------

    def _measure(self, value: Any) -> int:
        """Size of ``value`` via ``size_fn``, validated (done outside the lock: it may be slow)."""
        size = self._size_fn(value)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"size_fn must return a non-negative int, got {size!r}")
        return size

    def _store_locked(self, key: str, value: V, size: int) -> bool:
        """Insert under the held lock and evict LRU entries until within budget."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if self._max_bytes == 0 or size > self._max_bytes:
            return False
        self._entries[key] = (value, size)
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, (_, evicted_size) = self._entries.popitem(last=False)
            self._bytes -= evicted_size
            self._evictions += 1
        return True
