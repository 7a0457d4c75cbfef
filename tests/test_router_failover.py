"""Failover through the routers (issue #50, items 4 and 5): two real ``serve --preset tiny`` replicas (subprocesses)
behind vllm-router and behind SGLang's gateway, started with the failover settings docs/deployment.md documents
(:data:`failover_load.FAILOVER_FLAGS`), a bounded loop of small chat requests (streamed and not) from the ``openai``
client with ``max_retries=0``, and one replica stopped mid-run:

- SIGKILL: at most the requests in flight at the kill fail, and every request started after it is answered (the
  time to the last failure is printed for docs/deployment.md's table, not asserted: speed lives in benchmarks);
- SIGTERM: the replica drains (503 + ``Retry-After`` to new requests, which the router retries on the other
  replica); no request is lost;
- SIGKILL under each router's session policy (vllm-router ``consistent_hash`` with ``X-Session-Id``, the gateway's
  ``manual`` with ``X-SMG-Routing-Key``), 8 keyed sessions: a policy keeps choosing a dead session replica until the
  circuit breaker opens (2 failures) or the health check marks it down, so the retries must outlast the breaker;
  with the documented settings at most the requests in flight fail;
- ``--health-check-endpoint /ready``: a draining replica (SIGTERM, a long stream still in flight) is shown unhealthy
  by the router's own ``/workers`` view while its ``/health`` is still 200, and with retries off every new request
  is answered by the other replica: no 503 reaches the client.

Each claim is checked for each router, and both routers stand in front of the same two replicas at once (a replica
does not know which router sent a request): one replica 0 stopped serves both routers' runs, each with its own
load loop and its own outcomes (:func:`failover_load.run_failovers`, which stops replica 0 once both loops have had
:data:`KILL_AFTER` requests finish). The replica that is never stopped (replica 1) is one process for the whole
module (:func:`survivor`); each test gets a fresh replica 0 (:func:`victim`), which started loading while the test
before ran. Each loop sends :data:`REQUESTS` requests: the claims are about which requests fail (those in flight at
the stop, none after it), which a few dozen requests after the stop show as well as the benchmark's 60. A router
whose console script is not installed is skipped with the install line (see tests/replicas.py): its own test
(:func:`test_the_router_is_installed`) says so, and the others check the installed one."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import httpx
import openai
import pytest
from failover_load import CLIENTS, FAILOVER_FLAGS, REPLICA_FLAGS, run_failovers
from replicas import ENV, Replica, loading_replica, router_or_skip, start_router
from router_cases import ROUTERS, router_executable, shown_command

from asymspec_mm.bench.replicas import SESSION_HEADER, SESSION_POLICY, free_port, worker_health
from asymspec_mm.bench.router_health import seconds_until, stream_in_flight

pytestmark = pytest.mark.slow
#: Requests per run, and how many finish before replica 0 is stopped: up to 3 are then in flight (4 clients) and at
#: least :data:`AFTER` start after the stop (the requests the router must send around the stopped replica).
REQUESTS, KILL_AFTER = 32, 8
LOAD = {"requests": REQUESTS, "kill_after": KILL_AFTER}
#: Replica 0's flags, in every test: a drain that outlasts the health check's view of it (the /ready test) and
#: any request in flight (the SIGTERM test).
VICTIM_FLAGS = ("--max-batch-size", "4", "--drain-timeout", "120")


@pytest.fixture(scope="module")
def survivor():
    """Replica 1 of every test: started once, never signalled by a test, stopped after the module. Nothing of what
    it served before a test plays a part in one (counts are taken as differences), so each test still sees one
    replica stopped and one that stays up, as with two fresh ones; only the cost of a start and a stop per test goes."""
    if not any(router_executable(name) for name in ROUTERS):
        pytest.skip("neither router is installed: each test names its install line")
    with loading_replica(*REPLICA_FLAGS) as replica:  # loads while the first test starts its replica 0
        yield replica


@pytest.fixture(scope="module")
def victims(request):
    """Hands out replica 0 of each test that asks for :func:`victim`, ready; as soon as one is handed out, the next
    one (if a later test of the module needs one) starts loading, so that it loads while the test runs."""
    needed = sum("victim" in item.fixturenames for item in request.session.items if item.module is request.module)
    loading: list[Replica] = []

    def start() -> Replica:
        return Replica(free_port(), ["--ocr-workers", "0", *VICTIM_FLAGS], env=ENV).start()

    def take() -> Replica:
        nonlocal needed
        needed -= 1
        replica = loading.pop() if loading else start()
        if needed > 0:
            loading.append(start())
        return replica.wait_ready()

    try:
        yield take
    finally:
        for replica in loading:
            replica.stop()


@pytest.fixture
def victim(victims, survivor):
    """A fresh ready replica 0 for this test (stopped after it, if the test left it running); after :func:`survivor`,
    which the first one loads beside."""
    replica = victims()
    try:
        yield replica
    finally:
        replica.stop()


def installed() -> list[str]:
    """The routers whose console script is installed (the :func:`survivor` fixture skips where there is none)."""
    return [name for name in ROUTERS if router_executable(name)]


@pytest.mark.parametrize("router", list(ROUTERS))
def test_the_router_is_installed(router):
    """A router absent here is named, with its install line, rather than left out of the tests below unseen."""
    router_or_skip(router)


def started_after(run) -> list:
    """The requests of ``run`` that started after replica 0 was stopped."""
    return [o for o in run.outcomes if o.start >= run.stopped_at]


#: Requests a run must have started after the stop: all but the ``KILL_AFTER`` finished before it and the ``CLIENTS``
#: that may be in flight or starting at it (a loop waits at ``KILL_AFTER + CLIENTS`` until the stop).
AFTER = REQUESTS - KILL_AFTER - CLIENTS


def test_a_killed_replica_costs_at_most_its_requests_in_flight(tmp_path, survivor, victim):
    runs = run_failovers(installed(), FAILOVER_FLAGS, signal.SIGKILL, tmp_path, survivor, victim, **LOAD)
    for router, run in runs.items():
        summary = {"router": router, "signal": "SIGKILL", **run.summary()}
        print(json.dumps(summary))  # the numbers docs/deployment.md shows
        assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= AFTER, summary
        assert not run.failed_after(), summary  # every request started after the kill was answered
        assert len(run.failed()) <= len(run.in_flight()), summary  # the recovery time is printed, not asserted


def test_a_draining_replica_loses_no_request(tmp_path, survivor, victim):
    runs = run_failovers(installed(), FAILOVER_FLAGS, signal.SIGTERM, tmp_path, survivor, victim, **LOAD)
    for router, run in runs.items():
        summary = {"router": router, "signal": "SIGTERM", **run.summary()}
        print(json.dumps(summary))
        assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= AFTER, summary
        assert not run.failed(), summary


def test_a_killed_replica_costs_keyed_sessions_at_most_their_requests_in_flight(tmp_path, survivor, victim):
    routers = installed()
    keyed = {"policies": {r: SESSION_POLICY[r] for r in routers}, "session_headers": {r: SESSION_HEADER[r] for r in routers}}
    runs = run_failovers(routers, FAILOVER_FLAGS, signal.SIGKILL, tmp_path, survivor, victim, **keyed, **LOAD)
    for router, run in runs.items():
        summary = {"router": router, "policy": SESSION_POLICY[router], "signal": "SIGKILL", **run.summary()}
        print(json.dumps(summary))
        # each of the 8 sessions sends 2 or more requests after the stop: the dead replica's ones among them
        assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= AFTER, summary
        assert not run.failed_after(), summary  # the dead replica's sessions moved to the survivor, none lost
        assert len(run.failed()) <= len(run.in_flight()), summary


#: The documented settings with the health check on ``/ready`` and no retries: only the health check can keep a
#: request off a draining replica, so a 503 that reached the client would show that it did not.
READY_FLAGS = (*FAILOVER_FLAGS, "--health-check-endpoint", "/ready", "--disable-retries")
NEW_REQUESTS = 8


def test_a_health_check_on_ready_takes_a_draining_replica_out_of_rotation(tmp_path, survivor, victim):
    with contextlib.ExitStack() as routers:
        urls = {
            name: routers.enter_context(start_router(name, [victim, survivor.wait_ready()], *READY_FLAGS, log=tmp_path / f"{name}.log"))
            for name in installed()
        }
        with stream_in_flight(victim):  # a request in flight: the victim drains instead of exiting
            victim.terminate()
            for name, url in urls.items():  # each router's own health view
                down = seconds_until(lambda url=url: not worker_health(url)[victim.url], limit=60)
                assert down is not None, (name, worker_health(url))
            assert httpx.get(victim.url + "/health", timeout=10).status_code == 200  # alive: only /ready says draining
            for name, url in urls.items():
                before = survivor.served()
                routed = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
                for i in range(NEW_REQUESTS):  # an error (a 503 from the draining replica) raises here
                    messages = [{"role": "user", "content": f"Turn {i}."}]
                    out = routed.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
                    assert out.choices[0].finish_reason in ("length", "stop"), name
                assert survivor.served() - before == NEW_REQUESTS, name
        victim.kill()


def test_the_documented_failover_commands_are_the_tested_ones():
    """docs/deployment.md's Failover commands are the ones these tests start (two replicas, ``round_robin``)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "deployment.md").read_text()
    workers = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    for router in ROUTERS:
        assert shown_command(router, workers, policy="round_robin", extra=FAILOVER_FLAGS) in page.splitlines(), router
