"""Where a replica's resident memory goes under agent sessions (BENCHMARKS.md, soak section): one
``asymspec-mm serve --preset tiny`` replica on a free 127.0.0.1 port, ``--clients`` clients in the soak benchmark's
agent sessions (:mod:`asymspec_mm.bench.soak_session`) straight to it for ``--duration`` seconds, and every
``--every`` seconds one sample: requests served, resident memory (``VmRSS`` of the process and its children), the
prefix KV store's bytes and the scheduler's KV bytes (its ``/metrics``), and the rest, the resident memory less the
prefix store. One JSON line per sample, printed; whether "the rest" levels off is the question.

With ``--in-process`` the server runs in this process instead (:class:`~asymspec_mm.serve.server.ServerThread`, the
prefix store bounded to ``--prefix-mb`` so that it fills and evicts within a short run), under :mod:`tracemalloc`:
the samples are this process's (clients included), and at the end it prints the Python allocations that grew most
since the first sample, and the resident memory before and after glibc's ``malloc_trim(0)`` (memory freed but kept
by the allocator, which a trim hands back).

    python scripts/soak_memory.py --duration 240 --clients 4 --every 15
    python scripts/soak_memory.py --in-process --prefix-mb 64 --duration 240
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asymspec_mm.bench.replicas import Replica, free_port, rss_kb
from asymspec_mm.bench.soak_session import client_loop


def sample(replica: Replica, start: float) -> dict[str, float]:
    """One reading of ``replica``'s memory and counters, ``start`` the run's start (``time.monotonic()``)."""
    rss = replica.rss_mb()
    prefix = replica.metric("asymspec_prefix_cache_bytes") / 2**20
    return {
        "t_s": round(time.monotonic() - start, 1),
        "requests": replica.served(),
        "rss_mb": round(rss, 1),
        "prefix_kv_mb": round(prefix, 1),
        "kv_mb": round(replica.metric("asymspec_kv_bytes") / 2**20, 1),
        "rest_mb": round(rss - prefix, 1),
    }


def load(replica: Replica, duration: float, clients: int, every: float) -> list[dict[str, float]]:
    """``clients`` clients in sessions at ``replica`` for ``duration`` s, sampled every ``every`` s (printed)."""
    import httpx  # noqa: F401 - imported here, before the threads: their first imports would race
    import openai  # noqa: F401

    samples: list[dict[str, float]] = []
    start = time.monotonic()
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(every if samples else 0):
            samples.append(sample(replica, start))
            print(json.dumps(samples[-1]), flush=True)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client_loop, replica.url, "memory", i, start + duration, None) for i in range(clients)]:
            f.result()
    done.set()
    thread.join()
    samples.append(sample(replica, start))
    print(json.dumps(samples[-1]), flush=True)
    return samples


class InProcess(Replica):
    """This process as the replica: a :class:`~asymspec_mm.serve.server.ServerThread` on the tiny pair."""

    def __init__(self, url: str) -> None:
        super().__init__(0)
        self.url = url

    def rss_mb(self) -> float:
        return rss_kb(os.getpid()) / 1024


def run_in_process(duration: float, clients: int, every: float, prefix_mb: int) -> None:
    """:func:`load` on an in-process server, under :mod:`tracemalloc`; then the top growth and a ``malloc_trim``."""
    import tracemalloc

    from asymspec_mm.pipeline.facade import AsymSpecPipeline
    from asymspec_mm.serve.app import create_app
    from asymspec_mm.serve.server import ServerThread

    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none", prefix_cache_bytes=prefix_mb * 2**20)
    server = ServerThread(create_app(pipe, max_batch_size=4)).start()
    tracemalloc.start(8)
    first = tracemalloc.take_snapshot()
    try:
        load(InProcess(server.url), duration, clients, every)
        for stat in tracemalloc.take_snapshot().compare_to(first, "traceback")[:5]:
            print(json.dumps({"grew_mb": round(stat.size_diff / 2**20, 2), "blocks": stat.count_diff, "at": stat.traceback.format()[-2:]}))
        before = rss_kb(os.getpid()) / 1024
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(json.dumps({"rss_mb": round(before, 1), "after_malloc_trim_mb": round(rss_kb(os.getpid()) / 1024, 1)}), flush=True)
    finally:
        tracemalloc.stop()
        server.stop()
        pipe.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/soak_memory.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=240.0, help="seconds of load [default: %(default)s]")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients in sessions [default: %(default)s]")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between samples [default: %(default)s]")
    ap.add_argument("--log", default="runs/soak-memory.log", help="the replica's log [default: %(default)s]")
    ap.add_argument("--in-process", action="store_true", help="serve in this process, under tracemalloc")
    ap.add_argument("--prefix-mb", type=int, default=64, help="with --in-process: the prefix store's bound [default: %(default)s]")
    ap.add_argument("serve_flags", nargs="*", help="more `serve` options, after --")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.clients < 1 or args.every <= 0 or args.prefix_mb < 1:
        ap.error("--duration and --every must be positive, --clients and --prefix-mb at least 1")
    if args.in_process:
        run_in_process(args.duration, args.clients, args.every, args.prefix_mb)
        return 0
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    replica = Replica(free_port(), ["--log-level", "warning", *args.serve_flags], Path(args.log)).start()
    try:
        load(replica.wait_ready(), args.duration, args.clients, args.every)
    finally:
        replica.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
