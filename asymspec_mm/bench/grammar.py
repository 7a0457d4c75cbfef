"""What grammar-constrained decoding costs: tokens/s of JSON answers (``response_format`` json_schema) against the
same requests unconstrained, side by side, on the shipped tiny pair.

Each pair decodes one request twice: constrained (it stops when the grammar is complete), then unconstrained with
EOS ignored and the token budget set to the constrained answer's length, so both commit the same number of tokens
through the same method; which runs first alternates. Reported per method, as medians of the paired ratios:

- the time of a decoding step (the decoding loop's own time over its steps, set-up and prefill left out),
  constrained over free: what the grammar adds to the step that carries it (the masks of K + 1 positions,
  pushing the drafts, settling), at the same forwards. This is the overhead the issue's
  10% bound is about; a step's forwards do not depend on what it accepts.
- tokens/s, free over constrained: the whole effect, which also holds the acceptance. A grammar's forced tokens
  are where the drafter and the verifier agree, so the constrained run usually accepts more and is faster.

``python -m asymspec_mm.bench.grammar [--pairs 12] [--methods asymspec,floor]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from ..frontend.help import terminal_text

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 999},
        "color": {"enum": ["red", "green", "blue", "yellow"]},
        "reason": {"type": "string", "maxLength": 24},
    },
    "required": ["answer", "color", "reason"],
}


def measure(pipe: Any, problems: list[dict], methods: list[str], k: int = 4) -> dict[str, list[dict]]:
    """Per method, one record per problem: both runs' tokens and seconds, and the paired ratio."""
    from ..base.config import AsymSpecConfig

    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    out: dict[str, list[dict]] = {m: [] for m in methods}
    for i, p in enumerate(problems):
        messages = [{"role": "user", "content": [{"type": "image", "image": p["decoded_image"]}, p["question"]]}]
        view = {"caption": p["caption"], "ocr": p["ocr"]}
        for method in methods:
            timed: dict[str, tuple[int, float]] = {}
            order = ("constrained", "free") if i % 2 == 0 else ("free", "constrained")
            n = None
            if order[0] == "free":  # the free run needs the constrained answer's length: learn it untimed
                with pipe.prefix_kv.paused():
                    n = len(
                        pipe.chat(
                            messages, method=method, response_format=fmt, config=AsymSpecConfig(k=k, max_new_tokens=200), **view
                        ).token_ids
                    )
            for mode in order:
                with pipe.prefix_kv.paused():  # both prefill from scratch
                    if mode == "constrained":
                        cfg = AsymSpecConfig(k=k, max_new_tokens=200)
                        t0 = time.perf_counter()
                        res = pipe.chat(messages, method=method, response_format=fmt, config=cfg, **view)
                    else:
                        cfg = AsymSpecConfig(k=k, max_new_tokens=n or timed["constrained"][0])
                        t0 = time.perf_counter()
                        res = pipe.chat(messages, method=method, config=cfg, ignore_eos=True, **view)
                    timed[mode] = (len(res.token_ids), time.perf_counter() - t0, res.stats["steps"], res.stats["decode_wall_s"])
                    if mode == "constrained":
                        n = len(res.token_ids)
            (nc, sc, kc, dc), (nf, sf, kf, df) = timed["constrained"], timed["free"]
            out[method].append(
                {
                    "tokens": nc,
                    "steps": kc,
                    "constrained_s": sc,
                    "free_s": sf,
                    "ratio": (nf / sf) / (nc / sc),
                    "step_ratio": (dc / kc) / (df / kf),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.grammar", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--methods", default="asymspec,floor")
    args = ap.parse_args(argv)
    from ..eval.minivista import make_problem
    from ..pipeline.facade import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
    methods = args.methods.split(",")
    problems = [make_problem(11, i) for i in range(args.pairs + 1)]
    measure(pipe, problems[:1], methods)  # warm-up: first-use costs (grammar compiler, first forwards)
    results = measure(pipe, problems[1:], methods)
    print(
        "| method | pairs | tokens per answer | step time, constrained / free (median, range) "
        "| constrained tok/s | free tok/s | tok/s, free / constrained (median, range) |"
    )
    print("|---|---|---|---|---|---|---|")
    for method, rows in results.items():
        step, tps = sorted(r["step_ratio"] for r in rows), sorted(r["ratio"] for r in rows)
        print(
            f"| {method} | {len(rows)} | {statistics.median(r['tokens'] for r in rows):.0f} "
            f"| {statistics.median(step):.3f} ({step[0]:.3f}-{step[-1]:.3f}) "
            f"| {statistics.median(r['tokens'] / r['constrained_s'] for r in rows):.0f} "
            f"| {statistics.median(r['tokens'] / r['free_s'] for r in rows):.0f} "
            f"| {statistics.median(tps):.3f} ({tps[0]:.3f}-{tps[-1]:.3f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
