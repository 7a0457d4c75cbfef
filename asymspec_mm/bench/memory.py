"""Memory by allocation, with preemption: long requests through the scheduler under a KV budget of a few rows.

``python -m asymspec_mm.bench.memory`` sends 8 held-out MiniVista requests (AsymSpec K=4, EOS ignored, ``--tokens``
each) to a scheduler whose ``max_kv_bytes`` is ``--budget-rows`` finished rows (what the largest request holds when it
finishes, summed over its streams, read from an unbounded run), and the same requests to one without a budget.
Printed: how many answers equal the request decoded alone (``pipe.generate``), the measured peak against the budget,
the most rows that shared a step, the preemptions, and both wall times (issue #51's scenario: 2.5 finished rows).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..base.config import AsymSpecConfig
from ..frontend.help import terminal_text


def run(pipe: Any, cases: list[dict], tokens: int, budget: int | None) -> dict[str, Any]:
    """The cases through one scheduler (``budget``: its ``max_kv_bytes``); the answers, the KV each held when it
    finished, the peak, the most rows in a step, the preemptions and the seconds."""
    cfg = AsymSpecConfig(max_new_tokens=tokens)
    rows: list[int] = []
    t0 = time.perf_counter()
    with pipe.scheduler(max_batch_size=len(cases), max_kv_bytes=budget, on_step=lambda n, *_: rows.append(n)) as sched:
        handles = [sched.submit(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg, ignore_eos=True) for c in cases]
        results = [h.result(timeout=1800) for h in handles]
        peak, preemptions = sched.peak_kv_bytes, sched.preemptions
    return {
        "tokens": [r.token_ids for r in results],
        "held": [sum(r.stats["kv_bytes"].values()) for r in results],
        "peak": peak,
        "most_rows": max(rows, default=0),
        "preemptions": preemptions,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.memory", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=160, help="tokens each request decodes (EOS ignored)")
    ap.add_argument("--budget-rows", type=float, default=2.5, help="the budget in finished rows (the largest request's KV when it ends)")
    args = ap.parse_args(argv)
    from ..pipeline.facade import AsymSpecPipeline
    from .pairs import bench_cases

    pipe = AsymSpecPipeline.from_preset(args.preset)
    cases = bench_cases(args.requests)
    cfg = AsymSpecConfig(max_new_tokens=args.tokens)
    with pipe.prefix_kv.paused():
        alone = [
            pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg, ignore_eos=True).token_ids
            for c in cases
        ]
        free = run(pipe, cases, args.tokens, None)
        budget = int(args.budget_rows * max(free["held"]))
        bound = run(pipe, cases, args.tokens, budget)
    same = sum(a == b for a, b in zip(alone, bound["tokens"]))
    print(f"requests: {len(cases)} x {args.tokens} tokens; budget {budget:,} bytes ({args.budget_rows:g} finished rows)")
    print(
        f"answers equal to each request alone: {same} of {len(cases)} (unbounded run: {sum(a == b for a, b in zip(alone, free['tokens']))})"
    )
    print(f"measured peak: {bound['peak']:,} bytes ({bound['peak'] / budget:.2f} of the budget); unbounded: {free['peak']:,}")
    print(f"most rows in one step: {bound['most_rows']} bounded, {free['most_rows']} unbounded")
    print(f"preemptions: {bound['preemptions']}; wall: {bound['wall_s']:.1f} s bounded, {free['wall_s']:.1f} s unbounded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
