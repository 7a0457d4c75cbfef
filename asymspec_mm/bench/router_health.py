"""How fast a router takes a replica out of rotation, measured (docs/deployment.md, "Failover"): two
``asymspec-mm serve --preset tiny`` replicas behind vllm-router or SGLang's gateway with the documented failover
settings (:data:`~asymspec_mm.bench.replicas.FAILOVER_FLAGS`), no load; replica 0 is stopped and the router's own
health view (``GET /workers``, :func:`~asymspec_mm.bench.replicas.worker_health`) is polled every 50 ms:

- **SIGKILL**: seconds from the kill until the router shows the replica unhealthy;
- **SIGTERM with ``--health-check-endpoint /ready``**: seconds from the signal until the router shows the draining
  replica unhealthy (a stream to it keeps it draining meanwhile; ``/health`` would stay 200 until it exits);
- then the replica is started again on its port and the seconds until the router shows it healthy are measured too.

Each is repeated ``--repeats`` times; one JSON line per measurement, then the median of each, printed:

    python -m asymspec_mm.bench.router_health [--routers vllm-router,sglang-router] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .replicas import FAILOVER_FLAGS, ROUTERS, Replica, router_executable, running_replicas, running_router, worker_health

POLL_S = 0.05
LIMIT_S = 240.0  # the default settings take up to 3 minutes; the documented ones should take about 2 s
#: Replica flags: no OCR worker (it plays no part here), a drain long enough to outlast a measurement.
REPLICA_FLAGS = ("--ocr-workers", "0", "--drain-timeout", "120")


def seconds_until(condition: Callable[[], bool], limit: float = LIMIT_S) -> float | None:
    """Seconds until ``condition()`` holds (polled every :data:`POLL_S`); None when ``limit`` passes first."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if condition():
            return time.monotonic() - start
        time.sleep(POLL_S)
    return None


@contextlib.contextmanager
def stream_in_flight(replica: Replica) -> Iterator[None]:
    """A long streamed chat request straight to ``replica``, read line by line on a background thread (a client
    that reads; one that stops reading is cut), in flight once its first line has come: it keeps a SIGTERM'd replica
    draining (``--drain-timeout`` allowing) until the block ends, when the reader hangs up."""
    import httpx

    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 3000, "stream": True, "ignore_eos": True}
    started, done = threading.Event(), threading.Event()

    def read() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.stream("POST", replica.url + "/v1/chat/completions", json=body, timeout=300) as r:
            for _ in r.iter_lines():
                started.set()
                if done.is_set():
                    return

    threading.Thread(target=read, daemon=True).start()
    if not started.wait(120):
        raise RuntimeError(f"no stream from {replica.url} within 120 s")
    try:
        yield
    finally:
        done.set()


def measure_once(router_url: str, victim: Replica, how: signal.Signals) -> dict[str, float | None]:
    """Stop ``victim`` with ``how`` and time the router's health view; start it again and time its return."""
    down = lambda: not worker_health(router_url).get(victim.url, True)  # noqa: E731
    up = lambda: worker_health(router_url).get(victim.url, False)  # noqa: E731
    if how == signal.SIGKILL:
        victim.kill()
        marked_down = seconds_until(down)
    else:
        with stream_in_flight(victim):
            victim.terminate()
            marked_down = seconds_until(down)
        victim.stop(signal.SIGTERM, timeout=60)
    start = time.monotonic()
    victim.start().wait_ready()
    ready = time.monotonic() - start
    back = seconds_until(up)
    return {"marked_down_s": marked_down, "restart_ready_s": round(ready, 2), "marked_up_after_ready_s": back}


def measure(router: str, how: signal.Signals, repeats: int, logs: Path) -> list[dict]:
    """``repeats`` measurements of router ``router`` with replica 0 stopped by ``how`` each time."""
    flags = [*FAILOVER_FLAGS] + (["--health-check-endpoint", "/ready"] if how == signal.SIGTERM else [])
    rows = []
    with running_replicas(2, REPLICA_FLAGS, logs=logs) as replicas:
        workers = [r.url for r in replicas]
        with running_router(router, workers, log=logs / f"{router}-{how.name}.log", policy="round_robin", extra=flags) as url:
            for i in range(repeats):
                row = {"router": router, "signal": how.name, "health_endpoint": "/ready" if how == signal.SIGTERM else "/health", "run": i}
                row.update({k: None if v is None else round(v, 2) for k, v in measure_once(url, replicas[0], how).items()})
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def medians(rows: Sequence[dict]) -> dict[str, float | None]:
    keys = ("marked_down_s", "restart_ready_s", "marked_up_after_ready_s")
    return {k: (statistics.median(v) if (v := [r[k] for r in rows if r[k] is not None]) else None) for k in keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.router_health", description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", default=",".join(ROUTERS), help="routers to measure, comma-separated [default: %(default)s]")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per router and signal [default: %(default)s]")
    ap.add_argument("--out", default="runs/router-health", help="folder for the logs [default: %(default)s]")
    args = ap.parse_args(argv)
    names = args.routers.split(",")
    unknown = [n for n in names if n not in ROUTERS]
    if unknown or args.repeats < 1:
        ap.error(f"--routers takes {', '.join(ROUTERS)} (got {', '.join(unknown)}); --repeats at least 1")
    missing = [n for n in names if router_executable(n) is None]
    if missing:
        ap.error(f"not installed: {', '.join(missing)} (pip install them, or set ASYMSPEC_ROUTER_BIN to their bin folder)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for how in (signal.SIGKILL, signal.SIGTERM):
            rows = measure(name, how, args.repeats, out)
            print(json.dumps({"router": name, "signal": how.name, "median": medians(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
