"""The batch sweep's targets (issue #19) and, where one is missed, its measured cause from the sweep's own
timings (forward growth per stream, rows per step, set-up share)."""

from __future__ import annotations

from typing import Any

from .aggregate import TARGETS, judged
from .batching import _ratio
from .pairs import BenchPair
from .settings import STREAMS


def _forward_s(split: dict[str, float]) -> float:
    return sum(split[s] for s in STREAMS)


def _growth(b: dict, seq: dict) -> dict[str, float | None]:
    """How the parts of a step grew from the sequential step to a batched one (ratios of seconds per step)."""
    sb, s1 = b.get("split_step_s"), seq.get("split_step_s")
    if not sb or not s1:
        return {}
    out: dict[str, float | None] = {"forwards": _ratio(_forward_s(sb), _forward_s(s1))}
    for s in STREAMS:
        if s1[s] > 0:
            out[s] = sb[s] / s1[s]
    host_b = sb["gate"] + sb["trace"] + sb["other"]
    host_1 = s1["gate"] + s1["trace"] + s1["other"]
    out["host"] = _ratio(host_b, host_1)
    out["forward_frac_batched"] = _forward_s(sb) / sum(sb.values()) if sum(sb.values()) > 0 else None
    return out


def _step_parts(size: int, b: dict, seq: dict) -> str:
    g = _growth(b, seq)
    text = f"a step of {b['full_rows']} rows costs {b['step_s'] / seq['step_s']:.2f}x the single-row step"
    if g:
        per = ", ".join(f"{s.replace('_', '-')} {g[s]:.2f}x" for s in STREAMS if s in g)
        text += (
            f" (its forwards {g['forwards']:.2f}x: {per}; host work {g['host']:.2f}x; forwards are "
            f"{g['forward_frac_batched']:.0%} of the batched step)"
        )
    return text


def _throughput_cause(byv: dict, size: int, synthetic: bool) -> str:
    """Why the batched tokens/s stays below the target, from the measured parts."""
    seq, b = byv["1"], byv[str(size)]
    parts = [_step_parts(size, b, seq)]
    parts.append(f"{b['rows_per_step']:.1f} rows per step on average ({b['steps']:.0f} batched steps vs {seq['steps']:.0f} sequential)")
    if not synthetic and b.get("decode_ratio_to_seq"):
        p, d = seq["setup_frac"], b["decode_ratio_to_seq"]
        bound = 1.0 / (p + (1.0 - p) / d) if d else None
        parts.insert(
            0,
            f"set-up (image, vision, prompts, prefill; in generate_batch on the set-up thread one request at a time, "
            f"prefill batched between steps) is {p:.0%} of the sequential wall; "
            f"decode alone gains {d:.2f}x, which makes ~{bound:.2f}x for the whole (1 / (set-up + decode / {d:.2f}))",
        )
    return "; ".join(parts)


def batch_targets(sweep: dict[str, Any], bp: BenchPair) -> list[dict[str, Any]]:
    """Issue #19's targets the sweep can answer: the tiny pair's B=8 tokens/s ratio (CPU) and the real shapes'
    B=8 step-time ratio; each with its measured cause when missed."""
    if not sweep or 8 not in sweep["sizes"]:
        return []
    rows = []
    synthetic = sweep["mode"] == "synthetic"
    for name in sweep["variants"]:
        if sweep["methods"][name] not in ("floor", "asymspec") or "@" in name:
            continue
        byv = sweep["by_variant"][name]
        b = byv["8"]
        if bp.name.startswith("tiny"):
            measured = b["decode_ratio_to_seq"] if synthetic else b["ratio_to_seq"]
            if measured is None:
                continue
            notes = []
            if sweep["cases"] != 16:
                notes.append(f"over {sweep['cases']} problems, not 16")
            if bp.device.type != "cpu":
                notes.append(f"on {bp.device.type}, the target is stated for the CPU")
            if not bp.trained:
                notes.append("random tiny fallback")
            if synthetic:
                notes.append("synthetic caches: decode tokens/s")
            row = judged(
                {
                    "target": "batch_speedup",
                    "variant": name,
                    "text": f"{TARGETS['batch_speedup'][0]}: {name}",
                    "measured": measured,
                    "reps": b.get(("decode_ratio_to_seq" if synthetic else "ratio_to_seq") + "_reps"),
                    "note": "; ".join(notes) or None,
                }
            )
            rows.append({**row, "cause": None if row["met"] else _throughput_cause(byv, 8, synthetic)})
        if bp.name.startswith("real-shapes") and b["step_ratio"] is not None:
            row = judged(
                {
                    "target": "batch_step",
                    "variant": name,
                    "text": f"{TARGETS['batch_step'][0]}: {name}",
                    "measured": b["step_ratio"],
                    "reps": b.get("step_ratio_reps"),
                    "note": "random weights: per-step cost only (acceptance means nothing)",
                }
            )
            rows.append({**row, "cause": None if row["met"] else _step_parts(8, b, byv["1"])})
    return rows
