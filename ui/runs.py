"""One run of the steering inspector: its request, and the job that decodes its rows (the chosen method, and
Floor and the drafter alone for comparison) on the app's scheduler and collects their events for the page."""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asymspec_mm.request.request import Request, request_of

from .conversation import user_message
from .errors import DemoInputError

if TYPE_CHECKING:  # pragma: no cover
    from .conversation import ConversationStart

log = logging.getLogger("asymspec_mm.ui")


@dataclass
class _RunInputs:
    """A run's checked inputs: the loaded image, the view arguments and the comparison runs; :meth:`requests` makes
    the engine requests of its rows."""

    image: Any
    question: str
    caption: str | None
    ocr: str | bool | None
    method: str
    overrides: dict
    compare: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    warning: str | None = None  # the request is outside what the loaded pair can answer (the tiny pair)
    setup: str = "prefill"  # what setting its first row up does, for the status (ui.progress.setup_steps)
    #: Where the run stands in its session's conversation (the earlier turns it follows); None: no conversation.
    conversation: ConversationStart | None = None
    #: The OpenAI function tools the run offers (checked; None: none) and its ``tool_choice``.
    tools: list[dict] | None = None
    tool_choice: Any = None

    def messages(self) -> list[dict[str, Any]] | None:
        """The conversation the rows answer (None: a first turn, one question about the image)."""
        messages = self.conversation.messages(self.image, self.question) if self.conversation is not None else None
        if (self.tools or "compression" in self.overrides) and messages is None:
            # tools and compression need a conversation: a first turn is one user message
            messages = [user_message(self.question, self.image)]
        return messages

    def requests(self, methods: Iterable[str]) -> Iterator[Request]:
        """The engine :class:`~asymspec_mm.request.request.Request` of each row, one per method (the main one, then the
        comparisons), built as every edge builds one (``request_of``; checked when the scheduler adds it)."""
        messages = self.messages()
        tools = dict(tools=self.tools, tool_choice=self.tool_choice) if self.tools else {}
        for method in methods:
            fields = dict(caption=self.caption, ocr=self.ocr, method=method, **self.overrides)
            if messages is None:
                yield request_of(image=self.image, question=self.question, **fields)
            else:  # a follow-up or tools: every row answers the same conversation
                yield request_of(messages=messages, **tools, **fields)


def _file_path(payload: Any) -> str | None:
    """The server-side path of an uploaded file payload (Gradio FileData dict) or None."""
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    if isinstance(payload, (str, os.PathLike)):
        return str(payload)
    path = getattr(payload, "path", None)
    if path:
        return str(path)
    raise DemoInputError("the image input is not a file upload")


