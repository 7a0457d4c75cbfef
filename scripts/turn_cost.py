"""What a decode-loop turn costs while requests arrive: prompt pieces riding in the step's forwards against staging
forwards before the step, side by side in one process, in the loop thread's own CPU time.

A Floor row decodes on the tiny pair (random checkpoints); four AsymSpec requests (caption and OCR given, so set-up
runs no model) arrive at once. Each turn runs as the scheduler runs it (the prompt pieces under the token budget,
the step, the joins) and is timed in CPU time of this thread (``time.thread_time``, torch on one thread: every
forward runs here) and in wall time. Two arms in turn: ``rides`` (the paged default: an arriving row is a row of its
decode storages, its pieces ride in the step's forwards) and ``staging`` (the same paged storages declaring that they
take no pieces: a staging forward per storage before the step, the row handed over by reference at join, the path
before). Reported: the longest turn while the four arrive over the median turn with every row decoding, and the
forwards per turn::

    PYTHONPATH=. python scripts/turn_cost.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from asymspec_mm.base.config import AsymSpecConfig
from asymspec_mm.bench.pairs import bench_cases
from asymspec_mm.checkpoints.small import build_tiny_checkpoints
from asymspec_mm.core import BatchDecoder
from asymspec_mm.core.policy import DEFAULT_TOKEN_BUDGET, prefill_budget
from asymspec_mm.engines.paged_rows import PagedBatchEngine, PagedStorages
from asymspec_mm.frontend.options import load_pipeline


class StagedPaged(PagedBatchEngine):
    """A paged storage that takes no prompt pieces in its forwards (its rows arrive through staging forwards)."""

    takes_chunks = False


class StagedStorages(PagedStorages):
    def __call__(self, model, name: str) -> PagedBatchEngine:
        kv, new = self._pool(model)
        return StagedPaged(model, name, kv=kv, reports_pool=new)


def turn(decoder: BatchDecoder) -> None:
    """One turn as the scheduler runs it: the pieces (staging forwards now, rides for the step), joins, the step, joins."""
    rides = decoder.stage(prefill_budget(DEFAULT_TOKEN_BUDGET, decoder.step_tokens()))
    decoder.join_ready()
    decoder.step(rides=rides)
    decoder.join_ready()


def run_once(pipe, arm: str, live: dict, new: list[dict]) -> dict:
    decoder = BatchDecoder(pipe, engines=StagedStorages() if arm == "staging" else PagedStorages())
    decoder.add(0, pipe.prepare(**live, method="floor", config=AsymSpecConfig(max_new_tokens=400), ignore_eos=True, prefill=False))
    while decoder.arriving:
        decoder.prefill_step()
    for _ in range(5):
        decoder.step()
    cfg = AsymSpecConfig(max_new_tokens=40)
    for i, r in enumerate(new, start=1):
        decoder.add(i, pipe.prepare(**r, config=cfg, ignore_eos=True, prefill=False))
    arriving, after = [], []
    while len(after) < 10:
        calls = decoder.engine_calls + decoder.arriving.forwards
        w, c = time.perf_counter(), time.thread_time()
        busy = bool(decoder.arriving)
        turn(decoder)
        took = (time.perf_counter() - w, time.thread_time() - c)
        calls = decoder.engine_calls + decoder.arriving.forwards - calls
        (arriving if busy else after).append((*took, calls))
    return {
        "arm": arm,
        "turns_arriving": len(arriving),
        "longest_cpu_ms": 1e3 * max(c for _, c, _ in arriving),
        "longest_wall_ms": 1e3 * max(w for w, _, _ in arriving),
        "step_all_cpu_ms": 1e3 * statistics.median(c for _, c, _ in after),
        "step_all_wall_ms": 1e3 * statistics.median(w for w, _, _ in after),
        "forwards_arriving": [n for _, _, n in arriving],
        "forwards_all": statistics.median(n for _, _, n in after),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="runs/admission_ckpt")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    drafter_dir, verifier_dir = build_tiny_checkpoints(args.dir)
    pipe = load_pipeline(drafter=str(drafter_dir), verifier=str(verifier_dir))
    cases = [{"image": c["image"], "question": c["question"]} for c in bench_cases(1 + 4 * (args.reps + 1))]
    live = {**cases[0], "caption": "a chart", "ocr": ""}
    with pipe.prefix_kv.paused():
        for rep in range(args.reps + 1):  # the first is a warm-up
            new = [{**c, "caption": "a bar chart of four values", "ocr": "12 40 7"} for c in cases[1 + rep * 4 : 5 + rep * 4]]
            for arm in ("staging", "rides"):
                r = run_once(pipe, arm, live, new)
                r["cpu_ratio"] = r["longest_cpu_ms"] / r["step_all_cpu_ms"]
                r["wall_ratio"] = r["longest_wall_ms"] / r["step_all_wall_ms"]
                shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                print(json.dumps({"warmup": rep == 0, **shown}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
