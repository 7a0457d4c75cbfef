"""KV allocated at its peak over what the rows hold, padded against paged row storage, side by side in one run.

``python -m asymspec_mm.bench.kv_peak`` sends ``R`` held-out MiniVista requests (AsymSpec K=4, EOS ignored, ``T``
new tokens each) to a scheduler on each storage (``RowStorages("padded")``: one padded ``BatchEngine`` cache per
stream, staging prefill copied at join; ``RowStorages("paged")``: blocks on one pool per model) for every ``R`` of
``--rows`` and ``T`` of ``--tokens``. Printed per run: the scheduler's measured peak KV bytes (the storages' and
staging storages' peaks summed each turn), what the rows hold when they finish (their tokens over every stream,
``stats["kv_bytes"]`` summed) and the ratio. Then a request alone: the bound admission puts on it
(``BatchDecoder.kv_bound(alone=True)``) over what it holds, and whether a scheduler whose ``max_kv_bytes`` is
``--budget`` times what it holds admits and finishes it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..base.config import AsymSpecConfig
from ..frontend.help import terminal_text

KINDS = ("padded", "paged")


def _submit(sched: Any, case: dict, cfg: AsymSpecConfig) -> Any:
    return sched.submit(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=cfg, ignore_eos=True)


def peak_over_held(pipe: Any, kind: str, cases: list[dict], tokens: int, layout: str | None = None) -> dict[str, Any]:
    """``cases`` through one scheduler on ``kind`` storage (paged: in ``layout``, default by the model's number of
    layers): peak KV bytes, bytes the rows hold at the end, seconds."""
    from ..engines import RowStorages

    cfg = AsymSpecConfig(k=4, max_new_tokens=tokens)
    t0 = time.perf_counter()
    with pipe.scheduler(max_batch_size=len(cases), batch_engines=RowStorages(kind, layout=layout)) as sched:
        results = [h.result(timeout=1800) for h in [_submit(sched, c, cfg) for c in cases]]
        peak = sched.peak_kv_bytes
    held = sum(sum(r.stats["kv_bytes"].values()) for r in results)
    return {"peak": peak, "held": held, "ratio": peak / held, "tokens": [r.token_ids for r in results], "s": time.perf_counter() - t0}


def alone_under_budget(pipe: Any, kind: str, case: dict, tokens: int, held: int, budget_ratio: float) -> dict[str, Any]:
    """The admission bound of ``case`` alone on ``kind`` storage over ``held``, and whether a scheduler with
    ``max_kv_bytes = budget_ratio * held`` admits and finishes it."""
    from ..core.decoder import BatchDecoder
    from ..core.handle import KVBudgetError
    from ..engines import RowStorages

    cfg = AsymSpecConfig(k=4, max_new_tokens=tokens)
    session = pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=cfg, prefill=False)
    bound = BatchDecoder(pipe, engines=RowStorages(kind)).kv_bound(session, alone=True)
    budget = int(budget_ratio * held)
    with pipe.scheduler(max_batch_size=1, max_kv_bytes=budget, batch_engines=RowStorages(kind)) as sched:
        try:
            _submit(sched, case, cfg).result(timeout=1800)
            admitted, peak = True, sched.peak_kv_bytes
        except KVBudgetError:
            admitted, peak = False, 0
    return {"bound": bound, "budget": budget, "admitted": admitted, "peak": peak}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.kv_peak", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--tokens", type=int, nargs="+", default=[100, 400], help="tokens each request decodes (EOS ignored)")
    ap.add_argument("--budget", type=float, default=1.15, help="the alone request's budget, in units of what it holds")
    ap.add_argument("--layout", default=None, help="the paged pools' layout: segments or contiguous (default: by the models' layers)")
    args = ap.parse_args(argv)
    from ..pipeline.facade import AsymSpecPipeline
    from .pairs import bench_cases

    pipe = AsymSpecPipeline.from_preset(args.preset)
    cases = bench_cases(max(args.rows))
    print("| rows x tokens | padded: peak / held (MB) | ratio | paged: peak / held (MB) | ratio | same tokens |")
    print("|---|---|---|---|---|---|")
    alone_held = {}
    with pipe.prefix_kv.paused():
        for tokens in args.tokens:
            for rows in args.rows:
                got = {kind: peak_over_held(pipe, kind, cases[:rows], tokens, args.layout) for kind in KINDS}
                if rows == 1:
                    alone_held[tokens] = got["paged"]["held"]
                cells = " | ".join(f"{got[k]['peak'] / 1e6:.2f} / {got[k]['held'] / 1e6:.2f} | **{got[k]['ratio']:.2f}x**" for k in KINDS)
                same = got["padded"]["tokens"] == got["paged"]["tokens"]
                print(f"| {rows} x {tokens} | {cells} | {'yes' if same else 'no'} |", flush=True)
        print()
        print(
            f"| a request alone, tokens | storage | admission bound / held | budget {args.budget:g}x held | admitted, finished | peak / held |"
        )
        print("|---|---|---|---|---|---|")
        for tokens, held in alone_held.items():
            for kind in KINDS:
                a = alone_under_budget(pipe, kind, cases[0], tokens, held, args.budget)
                peak = f"{a['peak'] / held:.2f}x" if a["admitted"] else "–"
                verdict = "yes" if a["admitted"] else "no (KVBudgetError)"
                print(f"| {tokens} | {kind} | {a['bound'] / held:.2f}x | {a['budget'] / 1e6:.2f} MB | {verdict} | {peak} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
