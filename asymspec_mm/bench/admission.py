"""Admission stall: how long a decoding row waits between its steps while new requests are set up.

One live row decodes a long answer through the scheduler; once it has stepped a few times, ``n_new``
requests with an automatic caption (and OCR with ``--ocr ENGINE``) are submitted. Reported: the live row's
median gap between steps before they arrive, its longest gap while they are set up, their ratio (the stall),
its mean step during their set-up against its mean step after, and how many steps it made during their set-up.
``python -m asymspec_mm.bench.admission`` prints a run on random tiny checkpoints (the live row: Floor, 3,000
tokens); ``--ocr-workers N`` reads the images in N worker processes (:mod:`captioning.ocr.workers`) instead of the
set-up thread, ``--ocr-threads N`` bounds the OCR engine's compute threads; ``--contention`` measures OCR beside the
live row alone (:func:`measure_contention`) and the wait for the interpreter lock it adds (:func:`measure_lock_wait`).
:func:`measure_stall` takes any pipeline (a :class:`~asymspec_mm.request.preparing.ServingPipeline`: the measure is
the scheduler's, not the facade's).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base.config import AsymSpecConfig
from ..frontend.help import terminal_text

if TYPE_CHECKING:
    from ..request.preparing import ServingPipeline


def _p99(values: list[float]) -> float:
    """The 99th percentile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def stall_figures(live_stamps: list[float], window: tuple[float, float], after_steps: int = 10) -> dict[str, Any]:
    """The live row's gaps from its step times (monotonic seconds, in order) and the set-up ``window``:
    ``median_step_s`` before the window (the row alone), ``median_step_all_s`` over the ``after_steps`` gaps after
    it (every row decoding: the issue's reference), ``longest_gap_s`` of the gaps that overlap the window, the
    ratios ``stall`` (to the step alone) and ``stall_all`` (to the step with all rows), the mean gaps during the window
    (``mean_step_setup_s``) and over the ``after_steps`` after it (``mean_step_after_s``), their ratio
    ``setup_vs_after``, the 99th percentile of the gaps during the window (``p99_gap_setup_s``), and
    ``steps_during_setup``."""
    start, end = window
    gaps = [(a, b - a) for a, b in zip(live_stamps, live_stamps[1:])]
    before = [g for t, g in gaps if t + g <= start]
    during = [g for t, g in gaps if t < end and t + g > start]
    after = [g for t, g in gaps if t >= end][:after_steps]
    median = statistics.median(before) if before else float("nan")
    median_all = statistics.median(after) if after else float("nan")
    longest = max(during) if during else 0.0
    mean_during = statistics.fmean(during) if during else float("nan")
    mean_after = statistics.fmean(after) if after else float("nan")
    return {
        "median_step_s": median,
        "median_step_all_s": median_all,
        "longest_gap_s": longest,
        "stall": longest / median if before and median > 0 else float("nan"),
        "stall_all": longest / median_all if after and median_all > 0 else float("nan"),
        "mean_step_setup_s": mean_during,
        "mean_step_after_s": mean_after,
        "setup_vs_after": mean_during / mean_after if during and after and mean_after > 0 else float("nan"),
        "p99_gap_setup_s": _p99(during) if during else float("nan"),
        "steps_during_setup": sum(start <= t <= end for t in live_stamps),
    }


