"""Failover through the routers (issue #50, items 4 and 5): two real ``serve --preset tiny`` replicas (subprocesses)
behind vllm-router and behind SGLang's gateway, started with the failover settings docs/deployment.md documents
(:data:`failover_load.FAILOVER_FLAGS`), a bounded loop of small chat requests (streamed and not) from the ``openai``
client with ``max_retries=0``, and one replica stopped mid-run:

- SIGKILL: at most the requests in flight at the kill fail, and every request started after it is answered (the
  time to the last failure is printed for docs/deployment.md's table, not asserted: speed lives in benchmarks);
- SIGTERM: the replica drains (503 + ``Retry-After`` to new requests, which the router retries on the other
  replica); no request is lost.

A router whose console script is not installed is skipped with the install line (see tests/replicas.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from failover_load import FAILOVER_FLAGS, run_failover
from replicas import router_or_skip
from router_cases import ROUTERS, shown_command

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_killed_replica_costs_at_most_its_requests_in_flight(router, tmp_path):
    router_or_skip(router)
    run = run_failover(router, FAILOVER_FLAGS, signal.SIGKILL, log=tmp_path / f"{router}.log")
    summary = run.summary()
    print(json.dumps({"router": router, "signal": "SIGKILL", **summary}))  # the numbers docs/deployment.md shows
    assert len(run.outcomes) == 60, summary
    assert not run.failed_after(), summary  # every request started after the kill was answered
    assert len(run.failed()) <= len(run.in_flight()), summary  # the recovery time is printed and measured, not asserted


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_draining_replica_loses_no_request(router, tmp_path):
    router_or_skip(router)
    run = run_failover(router, FAILOVER_FLAGS, signal.SIGTERM, log=tmp_path / f"{router}.log")
    print(json.dumps({"router": router, "signal": "SIGTERM", **run.summary()}))
    assert len(run.outcomes) == 60 and not run.failed(), run.summary()


def test_the_documented_failover_commands_are_the_tested_ones():
    """docs/deployment.md's Failover commands are the ones these tests start (two replicas, ``round_robin``)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "deployment.md").read_text()
    workers = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    for router in ROUTERS:
        assert shown_command(router, workers, policy="round_robin", extra=FAILOVER_FLAGS) in page.splitlines(), router
