"""The output side of the engine loop: token ids in, texts and answers out, on a thread of their own.

The decode thread hands each step's committed :class:`~asymspec_mm.decode.TokenEvent` lists (token ids, no text) and
each request's end to an :class:`OutputProcessor`; its thread (``asymspec-output``) fills every event's ``text``
(the token decoded alone, as the single-request path does), makes a finished answer's text (the whole answer decoded,
cut at its first stop string, its tool calls parsed: :func:`~asymspec_mm.request.session.with_answer_text`) and hands
both to the request's :class:`~asymspec_mm.core.handle.Handle` in the order they came, so a handle's listener runs
here too, never on the decode thread. vLLM v1 splits its engine the same way (its ``OutputProcessor`` detokenizes
what the engine core returns), in another process; here a thread is enough: detokenizing is Rust code that releases
the interpreter's lock.

What stays on the decode thread is the stop-string check (:func:`~asymspec_mm.request.preparing.stop_fn`, only for
rows that have stop strings): its verdict decides whether the row takes part in the next step, so it must be known
before that step. Done here it would come a step late: the row would decode one more step than it does alone (vLLM
accepts that and drops the surplus; here the answer's token ids, trace, step count and the KV stored for its next
turn would all differ). The check decodes only the answer's tail (the longest stop string's length in tokens, plus
a few), once per step of such a row.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from ..request.session import MMResult, with_answer_text

log = logging.getLogger(__name__)

_STOP = object()


class OutputProcessor:
    """One thread that detokenizes and delivers every handle's updates, in order (see the module docstring).

    ``tokenizer`` decodes the answers' token ids (the pipeline's ``tokenizer``: the verifier's ids). After
    :meth:`close`, updates are delivered on the caller's thread (a set-up failing late, once the loop is gone)."""

    def __init__(self, tokenizer: Any, name: str = "asymspec-output"):
        self.tokenizer = tokenizer
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def events(self, handle: Any, events: list) -> None:
        """One step's committed events of ``handle``'s row (their ``text`` filled in before the handle gets them).
        While nobody reads the handle's steps (a caller waiting for the answer alone) the handle holds them and this
        thread is not woken: they come with the answer, or with :meth:`held` once a reader comes."""
        if not handle._hold_step(self, events):
            self._put(("events", handle, events))

    def held(self, handle: Any, steps: list[list]) -> None:
        """``handle``'s steps held until a reader came (:meth:`Handle._read_steps`), in order."""
        self._put(("held", handle, steps))

    def finish(self, handle: Any, result: Any = None, error: BaseException | None = None) -> None:
        """``handle``'s request ended with ``result`` (an :class:`MMResult` whose text is made here, or a caption's
        tokens) or ``error``; delivered after its events."""
        self._put(("finish", handle, result, error))

    def close(self) -> None:
        """Deliver what is queued, then stop the thread (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _put(self, item: tuple) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put(item)
                return
        self._deliver(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._deliver(item)
            except Exception:  # noqa: BLE001 - one request's delivery must not stop everyone's
                log.exception("output processor: delivering an update failed")

    def _deliver(self, item: tuple) -> None:
        kind, handle = item[0], item[1]
        if kind == "events":
            self._hand(handle, item[2])
            return
        for events in item[2] if kind == "held" else handle.held_steps():  # held steps before the answer
            self._hand(handle, events)
        if kind == "held":
            return
        result, error = item[2], item[3]
        if error is None and isinstance(result, MMResult):
            try:
                result = with_answer_text(result, self.tokenizer)
            except Exception as exc:  # noqa: BLE001 - the request fails alone, with the reason
                result, error = None, exc
        handle._finish(result, error)

    def _hand(self, handle: Any, events: list) -> None:
        """One step's ``events`` to ``handle``, each token's text filled in."""
        if handle.kind.answers:  # a caption's or completion's events are never read: only its tokens are wanted
            for ev in events:
                ev.text = self.tokenizer.decode([ev.token_id])
        handle._step(events)
