"""A bounded request loop through a router while one replica dies (SIGKILL) or drains (SIGTERM): what each request
got, and the counts docs/deployment.md's Failover table shows.

:func:`run_failover` starts two ``serve --preset tiny`` replicas and a router (with extra flags), sends
:data:`REQUESTS` small chat requests from :data:`CLIENTS` threads (every other one streamed) with the ``openai``
client (``max_retries=0``: only the router retries), stops replica 0 once :data:`KILL_AFTER` requests have finished,
and returns a :class:`FailoverRun`: each request's start, end and outcome, and the stop's time. Run as a script
(``python tests/failover_load.py ROUTER [POLICY [SIGKILL|SIGTERM ...]]``, with ``tests`` importable) it prints one
JSON line per run, with the router's default settings and with ``FAILOVER_FLAGS`` (the documented ones, from
:mod:`asymspec_mm.bench.replicas`): docs/deployment.md's table.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import openai
from replicas import Replica, running_replicas, start_router

from asymspec_mm.bench.replicas import FAILOVER_FLAGS, SESSION_HEADER, SESSION_POLICY

REQUESTS = 60
CLIENTS = 4
KILL_AFTER = 16
#: Session keys of a keyed run: enough that both replicas hold some (a session policy hashes each to one replica).
SESSIONS = 8
BUDGET = 8
TIMEOUT = 120.0  # seconds per request: a hung request fails instead of stalling the loop (a slow one, 20 s seen, passes)
#: Replica flags: a drain long enough for the requests in flight on a slow, shared machine (an 8-token answer took
#: over 20 s there, the default --drain-timeout, with four replicas on two cores).
REPLICA_FLAGS = ("--max-batch-size", "4", "--drain-timeout", "60")


@dataclass
class Outcome:
    """One request: when it started and ended (``time.monotonic()``), whether streamed, and what the client got:
    ``None`` for a whole answer, else the error (status code or exception name, and the start of its body)."""

    index: int
    streamed: bool
    start: float
    end: float
    error: str | None


@dataclass
class FailoverRun:
    """The outcomes of one run and the time replica 0 was stopped."""

    outcomes: list[Outcome] = field(default_factory=list)
    stopped_at: float = 0.0

    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    def in_flight(self) -> list[Outcome]:
        """The requests that started before the stop and ended after it."""
        return [o for o in self.outcomes if o.start < self.stopped_at < o.end]

    def failed_after(self) -> list[Outcome]:
        """The failed requests that started after the stop."""
        return [o for o in self.failed() if o.start >= self.stopped_at]

    def recovery_s(self) -> float:
        """Seconds from the stop to the end of the last failed request (0 when none failed)."""
        return max((o.end - self.stopped_at for o in self.failed()), default=0.0)

    def summary(self) -> dict:
        return {
            "requests": len(self.outcomes),
            "in_flight_at_stop": len(self.in_flight()),
            "streamed_in_flight": len([o for o in self.in_flight() if o.streamed]),
            "failed_in_flight": len([o for o in self.failed() if o.start < self.stopped_at]),
            "failed_after": len(self.failed_after()),
            "recovery_s": round(self.recovery_s(), 2),
            "errors": sorted({o.error for o in self.failed()}),
        }


def _describe(exc: Exception) -> str:
    """What the client got, in one short line: the status and whether the body was OpenAI's error object."""
    if isinstance(exc, openai.APIStatusError):
        body = exc.response.text
        try:
            kind = "OpenAI error JSON" if isinstance(json.loads(body).get("error", json.loads(body)).get("message"), str) else "JSON"
        except (ValueError, AttributeError):
            kind = f"text {body[:60]!r}"
        return f"{exc.status_code} {kind}"
    return type(exc).__name__


def _one(client: openai.OpenAI, index: int, streamed: bool, headers: dict[str, str]) -> str | None:
    messages = [{"role": "user", "content": f"Request {index}: which bar is the tallest?"}]
    extra = {"extra_body": {"ignore_eos": True}, "extra_headers": headers}
    try:
        if streamed:
            finish = None
            for chunk in client.chat.completions.create(model="tiny", messages=messages, max_tokens=BUDGET, stream=True, **extra):
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
            return None if finish == "length" else f"stream ended without a finish reason ({finish})"
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=BUDGET, **extra)
        return None if out.choices[0].finish_reason == "length" else f"finish {out.choices[0].finish_reason}"
    except Exception as exc:  # noqa: BLE001 - the outcome is what the run records
        return _describe(exc)


