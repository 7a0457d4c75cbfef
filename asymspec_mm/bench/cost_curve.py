"""The speed-up curve at chosen verifier/drafter cost ratios: ``asymspec-mm bench --cost-ratio 2,4,8,16,32``.

For each requested ratio r the verifier is replaced by a cost-emulating twin (:mod:`.twin`: the same logits, bit
for bit, at a higher cost per forward) whose size is calibrated so that a verifier forward of K + 1 tokens costs r
drafter forwards of one token (both on a KV cache). Then, side by side in one run:

* the per-call costs, measured on a prefilled request: ``c_drafter(1)``, ``c_drafter_comp(K+1)``, ``c_verifier(1)``,
  ``c_verifier(K+1)`` (medians of repeated extend + truncate), and the measured ratio ``c_verifier(K+1) /
  c_drafter(1)``;
* Floor, SD, AsymSpec and the drafter alone on MiniVista figure / visual / mixed problems, interleaved over
  repetitions (the order rotates), each request prefilled from scratch: tokens/s of the decode phase
  (``new_tokens / decode_wall_s``) and of whole requests (set-up and prefill included), at B = 1, and at B = ``batch``
  through ``generate_batch`` (whole calls);
* the bound from the measured per-call costs, ``MAL * c_verifier(1) / (K * c_drafter(1) + c_drafter_comp(K+1) +
  c_verifier(K+1))`` (host work counted as free, Floor's too), and the fraction of it the measured decode-phase
  speed-up reaches; the break-even ratio where AsymSpec = Floor.

Every number it prints is for the cost emulator, and every output says so.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

METHODS = ("floor", "sd", "asymspec", "drafter")
FAMILIES = ("figure", "visual", "mixed")
#: The paper's pair: Qwen3-32B against Qwen3-VL-2B-Instruct, about 16x the parameters.
PAPER_RATIO = 16.0
EMULATOR = "cost emulator: a twin of the tiny verifier with zero-output layers (same tokens, higher cost), not a bigger model"


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_costs(pipe: Any, problem: dict, k: int, reps: int = 15) -> dict[str, float]:
    """Seconds of one forward on a prefilled request's KV cache: ``drafter(1)``, ``drafter_comp(K+1)``,
    ``verifier(1)``, ``verifier(K+1)`` (extend, then truncate back; the median of ``reps``)."""
    import torch

    with pipe.prefix_kv.paused():
        session = pipe.prepare(problem["decoded_image"], problem["query"], caption=problem["caption"], ocr=problem["ocr"], prefill=True)
    streams, pending = session.streams, session.pending

    def cost(name: str, n: int) -> float:
        engine, base = streams[name], streams[name].length
        ids = pending[name].repeat(n).to(engine.device)

        def once() -> None:
            with torch.inference_mode():
                engine.extend(ids)
            engine.truncate(base)

        return _median_time(once, reps)

    return {
        "drafter_1": cost("drafter_full", 1),
        "drafter_comp_k1": cost("drafter_comp", k + 1),
        "verifier_1": cost("verifier", 1),
        "verifier_k1": cost("verifier", k + 1),
    }


def per_call_bound(mal: float, costs: dict[str, float], k: int) -> float:
    """``MAL * c_verifier(1) / (K * c_drafter(1) + c_drafter_comp(K+1) + c_verifier(K+1))``: AsymSpec's decode speed-up
    over Floor if nothing but the forwards cost anything."""
    step = k * costs["drafter_1"] + costs["drafter_comp_k1"] + costs["verifier_k1"]
    return mal * costs["verifier_1"] / step


def break_even(points: Sequence[tuple[float, float]]) -> float | None:
    """The ratio where the speed-up crosses 1, interpolated in log r between measured ``(ratio, speed-up)`` points;
    None when it does not cross inside them."""
    pts = sorted(points)
    for (r0, s0), (r1, s1) in zip(pts, pts[1:]):
        if (s0 - 1.0) * (s1 - 1.0) <= 0 and s0 != s1:
            w = (1.0 - s0) / (s1 - s0)
            return math.exp(math.log(r0) + w * (math.log(r1) - math.log(r0)))
    return None


def _run_single(pipe: Any, problems: list[dict], method: str, cfg: Any) -> dict[str, float]:
    """One repetition of ``method`` over the problems at B = 1 (each request prefilled from scratch)."""
    tokens = steps = 0
    decode_s = whole_s = 0.0
    ids = []
    for p in problems:
        with pipe.prefix_kv.paused():
            t0 = time.perf_counter()
            res = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, config=cfg)
            whole_s += time.perf_counter() - t0
        tokens += len(res.token_ids)
        steps += res.stats["steps"]
        decode_s += res.stats["decode_wall_s"]
        ids.append(res.token_ids)
    return {"tokens": tokens, "steps": steps, "decode_tps": tokens / decode_s, "whole_tps": tokens / whole_s, "token_ids": ids}


def _run_batch(pipe: Any, problems: list[dict], method: str, cfg: Any, batch: int) -> float:
    """Aggregate tokens/s of one ``generate_batch`` call over the problems at B = ``batch`` (whole call)."""
    requests = [{"image": p["decoded_image"], "question": p["query"], "caption": p["caption"], "ocr": p["ocr"]} for p in problems]
    with pipe.prefix_kv.paused():
        t0 = time.perf_counter()
        results = pipe.generate_batch(requests, method=method, config=cfg, batch_size=batch)
        wall = time.perf_counter() - t0
    return sum(len(r.token_ids) for r in results) / wall


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure_ratio(
    pipe: Any, problems: list[dict], cfg: Any, *, reps: int, batch: int, methods: Sequence[str] = METHODS, log: Callable[[str], None]
) -> dict[str, Any]:
    """Every method over ``problems``, repetitions interleaved (the order rotates), at B = 1 and (``batch`` > 1) at B =
    ``batch``: per method the tokens/s per repetition and, paired with Floor's of the same repetition, the ratios."""
    single: dict[str, list[dict]] = {m: [] for m in methods}
    batched: dict[str, list[float]] = {m: [] for m in methods}
    for rep in range(reps):
        order = list(methods[rep % len(methods) :]) + list(methods[: rep % len(methods)])
        for m in order:
            single[m].append(_run_single(pipe, problems, m, cfg))
            if batch > 1:
                batched[m].append(_run_batch(pipe, problems[:batch], m, cfg, batch))
        log(f"  rep {rep + 1}/{reps}: " + ", ".join(f"{m} {single[m][-1]['decode_tps']:.1f}" for m in methods) + " tok/s (decode)")
    out: dict[str, Any] = {"methods": {}}
    for m in methods:
        runs = single[m]
        row: dict[str, Any] = {
            "decode_tps": _spread([r["decode_tps"] for r in runs]),
            "whole_tps": _spread([r["whole_tps"] for r in runs]),
            "mal": runs[0]["tokens"] / runs[0]["steps"],
            "decode_vs_floor": _spread([r["decode_tps"] / f["decode_tps"] for r, f in zip(runs, single["floor"])]),
            "whole_vs_floor": _spread([r["whole_tps"] / f["whole_tps"] for r, f in zip(runs, single["floor"])]),
        }
        if batch > 1:
            row["batch_tps"] = _spread(batched[m])
            row["batch_vs_floor"] = _spread([x / f for x, f in zip(batched[m], batched["floor"])])
        out["methods"][m] = row
    out["token_ids"] = {m: single[m][0]["token_ids"] for m in methods}
    return out


