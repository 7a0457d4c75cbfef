"""The cost-ratio curve's outputs: a Markdown report with its targets, the speed-up-vs-ratio chart (PNG) and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cost_curve import EMULATOR, METHODS, PAPER_RATIO

#: The issue's targets: decode-phase and whole-request speed-ups at the ratio nearest 16 (B = 1), the fraction of the
#: per-call bound at every ratio of 4 or more, and the aggregate speed-up at B = 8 near 16.
TARGETS = {"decode_at_16": 2.5, "whole_at_16": 2.0, "fraction_of_bound": 0.9, "batch_at_16": 1.8}


def _cell(s: dict[str, float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def nearest(points: list[dict[str, Any]], ratio: float) -> dict[str, Any]:
    """The point whose measured ratio is nearest ``ratio`` (in log scale)."""
    import math

    return min(points, key=lambda p: abs(math.log(p["measured_ratio"] / ratio)))


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured value and whether the median meets it."""
    pts = res["points"]
    if not pts:
        return []
    p16 = nearest(pts, PAPER_RATIO)
    asym = p16["methods"]["asymspec"]
    out = [
        {"target": f"AsymSpec/Floor decode-phase tok/s >= {TARGETS['decode_at_16']}x at r ~ 16", "measured": asym["decode_vs_floor"]["median"], "want": TARGETS["decode_at_16"], "at": p16["measured_ratio"]},
        {"target": f"AsymSpec/Floor whole-request tok/s >= {TARGETS['whole_at_16']}x at r ~ 16", "measured": asym["whole_vs_floor"]["median"], "want": TARGETS["whole_at_16"], "at": p16["measured_ratio"]},
    ]  # fmt: skip
    if "batch_vs_floor" in asym:
        out.append({"target": f"AsymSpec/Floor aggregate tok/s at B = {res['settings']['batch']} >= {TARGETS['batch_at_16']}x at r ~ 16", "measured": asym["batch_vs_floor"]["median"], "want": TARGETS["batch_at_16"], "at": p16["measured_ratio"]})  # fmt: skip
    for p in pts:
        if p["target_ratio"] >= 4:
            out.append({"target": f">= {TARGETS['fraction_of_bound']:.0%} of the per-call bound at r ~ {p['target_ratio']:g}", "measured": p["fraction_of_bound"], "want": TARGETS["fraction_of_bound"], "at": p["measured_ratio"]})  # fmt: skip
    for t in out:
        t["met"] = t["measured"] >= t["want"]
    return out


