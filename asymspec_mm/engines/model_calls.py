"""Where a request's set-up runs its model calls: in the engine loop serving it (or the pipeline's home loop).

A request's set-up runs no model of its own when an engine loop serves it (the scheduler's decode thread): the
vision tower's call is handed to the loop (:meth:`ModelLoop.run`, between two of its steps) and a caption is a
drafter row the loop decodes beside every other row (:meth:`ModelLoop.decode_row`, its forwards shared with the
drafting forwards). The set-up thread is left with what runs no model (image decoding, OCR, tokenizing, grammar
compilation). The loop serving a set-up is scoped with :func:`using_loop`, so the set-up code itself is the same
for a single request and the scheduler; a call made outside any scope runs in the pipeline's ``home_loop``
(:data:`HomeLoop`), so one loop runs a pipeline's models at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from ..base.config import AsymSpecConfig

T = TypeVar("T")


@dataclass
class TokenRequest:
    """A request that only wants its tokens: ``method`` over ``to_prefill`` (stream -> its
    :class:`~asymspec_mm.engines.pieces.StreamPrompt`, ``prompt[:-1]``) with ``pending`` (stream -> the prompt's last
    token ``[1]``). What a :class:`~asymspec_mm.core.decoder.BatchDecoder` needs of a session, and no more. ``kind``:
    ``caption`` or ``summary`` (a child of the request whose set-up asks for it) or ``completion`` (the verifier's
    tokens of a prompt), the loop's :class:`~asymspec_mm.core.request_state.RequestKind`."""

    method: str
    config: AsymSpecConfig
    to_prefill: dict[str, Any]
    pending: dict[str, torch.Tensor]
    eos_ids: set[int]
    stop_fn: Any = None
    constraint: Any = None
    streams: dict[str, Any] = field(default_factory=dict)
    reuse_keys: dict[str, Any] = field(default_factory=dict)
    model: Any = None  # the model its stream runs on (None: the pipeline's for the stream)
    kind: str = "caption"


def greedy_request(method: str, stream: str, ids: torch.Tensor, max_new_tokens: int, eos_ids: set[int], kind: str) -> TokenRequest:
    """``stream``'s greedy tokens after the text prompt ``ids`` ``[L]`` (``method``'s one stream: ``floor`` for the
    verifier, ``drafter`` for ``drafter_full``) as a token request of ``kind``; no trace kept."""
    from .pieces import text_prompt  # here: pieces loads the vision cache, which a caller of this module may not need

    cfg = AsymSpecConfig(max_new_tokens=max_new_tokens, trace_top=0)
    return TokenRequest(method, cfg, {stream: text_prompt(ids[:-1], reuse=False)}, {stream: ids[-1:]}, set(eos_ids), kind=kind)


@dataclass
class TokenResult:
    """What a :class:`TokenRequest` row ends with: its token ids and step statistics."""

    token_ids: list[int]
    stats: dict[str, Any] = field(default_factory=dict)


class ModelLoop(Protocol):
    """An engine loop that runs a set-up's model calls."""

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one model call) in the loop between two steps; returns its value (or raises its error)."""
        ...

    def decode_row(self, request: TokenRequest) -> TokenResult:
        """Decode ``request`` as a row beside the others; returns once it is done."""
        ...


_LOOP: ContextVar[ModelLoop | None] = ContextVar("asymspec_model_loop", default=None)


def current_loop() -> ModelLoop | None:
    """The engine loop serving this set-up, or None (model calls run here)."""
    return _LOOP.get()


@contextmanager
def using_loop(loop: ModelLoop | None) -> Iterator[None]:
    """Within the block, set-up model calls go to ``loop`` (None: run on the calling thread)."""
    token = _LOOP.set(loop)
    try:
        yield
    finally:
        _LOOP.reset(token)


#: Where a pipeline's model calls made outside every loop's scope run (the captioner or the preparer called alone):
#: ``home()`` is the pipeline's loop for them (its scheduler, else its direct loop). ``None``: models with no
#: pipeline, called on the calling thread.
HomeLoop = Callable[[], ModelLoop]


def loop_for(home: HomeLoop | None) -> ModelLoop | None:
    """The loop a model call made here runs in: the one serving this set-up, else ``home()``, else ``None`` (here)."""
    loop = _LOOP.get()
    if loop is None and home is not None:
        loop = home()
    return loop


def run_model(fn: Callable[[], T], home: HomeLoop | None) -> T:
    """One model call (``fn``) in the loop :func:`loop_for` names, between two of its steps; here when there is none."""
    loop = loop_for(home)
    return loop.run(fn) if loop is not None else fn()


def model_runner(home: HomeLoop | None) -> Callable[[Callable[[], T]], T]:
    """:func:`run_model` with ``home`` bound: what code that may call a model takes as its ``run`` (the vision
    encoder's tower pass on a cache miss)."""
    return lambda fn: run_model(fn, home)


def stepped_tokens(steps: Iterator[list], run: Callable[[Callable[[], Any]], Any]) -> list[int]:
    """The token ids a single-row engine's ``steps`` (``greedy_steps``: a list of events a step) commit, each step one
    model call through ``run`` (:func:`model_runner`'s), so that rows decoding in that loop step in between."""
    tokens: list[int] = []
    while (events := run(lambda: next(steps, None))) is not None:
        tokens.extend(ev.token_id for ev in events)
    return tokens
