"""Admission stall: how long a decoding row waits between its steps while new requests are set up.

One live row decodes a long answer through the scheduler; once it has stepped a few times, ``n_new``
requests with an automatic caption (and OCR, when the pipeline has an engine) are submitted. Reported: the
live row's median gap between steps before they arrive, its longest gap while they are set up, their ratio
(the stall), and how many steps it made during their set-up. ``python -m asymspec_mm.bench.admission``
prints a run on random tiny checkpoints (the live row: Floor, 300 tokens); :func:`measure_stall` takes any
pipeline (a :class:`~asymspec_mm.requests.preparing.ServingPipeline`: the measure is the scheduler's, not the facade's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any

from ..base.config import AsymSpecConfig
from ..cli.help import terminal_text

if TYPE_CHECKING:
    from ..requests.preparing import ServingPipeline


def stall_figures(live_stamps: list[float], window: tuple[float, float], after_steps: int = 10) -> dict[str, Any]:
    """The live row's gaps from its step times (monotonic seconds, in order) and the set-up ``window``:
    ``median_step_s`` before the window (the row alone), ``median_step_all_s`` over the ``after_steps`` gaps after
    it (every row decoding: the issue's reference), ``longest_gap_s`` of the gaps that overlap the window, the
    ratios ``stall`` (to the step alone) and ``stall_all`` (to the step with all rows), and ``steps_during_setup``."""
    start, end = window
    gaps = [(a, b - a) for a, b in zip(live_stamps, live_stamps[1:])]
    before = [g for t, g in gaps if t + g <= start]
    during = [g for t, g in gaps if t < end and t + g > start]
    after = [g for t, g in gaps if t >= end][:after_steps]
    median = statistics.median(before) if before else float("nan")
    median_all = statistics.median(after) if after else float("nan")
    longest = max(during) if during else 0.0
    return {
        "median_step_s": median,
        "median_step_all_s": median_all,
        "longest_gap_s": longest,
        "stall": longest / median if before and median > 0 else float("nan"),
        "stall_all": longest / median_all if after and median_all > 0 else float("nan"),
        "steps_during_setup": sum(start <= t <= end for t in live_stamps),
    }


def measure_stall(
    pipe: ServingPipeline,
    live: dict,
    new: list[dict],
    *,
    live_method: str = "floor",
    live_tokens: int = 300,
    warm_steps: int = 20,
    new_tokens: int = 40,
    prefill_chunk_tokens: int | None = None,
    token_budget: int | None = None,
) -> dict:
    """Run the scenario once on a scheduler of ``pipe``. ``live`` / ``new[i]``: ``image``, ``question`` and optional
    ``caption``/``ocr`` (``None`` makes them); every row decodes its whole budget (EOS ignored: random weights could
    stop it early, and the lengths are the scenario); ``prefill_chunk_tokens``: the scheduler's batched prefill budget
    (``None``: its default). Returns :func:`stall_figures` plus the set-up window's length, the live row's steps, the
    longest time a request spent in the batched prefill (its pieces interleaved with the steps), and the new
    requests' caption seconds and tokens."""
    from ..core.scheduler import Scheduler

    stamps: list[float] = []
    joined: dict[int, float] = {}
    chunk = {} if prefill_chunk_tokens is None else {"prefill_chunk_tokens": prefill_chunk_tokens}
    if token_budget is not None:
        chunk["token_budget"] = token_budget
    with pipe.prefix_kv.paused(), Scheduler(pipe, max_batch_size=len(new) + 1, **chunk) as sched:
        cfg = AsymSpecConfig(max_new_tokens=live_tokens)
        h = sched.submit(
            live["image"],
            live["question"],
            caption=live.get("caption"),
            ocr=live.get("ocr"),
            method=live_method,
            config=cfg,
            ignore_eos=True,
        )
        steps = iter(h)
        for _ in range(warm_steps):
            next(steps)
            stamps.append(time.monotonic())
        new_cfg = AsymSpecConfig(max_new_tokens=new_tokens)  # they decode a while beside the live row (the step with all rows)
        handles = [
            sched.submit(r["image"], r["question"], caption=r.get("caption"), ocr=r.get("ocr"), config=new_cfg, ignore_eos=True)
            for r in new
        ]

        def first_step(handle) -> None:
            for _ in handle:
                joined.setdefault(handle.id, time.monotonic())

        watchers = [threading.Thread(target=first_step, args=(x,), daemon=True) for x in handles]
        for w in watchers:
            w.start()
        for _ in steps:
            stamps.append(time.monotonic())
        results = [x.result(timeout=600) for x in handles]
        for w in watchers:
            w.join(60)
    window = (min(x.submitted_at for x in handles), max(joined.values()))
    return {
        **stall_figures(stamps, window),
        "setup_window_s": window[1] - window[0],
        "live_steps": len(stamps),
        "longest_prefill_s": max(r.stats["prefill_s"] for r in results),
        "caption_s": sum(r.stats["caption_s"] for r in results),
        "caption_tokens": sum(len(pipe.tokenizer(r.view.caption, add_special_tokens=False)["input_ids"]) for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.admission", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--dir", default="runs/admission_ckpt", help="where the random tiny checkpoints are built (reused)")
    ap.add_argument("--new", type=int, default=4, help="requests set up while the live row decodes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="repetitions run first and not counted (the first AsymSpec step of a process pays one-time costs)",
    )
    ap.add_argument("--live-tokens", type=int, default=3000, help="the live row's length: it must outlast the set-up")
    ap.add_argument("--prefill-chunk-tokens", type=int, default=None, help="the batched prefill's tokens per forward")
    ap.add_argument("--token-budget", type=int, default=None, help="tokens a scheduler turn's forwards carry, decode first")
    args = ap.parse_args(argv)
    from ..checkpoints.small import build_tiny_checkpoints
    from .pairs import bench_cases, load_pair

    drafter_dir, verifier_dir = build_tiny_checkpoints(args.dir)
    pipe = load_pair("dirs", drafter=str(drafter_dir), verifier=str(verifier_dir)).pipe  # the bench's loader, OCR off
    total = args.warmup + args.reps
    cases = bench_cases(1 + args.new * total)
    live = {**cases[0], "caption": "a chart", "ocr": ""}
    runs = []
    for rep in range(total):  # new images each time: their captions are not in the caption cache yet
        new = [{**c, "caption": None, "ocr": False} for c in cases[1 + rep * args.new : 1 + (rep + 1) * args.new]]
        runs.append(
            measure_stall(
                pipe,
                live,
                new,
                live_method="floor",
                live_tokens=args.live_tokens,
                prefill_chunk_tokens=args.prefill_chunk_tokens,
                token_budget=args.token_budget,
            )
        )
    for i, r in enumerate(runs):
        print(("warm-up " if i < args.warmup else "") + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))
    runs = runs[args.warmup :]
    for key, label in (("stall", "the row's step alone"), ("stall_all", "the step with every row decoding")):
        v = sorted(r[key] for r in runs)
        print(
            f"{key} (longest gap during set-up / {label}): median {statistics.median(v):.2f}x (min {v[0]:.2f}, max {v[-1]:.2f}, n={len(v)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