def cpu_stall(live_stamps: list[float], loop_cpu: list[float], window: tuple[float, float], after_steps: int = 10) -> dict[str, Any]:
    """The live row's gaps in the decode loop's own CPU time (``loop_cpu``: the loop thread's ``time.thread_time()``
    at each step's end, beside ``live_stamps``): ``longest_gap_cpu_s`` of the gaps that overlap the set-up ``window``,
    ``median_step_all_cpu_s`` over the ``after_steps`` after it and their ratio ``stall_all_cpu``. A busy machine
    stretches wall gaps with waits for a core; the loop's CPU time counts only the work it did in them."""
    start, end = window
    gaps = [(a, cb - ca) for a, ca, cb in zip(live_stamps, loop_cpu, loop_cpu[1:])]
    walls = [b - a for a, b in zip(live_stamps, live_stamps[1:])]
    during = [g for (t, g), w in zip(gaps, walls) if t < end and t + w > start]
    after = [g for t, g in gaps if t >= end][:after_steps]
    longest = max(during) if during else 0.0
    median_all = statistics.median(after) if after else float("nan")
    return {
        "longest_gap_cpu_s": longest,
        "median_step_all_cpu_s": median_all,
        "stall_all_cpu": longest / median_all if after and median_all > 0 else float("nan"),
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
    setup_workers: int | None = None,
    max_stall: float | None = None,
) -> dict:
    """Run the scenario once on a scheduler of ``pipe``. ``live`` / ``new[i]``: ``image``, ``question`` and optional
    ``caption``/``ocr`` (``None`` makes them); every row decodes its whole budget (EOS ignored: random weights could
    stop it early, and the lengths are the scenario); ``prefill_chunk_tokens``: the scheduler's batched prefill budget
    (``None``: its default); ``setup_workers``: its set-up threads (``None``: its default); ``max_stall``: its stall bound (``None``: off). Returns :func:`stall_figures` and
    :func:`cpu_stall`
    plus the set-up window's length, each new request's time to its first token (``first_token_s``, in submission
    order), the live row's steps, the
    longest time a request spent in the batched prefill (its pieces interleaved with the steps), the new
    requests' caption seconds and tokens, and their OCR seconds (``ocr_s``, summed)."""
    from ..core.scheduler import Scheduler

    # each step's end, stamped in the decode loop: the texts are made on the output thread, which hands a consumer
    # several steps at once when it falls behind, so a consumer's stamps are not the row's steps. The live row takes
    # part in every step from the first until its last (it is alone at first, and a Floor row never skips a step).
    stamps: list[float] = []
    loop_cpu: list[float] = []  # the loop thread's CPU seconds at the same moments (the callback runs on it)
    joined: dict[int, float] = {}
    chunk = {} if prefill_chunk_tokens is None else {"prefill_chunk_tokens": prefill_chunk_tokens}
    if token_budget is not None:
        chunk["token_budget"] = token_budget
    if setup_workers is not None:
        chunk["setup_workers"] = setup_workers
    if max_stall is not None:
        chunk["max_stall"] = max_stall

    def on_step(*_: Any) -> None:
        stamps.append(time.monotonic())
        loop_cpu.append(time.thread_time())

    with pipe.prefix_kv.paused(), Scheduler(pipe, max_batch_size=len(new) + 1, on_step=on_step, **chunk) as sched:
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
            pass
        live_steps = h.result().stats["steps"]
        results = [x.result(timeout=600) for x in handles]
        for w in watchers:
            w.join(60)
    window = (min(x.submitted_at for x in handles), max(joined.values()))
    return {
        **stall_figures(stamps[:live_steps], window),
        **cpu_stall(stamps[:live_steps], loop_cpu[:live_steps], window),
        "setup_window_s": window[1] - window[0],
        "first_token_s": [joined[x.id] - x.submitted_at for x in handles],
        "live_steps": live_steps,
        "longest_prefill_s": max(r.stats["prefill_s"] for r in results),
        "caption_s": sum(r.stats["caption_s"] for r in results),
        "ocr_s": sum(r.stats["ocr_s"] for r in results),
        "caption_tokens": sum(len(pipe.tokenizer(r.view.caption, add_special_tokens=False)["input_ids"]) for r in results),
    }


