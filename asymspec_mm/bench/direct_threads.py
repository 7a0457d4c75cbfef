"""Concurrent callers with no scheduler: ``pipe.generate`` from N threads at once against one request after another.

With no loop started, a pipeline's direct calls are rows of its direct loop (:mod:`asymspec_mm.core.direct_loop`):
callers on several threads share each turn's forwards. Before it, each caller stepped its own request and a lock
around the models took the callers' steps in turn, so N callers took about as long as N requests one after another.

``python -m asymspec_mm.bench.direct_threads`` answers ``--requests`` held-out MiniVista requests of ``--tokens``
tokens (EOS ignored, the compressed views given, so every arm decodes the same tokens) in three arms, in turn,
``--reps`` times (after one untimed warm-up of each):

* ``sequential``: one thread, one request after another (``pipe.generate``);
* ``threads``: the requests split over ``--callers`` threads started at once, no scheduler (the direct loop);
* ``loop``: the same threads while ``pipe.scheduler(max_batch_size=callers)`` runs (each call a row of its loop);
* ``two_loops``: the same threads, half of them submitting to one scheduler and half to a second one on the same
  pipeline (two servers, or the demo beside the API, in one process): one loop runs the pipeline's models, the
  second's turns are its model calls (:mod:`asymspec_mm.core.model_owner`); before it, the two decode threads took
  turns on a lock around the models.

Printed per arm: wall seconds of each repetition and their median; then each arm's speed over ``sequential`` per
repetition (> 1: faster), and whether every arm gave the same tokens. The script uses only the public API, so it
also runs on an older checkout (``PYTHONPATH=old-tree``) for a before/after pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Any

ARMS = ("sequential", "threads", "loop", "two_loops")


def run_arm(pipe: Any, cases: list[dict], kw: dict[str, Any], arm: str, callers: int) -> tuple[float, list[list[int]]]:
    """Answer every case on ``arm`` (:data:`ARMS`); returns the wall seconds and each case's tokens, in order."""
    got: list[list[int] | None] = [None] * len(cases)
    errors: list[BaseException] = []

    def answer(indices: list[int], sched: Any = None) -> None:
        try:
            for i in indices:
                c = cases[i]
                args = (c["image"], c["question"])
                opts = dict(caption=c["caption"], ocr=c["ocr"], **kw)
                got[i] = (sched.submit(*args, **opts).result() if sched is not None else pipe.generate(*args, **opts)).token_ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with ExitStack() as loops:
        scheds = [loops.enter_context(pipe.scheduler(max_batch_size=callers)) for _ in range({"loop": 1, "two_loops": 2}.get(arm, 0))]
        t0 = time.perf_counter()
        if arm == "sequential":
            answer(list(range(len(cases))))
        else:
            # two loops: the callers alternate between them (pipe.generate would go to the one serving the pipeline)
            where = [scheds[j % 2] if arm == "two_loops" else None for j in range(callers)]
            threads = [threading.Thread(target=answer, args=(list(range(j, len(cases), callers)), where[j])) for j in range(callers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, [list(g or []) for g in got]


def main(argv: list[str] | None = None) -> int:
    from asymspec_mm.frontend.help import terminal_text

    doc = terminal_text(__doc__)
    ap = argparse.ArgumentParser(
        prog="python -m asymspec_mm.bench.direct_threads",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--callers", type=int, default=4, help="threads calling at once [default: %(default)s]")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="asymspec,floor")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"among {', '.join(ARMS)} [default: %(default)s]")
    ap.add_argument("--threads", type=int, default=1, help="torch's threads [default: %(default)s]")
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    if bad := [a for a in arms if a not in ARMS]:
        raise SystemExit(f"--arms: unknown arm {bad[0]!r}; choose among {', '.join(ARMS)}")
    if args.callers < 1 or args.requests < args.callers:
        raise SystemExit(f"--callers must be at least 1 and at most --requests ({args.requests}); got {args.callers}")
    import torch

    from asymspec_mm.base.config import AsymSpecConfig
    from asymspec_mm.bench.pairs import bench_cases
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

    torch.set_num_threads(args.threads)
    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none", prefix_cache_bytes=0)
    cases = bench_cases(args.requests)
    out: dict[str, Any] = {"requests": args.requests, "callers": args.callers, "tokens": args.tokens}
    for method in args.methods.split(","):
        kw = {"method": method, "config": AsymSpecConfig(max_new_tokens=args.tokens), "ignore_eos": True}
        for arm in arms:  # warm-up
            run_arm(pipe, cases[: args.callers], kw, arm, args.callers)
        walls: dict[str, list[float]] = {arm: [] for arm in arms}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.reps):
            for arm in arms:
                wall, tokens[arm] = run_arm(pipe, cases, kw, arm, args.callers)
                walls[arm].append(round(wall, 3))
        res: dict[str, Any] = {arm: {"s": s, "median_s": round(statistics.median(s), 3)} for arm, s in walls.items()}
        if "sequential" in arms:
            for arm in [a for a in arms if a != "sequential"]:
                res[f"{arm}_speedup"] = [round(a / b, 3) for a, b in zip(walls["sequential"], walls[arm])]
        res["same_tokens"] = len({json.dumps(t) for t in tokens.values()}) == 1
        out[method] = res
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
