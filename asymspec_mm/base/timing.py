"""Timing helpers for the benchmark: a sync-aware clock, timing proxies for engines, a timer for the loops.

:class:`TimedEngine` wraps any single-row engine of :mod:`asymspec_mm.engines` and implements the same stream
interface (``name``, ``length``, ``tokens_forwarded``, ``forward_calls``, ``device``, ``prefill``,
``extend``, ``truncate``); every call is timed and recorded. :class:`TimedStorage` does the same for a row
storage of the engine core (its ``extend``), which takes it through
:class:`~asymspec_mm.engines.RowStorages`' ``wrap``. :class:`BucketTimer` is the ``timer`` the
decoding loops enter around the gate and the trace's top-k (:func:`asymspec_mm.decode.steps_for`).

On CUDA the clock synchronizes the device before it is read, so a time covers the kernels of the
call and nothing queued before it. That adds syncs the plain loop does not have, which is why the
benchmark takes throughput from un-instrumented runs on CUDA (see :mod:`asymspec_mm.bench`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Clock:
    """``perf_counter`` that first waits for the device when ``sync`` is on (CUDA)."""

    def __init__(self, sync: bool = False):
        import torch

        self.sync = bool(sync) and torch.cuda.is_available()
        self._torch = torch

    def now(self) -> float:
        if self.sync:
            self._torch.cuda.synchronize()
        return time.perf_counter()


@dataclass
class CallRecord:
    """One engine call: ``op`` (prefill / extend / truncate), tokens it forwarded, seconds, and whether it
    happened during decoding (after :meth:`TimedEngine.mark_decode`)."""

    op: str
    n: int
    seconds: float
    decode: bool


@dataclass
class Ledger:
    """Where a run's time went: engine calls per stream and named function buckets (gate, trace)."""

    calls: dict[str, list[CallRecord]] = field(default_factory=dict)
    buckets: dict[str, float] = field(default_factory=dict)
    bucket_calls: dict[str, int] = field(default_factory=dict)

    def add_bucket(self, name: str, seconds: float) -> None:
        self.buckets[name] = self.buckets.get(name, 0.0) + seconds
        self.bucket_calls[name] = self.bucket_calls.get(name, 0) + 1

    def forward_seconds(self, stream: str, decode_only: bool = True) -> float:
        return sum(r.seconds for r in self.calls.get(stream, ()) if r.op in ("extend", "prefill") and (r.decode or not decode_only))

    def truncate_seconds(self) -> float:
        return sum(r.seconds for recs in self.calls.values() for r in recs if r.op == "truncate")

    def extend_costs(self) -> dict[str, dict[int, list[float]]]:
        """Decode-phase extend times per stream and per number of tokens forwarded in the call."""
        out: dict[str, dict[int, list[float]]] = {}
        for stream, recs in self.calls.items():
            for r in recs:
                if r.op == "extend" and r.decode:
                    out.setdefault(stream, {}).setdefault(r.n, []).append(r.seconds)
        return out


class TimedEngine:
    """A timing proxy with the stream interface of :class:`asymspec_mm.engines.Engine`.

    Anything else (``cache``, ``model``, ``rope_delta``...) is read through to the wrapped engine.
    """

    def __init__(self, engine: Any, ledger: Ledger, clock: Clock | None = None):
        self._engine = engine
        self.name = engine.name
        self._ledger = ledger
        self._clock = clock or Clock()
        self._decode = False
        ledger.calls.setdefault(self.name, [])

    # -- the stream interface -------------------------------------------------------------
    @property
    def length(self) -> int:
        return self._engine.length

    @property
    def tokens_forwarded(self) -> int:
        return self._engine.tokens_forwarded

    @property
    def forward_calls(self) -> int:
        return self._engine.forward_calls

    @property
    def device(self):
        return self._engine.device

    def prefill(self, ids: torch.Tensor, *args, **kwargs) -> None:
        before = self._engine.tokens_forwarded
        t0 = self._clock.now()
        self._engine.prefill(ids, *args, **kwargs)
        self._record("prefill", self._engine.tokens_forwarded - before, self._clock.now() - t0)

    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        t0 = self._clock.now()
        out = self._engine.extend(ids)
        self._record("extend", int(ids.shape[-1]), self._clock.now() - t0)
        return out

    def truncate(self, length: int) -> None:
        t0 = self._clock.now()
        self._engine.truncate(length)
        self._record("truncate", 0, self._clock.now() - t0)

    # -- bookkeeping ----------------------------------------------------------------------
    def mark_decode(self) -> None:
        """Calls from now on belong to the decoding loop (prefill excluded from the step split)."""
        self._decode = True

    def _record(self, op: str, n: int, seconds: float) -> None:
        self._ledger.calls[self.name].append(CallRecord(op, n, seconds, self._decode))

    def __getattr__(self, name: str):
        # Only reached for attributes not defined on the proxy.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._engine, name)

    def __repr__(self) -> str:
        return f"TimedEngine({self._engine!r})"


