"""One request at a time through ``pipe.generate``: the direct path (no loop running) against the same calls while a
scheduler runs on the pipeline (each call then a row of its loop, :mod:`asymspec_mm.core.loop_client`).

``python -m asymspec_mm.bench.single_call`` answers ``--requests`` held-out MiniVista requests of ``--tokens`` tokens
(EOS ignored, the compressed views given, so the arms decode the same tokens) on one thread, the arms in turn,
``--reps`` times; ``--arms direct`` alone runs on a tree without the loop's routing too (a before/after pair).
Printed: each arm's seconds per repetition and tokens/s, and the loop arm's ratio to the direct one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from typing import Any

from asymspec_mm.base.config import AsymSpecConfig


def run_arm(pipe: Any, cases: list[dict], cfg: AsymSpecConfig, method: str, loop: bool) -> float:
    """Seconds to answer every case with ``pipe.generate``, one after another (a scheduler running when ``loop``)."""
    scope = pipe.scheduler(max_batch_size=1) if loop else nullcontext()
    with scope:
        t0 = time.perf_counter()
        for c in cases:
            pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], method=method, config=cfg, ignore_eos=True)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.single_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="asymspec,floor")
    ap.add_argument("--arms", default="direct,loop", help="direct, loop (a scheduler running) [default: %(default)s]")
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
        run_arm(pipe, cases[:2], cfg, method, loop=False)  # warm-up
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(args.reps):
            for arm in arms:
                seconds[arm].append(run_arm(pipe, cases, cfg, method, loop=arm == "loop"))
        tokens = args.requests * args.tokens
        out[method] = {arm: {"s": s, "tokens_per_s": tokens / statistics.median(s)} for arm, s in seconds.items()}
        if {"direct", "loop"} <= set(arms):
            out[method]["loop_over_direct"] = [d / lp for d, lp in zip(seconds["direct"], seconds["loop"])]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
