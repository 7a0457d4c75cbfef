"""Set-up on a small pool of threads: several requests are set up at once, none waits in line behind another's.

A request's set-up (:meth:`~asymspec_mm.request.preparing.RequestPreparer.set_up` with ``prefill=False``: its images,
caption, OCR, prompts, grammar) spends most of its time waiting: for its caption, a row the decode loop decodes, for
its vision tower's call, which the loop runs between two steps, and for OCR in the ``--ocr-workers`` processes. With
one set-up thread a burst of new images was set up one after another, each waiting out its caption before the next
could start. :class:`SetupPool` runs ``setup_workers`` threads instead (a mixin of
:class:`~asymspec_mm.core.scheduler.Scheduler`, whose lines and lock it shares): while one waits for its caption,
another renders its templates, compiles its grammar or reads its OCR, and their captions share the loop's steps.

Set-up may end out of order; admission stays the policy's: a request set up joins the ready line in priority, then
arrival order (:func:`ready_position`), so it never passes a request that goes before it and was set up earlier.

What a set-up touches from several threads at once, and why that is safe: the vision feature store computes each
image once however many ask (:class:`vision_cache.store.FeatureStore`, a lock and an in-flight table); the caption
cache is a locked LRU, and a caption two set-ups ask for at once is written once (the drafter's captioner lets the
second wait for the first's row); the prefix store (locked) is only asked its size here, its lookups run in the loop
when a row joins; the grammar compiler compiles under its lock, one grammar at a time
(:class:`~asymspec_mm.request.grammar.GrammarCompiler`); the fast
tokenizers are only read (encoding and decoding borrow the Rust tokenizer shared; only a change of its truncation or
padding settings borrows it exclusively, which set-up never asks of the pair's tokenizers, and the LLMLingua-2
compressor, whose calls switch truncation on and off, tokenizes under its own lock). Each set-up counts its own
vision calls in its thread's context (:meth:`vision_cache.features.VisionEncoder.thread_counts`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .request_state import RequestState, RequestStatus, prompt_counts

if TYPE_CHECKING:
    from collections import deque

    from .request_state import RequestTable

#: Set-up threads of a scheduler unless it says otherwise (``setup_workers=``, ``serve --setup-workers``).
DEFAULT_SETUP_WORKERS = 4

_SETTING_UP: ContextVar[int | None] = ContextVar("asymspec_setting_up", default=None)


def setting_up() -> int | None:
    """The id of the request the calling thread is setting up (a caption it asks for is that request's child), or
    ``None`` outside a set-up."""
    return _SETTING_UP.get()


def ready_position(line: Sequence[tuple[float, int]], order: tuple[int, int]) -> int:
    """Where a request just set up, of ``order`` ``(priority, id)``, joins a ready line whose requests have the orders
    ``line``: before the first that goes after it (a higher priority value, or the same and a later arrival), so that
    a set-up ending early never lets its request pass one that goes first."""
    for i, other in enumerate(line):
        if other > order:
            return i
    return len(line)


class SetupPool:
    """The scheduler's set-up threads (see the module docstring); the scheduler provides the state it reads."""

    _cond: threading.Condition
    _waiting: deque[int]
    _ready: deque[int]
    _table: RequestTable
    _setting_up: set[int]
    _closing: bool
    error: Any
    pipe: Any
    max_batch_size: int
    wakeups: dict[str, int]  # the scheduler's count of worker wake-ups
    _end: Callable[..., None]  # the scheduler's: a request leaves the table with its answer or error
    _stop_on: Callable[[BaseException], None]  # the scheduler's: a worker thread stopped

    def _start_setup(self, workers: int) -> list[threading.Thread]:
        """Start ``workers`` set-up threads (each named ``asymspec-setup``)."""
        threads = [threading.Thread(target=self._prepare_loop, name="asymspec-setup", daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        return threads

    def _room(self) -> bool:
        """Whether one more request may be set up (called with ``_cond`` held): a request set up holds no KV (its
        prompts are prefilled once it has a row), so up to a batch of them wait set up or being set up, ready to take
        the rows that free."""
        return len(self._ready) + len(self._setting_up) < self.max_batch_size

    def _prepare_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while self.error is None and not (self._waiting and self._room()) and not (self._closing and not self._waiting):
                        self._cond.wait()
                        self.wakeups["setup"] += 1
                    if self.error is not None or not self._waiting:
                        return
                    rid = self._waiting.popleft()
                    self._setting_up.add(rid)
                    state = self._table[rid]
                    state.move(RequestStatus.SETTING_UP)
                self._prepare(state)
        except BaseException as exc:  # noqa: BLE001 - a dead thread must not leave callers waiting forever
            self._stop_on(exc)

    def _prepare(self, state: RequestState) -> None:
        """Set one request up; it joins the ready line in its place, or fails its own handle (a bad image, a context
        overflow)."""
        from ..engines.model_calls import using_loop  # here: the command line reads this module's default without torch

        session = None
        if state.handle.cancelled:
            self._end(state.rid, error=cancelled_error(state.handle))
        else:
            token = _SETTING_UP.set(state.rid)
            try:
                with using_loop(self):  # its model calls (the tower, a caption's tokens) run in the decode loop
                    # its timings and what set-up measures go on its record (session.record is state)
                    session = self.pipe.set_up(state.request, prefill=False, record=state)
            except Exception as exc:  # noqa: BLE001 - the error belongs to this request's handle
                # cancelled while it set up (its caption was cancelled with it): it fails as cancelled, not on the caption
                self._end(state.rid, error=cancelled_error(state.handle) if state.handle.cancelled else exc)
            finally:
                _SETTING_UP.reset(token)
        with self._cond:
            self._setting_up.discard(state.rid)
            if session is not None and state.rid in self._table:
                state.work = session
                state.set_prompts(*prompt_counts(session.to_prefill))  # by stream: its storages are chosen on joining
                state.move(RequestStatus.READY)
                line = [_order(self._table.get(rid), rid) for rid in self._ready]
                self._ready.insert(ready_position(line, state.order), state.rid)
            self._cond.notify_all()


def _order(state: RequestState | None, rid: int) -> tuple[float, int]:
    """A ready request's place in line (one already gone counts as first: it leaves at the next turn)."""
    return (float("-inf"), rid) if state is None else state.order


def cancelled_error(handle: Any) -> BaseException:
    """What a cancelled request fails with: the error its canceller gave, else a :class:`CancelledError`."""
    from concurrent.futures import CancelledError

    return handle.cancel_error or CancelledError(f"request {handle.id} was cancelled")