def measure_contention(pipe: ServingPipeline, live: dict, images: list, engine: Any, *, steps: int = 1500, warm_steps: int = 50) -> dict:
    """The live row (Floor, alone in a scheduler) decoding ``steps`` steps while a thread reads ``images`` in turn with
    ``engine`` (``None``: nothing beside it), as the set-up thread does: its ``mean_step_s``, ``median_step_s``,
    ``p99_step_s`` and ``longest_gap_s``, and the images OCR read a second meanwhile (``ocr_per_s``)."""
    from ..core.scheduler import Scheduler

    stop, reads = threading.Event(), [0]

    def read_on() -> None:
        while not stop.is_set():
            engine.read(images[reads[0] % len(images)])
            reads[0] += 1

    stamps: list[float] = []  # each step's end, stamped in the decode loop (a consumer thread would see them late)
    seen, enough = [0], threading.Event()

    def on_step(rows: int, calls: int, seconds: float) -> None:
        seen[0] += 1
        if seen[0] > warm_steps and not enough.is_set():
            stamps.append(time.monotonic())
            if len(stamps) > steps:
                enough.set()

    reader = threading.Thread(target=read_on, daemon=True) if engine is not None else None
    if reader is not None:
        reader.start()
        while not reads[0]:  # one read done: the reading is under way and its first-read costs are paid
            time.sleep(0.01)
    t0, reads0 = time.monotonic(), reads[0]
    try:
        with pipe.prefix_kv.paused(), Scheduler(pipe, max_batch_size=1, on_step=on_step) as sched:
            cfg = AsymSpecConfig(max_new_tokens=warm_steps + steps + 100)
            h = sched.submit(
                live["image"], live["question"], caption=live.get("caption"), ocr="", method="floor", config=cfg, ignore_eos=True
            )
            while not enough.wait(0.05):
                if h.done():
                    raise RuntimeError(f"the live row ended after {len(stamps)} of {steps} steps: {h.result()}")
            elapsed, done_reads = time.monotonic() - t0, reads[0] - reads0
            h.cancel()
    finally:
        stop.set()
        if reader is not None:
            reader.join(600)
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    return {
        "mean_step_s": statistics.fmean(gaps),
        "median_step_s": statistics.median(gaps),
        "p99_step_s": _p99(gaps),
        "longest_gap_s": gaps[-1],
        "ocr_per_s": done_reads / elapsed if engine is not None else 0.0,
    }


def measure_lock_wait(images: list, engine: Any, seconds: float = 3.0) -> dict:
    """How late a thread that sleeps 1 ms wakes while a second thread reads ``images`` with ``engine`` (``None``:
    nothing beside it), no model running: the wait for the interpreter lock (and a core) that OCR in this process
    adds to every wake-up, as it does to the decode loop after each model call. Returns ``lock_wait_mean_s`` and
    ``lock_wait_p99_s``."""
    stop, lates = threading.Event(), []

    def read_on() -> None:
        i = 0
        while not stop.is_set():
            engine.read(images[i % len(images)])
            i += 1

    reader = threading.Thread(target=read_on, daemon=True) if engine is not None else None
    if reader is not None:
        reader.start()
        time.sleep(0.2)
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            t = time.perf_counter()
            time.sleep(0.001)
            lates.append(time.perf_counter() - t - 0.001)
    finally:
        stop.set()
        if reader is not None:
            reader.join(600)
    lates.sort()
    return {"lock_wait_mean_s": statistics.fmean(lates), "lock_wait_p99_s": _p99(lates)}


@dataclass(frozen=True)
class Arm:
    """One OCR setting the run measures: the engine (``none``: no OCR), read in ``workers`` worker processes (0: in
    the set-up thread, as before) with ``threads`` compute threads (0: the engine's default) at ``nice`` lower CPU
    priority (workers only), on a scheduler with the stall bound ``max_stall`` (``None``: off)."""

    ocr: str
    workers: int = 0
    threads: int = 0
    nice: int = 0
    max_stall: float | None = None

    @property
    def label(self) -> str:
        bound = f", max stall {self.max_stall:g}x" if self.max_stall is not None else ""
        if self.ocr == "none":
            return "no OCR" + bound
        where = f"{self.workers} worker process{'es' * (self.workers > 1)}" if self.workers else "the set-up thread"
        niced = f", nice {self.nice}" if self.nice else ""
        return f"{self.ocr} in {where}, {self.threads or 'default'} thread{'s' * (self.threads != 1)}{niced}{bound}"

    def engine(self) -> Any:
        """The OCR engine the arm's pipeline gets (``"none"``: the engine that finds nothing)."""
        from captioning.ocr import get_ocr_engine
        from captioning.ocr.workers import ProcessOCREngine

        threads = self.threads or None
        if self.ocr == "none":
            return "none"
        if self.workers:
            return ProcessOCREngine(self.ocr, self.workers, threads=threads, nice=self.nice)
        return get_ocr_engine(self.ocr, **({"threads": threads} if threads else {}))


