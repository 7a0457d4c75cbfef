"""From runs to results: per-repetition summaries, paired ratios, per-variant medians, per-call costs,
the throughput projection, the bookkeeping checks over all runs and the targets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base.timing import median
from .pairs import BenchPair
from .settings import SPLIT_KEYS
from .spread import verdict


def _sum(runs: list[dict], key: str) -> float:
    """The total of ``key`` over ``runs``."""
    return float(sum(r[key] for r in runs))


def rep_summary(runs: list[dict]) -> dict[str, Any]:
    """One repetition of one variant (its runs over the cases) -> tokens/s, per-step and per-token times, split."""
    new, steps, dec = _sum(runs, "new_tokens"), _sum(runs, "steps"), _sum(runs, "decode_s")
    out: dict[str, Any] = {
        "new_tokens": new,
        "steps": steps,
        "decode_s": dec,
        "tokens_per_s": new / dec if dec > 0 else 0.0,
        "step_s": dec / steps if steps else float("nan"),
        "token_s": dec / new if new else float("nan"),
    }
    inst = [r for r in runs if r.get("split")]
    if inst:
        isteps = sum(r["steps"] for r in inst)
        loop = sum(r["loop_s"] for r in inst)
        out["split_step_s"] = {k: sum(r["split"][k] for r in inst) / isteps for k in SPLIT_KEYS} if isteps else {}
        out["split_frac"] = {k: sum(r["split"][k] for r in inst) / loop for k in SPLIT_KEYS} if loop > 0 else {}
        out["loop_step_s"] = loop / isteps if isteps else float("nan")
    return out


def paired_ratios(per_rep: dict[str, list[dict]], key: str = "tokens_per_s", reference: str = "floor") -> dict[str, list[float]]:
    """Per repetition r: ``value(variant, r) / value(reference, r)`` -- ratios of runs made side by side."""
    ref = per_rep.get(reference)
    if not ref:
        return {}
    out = {}
    for name, reps in per_rep.items():
        out[name] = [a[key] / b[key] if b[key] else float("nan") for a, b in zip(reps, ref)]
    return out


def variant_summary(runs: list[dict], reps: list[dict], ratios: list[float] | None) -> dict[str, Any]:
    """Medians over repetitions + pooled counters over every run of the variant."""
    new, steps = _sum(runs, "new_tokens"), _sum(runs, "steps")
    drafted, accepted = _sum(runs, "drafted"), _sum(runs, "accepted")
    k = runs[0]["k"] if runs else 0
    app = [sum(r["accepted_per_position"][i] for r in runs) for i in range(k)] if runs and runs[0]["accepted_per_position"] else []
    fwd: dict[str, float] = {}
    for r in runs:
        for s, n in r["decode_forwarded"].items():
            fwd[s] = fwd.get(s, 0) + n
    tps = [r["tokens_per_s"] for r in reps]
    out: dict[str, Any] = {
        "method": runs[0]["method"] if runs else None,
        "k": k,
        "tokens_per_s": median(tps),
        "tokens_per_s_min": min(tps) if tps else float("nan"),
        "tokens_per_s_max": max(tps) if tps else float("nan"),
        "tokens_per_s_reps": tps,
        "ratio_to_floor": median(ratios) if ratios else None,
        "ratio_to_floor_reps": ratios,
        "step_s": median([r["step_s"] for r in reps]),
        "step_s_reps": [r["step_s"] for r in reps],
        "token_s": median([r["token_s"] for r in reps]),
        "token_s_reps": [r["token_s"] for r in reps],
        "new_tokens": new,
        "steps": steps,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": new / steps if steps else None,
        "accepted_per_position": app,
        "accepted_per_position_rate": [a / steps for a in app] if steps else [],
        "full_accept_fraction": (app[-1] / steps) if app and steps else None,
        "forwarded_per_token": {s: n / new for s, n in fwd.items()} if new else {},
        "vision_calls": int(_sum(runs, "vision_calls")),
        "vision_cache_hits": int(_sum(runs, "vision_cache_hits")),
        "requests": len(runs),
        "context": runs[0]["context"] if runs else {},
    }
    split_reps = [r for r in reps if r.get("split_step_s")]
    if split_reps:
        out["split_step_s"] = {k2: median([r["split_step_s"][k2] for r in split_reps]) for k2 in SPLIT_KEYS}
        out["split_frac"] = {k2: median([r["split_frac"][k2] for r in split_reps]) for k2 in SPLIT_KEYS}
        out["loop_step_s_reps"] = [r["loop_step_s"] for r in split_reps]
        out["loop_step_s"] = median(out["loop_step_s_reps"])
        out["host_overhead_frac_reps"] = [r["split_frac"]["gate"] + r["split_frac"]["trace"] + r["split_frac"]["other"] for r in split_reps]
        out["host_overhead_frac"] = median(out["host_overhead_frac_reps"])
        out["gate_frac_reps"] = [r["split_frac"]["gate"] for r in split_reps]
        out["gate_frac"] = out["split_frac"]["gate"]
    return out


def summarize(per_rep: dict[str, list[dict]], runs_by: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """:func:`variant_summary` of every variant, its ratios paired against Floor's repetitions."""
    ratios = paired_ratios(per_rep)
    return {name: variant_summary(runs_by[name], per_rep[name], ratios.get(name)) for name in per_rep}


