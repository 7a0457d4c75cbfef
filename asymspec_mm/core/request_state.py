"""One record per request the engine loop holds: :class:`RequestState` in a :class:`RequestTable`.

A request's state is its :class:`RequestStatus`, not the container that holds it: the scheduler's lines (not set up,
set up and waiting for a row) hold request ids, and everything else about a request (its checked
:class:`~asymspec_mm.request.request.Request`, its set-up :class:`~asymspec_mm.request.session.Session`, its
:class:`~asymspec_mm.core.handle.Handle`, the prompt tokens each stream has computed, its timings) lives in its
record. The statuses and their transitions (vLLM v1's ``RequestStatus``, with the set-up this engine does before a
request can take a row)::

    WAITING -> SETTING_UP -> READY -> PREFILLING -> RUNNING -> FINISHED_STOPPED | FINISHED_LENGTH
                               ^          |  ^           |
                               +----------+  |           v
                             (taken back out |      PREEMPTED (its KV dropped, rebuilt later)
                              to make room)  +-----------+
    any status -> ABORTED (cancelled) | FAILED (its own error)

A request's :class:`RequestKind` says what it is for and where it enters: a caller's request (``ANSWER``) enters
``WAITING`` and is set up; a caption the set-up asks for (``CAPTION``) is a child request of the request being set
up (:attr:`RequestState.parent`, :meth:`RequestTable.children`): it comes with its prompt, so it enters ``READY``,
ahead of the requests waiting to join, and goes on from there as every request does (its own id, handle, statuses
and timings); a cancelled parent takes its children with it (:meth:`RequestTable.abandoned`). A ``SUMMARY`` (the
``summary`` compressor's model-written summary of a message of the request's context) is a child the same way. A ``COMPLETION`` (the
verifier's tokens for ``pipe.complete`` while a loop runs) enters ``READY`` too, with no parent::

    ANSWER:             WAITING -> SETTING_UP -> READY -> ...
    CAPTION, SUMMARY (children):                 READY -> PREFILLING -> RUNNING -> FINISHED_*   (their parent SETTING_UP)
    COMPLETION:                                  READY -> ...

The record is the engine's state of a request (vLLM v1's ``Request`` less its inputs): status, each stream's prompt
tokens and how many are computed, the decoder's row while it decodes, preemptions, timings, what set-up and prefill
measured (a :class:`~asymspec_mm.request.record.RequestRecord`, which a request set up without a loop has too),
handle. What set-up made of the request (the prompts, the view, the streams, the grammar: a
:class:`~asymspec_mm.request.session.Session`, vLLM's processed ``EngineCoreRequest``) is the record's
:attr:`~RequestState.work`, read, not changed, by the loop (the batched prefill advances copies of its prompts).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..request.record import RequestRecord

if TYPE_CHECKING:
    from ..engines.model_calls import TokenRequest
    from ..request.request import Request


class RequestStatus(enum.Enum):
    """Where a request stands (:attr:`stage` is the word :attr:`Handle.stage` shows)."""

    WAITING = enum.auto()  # in the line, not set up yet
    SETTING_UP = enum.auto()  # image, caption, OCR, prompts being prepared on the set-up thread
    READY = enum.auto()  # set up (holds no KV), waiting for a row
    PREFILLING = enum.auto()  # has a row; its prompts (or a preempted row's prompt and tokens) are being prefilled
    RUNNING = enum.auto()  # decoded each step
    PREEMPTED = enum.auto()  # its KV dropped to make room; rebuilt from its prompt and tokens when it resumes
    FINISHED_STOPPED = enum.auto()  # ended by EOS, a stop string or a tool call
    FINISHED_LENGTH = enum.auto()  # ended by its token budget
    ABORTED = enum.auto()  # cancelled by its caller
    FAILED = enum.auto()  # failed on its own error (a bad image, a failing forward), or the worker stopped

    @property
    def stage(self) -> str:
        """The word :attr:`Handle.stage` shows (``done`` for every finished status)."""
        return "done" if self.finished else _STAGES[self]

    @property
    def finished(self) -> bool:
        return self in FINISHED

    @property
    def has_row(self) -> bool:
        """Whether it counts against ``max_batch_size`` (admitted and not finished)."""
        return self in (RequestStatus.PREFILLING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)


_STAGES = {
    RequestStatus.WAITING: "queued",
    RequestStatus.SETTING_UP: "setting_up",
    RequestStatus.READY: "set_up",
    RequestStatus.PREFILLING: "prefill",
    RequestStatus.RUNNING: "decoding",
    RequestStatus.PREEMPTED: "preempted",
}

FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.ABORTED, RequestStatus.FAILED})


class RequestKind(enum.Enum):
    """What a request is for (the value is what :class:`~asymspec_mm.engines.model_calls.TokenRequest` names)."""

    ANSWER = "answer"  # a caller's request: set up, then answered with an MMResult, its steps streamed to its handle
    CAPTION = "caption"  # a child of the request being set up: the drafter's tokens for its image's caption
    SUMMARY = "summary"  # a child of the request being set up: a model's summary of a message of its context
    COMPLETION = "completion"  # the verifier's greedy tokens of a prompt (``pipe.complete`` while a loop runs)

    @property
    def entry(self) -> RequestStatus:
        """The status it enters the table in: a caller's request waits to be set up; a token request comes with its
        prompts (set up by whoever asked for it) and waits for a row."""
        return RequestStatus.WAITING if self is RequestKind.ANSWER else RequestStatus.READY

    @property
    def is_child(self) -> bool:
        """Whether the set-up of another request asks for it (it goes when that request is cancelled)."""
        return self in (RequestKind.CAPTION, RequestKind.SUMMARY)

    @property
    def answers(self) -> bool:
        """Whether its caller reads an answer (texts, a result) rather than token ids alone."""
        return self is RequestKind.ANSWER


#: The transitions a request may take (any status may also end ABORTED or FAILED).
TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset({RequestStatus.SETTING_UP}),
    RequestStatus.SETTING_UP: frozenset({RequestStatus.READY}),
    RequestStatus.READY: frozenset({RequestStatus.PREFILLING, RequestStatus.RUNNING}),
    RequestStatus.PREFILLING: frozenset({RequestStatus.RUNNING, RequestStatus.READY, RequestStatus.PREEMPTED}),
    RequestStatus.RUNNING: frozenset({RequestStatus.PREEMPTED, RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH}),
    RequestStatus.PREEMPTED: frozenset({RequestStatus.PREFILLING}),
}


class TransitionError(RuntimeError):
    """A status change the request's state machine does not allow (a bug in the engine loop, never the caller's)."""


@dataclass(eq=False)
class RequestState(RequestRecord):
    """Everything the engine knows about one request, under its id (see the module docstring).

    ``request`` is what its caller sent (never changed here): the checked
    :class:`~asymspec_mm.request.request.Request` of an ``ANSWER``, the
    :class:`~asymspec_mm.engines.model_calls.TokenRequest` of a caption or completion; ``work`` what set-up made of it
    (a :class:`~asymspec_mm.request.session.Session`; a token request is its own); ``computed`` the prompt tokens of
    each stream storage already in its KV (vLLM's ``num_computed_tokens``, per stream: a request has a prompt per
    stream)."""

    rid: int
    #: its :class:`~.handle.Handle`, the caller's view of this record (set by the handle; None in the policy's tests;
    #: typed loosely: handle.py imports this module)
    handle: Any = None
    request: Request | TokenRequest | None = None
    priority: int = 0
    status: RequestStatus = RequestStatus.WAITING
    work: Any = None
    kind: RequestKind = RequestKind.ANSWER
    parent: int | None = None  # the request whose set-up asked for this one (a caption's)
    #: the prompt tokens each stream storage has to prefill (by stream name while it waits for a row, by storage
    #: once it has one: a preempted row's are its prompt and the tokens it had cached); empty: nothing to prefill
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)
    #: the decoder's row decoding it (:class:`~asymspec_mm.decode.row.Row`) while it is RUNNING, else None
    row: Any = None
    preemptions: int = 0  # times its KV was dropped while it decoded (a PREFILLING row with some is resuming)
    alone_kv: int | None = None  # KV bytes it can need by itself (admission's bound), once measured
    #: when it entered the table (``time.monotonic()``)
    submitted_at: float = field(default_factory=time.monotonic)
    left_line_at: float | None = None  # when it left the line for a row (admitted, or dropped)
    finished_at: float | None = None  # when it ended
    #: when it entered each status (``time.monotonic()``): its handle's :attr:`~.handle.Handle.times`
    times: dict[RequestStatus, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.times.setdefault(self.status, self.submitted_at)

    @property
    def order(self) -> tuple[int, int]:
        """Who goes first: lower priority value, then earlier arrival (ids grow with arrival)."""
        return (self.priority, self.rid)

    @property
    def prompt_left(self) -> dict[str, int]:
        """The prompt tokens each stream storage has still to prefill (:attr:`prompt_tokens` less :attr:`computed`)."""
        return {name: n - self.computed.get(name, 0) for name, n in self.prompt_tokens.items()}

    @classmethod
    def of_token_request(cls, rid: int, handle: Any, request: TokenRequest, parent: int | None = None) -> RequestState:
        """The record of a token request (a caption, a summary, a completion): it comes with its prompts, so it enters
        at its kind's entry status with its prompt tokens counted; ``parent``: the request whose set-up asked for it."""
        kind = RequestKind(request.kind)
        state = cls(rid, handle, request, -1, kind.entry, work=request, kind=kind, parent=parent)
        state.set_prompts(*prompt_counts(request.to_prefill))
        return state

    def set_prompts(self, tokens: Mapping[str, int], computed: Mapping[str, int] | None = None) -> None:
        """Its prompts to prefill are now ``tokens`` per stream storage, ``computed`` of them in its KV already (a
        stored prefix found; ``None``: none)."""
        self.prompt_tokens, self.computed = dict(tokens), dict(computed or {})

    def move(self, status: RequestStatus) -> None:
        """Change status along :data:`TRANSITIONS` (or to a finished status from any live one); leaving RUNNING, it
        no longer has a decoder row."""
        if status is self.status:
            return
        if self.status.finished:
            raise TransitionError(f"request {self.rid} is {self.status.name}: it cannot become {status.name}")
        if status not in (RequestStatus.ABORTED, RequestStatus.FAILED) and status not in TRANSITIONS.get(self.status, ()):
            raise TransitionError(f"request {self.rid}: {self.status.name} -> {status.name} is not a transition")
        self.status = status
        if status is not RequestStatus.RUNNING:
            self.row = None
        self.times[status] = time.monotonic()
        if status.finished:
            self.finished_at = self.times[status]