def arms_of(engines: str, workers: str, threads: str, nice: str = "0", stalls: str = "none") -> list[Arm]:
    """Every combination of the comma-separated ``engines`` x ``workers`` x ``threads`` x ``nice`` (one arm for
    ``none``; ``nice`` only with workers) x ``stalls`` (``none``: no stall bound)."""

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    bounds = [None if x.strip() == "none" else float(x) for x in stalls.split(",") if x.strip()]
    arms: list[Arm] = []
    for ocr in (e.strip() for e in engines.split(",") if e.strip()):
        for bound in bounds:
            combos = (
                [Arm(ocr, max_stall=bound)]
                if ocr == "none"
                else [Arm(ocr, w, t, n if w else 0, bound) for w in ints(workers) for t in ints(threads) for n in ints(nice)]
            )
            arms += [arm for i, arm in enumerate(combos) if arm not in arms and arm not in combos[:i]]
    return arms


def _summary(runs: list[dict], key: str) -> str:
    v = sorted(r[key] for r in runs)
    return f"{statistics.median(v):.2f}x ({v[0]:.2f}-{v[-1]:.2f})"


def _median_of(runs: list[dict], key: str, scale: float = 1.0) -> str:
    v = sorted(r[key] * scale for r in runs)
    return f"{statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f})"


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
    ap.add_argument("--setup-workers", type=int, default=None, help="the scheduler's set-up threads [default: the scheduler's]")
    ap.add_argument(
        "--max-stall",
        default="none",
        help="the scheduler's stall bound (a turn's set-up calls and prompt pieces cost at most this times its step), "
        "comma-separated; none is off; each is an arm [default: %(default)s]",
    )
    ap.add_argument(
        "--ocr",
        default="none",
        help="OCR engines the new requests are read with, comma-separated (none, rapidocr, easyocr, auto); each is an "
        "arm [default: %(default)s]",
    )
    ap.add_argument(
        "--ocr-workers",
        default="0",
        help="OCR worker processes, comma-separated; 0 reads in the set-up thread; each is an arm [default: %(default)s]",
    )
    ap.add_argument(
        "--ocr-threads",
        default="0",
        help="the OCR engine's compute threads, comma-separated; 0 is its default (one per core); each is an arm [default: %(default)s]",
    )
    ap.add_argument(
        "--ocr-nice",
        default="0",
        help="how much lower the OCR workers' CPU priority is (0-19), comma-separated; each is an arm [default: %(default)s]",
    )
    ap.add_argument(
        "--contention",
        action="store_true",
        help="instead: the live row alone while each arm's engine reads images in a loop beside it (how OCR's threads, "
        "and its hold of the interpreter lock in-process, slow the decode loop's steps); then, no model running, how "
        "late a sleeping thread wakes beside the reading (the wait for the interpreter lock)",
    )
    args = ap.parse_args(argv)
    from captioning.ocr import DEFAULT_OCR_CACHE

    from ..checkpoints.small import build_tiny_checkpoints
    from ..frontend.options import load_pipeline
    from .pairs import bench_cases

    arms = arms_of(args.ocr, args.ocr_workers, args.ocr_threads, args.ocr_nice, args.max_stall)
    drafter_dir, verifier_dir = build_tiny_checkpoints(args.dir)
    # one pipeline per arm (their caption caches apart): the same images in every arm of a repetition
    pipes = [load_pipeline(drafter=str(drafter_dir), verifier=str(verifier_dir), ocr_engine=arm.engine()) for arm in arms]
    total = args.warmup + args.reps
    cases = bench_cases(1 + args.new * total)
    live = {**cases[0], "caption": "a chart", "ocr": ""}
    runs: dict[Arm, list[dict]] = {arm: [] for arm in arms}
    try:
        for rep in range(total):  # new images each time: their captions are not in the caption cache yet
            for arm, pipe in zip(arms, pipes):  # the arms in turn: a change of the machine's load reaches them all
                images = [c["image"] for c in cases[1 + rep * args.new : 1 + (rep + 1) * args.new]]
                if args.contention:
                    engine = None if arm.ocr == "none" else pipe.ocr_engine
                    r = {**measure_contention(pipe, live, images, engine), **measure_lock_wait(images, engine)}
                else:
                    ocr = False if arm.ocr == "none" else None
                    new = [{**c, "caption": None, "ocr": ocr} for c in cases[1 + rep * args.new : 1 + (rep + 1) * args.new]]
                    DEFAULT_OCR_CACHE.clear()  # every arm reads these images afresh
                    r = measure_stall(
                        pipe,
                        live,
                        new,
                        live_method="floor",
                        live_tokens=args.live_tokens,
                        prefill_chunk_tokens=args.prefill_chunk_tokens,
                        token_budget=args.token_budget,
                        setup_workers=args.setup_workers,
                        max_stall=arm.max_stall,
                    )
                runs[arm].append(r)
                shown = {
                    k: round(v, 4) if isinstance(v, float) else [round(x, 3) for x in v] if isinstance(v, list) else v for k, v in r.items()
                }
                print(("warm-up " if rep < args.warmup else "") + json.dumps({"arm": arm.label, **shown}), flush=True)
                if not args.contention and math.isnan(r["mean_step_after_s"]):
                    print(f"  the live row ended before the set-up did: raise --live-tokens (now {args.live_tokens})", flush=True)
    finally:
        for pipe in pipes:
            close = getattr(pipe, "close", None)
            if close is not None:
                close()
    for arm in arms:
        counted = runs[arm][args.warmup :]
        print(f"{arm.label} (n={len(counted)}; median (min-max)):")
        if args.contention:
            print(
                f"  live row's step, ms: mean {_median_of(counted, 'mean_step_s', 1e3)}, median "
                f"{_median_of(counted, 'median_step_s', 1e3)}, p99 {_median_of(counted, 'p99_step_s', 1e3)}, longest "
                f"{_median_of(counted, 'longest_gap_s', 1e3)}; OCR images/s {_median_of(counted, 'ocr_per_s')}"
            )
            print(
                f"  no model running, a thread's wake-up after 1 ms waits, ms: mean {_median_of(counted, 'lock_wait_mean_s', 1e3)}, "
                f"p99 {_median_of(counted, 'lock_wait_p99_s', 1e3)}"
            )
            continue
        print(f"  stall_all (longest gap during set-up / the step with every row decoding): {_summary(counted, 'stall_all')}")
        print(f"  stall (longest gap during set-up / the row's step alone): {_summary(counted, 'stall')}")
        print(f"  stall_all in the loop thread's CPU time: {_summary(counted, 'stall_all_cpu')}")
        print(f"  the live row's mean step during set-up / after: {_summary(counted, 'setup_vs_after')}")
        print(
            f"  the live row's gaps during set-up, ms: longest {_median_of(counted, 'longest_gap_s', 1e3)}, p99 "
            f"{_median_of(counted, 'p99_gap_setup_s', 1e3)}, mean {_median_of(counted, 'mean_step_setup_s', 1e3)}; its step "
            f"with every row decoding {_median_of(counted, 'median_step_all_s', 1e3)}"
        )
        ocr_s = sorted(r["ocr_s"] for r in counted)
        window = sorted(r["setup_window_s"] for r in counted)
        first = sorted(statistics.fmean(r["first_token_s"]) for r in counted)
        print(
            f"  OCR seconds of the {args.new} requests: {statistics.median(ocr_s):.2f} s; set-up window "
            f"(first submitted to last joined): {statistics.median(window):.2f} s; their mean time to first token "
            f"{statistics.median(first):.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
