#!/usr/bin/env python
"""Batched decoding on vLLM's CPU build (issue #19): ``generate_batch(batch_size=B)`` against the sequential loop.

Run in the vLLM venv (see VLLM.md)::

    PYTHONPATH=. .venv-vllm/bin/python scripts/vllm_batch_bench.py --out runs/vllm_batch_bench.json

The pair is the one ``tests/test_vllm_batch.py`` builds (:func:`test_vllm_batch.build_vl_pipes`: the tiny random
Qwen3-VL drafter + Qwen3 verifier, fp32, every stream on vLLM, with the tests' vLLM settings: in-process engine,
one OpenMP thread, ``block_size=32``, ``enforce_eager``). For each method, every repetition runs the same N
requests (different images, questions, captions) two ways, side by side, the order rotating:

* **sequential**: ``pipe.generate`` one request after another (the single-engine loop: K + 2 ``LLM.generate``
  calls a step for AsymSpec, one for Floor);
* **batched**: ``pipe.generate_batch(requests, batch_size=B)`` (one ``LLM.generate`` call per stream a step for
  all rows: 3 for AsymSpec, 1 for Floor).

tokens/s is the call's tokens over its wall time (set-up included, as a caller sees it); the ratio is the median
over repetitions of batched / sequential in the same repetition (min-max in brackets). Where the time goes is
measured in the same runs: set-up (caption, OCR and prefill seconds from each result's stats; set-up calls are
the ``LLM.generate`` calls beyond the decode steps' own), the time inside
``LLM.generate`` and inside the worker's model runner (``execute_model`` + ``sample_tokens``: the forwards, our
logits capture and vLLM's sampling), and the ``collective_rpc`` that collects the logits; the difference between
``LLM.generate`` and the model runner is vLLM's per-call overhead (request processing, scheduling, detokenizer-free
output handling). A probe then times single batched calls (1 and B rows, 1 and K + 1 tokens; a drafting call of K
tokens) to give the fixed cost of a call and the cost per row. Every batched result's tokens are checked equal to
the sequential run's.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# the test module sets vLLM's environment (small KV cache, engine in this process, one OpenMP thread) before vLLM loads
import test_vllm_batch as tvb  # noqa: E402
from conftest import make_case  # noqa: E402

FIELDS = ("image", "question", "caption", "ocr")


# ------------------------------------------------------------------ instrumentation (this process only)
def _install_worker_clock(worker) -> bool:
    """Time the worker's model runner: ``execute_model`` (input preparation, the forward, our logits capture),
    ``sample_tokens`` (vLLM's logits + sampler) and, inside the first, the network's ``forward`` alone."""
    runner = worker.model_runner
    if getattr(runner, "_bench_clock", None) is not None:
        return True
    clock = runner._bench_clock = {"steps": 0, "tokens": 0, "reqs": 0, "execute_s": 0.0, "sample_s": 0.0, "forward_s": 0.0}
    execute, forward = runner.execute_model, runner.model.forward

    def model_forward(*args, **kwargs):  # the network itself (no logits: those are compute_logits)
        t0 = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            clock["forward_s"] += time.perf_counter() - t0

    runner.model.forward = model_forward

    def execute_model(scheduler_output, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return execute(scheduler_output, *args, **kwargs)
        finally:
            clock["execute_s"] += time.perf_counter() - t0
            if scheduler_output is not None and not kwargs.get("dummy_run"):
                clock["steps"] += 1
                clock["tokens"] += int(scheduler_output.total_num_scheduled_tokens)
                clock["reqs"] += len(scheduler_output.num_scheduled_tokens)

    runner.execute_model = execute_model
    sample = getattr(runner, "sample_tokens", None)
    if sample is not None:

        def sample_tokens(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return sample(*args, **kwargs)
            finally:
                clock["sample_s"] += time.perf_counter() - t0

        runner.sample_tokens = sample_tokens
    return True


def _read_worker_clock(worker) -> dict:
    return dict(worker.model_runner._bench_clock)


class Meter:
    """Counts and times every ``LLM.generate`` / ``collective_rpc`` of the given LLMs (instance wrappers) and their
    model runners; :meth:`snap` reads all of it (``name.key`` per LLM and ``key`` summed), so a run is the difference
    of two snapshots."""

    HOST = ("generate_calls", "generate_s", "rpc_calls", "rpc_s")

    def __init__(self, llms: dict):
        self.llms = llms
        self.host = {f"{n}.{k}": 0 for n in llms for k in self.HOST}
        for name, llm in llms.items():
            rpc = llm.collective_rpc
            rpc(_install_worker_clock)
            for attr, calls, secs in (("generate", "generate_calls", "generate_s"), ("collective_rpc", "rpc_calls", "rpc_s")):
                inner = getattr(llm, attr)

                def timed(*args, _inner=inner, _calls=f"{name}.{calls}", _secs=f"{name}.{secs}", **kwargs):
                    t0 = time.perf_counter()
                    try:
                        return _inner(*args, **kwargs)
                    finally:
                        self.host[_calls] += 1
                        self.host[_secs] += time.perf_counter() - t0

                setattr(llm, attr, timed)
            llm._bench_rpc = rpc  # the unwrapped collective_rpc, to read the clocks without counting

    @property
    def generate_calls(self) -> int:
        return sum(self.host[f"{n}.generate_calls"] for n in self.llms)

    def snap(self) -> dict:
        out = dict(self.host)
        for name, llm in self.llms.items():
            out.update({f"{name}.{k}": v for k, v in llm._bench_rpc(_read_worker_clock)[0].items()})
        for key in {k.split(".", 1)[1] for k in out}:
            out[key] = sum(out[f"{n}.{key}"] for n in self.llms)
        return out

    @staticmethod
    def diff(a: dict, b: dict) -> dict:
        return {k: b[k] - a[k] for k in b}


# ------------------------------------------------------------------ the two loops
def sequential(pipe, reqs, method, cfg):
    return [pipe.generate(*(r[f] for f in FIELDS[:2]), caption=r["caption"], ocr=r["ocr"], method=method, config=cfg) for r in reqs]


def batched(pipe, reqs, method, cfg, size, log):
    on_step = lambda rows, calls, s: log.append((rows, calls, s))  # noqa: E731
    return pipe.generate_batch([{f: r[f] for f in FIELDS} for r in reqs], method=method, config=cfg, batch_size=size, on_step=on_step)


def setup_seconds(results) -> float:
    """Per-request set-up (caption, OCR, prefill) as each result's stats measured it."""
    return sum(r.stats.get("caption_s", 0.0) + r.stats.get("ocr_s", 0.0) + r.stats.get("prefill_s", 0.0) for r in results)


def run_cell(pipe, meter, reqs, method, cfg, mode, size):
    log: list = []
    before = meter.snap()
    t0 = time.perf_counter()
    if mode == "sequential":
        results = sequential(pipe, reqs, method, cfg)
    else:
        results = batched(pipe, reqs, method, cfg, size, log)
    wall = time.perf_counter() - t0
    used = Meter.diff(before, meter.snap())
    setup_s = setup_seconds(results)
    tokens = sum(len(r.token_ids) for r in results)
    if mode == "sequential":
        steps = sum(r.stats["steps"] for r in results)
        rows_per_step = 1.0
        # decode-phase calls of each request: its forward calls less one prefill call per stream it prefilled
        decode_calls = sum(sum(r.stats["forward_calls"].values()) - sum(v > 0 for v in r.stats["prefill_tokens"].values()) for r in results)
    else:
        steps = len(log)
        rows_per_step = sum(rows for rows, _, _ in log) / steps
        decode_calls = sum(c for _, c, _ in log)
    setup_calls = used["generate_calls"] - decode_calls
    model_s = used["execute_s"] + used["sample_s"]
    return {
        "mode": mode,
        "batch_size": 1 if mode == "sequential" else size,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "steps": steps,
        "rows_per_step": rows_per_step,
        "decode_calls": decode_calls,
        "calls_per_step": decode_calls / steps,
        "per_row_engine_calls_per_step": sorted({r.stats["engine_calls_per_step"] for r in results}) if mode != "sequential" else None,
        "setup_s": setup_s,
        "setup_calls": setup_calls,
        "decode_s": wall - setup_s,
        "generate_calls": used["generate_calls"],
        "generate_s": used["generate_s"],
        "rpc_calls": used["rpc_calls"],
        "rpc_s": used["rpc_s"],
        "model_s": model_s,
        "forward_s": used["forward_s"],
        "runner_rest_s": model_s - used["forward_s"],
        "vllm_steps": used["steps"],
        "vllm_tokens": used["tokens"],
        "overhead_per_call_ms": 1e3 * (used["generate_s"] - model_s) / max(used["generate_calls"], 1),
        "outside_generate_s": wall - used["generate_s"] - used["rpc_s"],
        "per_llm": {
            n: {
                "generate_calls": used[f"{n}.generate_calls"],
                "generate_s": used[f"{n}.generate_s"],
                "model_s": used[f"{n}.execute_s"] + used[f"{n}.sample_s"],
                "forward_s": used[f"{n}.forward_s"],
                "vllm_steps": used[f"{n}.steps"],
                "ms_per_call": 1e3 * used[f"{n}.generate_s"] / max(used[f"{n}.generate_calls"], 1),
                "overhead_per_call_ms": 1e3
                * (used[f"{n}.generate_s"] - used[f"{n}.execute_s"] - used[f"{n}.sample_s"])
                / max(used[f"{n}.generate_calls"], 1),
            }
            for n in meter.llms
        },
        "token_ids": [r.token_ids for r in results],
    }


# ------------------------------------------------------------------ the per-call probe
def probe(pipe, meter, reqs, cfg, size, reps):
    """Single batched calls on each stream's LLM, over the rows of ``size`` prepared AsymSpec requests (the verifier's
    text rows; the drafter's image rows, whose every request carries the image): fresh random tokens each call, rolled
    back after it. Wall per call, time in the model runner and in the network's forward, for 1 and ``size`` rows,
    1 and K + 1 tokens, and one drafting call of K tokens (``draft``)."""
    import torch

    from asymspec_mm.engines.vllm_rows import VLLMBatchEngine

    k = cfg.k
    sessions = [pipe.prepare(r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], config=cfg, prefill=True) for r in reqs[:size]]
    rng = random.Random(0)
    out = []
    for stream, model, llm_name in (("verifier", pipe.verifier, "verifier"), ("drafter_full", pipe.drafter_full, "drafter")):
        batch = VLLMBatchEngine(model, stream)
        for r, session in enumerate(sessions):
            batch.join(r, session.streams[stream])
        for rows in (1, size):
            for kind, n in (("extend", 1), ("extend", k + 1), ("draft", k)):
                walls, models, forwards = [], [], []
                for rep in range(reps + 1):
                    width = 1 if kind == "draft" else n
                    ids = {r: torch.tensor([rng.randrange(20, 400) for _ in range(width)]) for r in range(rows)}  # no special ids
                    base = {r: batch.length(r) for r in ids}
                    before, t0 = meter.snap(), time.perf_counter()
                    batch.draft(ids, n) if kind == "draft" else batch.extend(ids)
                    wall = time.perf_counter() - t0
                    used = Meter.diff(before, meter.snap())
                    for r in ids:
                        batch.truncate(r, base[r])
                    if rep:  # the first is a warm-up
                        walls.append(wall)
                        models.append(used[f"{llm_name}.execute_s"] + used[f"{llm_name}.sample_s"])
                        forwards.append(used[f"{llm_name}.forward_s"])
                w, m, f = (statistics.median(x) for x in (walls, models, forwards))
                label = f"draft k={n}" if kind == "draft" else f"extend {n} token(s)"
                out.append(
                    {
                        "stream": stream,
                        "rows": rows,
                        "call": label,
                        "wall_ms": 1e3 * w,
                        "model_ms": 1e3 * m,
                        "forward_ms": 1e3 * f,
                        "overhead_ms": 1e3 * (w - m),
                    }
                )
        for r in list(batch.rows):
            batch.leave(r)
    return out


