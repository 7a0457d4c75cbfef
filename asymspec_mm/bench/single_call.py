"""One request at a time through ``pipe.generate``: the direct path (no loop running: the engine core stepped on the
caller's thread, :mod:`asymspec_mm.core.direct`), the single-row engines it replaced (``solo``: ``prefill=True``, a
contiguous cache per stream) and the same calls while a scheduler runs on the pipeline (each call then a row of its
loop, :mod:`asymspec_mm.core.loop_client`).

``python -m asymspec_mm.bench.single_call`` answers ``--requests`` held-out MiniVista requests of ``--tokens`` tokens
(EOS ignored, the compressed views given, so the arms decode the same tokens) on one thread, the arms in turn,
``--reps`` times; ``--arms direct`` alone runs on a tree without the loop's routing too (a before/after pair).
Printed per arm and repetition: wall seconds, CPU seconds of the whole process (every thread), and the CPU seconds
of each thread by name (the caller's ``MainThread``, the loop's decode, set-up and output threads), so a loaded
machine's waits and the loop's own work can be told apart; then each arm's median and its ratio to the
``--base`` arm (default ``direct``), by wall and by CPU time. ``--profile DIR`` profiles the busy thread of each arm's last repetition
(the caller's on the direct path, the loop's decode thread otherwise) with ``cProfile`` on that thread's CPU clock,
writes ``DIR/METHOD-ARM.pstats`` and prints the CPU seconds of the regions the loop and the direct path differ in
(:data:`REGIONS`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from asymspec_mm.base.config import AsymSpecConfig


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds each live thread of this process has used, summed by thread name (the set-up threads share one)."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            spent = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
        out[thread.name] = out.get(thread.name, 0.0) + spent
    return out


#: The thread that decodes while a loop runs (the scheduler's decode thread), profiled on the loop's arms.
LOOP_THREAD = "asymspec-scheduler"

#: Regions of the busy thread's profile: a label and the functions (``(module path suffix, name)``) whose cumulative
#: CPU seconds it sums. Model forwards are the model's own ``forward`` below the storages; the rest is what the
#: paged storage, the loop's turn and the hand-off to the output thread add around them.
REGIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "model forwards (decode and prefill)": (
        ("engines/paged_rows.py", "_forward"),
        ("engines/single.py", "_forward"),
        ("engines/single.py", "_forward_piece"),
    ),
    "paged: the forward's plan": (("engines/paged_attention.py", "ragged_plan"),),
    "paged: attention (gather + SDPA)": (("engines/paged_attention.py", "paged_attention"),),
    "paged: packed inputs": (("engines/paged_rows.py", "packed_inputs"),),
    "paged: block pool (append, sync, commit)": (
        ("engines/block_pool.py", "append"),
        ("engines/paged_kv.py", "sync"),
        ("engines/paged_kv.py", "copy_blocks"),
        ("engines/paged_attention.py", "commit"),
    ),
    "direct: sdpa attention": (("integrations/sdpa_attention.py", "sdpa_attention_forward"),),
    "direct: KV cache update": (("transformers/cache_utils.py", "update"),),
    "mask builder": (("transformers/masking_utils.py", "create_causal_mask"),),
    "the decoder's step": (("decode/rows.py", "step"),),
    "loop: the turn's bookkeeping": (
        ("core/policy_view.py", "plan_turn"),
        ("core/scheduler.py", "_retire_waiting"),
        ("core/engine_core.py", "retire_cancelled"),
        ("core/engine_core.py", "run_jobs"),
        ("core/policy.py", "admitted"),
        ("core/policy.py", "prefilled"),
        ("core/engine_core.py", "_admit"),
        ("core/engine_core.py", "_make_room"),
        ("core/engine_core.py", "_prefill"),
        ("core/engine_core.py", "_joined"),
        ("core/turn_costs.py", "turn"),
    ),
    "loop: KV accounting": (
        ("core/decoder.py", "reset_peaks"),
        ("core/decoder.py", "peak"),
        ("core/decoder.py", "allocated"),
        ("core/decoder.py", "held_tokens"),
    ),
    "loop: hand-off to the output thread": (("core/output_processor.py", "events"), ("core/output_processor.py", "finish")),
}


def region_seconds(stats: pstats.Stats) -> dict[str, float]:
    """CPU seconds of each of :data:`REGIONS` in ``stats`` (cumulative, recursion counted once by ``pstats``), and
    the thread's whole CPU time (``"in all"``)."""
    found = {label: 0.0 for label in REGIONS}
    total = 0.0
    for (path, _, name), (_, _, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += own
        for label, functions in REGIONS.items():
            if any(name == fn and path.replace("\\", "/").endswith(suffix) for suffix, fn in functions):
                found[label] += cumulative
    return {"in all": total, **found}


@contextmanager
def busy_thread_profile(profile: cProfile.Profile | None, loop: bool):
    """Run ``profile`` (on its thread's CPU clock) in the busy thread of the body: the loop's decode thread (started
    inside the body) with ``loop``, else the calling thread; nothing without ``profile``."""
    if profile is None:
        yield
        return
    if not loop:
        profile.enable()
        try:
            yield
        finally:
            profile.disable()
        return

    def first_call(*_: Any) -> None:  # each new thread's first profiled event: only the decode thread is profiled
        sys.setprofile(None)
        if threading.current_thread().name == LOOP_THREAD:
            profile.enable()

    threading.setprofile(first_call)
    try:
        yield
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


#: The arms: the direct path (the engine core on the caller's thread), the single-row engines it replaced (``solo``:
#: one contiguous cache per stream), the loop on its default (paged) row storages, the loop on padded ones (the
#: loop's own cost apart from paged attention's), the loop on paged storages in each pool layout (whatever the
#: model's number of layers would choose), the loop with a pool per stream (as the direct path keeps).
ARMS = ("direct", "solo", "loop", "loop_padded", "loop_segments", "loop_contiguous", "loop_per_stream")


def run_arm(
    pipe: Any, cases: list[dict], cfg: AsymSpecConfig, method: str, arm: str, profile: cProfile.Profile | None = None
) -> dict[str, Any]:
    """Answer every case with ``pipe.generate``, one after another, on ``arm`` (:data:`ARMS`); returns the wall
    seconds ``s``, the process's CPU seconds ``cpu_s`` and each thread's ``threads`` (by name). ``profile``: a
    ``cProfile.Profile`` on a thread CPU clock that records the arm's busy thread (:func:`busy_thread_profile`)."""
    from asymspec_mm.engines import RowStorages

    if arm not in ARMS:
        raise SystemExit(f"--arms: unknown arm {arm!r}; choose among {', '.join(ARMS)}")
    storages = None  # the arm's row storages (built for that arm alone: an older checkout runs loop and direct)
    if arm == "loop_padded":
        storages = RowStorages("padded")
    elif arm in ("loop_segments", "loop_contiguous"):
        storages = RowStorages(layout=arm.removeprefix("loop_"))
    elif arm == "loop_per_stream":
        storages = RowStorages(per_stream=True)
    loop = arm.startswith("loop")
    solo = {"prefill": True} if arm == "solo" else {}  # a single-row set-up's option: the single-row engines
    with busy_thread_profile(profile, loop), pipe.scheduler(max_batch_size=1, batch_engines=storages) if loop else nullcontext():
        before, cpu0, t0 = thread_cpu_seconds(), time.process_time(), time.perf_counter()
        for c in cases:
            pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], method=method, config=cfg, ignore_eos=True, **solo)
        wall, cpu, after = time.perf_counter() - t0, time.process_time() - cpu0, thread_cpu_seconds()
    threads = {name: round(after[name] - before.get(name, 0.0), 4) for name in after if after[name] - before.get(name, 0.0) > 1e-4}
    return {"s": wall, "cpu_s": cpu, "threads": threads}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.single_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="asymspec,floor")
    ap.add_argument(
        "--arms",
        default="direct,loop",
        help="direct, solo (the single-row engines: prefill=True), loop (a scheduler running), loop_padded (on padded storages), loop_segments / loop_contiguous (on paged storages in that pool layout), loop_per_stream (a pool per stream) [default: %(default)s]",
    )
    ap.add_argument("--base", default="direct", help="the arm the others' speed ratios are over [default: %(default)s]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", type=Path, default=None, help="profile each arm's last repetition; write DIR/METHOD-ARM.pstats")
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
        for arm in arms:  # warm-up: each arm's first calls (and the loop's first storages) are not timed
            run_arm(pipe, cases[:2], cfg, method, arm)
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        profiles: dict[str, cProfile.Profile] = {}
        for rep in range(args.reps):
            for arm in arms:
                profile = None
                if args.profile is not None and rep == args.reps - 1:
                    profile = profiles[arm] = cProfile.Profile(time.thread_time)
                runs[arm].append(run_arm(pipe, cases, cfg, method, arm, profile))
        tokens = args.requests * args.tokens
        out[method] = {}
        for arm, got in runs.items():
            s, cpu = [r["s"] for r in got], [r["cpu_s"] for r in got]
            out[method][arm] = {"s": s, "cpu_s": cpu, "threads": [r["threads"] for r in got], "tokens_per_s": tokens / statistics.median(s)}
        for arm in [a for a in arms if a != args.base and args.base in arms]:  # speed ratios: > 1 the arm is faster
            d, lp = runs[args.base], runs[arm]
            out[method][f"{arm}_over_{args.base}"] = [a["s"] / b["s"] for a, b in zip(d, lp)]
            out[method][f"{arm}_over_{args.base}_cpu"] = [a["cpu_s"] / b["cpu_s"] for a, b in zip(d, lp)]
        for arm, profile in profiles.items():  # the busy thread's regions, CPU seconds (profiler overhead included)
            args.profile.mkdir(parents=True, exist_ok=True)
            path = args.profile / f"{method}-{arm}.pstats"
            profile.dump_stats(path)
            out[method][f"{arm}_profile"] = {k: round(v, 4) for k, v in region_seconds(pstats.Stats(str(path))).items()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