def prompt_counts(prompts: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """``(tokens, computed)`` of ``prompts`` (name -> :class:`~asymspec_mm.engines.pieces.StreamPrompt`): each one's
    length and the tokens of it already in the KV, what :meth:`RequestState.set_prompts` takes."""
    return {name: int(p.ids.numel()) for name, p in prompts.items()}, {name: int(p.done) for name, p in prompts.items()}


def is_cancelled(state: RequestState) -> bool:
    """Whether ``state``'s caller cancelled it (a request stepped without a handle, on its caller's thread, never is)."""
    return state.handle is not None and state.handle.cancelled


class RequestTable:
    """The engine's requests by id, in arrival order (ids grow with arrival). Not thread-safe: the scheduler reads and
    writes it under its condition's lock."""

    def __init__(self) -> None:
        self._by_id: dict[int, RequestState] = {}

    def add(self, state: RequestState) -> RequestState:
        """Enter ``state``, at its kind's entry status (:attr:`RequestKind.entry`); a child's parent must be in the
        table (it is being set up)."""
        if state.rid in self._by_id:
            raise ValueError(f"request {state.rid} is already in the table")
        if state.status is not state.kind.entry:
            raise TransitionError(f"request {state.rid} ({state.kind.value}) enters {state.kind.entry.name}, not {state.status.name}")
        if state.parent is not None and state.parent not in self._by_id:
            raise ValueError(f"request {state.rid}'s parent {state.parent} is not in the table")
        self._by_id[state.rid] = state
        return state

    def children(self, rid: int) -> list[RequestState]:
        """The requests ``rid``'s set-up asked for (its captions), in arrival order."""
        return [s for s in self._by_id.values() if s.parent == rid]

    def abandoned(self) -> list[RequestState]:
        """The children still live whose parent is cancelled or gone: nobody waits for them any more."""
        out = []
        for state in self._by_id.values():
            if state.parent is None or state.status.finished or state.handle is None or state.handle.cancelled:
                continue
            parent = self._by_id.get(state.parent)
            if parent is None or (parent.handle is not None and parent.handle.cancelled):
                out.append(state)
        return out

    def __getitem__(self, rid: int) -> RequestState:
        return self._by_id[rid]

    def get(self, rid: int) -> RequestState | None:
        return self._by_id.get(rid)

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(list(self._by_id.values()))

    def pop(self, rid: int) -> RequestState | None:
        """Take a finished request out (its handle already has its answer or error)."""
        return self._by_id.pop(rid, None)

    def with_status(self, *statuses: RequestStatus) -> list[RequestState]:
        """The requests in ``statuses``, in arrival order."""
        return [s for s in self._by_id.values() if s.status in statuses]

    def clear(self) -> list[RequestState]:
        """Empty the table; returns what it held."""
        out, self._by_id = list(self._by_id.values()), {}
        return out
