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

The replica that is never stopped (replica 1) is one process for the whole module (:func:`survivor`); each test
gets a fresh replica 0, the one it kills or drains (:func:`victim`), which started loading while the test before ran.
Each run sends :data:`REQUESTS` requests and stops replica 0 after :data:`KILL_AFTER`: the claims are about which
requests fail (those in flight at the stop, none after it), which a few dozen requests after the stop show as well
as the benchmark's 60. A router whose console script is not installed is skipped with the install line (see
tests/replicas.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import openai
import pytest
from failover_load import FAILOVER_FLAGS, REPLICA_FLAGS, run_failover
from replicas import ENV, Replica, loading_replica, router_or_skip, start_router
from router_cases import ROUTERS, router_executable, shown_command

from asymspec_mm.bench.replicas import SESSION_HEADER, SESSION_POLICY, free_port, worker_health
from asymspec_mm.bench.router_health import seconds_until, stream_in_flight

pytestmark = pytest.mark.slow
#: Requests per run, and how many finish before replica 0 is stopped: 3 are then in flight (4 clients) and at least
#: 17 start after the stop (the requests the router must send around the stopped replica).
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
    """A fresh ready replica 0 for this test (stopped after it, if the test left it running)."""
    survivor.wait_ready()  # the survivor started first: the victims never hold up its load
    replica = victims()
    try:
        yield replica
    finally:
        replica.stop()


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_killed_replica_costs_at_most_its_requests_in_flight(router, tmp_path, survivor, victim):
    router_or_skip(router)
    log = tmp_path / f"{router}.log"
    run = run_failover(router, FAILOVER_FLAGS, signal.SIGKILL, log=log, survivor=survivor, victim=victim, **LOAD)
    summary = run.summary()
    print(json.dumps({"router": router, "signal": "SIGKILL", **summary}))  # the numbers docs/deployment.md shows
    assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= REQUESTS - KILL_AFTER - 7, summary
    assert not run.failed_after(), summary  # every request started after the kill was answered
    assert len(run.failed()) <= len(run.in_flight()), summary  # the recovery time is printed and measured, not asserted


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_draining_replica_loses_no_request(router, tmp_path, survivor, victim):
    router_or_skip(router)
    log = tmp_path / f"{router}.log"
    run = run_failover(router, FAILOVER_FLAGS, signal.SIGTERM, log=log, survivor=survivor, victim=victim, **LOAD)
    print(json.dumps({"router": router, "signal": "SIGTERM", **run.summary()}))
    assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= REQUESTS - KILL_AFTER - 7, run.summary()
    assert not run.failed(), run.summary()


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_killed_replica_costs_keyed_sessions_at_most_their_requests_in_flight(router, tmp_path, survivor, victim):
    router_or_skip(router)
    policy, header = SESSION_POLICY[router], SESSION_HEADER[router]
    log = tmp_path / f"{router}.log"
    keyed = {"policy": policy, "session_header": header, "survivor": survivor, "victim": victim}
    run = run_failover(router, FAILOVER_FLAGS, signal.SIGKILL, log=log, **keyed, **LOAD)
    summary = run.summary()
    print(json.dumps({"router": router, "policy": policy, "signal": "SIGKILL", **summary}))
    # each of the 8 sessions sends 2 or more requests after the stop: the dead replica's ones among them
    assert len(run.outcomes) == REQUESTS and len(started_after(run)) >= REQUESTS - KILL_AFTER - 7, summary
    assert not run.failed_after(), summary  # the dead replica's sessions moved to the survivor, none lost
    assert len(run.failed()) <= len(run.in_flight()), summary


def started_after(run) -> list:
    """The requests of ``run`` that started after replica 0 was stopped."""
    return [o for o in run.outcomes if o.start >= run.stopped_at]


#: The documented settings with the health check on ``/ready`` and no retries: only the health check can keep a
#: request off a draining replica, so a 503 that reached the client would show that it did not.
READY_FLAGS = (*FAILOVER_FLAGS, "--health-check-endpoint", "/ready", "--disable-retries")
NEW_REQUESTS = 8


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_health_check_on_ready_takes_a_draining_replica_out_of_rotation(router, tmp_path, survivor, victim):
    router_or_skip(router)
    with start_router(router, [victim, survivor.wait_ready()], *READY_FLAGS, log=tmp_path / "r.log") as url:
        with stream_in_flight(victim):  # a request in flight: the victim drains instead of exiting
            victim.terminate()
            assert seconds_until(lambda: not worker_health(url)[victim.url], limit=60) is not None, worker_health(url)
            assert httpx.get(victim.url + "/health", timeout=10).status_code == 200  # alive: only /ready says draining
            before = survivor.served()
            routed = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
            for i in range(NEW_REQUESTS):  # an error (a 503 from the draining replica) raises here
                out = routed.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Turn {i}."}], max_tokens=4)
                assert out.choices[0].finish_reason in ("length", "stop")
            assert survivor.served() - before == NEW_REQUESTS
        victim.kill()


def test_the_documented_failover_commands_are_the_tested_ones():
    """docs/deployment.md's Failover commands are the ones these tests start (two replicas, ``round_robin``)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "deployment.md").read_text()
    workers = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    for router in ROUTERS:
        assert shown_command(router, workers, policy="round_robin", extra=FAILOVER_FLAGS) in page.splitlines(), router
