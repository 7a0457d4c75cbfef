"""The admission stall in the decode thread's own CPU time: what the loop's turns cost while requests arrive.

The scenario of ``python -m asymspec_mm.bench.admission`` (random tiny checkpoints, a Floor row decoding 3,000
tokens, four AsymSpec requests whose captions the drafter writes, OCR per arm), with torch on one thread so that
every forward runs on the decode thread, and each turn stamped in the decode loop (``Scheduler(on_step=...)``) with
its wall time and the decode thread's CPU time (``time.thread_time``). On a machine shared with other jobs the wall
gaps hold however long the thread waited for a core; its CPU time holds only the work the turn did. Reported per arm:
the longest turn while the four are set up over the median turn with every row decoding, in CPU time and in wall
time. It uses only the public scheduler, so it runs against any checkout on ``PYTHONPATH`` (before and after a change,
in turn)::

    PYTHONPATH=. python scripts/admission_turns.py --reps 5 --ocr none,rapidocr --ocr-workers 1 --ocr-threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch

from asymspec_mm.base.config import AsymSpecConfig
from asymspec_mm.bench.admission import arms_of
from asymspec_mm.bench.pairs import bench_cases
from asymspec_mm.checkpoints.small import build_tiny_checkpoints
from asymspec_mm.core.scheduler import Scheduler
from asymspec_mm.frontend.options import load_pipeline


def run_once(pipe, live: dict, new: list[dict], live_tokens: int = 3000, warm_steps: int = 20, after: int = 10) -> dict:
    """One repetition: the turns' (wall, cpu) seconds during the set-up window and the ``after`` turns past it."""
    turns: list[tuple[float, float]] = []  # (monotonic, thread_time) at each step's end, in the decode thread
    joined: dict[int, float] = {}

    def on_step(rows: int, calls: int, seconds: float) -> None:
        turns.append((time.monotonic(), time.thread_time()))

    with pipe.prefix_kv.paused(), Scheduler(pipe, max_batch_size=len(new) + 1, on_step=on_step) as sched:
        h = sched.submit(
            live["image"], live["question"], caption=live["caption"], ocr=live["ocr"], method="floor",
            config=AsymSpecConfig(max_new_tokens=live_tokens), ignore_eos=True,
        )  # fmt: skip
        steps = iter(h)
        for _ in range(warm_steps):
            next(steps)
        cfg = AsymSpecConfig(max_new_tokens=40)
        start = time.monotonic()
        handles = [sched.submit(r["image"], r["question"], caption=None, ocr=r["ocr"], config=cfg, ignore_eos=True) for r in new]

        def first_step(handle) -> None:
            for _ in handle:
                joined.setdefault(handle.id, time.monotonic())

        watchers = [threading.Thread(target=first_step, args=(x,), daemon=True) for x in handles]
        for w in watchers:
            w.start()
        for _ in steps:
            pass
        for x in handles:
            x.result(timeout=600)
        for w in watchers:
            w.join(60)
    end = max(joined.values())
    gaps = [(a[0], b[0] - a[0], b[1] - a[1]) for a, b in zip(turns, turns[1:])]
    during = [(w, c) for t, w, c in gaps if t < end and t + w > start]
    past = [(w, c) for t, w, c in gaps if t >= end][:after]
    return {
        "longest_cpu_s": max(c for _, c in during),
        "longest_wall_s": max(w for w, _ in during),
        "step_all_cpu_s": statistics.median(c for _, c in past),
        "step_all_wall_s": statistics.median(w for w, _ in past),
        "turns_during": len(during),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="runs/admission_ckpt")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--ocr", default="none")
    ap.add_argument("--ocr-workers", default="1")
    ap.add_argument("--ocr-threads", default="1")
    ap.add_argument("--label", default="", help="a name for this checkout in the printed lines")
    args = ap.parse_args()
    torch.set_num_threads(1)
    arms = arms_of(args.ocr, args.ocr_workers, args.ocr_threads)
    drafter_dir, verifier_dir = build_tiny_checkpoints(args.dir)
    pipes = [load_pipeline(drafter=str(drafter_dir), verifier=str(verifier_dir), ocr_engine=arm.engine()) for arm in arms]
    cases = bench_cases(1 + 4 * (args.warmup + args.reps))
    live = {**cases[0], "caption": "a chart", "ocr": ""}
    try:
        for rep in range(args.warmup + args.reps):
            for arm, pipe in zip(arms, pipes):
                new = [{**c, "ocr": False if arm.ocr == "none" else None} for c in cases[1 + rep * 4 : 1 + (rep + 1) * 4]]
                r = run_once(pipe, live, new)
                r = {k: round(v, 5) for k, v in r.items()}
                r["cpu_ratio"] = round(r["longest_cpu_s"] / r["step_all_cpu_s"], 3)
                r["wall_ratio"] = round(r["longest_wall_s"] / r["step_all_wall_s"], 3)
                print(json.dumps({"tree": args.label, "arm": arm.label, "warmup": rep < args.warmup, **r}), flush=True)
    finally:
        for pipe in pipes:
            close = getattr(pipe, "close", None)
            if close is not None:
                close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
