"""The models' lock: re-entrant and granted in arrival order.

Requests set up on one thread (caption tokens, prefills) and rows decoded on another take turns at the
models one model call at a time. A plain lock lets the thread that just released it take it straight back
(its loop is back at ``acquire`` before the waiter wakes), so one side could run hundreds of calls while
the other waits; granting the lock first come, first served makes them alternate.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class FairRLock:
    """A re-entrant lock whose waiters get it in the order they asked (FIFO); usable as a context manager."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._line: deque[object] = deque()
        self._takers: set[str] | None = None  # the names of the threads that took it, while recorded

    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Within the block, the names of the threads that take the lock are added to the set it yields (which
        threads run model calls: with an engine loop running, only the loop's)."""
        takers: set[str] = set()
        self._takers = takers
        try:
            yield takers
        finally:
            self._takers = None

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            ticket = object()
            self._line.append(ticket)
            while self._owner is not None or self._line[0] is not ticket:
                self._cond.wait()
            self._line.popleft()
            self._owner, self._depth = me, 1
            if self._takers is not None:
                self._takers.add(threading.current_thread().name)
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a FairRLock held by another thread")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> FairRLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