class TimedStorage:
    """A timing proxy of a row storage of the engine core (:class:`~asymspec_mm.engines.paged_rows.PagedBatchEngine`):
    each ``extend`` is timed and recorded in ``ledger`` under the storage's ``name`` (the stream it was built for),
    with the tokens it appended (every row's ids, and the prompt pieces it carried).

    A forward that carries arriving rows' prompt pieces (``extend(ids, prompts=...)``, the prefill turns) is recorded
    as a ``prefill`` call outside the decode phase, so :meth:`Ledger.forward_seconds` and :meth:`Ledger.extend_costs`
    hold the decode forwards alone. Anything else is read and written through to the storage; rollbacks go through
    its rows' views, so no truncate is recorded (a paged rollback is a block table's length, no model call).
    """

    def __init__(self, storage: Any, ledger: Ledger, clock: Clock | None = None):
        self._storage = storage
        self._ledger = ledger
        self._clock = clock or Clock()

    def extend(self, ids: dict[int, torch.Tensor], prompts: dict[int, Any] | None = None) -> dict[int, torch.Tensor]:
        """``ids`` ``{row: [n_r]}`` appended (``prompts``: ``{row: PrefillChunk}`` riding along), timed."""
        t0 = self._clock.now()
        out = self._storage.extend(ids, prompts=prompts) if prompts else self._storage.extend(ids)
        seconds = self._clock.now() - t0
        n = sum(int(t.numel()) for t in ids.values()) + sum(int(p.ids.numel()) for p in (prompts or {}).values())
        op = "prefill" if prompts else "extend"
        self._ledger.calls.setdefault(self._storage.name, []).append(CallRecord(op, n, seconds, decode=not prompts))
        return out

    def __getattr__(self, name: str):
        # Only reached for attributes not defined on the proxy.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._storage, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # the core sets the storage's own attributes (its peak measure): they belong to the storage
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._storage, name, value)

    def __repr__(self) -> str:
        return f"TimedStorage({self._storage!r})"


def wrap_streams(streams: dict[str, Any], ledger: Ledger, clock: Clock | None = None, *, decode: bool = False) -> dict[str, TimedEngine]:
    """A timing proxy for each stream; ``decode``: their calls count as decoding from the start (streams
    wrapped after their prefill)."""
    wrapped = {name: TimedEngine(e, ledger, clock) for name, e in streams.items()}
    if decode:
        for e in wrapped.values():
            e.mark_decode()
    return wrapped


class BucketTimer:
    """The decoding loops' ``timer`` (:data:`asymspec_mm.decode.Timer`): ``with timer(name):`` adds the block's
    seconds to bucket ``name`` of ``ledger``. Only the outermost of nested blocks counts, so time inside
    a block is never counted in two buckets."""

    def __init__(self, ledger: Ledger, clock: Clock | None = None):
        self.ledger = ledger
        self.clock = clock or Clock()
        self._depth = 0

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._depth += 1
        t0 = self.clock.now()
        try:
            yield
        finally:
            self.ledger.add_bucket(name, self.clock.now() - t0)
            self._depth -= 1


def median(values: list[float]) -> float:
    """Median (mean of the two middle values for an even count); NaN for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
