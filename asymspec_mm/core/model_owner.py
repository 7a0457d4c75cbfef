"""Which loop runs a pipeline's models: one at a time, by construction, so no lock orders their calls.

The first scheduler started on a pipeline claims it (:func:`claim`, before its threads start) and its decode thread
runs the pipeline's models until it ends (:func:`release`). Everything else that runs a model of that pipeline
meanwhile hands the call to it, between two of its steps:

- a turn of the pipeline's direct loop, or a call made with no loop (:func:`models_here`): with no scheduler owning
  the pipeline it runs on its caller's thread, counted, and a scheduler starting waits for it to end (no new one
  starts meanwhile, so a stream of direct callers cannot keep a scheduler from starting);
- a turn of another scheduler on the same pipeline (:func:`turn_host`: two servers, or the demo beside the API, on
  one loaded pipeline): a model call of the owner's loop; when the owner ends, the next scheduler to run a turn takes
  the pipeline over.

:func:`paused` holds every turn of a pipeline before it starts (a turn already running finishes), as vLLM's
``pause_generation`` does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from ..base.errors import AsymSpecError

T = TypeVar("T")


class ModelsLoop(Protocol):
    """A loop that can own a pipeline's models (a :class:`~.scheduler.Scheduler`)."""

    @property
    def on_decode_thread(self) -> bool:
        """Whether the calling thread is its decode thread."""
        ...

    @property
    def takes_jobs(self) -> bool:
        """Whether :meth:`run` hands a call to its decode thread now (it runs and has work to finish)."""
        ...

    def run(self, fn: Callable[[], T]) -> T:
        """``fn`` on its decode thread, between two of its steps."""
        ...


#: The loop whose decode thread runs each pipeline's models now, from its claim to its release.
_OWNER: weakref.WeakKeyDictionary[Any, ModelsLoop] = weakref.WeakKeyDictionary()
#: The thread running each pipeline's models on its own now (no loop owning them: a direct turn, a call made with no
#: loop), and how deep (a call made within its turn runs at once): one such thread at a time.
_ALONE: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
#: How many schedulers wait to claim each pipeline (direct turns wait for them rather than start).
_CLAIMING: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
#: How many :func:`paused` blocks hold each pipeline's turns now.
_PAUSED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_COND = threading.Condition()


def _bump(table: weakref.WeakKeyDictionary, pipe: Any, by: int) -> None:
    """Add ``by`` to ``pipe``'s count in ``table`` and wake every waiter (called with ``_COND`` held)."""
    table[pipe] = table.get(pipe, 0) + by
    _COND.notify_all()


def _alone_here(pipe: Any) -> bool:
    """Whether the calling thread runs ``pipe``'s models on its own now (called with ``_COND`` held)."""
    entry = _ALONE.get(pipe)
    return entry is not None and entry[0] == threading.get_ident()


@contextmanager
def paused(pipe: Any) -> Iterator[None]:
    """While the block runs no turn of ``pipe``'s loops starts (a turn already running finishes): a direct turn or
    call waits before it runs, a scheduler's decode thread before its next step. Requests and calls still enter and
    wait together for the next turn (for a consistent look at a pipeline, or a batch made to start together)."""
    with _COND:
        _bump(_PAUSED, pipe, 1)
    try:
        yield
    finally:
        with _COND:
            _bump(_PAUSED, pipe, -1)


def claim(pipe: Any, loop: ModelsLoop) -> None:
    """``loop`` (a scheduler starting, before its threads do) owns ``pipe``'s models from now on when no other loop
    does, once a turn running on a caller's thread has ended (none starts meanwhile); beside an owner it is a guest,
    its turns that owner's model calls (:func:`turn_host`). Started from within a turn running on this thread, it
    claims nothing now (the turn would wait for itself): its first turn takes the pipeline over. Started on the
    owner's decode thread (a callback within its step) it is refused: its turns would wait for that very thread."""
    with _COND:
        owner = _OWNER.get(pipe)
        if owner is not None and owner.on_decode_thread:
            raise AsymSpecError(
                "a scheduler was started from within a step of the scheduler that runs this pipeline's models (a "
                "callback on its decode thread): its turns would wait for that thread; start it from another thread"
            )
        if owner is not None or _alone_here(pipe):
            return
        _bump(_CLAIMING, pipe, 1)
        try:
            while _ALONE.get(pipe) is not None:
                _COND.wait()
            if _OWNER.get(pipe) is None:
                _OWNER[pipe] = loop
        finally:
            _bump(_CLAIMING, pipe, -1)


def release(pipe: Any, loop: ModelsLoop) -> None:
    """``loop``'s decode thread has ended: it runs none of ``pipe``'s models any more."""
    with _COND:
        if _OWNER.get(pipe) is loop:
            del _OWNER[pipe]
        _COND.notify_all()


def running_loop(pipe: Any) -> Any:
    """The loop whose decode thread runs ``pipe``'s models now, or ``None``."""
    with _COND:
        return _OWNER.get(pipe)


@contextmanager
def models_here(pipe: Any) -> Iterator[ModelsLoop | None]:
    """Where a direct turn or a call of ``pipe`` made outside every loop runs: yields the loop that owns ``pipe``'s
    models and takes jobs (the turn is to be one of its model calls), or ``None``, this thread then the one running the
    models on its own until the block ends (one thread at a time). Waits while the owner takes no more jobs (it is
    ending), while another thread runs them on its own, while a scheduler is claiming the pipeline, and while it is
    :func:`paused`; a call made within a turn already running (on this thread, or on the owner's decode thread: a
    callback) never waits."""
    me = threading.get_ident()
    with _COND:
        while True:
            owner, entry = _OWNER.get(pipe), _ALONE.get(pipe)
            if (entry is not None and entry[0] == me) or (owner is not None and owner.on_decode_thread):
                break
            if _PAUSED.get(pipe, 0) or entry is not None:
                _COND.wait()
            elif owner is not None and not owner.takes_jobs:
                _COND.wait()
            elif owner is None and _CLAIMING.get(pipe, 0):
                _COND.wait()
            else:
                break
        if owner is None:
            depth = entry[1] if entry is not None else 0
            _ALONE[pipe] = (me, depth + 1)
    if owner is not None:
        yield owner
        return
    try:
        yield None
    finally:
        with _COND:
            _, depth = _ALONE[pipe]
            if depth > 1:
                _ALONE[pipe] = (me, depth - 1)
            else:
                del _ALONE[pipe]
            _COND.notify_all()


def call_here_or_in_owner(pipe: Any, fn: Callable[[], T]) -> T:
    """``fn`` (one model call of ``pipe``) where :func:`models_here` says: the owner's model call, or here."""
    with models_here(pipe) as owner:
        return owner.run(fn) if owner is not None else fn()


@contextmanager
def turn_host(pipe: Any, loop: ModelsLoop) -> Iterator[ModelsLoop | None]:
    """Where the next turn of scheduler ``loop`` runs: yields ``None`` when ``loop`` owns ``pipe``'s models (its
    decode thread runs the turn; with no owner it takes the pipeline over, once no turn runs on a caller's thread),
    or the owner, whose model call the turn is. Waits while the pipeline is :func:`paused` and while the owner takes
    no more jobs (it is ending)."""
    with _COND:
        while True:
            owner = _OWNER.get(pipe)
            if (
                _PAUSED.get(pipe, 0)
                or (owner is None and _ALONE.get(pipe) is not None)
                or (owner not in (None, loop) and not owner.takes_jobs)
            ):
                _COND.wait()
                continue
            if owner is None:
                _OWNER[pipe] = owner = loop
            break
    yield None if owner is loop else owner
