"""The soak and failover benchmark (issue #50, item 7): two ``asymspec-mm serve --preset tiny`` replicas (subprocesses
on free 127.0.0.1 ports, one shared ``--responses-store``) behind vllm-router, and clients in agent-like sessions
(:mod:`asymspec_mm.bench.soak_session`) for a bounded time, in three phases:

1. **with session keys** (``X-Session-Id``, router policy ``consistent_hash``): most of the run;
2. **without keys**, through a second router with ``round_robin`` (what a conversation meets when nothing keeps it
   on one replica): the cached share per turn to compare;
3. **failover**, with keys again: replica 1 gets SIGTERM (it drains, is restarted once it exits), then, once the
   router sends it requests again, SIGKILL; what each cost (failed requests, seconds until requests succeed again,
   how long the restarted replica stayed out of rotation), with vllm-router's default retry, health-check and
   circuit-breaker settings.

Each replica's resident memory (``VmRSS`` from ``/proc``, its child processes included) is read after the warm-up and
at the end of phase 2. The report (JSON and markdown, :mod:`asymspec_mm.bench.soak_report`) goes to ``--out``.

    python -m asymspec_mm.bench.soak --duration 600 --clients 16 --out runs/soak
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .replicas import ROUTER_BIN_ENV, Replica, free_port, router_executable, running_router
from .soak_report import failover_cost, markdown, phase_summary
from .soak_session import RequestRecord, client_loop, stream_turn

ROUTER = "vllm-router"
SESSION_HEADER = "X-Session-Id"
POLICIES = {"keyed": "consistent_hash", "keyless": "round_robin", "failover": "consistent_hash"}
#: Seconds of the failover phase kept after the SIGKILL, at the least, to see what it costs.
KILL_WINDOW_S = 30.0


def find_router(folder: str | None) -> str | None:
    """vllm-router's console script: in ``folder``, ``$ASYMSPEC_ROUTER_BIN``, next to this Python, or on PATH."""
    return router_executable(ROUTER, folder)


def soak_replica(port: int, store: Path, log: Path) -> Replica:
    """A tiny replica on ``port`` with the shared Responses ``store`` and vllm-router's load format, logging to ``log``."""
    flags = ["--responses-store", str(store), "--load-format", "vllm-router", "--log-level", "warning"]
    return Replica(port, flags, log)


def memory_mb(replica: Replica) -> dict[str, float]:
    """Resident memory (:meth:`Replica.rss_mb`) and what its bounded stores hold: the prefix KV store (1 GiB by default)."""
    return {"rss_mb": round(replica.rss_mb(), 1), "prefix_kv_mb": round(replica.metric("asymspec_prefix_cache_bytes") / 2**20, 1)}


def run_clients(url: str, phase: str, clients: int, seconds: float, header: str | None) -> list[RequestRecord]:
    """``clients`` client threads in sessions for ``seconds``; every request's record."""
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client_loop, url, phase, i, deadline, header) for i in range(clients)]
        return [r for f in futures for r in f.result()]


def measured_phase(
    url: str, phase: str, clients: int, seconds: float, header: str | None, replicas: list[Replica]
) -> tuple[list[RequestRecord], dict[str, Any]]:
    before = [r.served() for r in replicas]
    start = time.monotonic()
    records = run_clients(url, phase, clients, seconds, header)
    wall = time.monotonic() - start
    served = [r.served() - b for r, b in zip(replicas, before)]
    return records, phase_summary(records, wall, served)