# ------------------------------------------------------------------ report
def spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def summarize(cells: list[dict], methods) -> dict:
    summary = {}
    for m in methods:
        seq = [c for c in cells if c["method"] == m and c["mode"] == "sequential"]
        bat = [c for c in cells if c["method"] == m and c["mode"] == "batched"]
        ratios = [b["tokens_per_s"] / s["tokens_per_s"] for s, b in zip(seq, bat)]
        decode_ratios = [(b["tokens"] / b["decode_s"]) / (s["tokens"] / s["decode_s"]) for s, b in zip(seq, bat)]
        med = {}
        for name, group in (("sequential", seq), ("batched", bat)):
            keys = [k for k, v in group[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "rep"]
            med[name] = {k: statistics.median(c[k] for c in group) for k in keys}
            med[name]["tokens_per_s_range"] = [min(c["tokens_per_s"] for c in group), max(c["tokens_per_s"] for c in group)]
        summary[m] = {
            "ratio": spread(ratios),
            "decode_ratio": spread(decode_ratios),
            "sequential": med["sequential"],
            "batched": med["batched"],
            "tokens_equal": all(s["token_ids"] == b["token_ids"] for s, b in zip(seq, bat)),
            "batch_calls_per_step": sorted({v for b in bat for v in b["per_row_engine_calls_per_step"]}),
        }
    return summary


def table(summary, size) -> str:
    lines = [
        f"| method | loop | tokens/s [min-max] | B={size} / sequential [min-max] | decode-only ratio | engine calls / step "
        "| steps (rows/step) | set-up s | decode s | in LLM.generate s (calls) | in model runner s | of which forward s "
        "| vLLM outside the runner / call ms | collective_rpc s | outside vLLM s | tokens = sequential |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in summary.items():
        for name in ("sequential", "batched"):
            c = s[name]
            lo, hi = c["tokens_per_s_range"]
            r, rlo, rhi = s["ratio"]
            d = s["decode_ratio"][0]
            ratio = "1.00x" if name == "sequential" else f"**{r:.2f}x** [{rlo:.2f}-{rhi:.2f}]"
            dratio = "1.00x" if name == "sequential" else f"{d:.2f}x"
            loop = "sequential (pipe.generate)" if name == "sequential" else f"generate_batch(batch_size={size})"
            same = "–" if name == "sequential" else ("yes" if s["tokens_equal"] else "**no**")
            lines.append(
                f"| {m} | {loop} | {c['tokens_per_s']:.1f} [{lo:.1f}-{hi:.1f}] | {ratio} | {dratio} | {c['calls_per_step']:.2f} "
                f"| {c['steps']:.0f} ({c['rows_per_step']:.1f}) | {c['setup_s']:.2f} | {c['decode_s']:.2f} "
                f"| {c['generate_s']:.2f} ({c['generate_calls']:.0f}) | {c['model_s']:.2f} | {c['forward_s']:.2f} | {c['overhead_per_call_ms']:.2f} "
                f"| {c['rpc_s']:.2f} | {c['outside_generate_s']:.2f} | {same} |"
            )
    return "\n".join(lines)


#: issue #19: vLLM (CPU build), B=8 aggregate tokens/s >= 2.5x the sequential loop's, 3 engine calls a step
TARGET_RATIO = 2.5
BATCHED_CALLS = {"asymspec": 3, "sd": 2, "floor": 1, "drafter": 1}


def targets(summary, size, k) -> list[dict]:
    out = []
    for m, s in summary.items():
        r, lo, hi = s["ratio"]
        out.append(
            {
                "target": f"{m}: B={size} tokens/s >= {TARGET_RATIO}x sequential",
                "measured": f"{r:.2f}x [{lo:.2f}-{hi:.2f}]",
                "met": r >= TARGET_RATIO,
            }
        )
        want = BATCHED_CALLS[m]
        got = s["batch_calls_per_step"]
        seq = s["sequential"]["calls_per_step"]
        out.append(
            {
                "target": f"{m}: {want} engine call(s) a step batched (sequential: {k + 2 if m == 'asymspec' else want})",
                "measured": f"batched {', '.join(f'{g:g}' for g in got)} (every row's stats); sequential {seq:.2f}",
                "met": got == [want],
            }
        )
    return out


def targets_table(rows) -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |" for t in rows]
    return "\n".join(lines)


def probe_table(rows) -> str:
    lines = [
        "| stream | rows | call | LLM.generate wall ms | in model runner ms | of which network forward ms | vLLM outside the runner ms |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['stream']} | {p['rows']} | {p['call']} | {p['wall_ms']:.2f} | {p['model_ms']:.2f} | {p['forward_ms']:.2f} | {p['overhead_ms']:.2f} |"
        for p in rows
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="floor,asymspec")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--probe-reps", type=int, default=10, help="calls per probe cell (0: no probe)")
    ap.add_argument("--out", default="runs/vllm_batch_bench.json", help="JSON file to write")
    args = ap.parse_args(argv)
    if tvb._SKIP:
        print(f"vLLM unusable here: {tvb._SKIP}", file=sys.stderr)
        return 2
    import torch

    from asymspec_mm import AsymSpecConfig

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        vl = tvb.build_vl_pipes(Path(tmp))
        pipe = vl.pipe
        meter = Meter({"verifier": pipe.verifier.llm, "drafter": vl.served.llm})
        cfg = AsymSpecConfig(k=args.k, max_new_tokens=args.max_new_tokens)
        reqs = [make_case(300 + i) for i in range(args.requests)]
        methods = [m for m in args.methods.split(",") if m]
        cells_spec = [(m, mode) for m in methods for mode in ("sequential", "batched")]
        for m, mode in cells_spec:  # warm-up, untimed
            run_cell(pipe, meter, reqs[:3], m, cfg, mode, args.batch_size)
        cells = []
        for rep in range(args.reps):
            shift = rep % max(len(cells_spec), 1)
            for m, mode in cells_spec[shift:] + cells_spec[:shift]:
                c = run_cell(pipe, meter, reqs, m, cfg, mode, args.batch_size)
                c.update(method=m, rep=rep)
                cells.append(c)
                print(f"rep {rep} {m:9s} {mode:10s} {c['tokens_per_s']:8.1f} tok/s  {c['calls_per_step']:.2f} calls/step", flush=True)
        probed = probe(pipe, meter, reqs, cfg, args.batch_size, args.probe_reps) if args.probe_reps else []
    cells.sort(key=lambda c: (methods.index(c["method"]), c["rep"], c["mode"]))
    summary = summarize(cells, methods)
    import vllm

    env = {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "torch_threads": torch.get_num_threads(),
        "llm_kwargs": {k: v for k, v in tvb.LLM_KW.items()},
    }
    settings = dict(vars(args), pair="tests/test_vllm_batch.py build_vl_pipes (tiny random Qwen3-VL + Qwen3, fp32)")
    report = {
        "settings": settings,
        "env": env,
        "summary": summary,
        "targets": targets(summary, args.batch_size, args.k),
        "cells": cells,
        "probe": probed,
        "wall_s": time.perf_counter() - t_start,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print()
    print(table(summary, args.batch_size))
    print()
    print(targets_table(report["targets"]))
    if probed:
        print()
        print(probe_table(probed))
    print(f"\nwrote {out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
