"""One request at a time through ``pipe.generate``: the direct path (no loop running) against the same calls while a
scheduler runs on the pipeline (each call then a row of its loop, :mod:`asymspec_mm.core.loop_client`).

``python -m asymspec_mm.bench.single_call`` answers ``--requests`` held-out MiniVista requests of ``--tokens`` tokens
(EOS ignored, the compressed views given, so the arms decode the same tokens) on one thread, the arms in turn,
``--reps`` times; ``--arms direct`` alone runs on a tree without the loop's routing too (a before/after pair).
Printed per arm and repetition: wall seconds, CPU seconds of the whole process (every thread), and the CPU seconds
of each thread by name (the caller's ``MainThread``, the loop's decode, set-up and output threads), so a loaded
machine's waits and the loop's own work can be told apart; then each arm's median and the loop's ratio to the
direct path, by wall and by CPU time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from contextlib import nullcontext
from typing import Any

from asymspec_mm.base.config import AsymSpecConfig


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds each live thread of this process has used, summed by thread name (the set-up threads share one)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            spent = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
        out[thread.name] = out.get(thread.name, 0.0) + spent
    return out


#: The arms: the direct path, the loop on its default (paged) row storages, the loop on padded ones (one contiguous
#: cache per stream, as the direct path keeps: the loop's own cost apart from paged attention's), the loop on paged
#: storages in each pool layout (whatever the model's number of layers would choose).
ARMS = ("direct", "loop", "loop_padded", "loop_segments", "loop_contiguous")


def run_arm(pipe: Any, cases: list[dict], cfg: AsymSpecConfig, method: str, arm: str) -> dict[str, Any]:
    """Answer every case with ``pipe.generate``, one after another, on ``arm`` (:data:`ARMS`); returns the wall
    seconds ``s``, the process's CPU seconds ``cpu_s`` and each thread's ``threads`` (by name)."""
    from asymspec_mm.engines import RowStorages

    if arm not in ARMS:
        raise SystemExit(f"--arms: unknown arm {arm!r}; choose among {', '.join(ARMS)}")
    storages = None  # the arm's row storages (built for that arm alone: an older checkout runs loop and direct)
    if arm == "loop_padded":
        storages = RowStorages("padded")
    elif arm in ("loop_segments", "loop_contiguous"):
        storages = RowStorages(layout=arm.removeprefix("loop_"))
    scope = pipe.scheduler(max_batch_size=1, batch_engines=storages) if arm != "direct" else nullcontext()
    with scope:
        before, cpu0, t0 = thread_cpu_seconds(), time.process_time(), time.perf_counter()
        for c in cases:
            pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], method=method, config=cfg, ignore_eos=True)
        wall, cpu, after = time.perf_counter() - t0, time.process_time() - cpu0, thread_cpu_seconds()
    threads = {name: round(after[name] - before.get(name, 0.0), 4) for name in after if after[name] - before.get(name, 0.0) > 1e-4}
    return {"s": wall, "cpu_s": cpu, "threads": threads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.single_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="asymspec,floor")
    ap.add_argument(
        "--arms",
        default="direct,loop",
        help="direct, loop (a scheduler running), loop_padded (on padded storages), loop_segments / loop_contiguous (on paged storages in that pool layout) [default: %(default)s]",
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    from asymspec_mm.bench.pairs import bench_cases
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

    torch.set_num_threads(args.threads)
    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none", prefix_cache_bytes=0)
    cases = bench_cases(args.requests)
    cfg = AsymSpecConfig(max_new_tokens=args.tokens)
    arms = args.arms.split(",")
    out: dict[str, Any] = {}
    for method in args.methods.split(","):
        for arm in arms:  # warm-up: each arm's first calls (and the loop's first storages) are not timed
            run_arm(pipe, cases[:2], cfg, method, arm)
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        for _ in range(args.reps):
            for arm in arms:
                runs[arm].append(run_arm(pipe, cases, cfg, method, arm))
        tokens = args.requests * args.tokens
        out[method] = {}
        for arm, got in runs.items():
            s, cpu = [r["s"] for r in got], [r["cpu_s"] for r in got]
            out[method][arm] = {"s": s, "cpu_s": cpu, "threads": [r["threads"] for r in got], "tokens_per_s": tokens / statistics.median(s)}
        for arm in [a for a in arms if a != "direct" and "direct" in arms]:  # speed ratios: > 1 the loop is faster
            d, lp = runs["direct"], runs[arm]
            out[method][f"{arm}_over_direct"] = [a["s"] / b["s"] for a, b in zip(d, lp)]
            out[method][f"{arm}_over_direct_cpu"] = [a["cpu_s"] / b["cpu_s"] for a, b in zip(d, lp)]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