class _Job:
    """One request of the page: its rows in the app's scheduler (the main method, then the comparisons, submitted
    together so that they and other users' rows share decoding steps), one thread per row that records each
    step's committed events and wakes the handler through :attr:`q`, and what has been decoded so far (read by
    the handler and by Stop). The handler may run on any thread; nothing here holds the pipeline's lock."""

    #: Stop decoding when the page has not collected committed tokens for this long (the client went away
    #: without Gradio closing the handler), so an abandoned request does not hold rows of the batch.
    abandon_after_s = 30.0

    def __init__(self, scheduler: Any, req: _RunInputs, session: str | None = None) -> None:
        self.scheduler = scheduler
        self.req = req
        self.session = session
        #: Panel keys, in submission order: "main", then the comparison methods.
        self.keys: tuple[str, ...] = ("main", *req.compare)
        self.methods = {"main": req.method, **{m: m for m in req.compare}}
        self.handles: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] | None = None
        self.traces: dict[str, list] = {k: [] for k in self.keys}
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self.stopped: set[str] = set()  # rows cancelled before they finished
        self.lock = threading.Lock()
        self.cancel = threading.Event()  # Stop, the client went away, or the app closes
        self.frozen: _Snapshot | None = None  # what a stopped job shows (taken once, when it is stopped)
        self.final_shown = False  # the handler showed the final answer or an error: Stop leaves the page alone
        self.ended_at: float | None = None  # when the handler ended (monotonic)
        self.ended = threading.Event()
        self.t0 = time.perf_counter()
        self.t_end: float | None = None
        self.q: queue.Queue = queue.Queue()
        self.last_read = time.monotonic()
        self.reader_waiting = False

    def start(self) -> _Job:
        """Submit every row (bad settings raise here; rows already submitted are then cancelled) and listen to each
        row's updates (:meth:`Handle.listen`: on the scheduler's thread, no thread per row); returns self."""
        self.messages = self.req.messages()  # what the rows read (None: a first turn, one question about the image)
        try:
            for key, request in zip(self.keys, self.req.requests(self.methods[key] for key in self.keys)):
                self.handles[key] = self.scheduler.add(request)
        except BaseException:
            self.stop()
            raise
        for key, handle in self.handles.items():
            handle.listen(functools.partial(self._on_update, key))
        return self

    def stop(self) -> None:
        """Cancel every row (each leaves the batch at the next step boundary) and freeze what the page shows."""
        with self.lock:
            if self.frozen is None:
                self.frozen = self._snapshot()
                self.t_end = self.t_end or time.perf_counter()
            self.cancel.set()
        for handle in list(self.handles.values()):
            handle.cancel()

    def _on_update(self, key: str, kind: str, value: Any) -> None:
        """One row's update (``events``, then its ``result`` or ``error``; a cancellation is a ``CancelledError``), on
        the scheduler's thread: kept under the job's lock and handed to the reader."""
        if kind == "events":
            with self.lock:
                self.traces[key].extend(value)
            self.q.put((key, "events"))
            self._check_abandoned()
            return
        with self.lock:
            if kind == "result":
                self.results[key], outcome = value, "done"
            elif isinstance(value, CancelledError):
                self.stopped.add(key)
                outcome = "stopped"
            else:  # reported to the page; the server keeps serving
                self.errors[key], outcome = value, "error"
        self.q.put((key, outcome))

    def _check_abandoned(self) -> None:
        """Stop when the reader has left items unread for :attr:`abandon_after_s`."""
        idle = time.monotonic() - self.last_read
        if not self.cancel.is_set() and not self.reader_waiting and not self.q.empty() and idle > self.abandon_after_s:
            log.warning("the client stopped reading; abandoning the request")
            self.stop()

    def get(self, timeout: float | None = None) -> tuple[str, str] | None:
        """The next (key, kind) item for the handler (the reader); None after ``timeout`` seconds without one."""
        self.reader_waiting = True
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        finally:
            self.reader_waiting = False
            self.last_read = time.monotonic()

    def settled(self) -> bool:
        """Whether every row has finished, failed or been cancelled."""
        with self.lock:
            return all(k in self.results or k in self.errors or k in self.stopped for k in self.keys)

    def _snapshot(self) -> _Snapshot:
        return _Snapshot({k: list(v) for k, v in self.traces.items()}, dict(self.results), dict(self.errors), set(self.stopped))

    def snapshot(self) -> _Snapshot:
        """What the page shows: the frozen state of a stopped job, else the rows as decoded so far."""
        with self.lock:
            return self.frozen if self.frozen is not None else self._snapshot()

    def elapsed(self) -> float:
        return (self.t_end or time.perf_counter()) - self.t0


@dataclass
class _Snapshot:
    """A job's rows at one moment: traces, results, errors and the rows cancelled before they finished."""

    traces: dict[str, list]
    results: dict[str, Any]
    errors: dict[str, BaseException]
    stopped: set[str]

    def state(self, key: str, stopping: bool) -> str:
        """done, error, stopped (cancelled, or unfinished when the job was stopped) or running."""
        if key in self.results:
            return "done"
        if key in self.errors:
            return "error"
        if key in self.stopped or stopping:
            return "stopped"
        return "running"