def load_loop(
    url: str, stop, requests: int = REQUESTS, clients: int = CLIENTS, kill_after: int = KILL_AFTER, session_header: str | None = None
) -> FailoverRun:
    """:data:`REQUESTS` requests through the router at ``url`` from ``clients`` threads; ``stop()`` is called once
    ``kill_after`` have finished (its time recorded: the one it returns, else the time of the call). Requests past the
    first ``kill_after + clients`` wait for ``stop()`` to return before they start (at once where it only signals a
    process; a :func:`shared_stop` waits for the other loops too): every run has requests left for after the stop.
    With ``session_header``, request ``i`` carries the session key ``session-{i % SESSIONS}`` in that header (keyed
    sessions, which a session policy pins to one replica each)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    run = FailoverRun()
    lock = threading.Lock()
    counter = iter(range(requests))
    stopped = threading.Event()

    def worker() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            if index >= kill_after + clients:
                stopped.wait(TIMEOUT * requests)
            start = time.monotonic()
            headers = {session_header: f"session-{index % SESSIONS}"} if session_header else {}
            error = _one(client, index, index % 2 == 1, headers)
            with lock:
                run.outcomes.append(Outcome(index, index % 2 == 1, start, time.monotonic(), error))
                fire = len(run.outcomes) == kill_after
            if fire:
                called = time.monotonic()
                run.stopped_at = stop() or called
                stopped.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * requests)
    return run


def run_failover(
    router: str,
    flags: Sequence[str],
    how: signal.Signals = signal.SIGKILL,
    log: Path | None = None,
    policy: str = "round_robin",
    survivor: Replica | None = None,
    victim: Replica | None = None,
    **loop,
) -> FailoverRun:
    """Two replicas behind ``router`` (``policy``, extra ``flags``); replica 0 gets ``how`` mid-run. With ``survivor``
    (a replica started with :data:`REPLICA_FLAGS` that the caller keeps and stops), it is replica 1: runs in a row
    share the replica that is never stopped. With ``victim`` (a ready replica the caller started), it is replica 0;
    the ones not given are started here and stopped after the run."""
    given = [r for r in (victim, survivor) if r is not None]
    with running_replicas(2 - len(given), *REPLICA_FLAGS) as started:
        fresh = iter(started)
        replicas = [victim or next(fresh), survivor.wait_ready() if survivor is not None else next(fresh)]
        with start_router(router, replicas, *flags, log=log, policy=policy) as url:
            stopped = replicas[0]
            return load_loop(url, lambda: stopped.kill() if how == signal.SIGKILL else stopped.terminate(), **loop)


def shared_stop(loops: int, stop: Callable[[], None]) -> Callable[[], float]:
    """The ``stop`` of ``loops`` :func:`load_loop` runs at once: ``stop()`` runs once, when the last loop calls it
    (each has had its ``kill_after`` requests finish); each caller waits for it and gets the time it ran."""
    ready = threading.Condition()
    arrived: list[str] = []
    at: list[float] = []

    def arrive() -> float:
        with ready:
            arrived.append("loop")
            if len(arrived) == loops:
                at.append(time.monotonic())
                stop()
                ready.notify_all()
            else:
                ready.wait_for(lambda: at, TIMEOUT * REQUESTS)
        return at[0] if at else time.monotonic()

    return arrive


def run_failovers(
    routers: Sequence[str],
    flags: Sequence[str],
    how: signal.Signals,
    logs: Path,
    survivor: Replica,
    victim: Replica,
    policies: Mapping[str, str] | None = None,
    session_headers: Mapping[str, str] | None = None,
    **loop,
) -> dict[str, FailoverRun]:
    """Every router of ``routers`` (its policy from ``policies``, else ``round_robin``; extra ``flags``; its log in
    ``logs``) in front of the same two replicas, ``victim`` (replica 0) and ``survivor``, and a :func:`load_loop`
    through each at once (with its header from ``session_headers``); ``victim`` gets ``how`` once, when every loop has
    had its ``kill_after`` requests finish. Each router's run, by name: one replica 0 serves every router's claim."""
    stop = shared_stop(len(routers), lambda: victim.kill() if how == signal.SIGKILL else victim.terminate())
    runs: dict[str, FailoverRun] = {}
    with contextlib.ExitStack() as started:
        urls = {
            name: started.enter_context(
                start_router(
                    name,
                    [victim, survivor.wait_ready()],
                    *flags,
                    log=logs / f"{name}.log",
                    policy=(policies or {}).get(name, "round_robin"),
                )
            )
            for name in routers
        }

        def through(name: str) -> None:
            runs[name] = load_loop(urls[name], stop, session_header=(session_headers or {}).get(name), **loop)

        threads = [threading.Thread(target=through, args=(name,), daemon=True) for name in routers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * loop.get("requests", REQUESTS))
    return runs


if __name__ == "__main__":
    import sys

    # python tests/failover_load.py ROUTER [POLICY [SIGNAL ...]]: both settings, each signal (default both)
    name, policy = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "round_robin")
    signals = [signal.Signals[s] for s in sys.argv[3:]] or [signal.SIGKILL, signal.SIGTERM]
    header = SESSION_HEADER[name] if policy == SESSION_POLICY[name] else None
    for label, flags in (("default", []), ("failover flags", FAILOVER_FLAGS)):
        for how in signals:
            run = run_failover(name, flags, how, policy=policy, session_header=header)
            print(json.dumps({"router": name, "policy": policy, "settings": label, "signal": how.name, **run.summary()}), flush=True)
