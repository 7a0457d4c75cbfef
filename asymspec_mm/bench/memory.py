"""Memory by allocation, with preemption: long requests through the scheduler under a KV budget that holds about two.

``python -m asymspec_mm.bench.memory`` sends 8 held-out MiniVista requests (AsymSpec K=4, EOS ignored, ``--tokens``
each) to a scheduler whose ``max_kv_bytes`` is ``--budget-rows`` times the largest request's whole need alone (its
prompt and token budget, with the storage's padding and compaction slack), and the same requests to one without a
budget. Printed: whether every answer equals its unbounded run, the measured peak against the budget, the
preemptions, and both wall times.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..base.config import AsymSpecConfig
from ..frontend.help import terminal_text


def run(pipe: Any, cases: list[dict], tokens: int, budget: int | None) -> dict[str, Any]:
    """The cases through one scheduler (``budget``: its ``max_kv_bytes``); the answers, peak, preemptions, seconds."""
    cfg = AsymSpecConfig(max_new_tokens=tokens)
    t0 = time.perf_counter()
    with pipe.scheduler(max_batch_size=len(cases), max_kv_bytes=budget) as sched:
        handles = [sched.submit(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg, ignore_eos=True) for c in cases]
        results = [h.result(timeout=1800) for h in handles]
        peak, preemptions = sched.peak_kv_bytes, sched.preemptions
    return {"tokens": [r.token_ids for r in results], "peak": peak, "preemptions": preemptions, "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.memory", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=160, help="tokens each request decodes (EOS ignored)")
    ap.add_argument("--budget-rows", type=float, default=1.3, help="the budget in units of the largest request's whole need")
    args = ap.parse_args(argv)
    from ..core import BatchDecoder
    from ..pipeline.facade import AsymSpecPipeline
    from .pairs import bench_cases

    pipe = AsymSpecPipeline.from_preset(args.preset)
    cases = bench_cases(args.requests)
    cfg = AsymSpecConfig(max_new_tokens=args.tokens)
    probe = BatchDecoder(pipe)
    one = max(
        probe.kv_bound(pipe.prepare(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg, prefill=False), alone=True)
        for c in cases
    )
    budget = int(args.budget_rows * one)
    with pipe.prefix_kv.paused():
        free = run(pipe, cases, args.tokens, None)
        bound = run(pipe, cases, args.tokens, budget)
    same = sum(a == b for a, b in zip(free["tokens"], bound["tokens"]))
    print(
        f"requests: {len(cases)} x {args.tokens} tokens; budget {budget:,} bytes ({args.budget_rows:g} x the largest request's whole need alone)"
    )
    print(f"answers equal to the unbounded run: {same} of {len(cases)}")
    print(f"measured peak: {bound['peak']:,} bytes ({bound['peak'] / budget:.2f} of the budget); unbounded: {free['peak']:,}")
    print(f"preemptions: {bound['preemptions']}; wall: {bound['wall_s']:.1f} s bounded, {free['wall_s']:.1f} s unbounded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
