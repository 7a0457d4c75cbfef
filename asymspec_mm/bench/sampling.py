"""What sampling costs: sampled decoding (temperature > 0, the sampled rule) against greedy decoding of the same
requests, side by side, on the shipped tiny pair.

Each pair decodes one request twice with EOS ignored and the same token budget, greedy and sampled (which runs first
alternates), so both commit the same number of tokens through the same method. Reported per method, as medians of
the paired ratios:

- the time of a decoding step (the decoding loop's own time over its steps; set-up and prefill left out), sampled over
  greedy: what the sampled rule adds to a step at the same forwards (the tempered and filtered distributions, the
  gate's set, the draws, the per-row uniforms). A step's forwards do not depend on what it accepts.
- tokens/s, greedy over sampled: the whole effect, acceptance included (sampled drafts are accepted less often where
  the drafter's distribution is flat).

``python -m asymspec_mm.bench.sampling [--pairs 8] [--methods asymspec,floor] [--temperature 0.7 --top-p 0.8] [--top-k 20]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from ..frontend.help import terminal_text


def measure(
    pipe: Any,
    problems: list[dict],
    methods: list[str],
    *,
    k: int = 4,
    tokens: int = 48,
    temperature: float = 0.7,
    top_p: float = 0.8,
    top_k: int = 0,
) -> dict[str, list[dict]]:
    """Per method, one record per problem: both runs' seconds, steps and acceptance, and the paired ratios."""
    from ..base.config import AsymSpecConfig

    out: dict[str, list[dict]] = {m: [] for m in methods}
    greedy_cfg = AsymSpecConfig(k=k, max_new_tokens=tokens)
    sampled_cfg = greedy_cfg.with_(temperature=temperature, top_p=top_p, top_k=top_k)
    for i, p in enumerate(problems):
        for method in methods:
            timed: dict[str, tuple[float, int, float, float]] = {}
            order = ("greedy", "sampled") if i % 2 == 0 else ("sampled", "greedy")
            for mode in order:
                cfg = greedy_cfg if mode == "greedy" else sampled_cfg.with_(seed=i)
                with pipe.prefix_kv.paused():  # both prefill from scratch
                    t0 = time.perf_counter()
                    res = pipe.generate(
                        p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, config=cfg, ignore_eos=True
                    )
                s = res.stats
                timed[mode] = (time.perf_counter() - t0, s["steps"], s["decode_wall_s"], s["mean_accepted_length"])
            (sg, kg, dg, mg), (ss, ks, ds, ms) = timed["greedy"], timed["sampled"]
            out[method].append(
                {
                    "tokens": tokens,
                    "greedy_s": sg,
                    "sampled_s": ss,
                    "greedy_mal": mg,
                    "sampled_mal": ms,
                    "ratio": (tokens / sg) / (tokens / ss),
                    "step_ratio": (ds / ks) / (dg / kg),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.sampling", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--methods", default="asymspec,floor")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine) [default: %(default)s]")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from ..eval.minivista import make_problem
    from ..pipeline.facade import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
    methods = args.methods.split(",")
    problems = [make_problem(11, i) for i in range(args.pairs + 1)]
    kw = dict(tokens=args.tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    measure(pipe, problems[:1], methods, **kw)  # warm-up: first-use costs
    results = measure(pipe, problems[1:], methods, **kw)
    print(
        f"temperature {args.temperature:g}, top_p {args.top_p:g}, top_k {args.top_k}, {args.tokens} tokens a request (EOS ignored), "
        f"K = 4, {args.threads} thread(s)"
    )
    print(
        "| method | pairs | MAL greedy | MAL sampled | step time, sampled / greedy (median, range) "
        "| greedy tok/s | sampled tok/s | tok/s, greedy / sampled (median, range) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method, rows in results.items():
        step, tps = sorted(r["step_ratio"] for r in rows), sorted(r["ratio"] for r in rows)
        print(
            f"| {method} | {len(rows)} | {statistics.median(r['greedy_mal'] for r in rows):.2f} "
            f"| {statistics.median(r['sampled_mal'] for r in rows):.2f} "
            f"| {statistics.median(step):.3f} ({step[0]:.3f}-{step[-1]:.3f}) "
            f"| {statistics.median(r['tokens'] / r['greedy_s'] for r in rows):.0f} "
            f"| {statistics.median(r['tokens'] / r['sampled_s'] for r in rows):.0f} "
            f"| {statistics.median(tps):.3f} ({tps[0]:.3f}-{tps[-1]:.3f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