def run_cost_curve(
    ratios: Sequence[float],
    *,
    cases: int = 6,
    reps: int = 3,
    max_new_tokens: int = 48,
    k: int = 4,
    batch: int = 8,
    device: str = "cpu",
    workdir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The whole curve (module docstring) on the shipped tiny pair (fp32, on ``device``); returns a JSON-able result."""
    from ..base.config import AsymSpecConfig
    from ..eval.minivista import make_problem
    from ..pipeline.facade import AsymSpecPipeline
    from ..pipeline.presets import TINY_DIR, TINY_OCR_LAYOUT
    from .twin import build_twin, layers_for_ratio

    load = dict(ocr="none", device=device, dtype="fp32", ocr_layout=TINY_OCR_LAYOUT, local_files_only=True)
    problems = [make_problem(23, i, FAMILIES[i % len(FAMILIES)]) for i in range(max(cases, batch))]
    cfg = AsymSpecConfig(k=k, max_new_tokens=max_new_tokens)
    root = Path(workdir or tempfile.mkdtemp(prefix="asymspec-twins-"))
    base = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", TINY_DIR / "verifier", **load)
    reference = {m: [base.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=m, config=cfg).token_ids
                     for p in problems[:cases]] for m in ("floor", "asymspec")}  # fmt: skip
    base_costs = forward_costs(base, problems[0], k)
    n_layers = int(base.verifier.config.num_hidden_layers)
    probe_extra = 4 * n_layers
    probe = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", build_twin(TINY_DIR / "verifier", root / "probe", probe_extra), **load)
    probe_costs = forward_costs(probe, problems[0], k)
    cost_at = {n_layers: base_costs["verifier_k1"], n_layers + probe_extra: probe_costs["verifier_k1"]}
    del probe
    points = []
    for r in ratios:
        layers = layers_for_ratio(r, n_layers, cost_at, base_costs["drafter_1"])
        for attempt in range(2):  # a second twin when the first misses the ratio by more than 10%
            twin_dir = build_twin(TINY_DIR / "verifier", root / f"r{r:g}-{layers}", layers - n_layers)
            pipe = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", twin_dir, **load)
            costs = forward_costs(pipe, problems[0], k)
            measured_r = costs["verifier_k1"] / costs["drafter_1"]
            cost_at[layers] = costs["verifier_k1"] * base_costs["drafter_1"] / costs["drafter_1"]  # in the calibration's units
            refit = min(max(layers_for_ratio(r, n_layers, cost_at, base_costs["drafter_1"]), layers // 2), 2 * layers)
            if attempt or abs(measured_r / r - 1) <= 0.1 or refit == layers:
                break
            layers = refit
        log(f"r = {r:g}: {layers} verifier layers ({layers - n_layers} zero-output), measured ratio {measured_r:.1f} [{EMULATOR}]")
        runs = measure_ratio(pipe, problems[:cases], cfg, reps=reps, batch=batch, log=log)
        same = sum(a == b for m in reference for a, b in zip(reference[m], runs["token_ids"][m]))
        asym = runs["methods"]["asymspec"]
        bound = per_call_bound(asym["mal"], costs, k)
        points.append(
            {
                "target_ratio": r,
                "layers": layers,
                "measured_ratio": measured_r,
                "costs_s": costs,
                "verifier_1_over_drafter_1": costs["verifier_1"] / costs["drafter_1"],
                "methods": runs["methods"],
                "bound": bound,
                "fraction_of_bound": asym["decode_vs_floor"]["median"] / bound,
                "twin_tokens_equal": {"equal": same, "of": 2 * cases},
            }
        )
        del pipe
    curve = [(p["measured_ratio"], p["methods"]["asymspec"]["decode_vs_floor"]["median"]) for p in points]
    curve_whole = [(p["measured_ratio"], p["methods"]["asymspec"]["whole_vs_floor"]["median"]) for p in points]
    low = [(p["measured_ratio"], p["methods"]["asymspec"]["decode_vs_floor"]["min"]) for p in points]
    high = [(p["measured_ratio"], p["methods"]["asymspec"]["decode_vs_floor"]["max"]) for p in points]
    return {
        "what": EMULATOR,
        "settings": {
            "cases": cases,
            "reps": reps,
            "max_new_tokens": max_new_tokens,
            "k": k,
            "batch": batch,
            "families": FAMILIES,
            "device": device,
        },
        "base_costs_s": base_costs,
        "points": points,
        "break_even": {
            "decode": break_even(curve),
            "whole": break_even(curve_whole),
            "spread": sorted(x for x in (break_even(low), break_even(high)) if x is not None),
        },
    }