def call_costs(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Median seconds of one decode-phase extend per stream and tokens per call, pooled over runs."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for s, d in r.get("extend_costs", {}).items():
            for n, ts in d.items():
                pooled.setdefault(s, {}).setdefault(n, []).extend(ts)
    return {
        s: {n: {"median_s": median(ts), "calls": len(ts)} for n, ts in sorted(d.items(), key=lambda x: int(x[0]))}
        for s, d in pooled.items()
    }


def project(
    costs: dict,
    k: int,
    *,
    floor_token_s: float,
    asym_host_step_s: float,
    sd_host_step_s: float | None,
    scenarios: Sequence[tuple[float, float]],
) -> list[dict[str, Any]]:
    """PROJECTED tokens/s from measured per-call costs for given (acceptance rate, mean accepted length).

    AsymSpec step = (K - f) * c(drafter_full, 1 token) + f * c(drafter_full, 2 tokens) + c(drafter_comp, K+1)
    + c(verifier, K+1) + host, where f = AR^K is the fraction of steps that follow a step accepting all K
    drafts (i.i.d. positions), whose first drafting forward also carries that step's d_K (without a measured
    2-token cost, 2 x the 1-token cost: a separate forward); tokens/s = MAL / step. SD likewise with the
    compressed stream drafting.
    Floor is measured (its cost does not depend on acceptance).
    """

    def cost(stream: str, n: int) -> float | None:
        c = costs.get(stream, {}).get(str(n))
        return c["median_s"] if c else None

    full1, comp_k1, ver_k1, comp1 = cost("drafter_full", 1), cost("drafter_comp", k + 1), cost("verifier", k + 1), cost("drafter_comp", 1)
    full2, comp2 = cost("drafter_full", 2), cost("drafter_comp", 2)

    def drafting(one: float, two: float | None, f: float) -> float:
        return (k - f) * one + f * (two if two is not None else 2 * one)

    rows = []
    for ar, mal in scenarios:
        f = ar**k
        row: dict[str, Any] = {
            "acceptance_rate": ar,
            "mean_accepted_length": mal,
            "full_accept_fraction": f,
            "floor_tokens_per_s": 1.0 / floor_token_s if floor_token_s else None,
        }
        if None not in (full1, comp_k1, ver_k1):
            step = drafting(full1, full2, f) + comp_k1 + ver_k1 + asym_host_step_s
            row.update(
                asymspec_step_s=step,
                asymspec_tokens_per_s=mal / step,
                asymspec_ratio_to_floor=(mal / step) * floor_token_s if floor_token_s else None,
            )
        if None not in (comp1, ver_k1) and sd_host_step_s is not None:
            step = drafting(comp1, comp2, f) + ver_k1 + sd_host_step_s
            row.update(
                sd_step_s=step, sd_tokens_per_s=mal / step, sd_ratio_to_floor=(mal / step) * floor_token_s if floor_token_s else None
            )
        rows.append(row)
    return rows


def host_step_s(summary: dict | None) -> float | None:
    """Host seconds per step of a variant (gate + trace + rest); None without a split."""
    if not summary or "split_step_s" not in summary:
        return None
    s = summary["split_step_s"]
    return s["gate"] + s["trace"] + s["other"]


def projection(summary: dict[str, dict], costs: dict, k: int, scenarios: Sequence[tuple[float, float]], *, trained: bool) -> dict[str, Any]:
    """The ``projection`` section: :func:`project` at ``scenarios`` from the main comparison's costs and host
    overhead; on a trained pair also at its own measured acceptance, beside its measured tokens/s (a model check)."""
    floor_token_s = summary["floor"]["token_s"]
    asym = summary.get("asymspec")
    proj: dict[str, Any] = {"label": "PROJECTION from measured per-call costs, not a measured throughput", "k": k}
    if asym and host_step_s(asym) is not None:
        proj["scenarios"] = project(
            costs,
            k,
            floor_token_s=floor_token_s,
            asym_host_step_s=host_step_s(asym),
            sd_host_step_s=host_step_s(summary.get("sd")),
            scenarios=scenarios,
        )
        if trained and asym["acceptance_rate"] is not None:
            f_meas = asym["full_accept_fraction"] or 0.0
            ar_equiv = f_meas ** (1.0 / k) if f_meas > 0 else 0.0
            check = project(
                costs,
                k,
                floor_token_s=floor_token_s,
                asym_host_step_s=host_step_s(asym),
                sd_host_step_s=None,
                scenarios=[(ar_equiv, asym["mean_accepted_length"])],
            )[0]
            proj["model_check"] = {
                "measured_tokens_per_s": asym["tokens_per_s"],
                "projected_tokens_per_s": check.get("asymspec_tokens_per_s"),
                "measured_acceptance": {"mal": asym["mean_accepted_length"], "full_accept_fraction": f_meas},
            }
    return proj


def collect_checks(runs: list[dict]) -> dict[str, Any]:
    """The bookkeeping checks over all ``runs``: each must hold in every run; the worst split-sum error."""
    errs = [r["checks"].get("split_sum_rel_err", 0.0) for r in runs]
    return {
        "runs": len(runs),
        "forwarded_ok": all(r["checks"]["forwarded_ok"] for r in runs),
        "tokens_ok": all(r["checks"]["tokens_ok"] for r in runs),
        "per_position_monotone": all(r["checks"]["per_position_monotone"] for r in runs),
        "split_nonnegative": all(r["checks"].get("split_nonnegative", True) for r in runs),
        "split_sum_max_rel_err": max(errs) if errs else 0.0,
        "split_sum_ok": all(r["checks"].get("split_sum_ok", True) for r in runs),
    }


TARGETS = {
    "loop_overhead": ("loop overhead (all but model forwards) <= 5% of AsymSpec step time", 0.05),
    "gate_fusion": ("gate + fusion <= 1% of AsymSpec step time", 0.01),
    "tiny_speedup": ("tiny pair: AsymSpec tokens/s >= 1.3x Floor (paired)", 1.3),
    "length_growth": ("per-token time growth with prompt length: AsymSpec / Floor <= 1.2", 1.2),
    # issue #19 (batched decoding; evaluated by asymspec_mm.bench.batching.batch_targets)
    "batch_speedup": ("tiny pair, CPU: generate_batch(batch_size=8) over 16 problems >= 3x the sequential loop's tokens/s", 3.0),
    "batch_step": ("real shapes: per-step time at B=8 <= 3x the sequential (B=1) step", 3.0),
}

#: The targets met from above (a ratio of at least the threshold); the others are ceilings.
AT_LEAST = frozenset({"tiny_speedup", "batch_speedup"})


def target_verdict(row: dict[str, Any]) -> str:
    """The verdict of a target row by its repetitions (:func:`.spread.verdict`): met or NOT met only when every one
    of at least three repetitions lies on one side of the threshold."""
    return verdict(row.get("reps") or [], TARGETS[row["target"]][1], at_most=row["target"] not in AT_LEAST)


def judged(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its ``verdict`` and ``met`` (True only for the verdict met)."""
    v = target_verdict(row)
    return {**row, "verdict": v, "met": v == "met"}


def evaluate_targets(result: dict[str, Any], bp: BenchPair) -> list[dict[str, Any]]:
    """Each :data:`TARGETS` entry that the result can answer: measured median, repetitions, verdict
    (:func:`target_verdict`) and a caveat."""
    rows = []
    asym = result.get("main", {}).get("variants", {}).get("asymspec")
    if asym and "host_overhead_frac" in asym:
        rows.append(
            {
                "target": "loop_overhead",
                "text": TARGETS["loop_overhead"][0],
                "measured": asym["host_overhead_frac"],
                "reps": asym["host_overhead_frac_reps"],
            }
        )
        rows.append(
            {
                "target": "gate_fusion",
                "text": TARGETS["gate_fusion"][0],
                "measured": asym["gate_frac"],
                "reps": asym["gate_frac_reps"],
            }
        )
    if asym and bp.name.startswith("tiny") and asym.get("ratio_to_floor") is not None:
        rows.append(
            {
                "target": "tiny_speedup",
                "text": TARGETS["tiny_speedup"][0],
                "measured": asym["ratio_to_floor"],
                "reps": asym["ratio_to_floor_reps"],
                "note": None if bp.trained else "random tiny fallback: acceptance is not the trained pair's",
            }
        )
    sl = result.get("scaling_length", {})
    key = "growth_ratio_asymspec_vs_floor" if bp.trained else "growth_ratio_asymspec_step_vs_floor"
    g = sl.get(key)
    if g is not None:
        rows.append(
            {
                "target": "length_growth",
                "text": TARGETS["length_growth"][0],
                "measured": g,
                "reps": sl.get(key + "_reps"),
                "note": None
                if bp.trained
                else "random weights: AsymSpec per-step time (per-token time at fixed acceptance) vs Floor per-token",
            }
        )
    return [judged(r) for r in rows]
