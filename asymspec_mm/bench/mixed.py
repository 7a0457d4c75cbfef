"""Mixed traffic: requests in several setting groups decoded by one decoder, against one decoder per group stepped
in turn (how the scheduler batched them before issue #42) and against the same requests with one shared setting.

``python -m asymspec_mm.bench.mixed`` takes 16 held-out MiniVista requests in four groups (AsymSpec K=2, CDA,
beta 0.5; AsymSpec K=6, fixed gate, beta 1; Floor; SD K=4), every row decoding ``--tokens`` tokens (EOS ignored,
so every arm emits the same number of tokens), the compressed views given (the set-up is not timed: this measures
decoding). The arms run in turn, ``--reps`` times: ``mixed`` (one decoder), ``groups`` (one decoder per group,
stepped round robin, one set of forwards each) and ``uniform`` (the 16 requests as AsymSpec K=4, CDA, beta 1).
Printed: aggregate tokens/s, model calls per step (the most and the mean) and the ratios measured side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from ..base.config import AsymSpecConfig
from ..frontend.help import terminal_text

#: The four setting groups of the mixed traffic (method, settings).
GROUPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("asymspec", {"k": 2, "gate": "cda", "beta": 0.5}),
    ("asymspec", {"k": 6, "gate": "fixed", "beta": 1.0}),
    ("floor", {"k": 4}),
    ("sd", {"k": 4}),
)
#: The one setting every request gets in the ``uniform`` arm.
UNIFORM: tuple[str, dict[str, Any]] = ("asymspec", {"k": 4, "gate": "cda", "beta": 1.0})


def requests_of(cases: list[dict], tokens: int, uniform: bool) -> list[tuple[str, AsymSpecConfig, dict]]:
    """``(method, config, case)`` per case: group ``i % 4`` of :data:`GROUPS`, or :data:`UNIFORM` for all."""
    out = []
    for i, case in enumerate(cases):
        method, settings = UNIFORM if uniform else GROUPS[i % len(GROUPS)]
        out.append((method, AsymSpecConfig(max_new_tokens=tokens, **settings), case))
    return out


def run_arm(pipe: Any, requests: list[tuple[str, AsymSpecConfig, dict]], per_group: bool) -> dict[str, Any]:
    """Decode ``requests`` (prefilled alone, not timed) on one decoder, or on one decoder per step shape stepped in
    turn (``per_group``); returns wall seconds, tokens, tokens/s, steps and model calls per step."""
    from ..core import BatchDecoder
    from ..decode.rows import step_shape

    decoders: dict[tuple, BatchDecoder] = {}
    for i, (method, cfg, case) in enumerate(requests):
        key = step_shape(method, cfg) if per_group else ()
        decoder = decoders.setdefault(key, BatchDecoder(pipe))
        session = pipe.prepare(
            case["image"],
            case["question"],
            caption=case["caption"],
            ocr=case["ocr"],
            method=method,
            config=cfg,
            ignore_eos=True,
            prefill=True,
        )
        decoder.add(i, session)
    tokens, calls = 0, []
    t0 = time.perf_counter()
    while any(d.rows for d in decoders.values()):
        for decoder in [d for d in decoders.values() if d.rows]:
            before = decoder.engine_calls
            for _, events in decoder.step():
                tokens += len(events)
            calls.append(decoder.engine_calls - before)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "steps": len(calls),
        "max_calls_per_step": max(calls),
        "mean_calls_per_step": statistics.mean(calls),
    }


def measure(pipe: Any, cases: list[dict], tokens: int, reps: int) -> dict[str, Any]:
    """The three arms in turn, ``reps`` times (one warm-up first); the median of each figure and the ratios of
    tokens/s pair by pair (``mixed / groups`` and ``mixed / uniform``)."""
    arms = {
        "mixed": (requests_of(cases, tokens, uniform=False), False),
        "groups": (requests_of(cases, tokens, uniform=False), True),
        "uniform": (requests_of(cases, tokens, uniform=True), False),
    }
    with pipe.prefix_kv.paused():
        for reqs, per_group in arms.values():  # warm-up
            run_arm(pipe, reqs[:4], per_group)
        runs: dict[str, list[dict]] = {name: [] for name in arms}
        for _ in range(reps):
            for name, (reqs, per_group) in arms.items():
                runs[name].append(run_arm(pipe, reqs, per_group))
    med = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    ratio = lambda a, b: [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[a], runs[b])]  # noqa: E731
    return {
        "requests": len(cases),
        "tokens_per_request": tokens,
        "reps": reps,
        "arms": med,
        "mixed_over_groups": ratio("mixed", "groups"),
        "mixed_over_uniform": ratio("mixed", "uniform"),
        "k_max_plus_2": max(s.get("k", 4) for m, s in GROUPS if m == "asymspec") + 2,
    }


def report(figures: dict[str, Any]) -> str:
    """The figures as a Markdown table and two ratio lines."""
    lines = ["| arm | tokens/s | steps | max calls / step | mean calls / step |", "|---|---:|---:|---:|---:|"]
    for name, f in figures["arms"].items():
        lines.append(
            f"| {name} | {f['tokens_per_s']:.1f} | {f['steps']:.0f} | {f['max_calls_per_step']:.0f} | {f['mean_calls_per_step']:.2f} |"
        )
    for key in ("mixed_over_groups", "mixed_over_uniform"):
        r = figures[key]
        lines.append(
            f"\n{key.replace('_', ' ')} (tokens/s, pair by pair): median {statistics.median(r):.2f}x (min {min(r):.2f}, max {max(r):.2f})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.mixed", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny", help="the pair (a preset name)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32, help="tokens each request decodes (EOS ignored)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    from ..pipeline.facade import AsymSpecPipeline
    from .pairs import bench_cases

    pipe = AsymSpecPipeline.from_preset(args.preset)
    figures = measure(pipe, bench_cases(args.requests), args.tokens, args.reps)
    print(report(figures))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