def render_markdown(res: dict[str, Any]) -> str:
    """The report: what was measured, one row per ratio, the targets, the break-even ratio."""
    s = res["settings"]
    lines = [
        "## Speed at the paper's cost ratio (cost-emulating verifier twin)",
        "",
        f"**Every number here is for a {EMULATOR}.** MiniVista {', '.join(s['families'])} problems ({s['cases']} a "
        f"repetition, {s['reps']} interleaved repetitions, {s['max_new_tokens']} tokens at most, K = {s['k']}); "
        "tokens/s medians with their min-max over repetitions; ratios paired with Floor's run of the same repetition.",
        "r = c_verifier(K+1) / c_drafter(1), measured in the run. Bound = MAL * c_verifier(1) / (K * c_drafter(1) + "
        "c_drafter_comp(K+1) + c_verifier(K+1)): the decode speed-up if only the forwards cost anything.",
        "",
        "| r asked | r measured | layers | c_d(1) ms | c_dc(K+1) ms | c_v(1) ms | c_v(K+1) ms | Floor tok/s | SD | AsymSpec | drafter alone "
        "| AsymSpec / Floor, decode | whole request | MAL | bound | of bound | B = "
        + str(s["batch"])
        + " AsymSpec / Floor | twin tokens equal |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in res["points"]:
        m, c = p["methods"], p["costs_s"]
        asym = m["asymspec"]
        batch = _cell(asym["batch_vs_floor"]) if "batch_vs_floor" in asym else "-"
        lines.append(
            f"| {p['target_ratio']:g} | {p['measured_ratio']:.1f} | {p['layers']} | {1e3 * c['drafter_1']:.2f} | {1e3 * c['drafter_comp_k1']:.2f} "
            f"| {1e3 * c['verifier_1']:.2f} | {1e3 * c['verifier_k1']:.2f} | "
            + " | ".join(f"{m[x]['decode_tps']['median']:.1f}" for x in METHODS)
            + f" | **{_cell(asym['decode_vs_floor'])}** | {_cell(asym['whole_vs_floor'])} | {asym['mal']:.2f} | {p['bound']:.2f} "
            f"| {p['fraction_of_bound']:.0%} | {batch} | {p['twin_tokens_equal']['equal']}/{p['twin_tokens_equal']['of']} |"
        )
    be = res["break_even"]
    spread = be["spread"]
    lines += [
        "",
        "Floor, SD, AsymSpec and the drafter alone: decode-phase tokens/s (medians).",
        "",
        "Break-even ratio (AsymSpec = Floor, decode phase): "
        + (f"{be['decode']:.1f}" if be["decode"] else "not inside the measured ratios")
        + (f" (from the repetitions' min and max curves: {', '.join(f'{x:.1f}' for x in spread)})" if spread else "")
        + "; whole requests: "
        + (f"{be['whole']:.1f}" if be["whole"] else "not inside the measured ratios")
        + ".",
        "",
        "| target | measured | met |",
        "|---|---:|---|",
    ]
    for t in targets(res):
        lines.append(f"| {t['target']} | {t['measured']:.2f} (at r = {t['at']:.1f}) | {'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def render_chart(res: dict[str, Any], path: str | Path) -> Path:
    """Speed-up over Floor against the measured ratio: decode phase (with the repetitions' range), whole requests, the
    per-call bound, break-even and the paper's ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(res["points"], key=lambda p: p["measured_ratio"])
    r = [p["measured_ratio"] for p in pts]
    dec = [p["methods"]["asymspec"]["decode_vs_floor"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.fill_between(r, [d["min"] for d in dec], [d["max"] for d in dec], alpha=0.2, color="#c44e52", label="decode, range over repetitions")
    ax.plot(r, [d["median"] for d in dec], "o-", color="#c44e52", label="AsymSpec / Floor, decode phase")
    ax.plot(r, [p["methods"]["asymspec"]["whole_vs_floor"]["median"] for p in pts], "s--", color="#4c72b0", label="whole requests")
    ax.plot(r, [p["bound"] for p in pts], ":", color="#555", label="per-call bound")
    if any("batch_vs_floor" in p["methods"]["asymspec"] for p in pts):
        ax.plot(
            r,
            [p["methods"]["asymspec"].get("batch_vs_floor", {}).get("median", float("nan")) for p in pts],
            "^-.",
            color="#55a868",
            label=f"B = {res['settings']['batch']}",
        )
    ax.axhline(1.0, color="#999", lw=0.8)
    ax.axvline(PAPER_RATIO, color="#8172b2", lw=0.8, ls="--", label="the paper's ratio (~16)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cost ratio r = c_verifier(K+1) / c_drafter(1), measured")
    ax.set_ylabel("speed-up over Floor")
    ax.set_title("AsymSpec speed-up vs cost ratio (cost-emulating twin, not a bigger model)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def write_cost_outputs(res: dict[str, Any], out_dir: str | Path, stem: str = "cost-curve") -> dict[str, Path]:
    """``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (when matplotlib is installed) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps({**res, "targets": targets(res)}, indent=1), encoding="utf-8")
    paths["markdown"].write_text(render_markdown(res), encoding="utf-8")
    try:
        paths["chart"] = render_chart(res, out / f"{stem}.png")
    except ImportError:
        pass
    return paths
