"""Graceful drain: what a server does between SIGTERM and its exit.

:class:`Drain` is the state the app and the server share: whether the server is draining, since when and until
when, and the work requests in flight. :class:`DrainGate` (ASGI middleware) counts those requests and, while the
server drains, answers a new one ``503`` with ``Retry-After`` and OpenAI's error object (a router retries it on
another replica); the probes (:data:`PROBE_PATHS`) stay open so that readiness can say ``draining``. The server
(:class:`~asymspec_mm.serve.server.DrainingServer`) begins the drain on SIGTERM, waits for the requests in flight
and for the linger (``--drain-linger``), ends the ones still running at the deadline with :meth:`Drain.expire` (a
``503`` naming ``--drain-timeout``), and exits.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ..base.checks import is_number
from ..base.errors import AsymSpecError
from .errors import RequestError

#: Seconds a server drains by default (``--drain-timeout``): under Kubernetes' default 30 s grace period, so the
#: server ends its own late requests with an answer before the kubelet's SIGKILL would cut them.
DEFAULT_DRAIN_TIMEOUT = 20.0
#: Seconds a draining server stays up after SIGTERM at least, refusing new work, however soon its last request ends
#: (``--drain-linger``): long enough for a router to take it out of rotation (its health check on ``/ready``: 1.5-2.1
#: s with docs/deployment.md's settings; its circuit breaker after two refusals) before the port closes. A request a
#: router sends to a port that has just closed may not be retried: sglang-router 0.3.2 answered a stream sent to a
#: replica that had drained in 0.25 s and exited with a 500 of its own.
DEFAULT_DRAIN_LINGER = 2.0
#: Seconds a client refused by a draining server is told to wait (``Retry-After``) before it retries elsewhere.
DRAIN_RETRY_AFTER_S = 1
#: Paths a draining server still answers (the probes and what routers poll); they are not counted as work.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics", "/get_load", "/get_server_info"})


class Drain:
    """Whether the server drains, and the work requests in flight (thread-safe; the HTTP loop and the signal
    handler share it). ``timeout``: the seconds a drain may last (``--drain-timeout``); ``linger``: the seconds it
    lasts at least, idle or not (``--drain-linger``, at most ``timeout``). ``on_expire`` callbacks end the requests
    still running when it runs out."""

    def __init__(self, timeout: float = DEFAULT_DRAIN_TIMEOUT, linger: float = DEFAULT_DRAIN_LINGER) -> None:
        if not is_number(timeout) or not 0 < timeout < float("inf"):
            raise AsymSpecError(f"drain_timeout={timeout!r} must be a positive number of seconds (--drain-timeout)")
        if not is_number(linger) or not 0 <= linger < float("inf"):
            raise AsymSpecError(f"drain_linger={linger!r} must be a number of seconds >= 0 (--drain-linger)")
        self.linger = min(float(linger), float(timeout))
        self._lock = threading.Lock()
        self.in_flight = 0
        self.started_at: float | None = None  # time.monotonic() of begin()
        self.timeout = float(timeout)
        self.expired = False
        self._on_expire: list[Callable[[RequestError], None]] = []

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self) -> None:
        """Start draining (once; a later call keeps the first deadline): new work is refused from now on."""
        with self._lock:
            if self.started_at is None:
                self.started_at = time.monotonic()

    def left(self) -> float:
        """Seconds left until the drain's deadline (``inf`` while not draining)."""
        if self.started_at is None:
            return float("inf")
        return self.started_at + self.timeout - time.monotonic()

    def done(self) -> bool:
        """Whether the server may stop now: draining, and either no work in flight once the linger has passed, or
        the deadline passed."""
        with self._lock:
            idle = self.in_flight == 0
        if self.started_at is None:
            return False
        lingered = time.monotonic() - self.started_at >= self.linger
        return (idle and lingered) or self.left() <= 0

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def on_expire(self, callback: Callable[[RequestError], None]) -> None:
        """Call ``callback(error)`` when the drain times out, to end the requests still running with ``error``."""
        self._on_expire.append(callback)

    def expire(self) -> None:
        """End the requests still in flight with :func:`timeout_error` (once)."""
        with self._lock:
            if self.expired:
                return
            self.expired = True
        error = timeout_error(self.timeout)
        for callback in self._on_expire:
            callback(error)


def refusal() -> RequestError:
    """The error of a request that reaches a draining server."""
    return RequestError(
        503,
        "the server is shutting down (draining) and takes no new requests; retry on another replica",
        code="server_draining",
        headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
    )


def timeout_error(timeout: float) -> RequestError:
    """The error of a request still running when the drain's ``timeout`` (seconds) ran out."""
    return RequestError(
        503,
        f"the server shut down before this request finished: it was still running when the drain timeout "
        f"(--drain-timeout {timeout:g} s) ran out; retry it, or raise --drain-timeout",
        code="drain_timeout",
        headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
    )


class DrainGate:
    """ASGI middleware over the app: counts the work requests in flight in ``drain`` and, while it drains, answers
    a new one with :func:`refusal` (``on_refused(status)`` records it). Probe paths pass untouched."""

    def __init__(self, app: Any, drain: Drain, on_refused: Callable[[int], None] | None = None) -> None:
        self.app, self.drain, self.on_refused = app, drain, on_refused

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("path") in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            err = refusal()
            if self.on_refused is not None:
                self.on_refused(err.status)
            body = json.dumps(err.body()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
            await send({"type": "http.response.start", "status": err.status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()