def failover_phase(url: str, clients: int, seconds: float, victim: Replica) -> dict[str, Any]:
    """Keyed load for ``seconds`` while ``victim`` gets SIGTERM 2 s in (restarted once it has exited), then, once the
    restarted replica takes requests again (the router may hold it out of rotation for a while), SIGKILL: at
    half time or then, whichever is later (at the latest :data:`KILL_WINDOW_S` before the end); the cost of each."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(run_clients, url, "failover", clients, seconds, SESSION_HEADER)
        time.sleep(2.0)
        term_at = time.monotonic()
        term_children = victim.stop(signal.SIGTERM)
        term_exit_s = time.monotonic() - term_at
        victim.start().wait_ready()
        ready_s = time.monotonic() - term_at
        back_s = None
        while back_s is None and time.monotonic() < t0 + seconds - KILL_WINDOW_S:
            if victim.served() > 0:  # its counter starts at 0 with the process: a request routed to it again
                back_s = time.monotonic() - term_at
            else:
                time.sleep(1.0)
        time.sleep(max(0.0, min(t0 + seconds / 2, t0 + seconds - KILL_WINDOW_S) - time.monotonic()))
        kill_at = time.monotonic()
        kill_served = victim.served()
        kill_children = victim.stop(signal.SIGKILL)
        records = load.result()
    end = max([kill_at, *(r.end for r in records)])
    term = failover_cost(records, term_at, kill_at)
    term.update(
        exited_after_s=round(term_exit_s, 2),
        ready_again_after_s=round(ready_s, 2),
        routed_to_again_after_s=None if back_s is None else round(back_s, 2),
        children_left=term_children,
    )
    kill = failover_cost(records, kill_at, end)
    kill.update(victim_requests_before=kill_served, children_left=kill_children)
    return {"SIGTERM": term, "SIGKILL": kill}


def warm_up(replicas: list[Replica]) -> None:
    """One turn straight to each replica, so that first-request costs stay out of the timings."""
    import openai

    from ..eval.minivista_agent import make_agent_problem

    problem = make_agent_problem(0, 0)
    for r in replicas:
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        stream_turn(client, problem["messages"], problem, {}, "warm-up")


def run(duration: float, clients: int, out: Path, router_exe: str, keyless_s: float, failover_s: float) -> dict[str, Any]:
    """The whole benchmark; the report (also written to ``out/soak.json`` and ``out/soak.md``)."""
    from .serving import machine

    out.mkdir(parents=True, exist_ok=True)
    keyed_s = duration - keyless_s - failover_s
    if keyed_s <= 0:
        raise ValueError(
            f"--duration {duration:g} leaves no time with session keys after {keyless_s:g} s without and {failover_s:g} s of failover"
        )
    store = out / "responses.sqlite"
    store.unlink(missing_ok=True)
    replicas = [soak_replica(free_port(), store, out / f"replica{i}.log").start() for i in range(2)]
    try:
        for r in replicas:
            r.wait_ready()
        warm_up(replicas)
        memory_start = [memory_mb(r) for r in replicas]
        urls = [r.url for r in replicas]
        phases: dict[str, Any] = {}
        with running_router(ROUTER, urls, out / "router-consistent_hash.log", POLICIES["keyed"], exe=router_exe) as url:
            _, phases["keyed"] = measured_phase(url, "keyed", clients, keyed_s, SESSION_HEADER, replicas)
            if keyless_s > 0:
                with running_router(ROUTER, urls, out / "router-round_robin.log", POLICIES["keyless"], exe=router_exe) as plain:
                    _, phases["keyless"] = measured_phase(plain, "keyless", clients, keyless_s, None, replicas)
            memory_end = [memory_mb(r) for r in replicas]
            failover = failover_phase(url, clients, failover_s, replicas[1]) if failover_s > 0 else {}
    finally:
        for r in replicas:
            r.stop()
    report = {
        "settings": {
            "duration_s": duration, "clients": clients, "keyed_s": keyed_s, "keyless_s": keyless_s,
            "failover_s": failover_s, "router": ROUTER, "policies": POLICIES, "session_header": SESSION_HEADER,
            "machine": machine(),
        },
        "phases": phases,
        "five_xx": sum(p["five_xx"] for p in phases.values()),
        "replicas": [
            {"rss_start_mb": a["rss_mb"], "rss_end_mb": b["rss_mb"], "prefix_kv_start_mb": a["prefix_kv_mb"], "prefix_kv_end_mb": b["prefix_kv_mb"]}
            for a, b in zip(memory_start, memory_end)
        ],
        "failover": failover,
    }  # fmt: skip
    (out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "soak.md").write_text(markdown(report))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load, all phases [default: %(default)s]")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients, each in sessions [default: %(default)s]")
    ap.add_argument("--keyless", type=float, default=None, help="seconds without session keys [default: 15%% of --duration]")
    ap.add_argument("--failover", type=float, default=None, help="seconds of the failover phase; 0 skips it [default: 25%% of --duration]")
    ap.add_argument("--router-bin", default=None, help=f"folder holding {ROUTER} [default: ${ROUTER_BIN_ENV}, this Python's bin, PATH]")
    ap.add_argument("--out", default="runs/soak", help="folder for soak.json, soak.md and the logs [default: %(default)s]")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.clients < 1:
        ap.error("--duration must be positive and --clients at least 1")
    exe = find_router(args.router_bin)
    if exe is None:
        ap.error(f"{ROUTER} is not installed: pip install vllm-router==0.1.17 (or name its folder with --router-bin)")
    keyless = 0.15 * args.duration if args.keyless is None else args.keyless
    failover = 0.25 * args.duration if args.failover is None else args.failover
    try:
        report = run(args.duration, args.clients, Path(args.out), exe, keyless, failover)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
