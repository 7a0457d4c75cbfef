"""The benchmark's PNG chart: one panel per part of the run that has data, and no empty ones.

A bench run may skip the main comparison, either sweep or the batch sweep (``--skip-...``); :func:`chart_panels`
lists the panels the results can fill, in a fixed order, and :func:`build_chart` lays out exactly those (two a
row; an odd last one spans the row).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .settings import SPLIT_KEYS, SPLIT_LABELS

__all__ = ["chart_panels", "build_chart", "render_chart"]

Panel = tuple[str, Callable[[Any], None]]  # (title, draw(ax))

_SPLIT_COLORS = {
    "drafter_full": "#4c72b0",
    "drafter_comp": "#55a868",
    "verifier": "#c44e52",
    "gate": "#8172b2",
    "trace": "#ccb974",
    "other": "#999",
}


def _throughput(res: dict[str, Any]) -> Panel | None:
    main = res.get("main", {}).get("variants", {})
    if not main:
        return None
    names = list(main)
    title = "Throughput" + ("" if res["meta"].get("trained", True) else " (random weights: AsymSpec/SD not meaningful)")

    def draw(ax: Any) -> None:
        ax.barh(
            names,
            [main[n]["ratio_to_floor"] or 0 for n in names],
            color=["#888" if main[n]["method"] == "floor" else "#3a7" for n in names],
        )
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("tokens/s ratio to Floor (median of paired reps)")
        ax.invert_yaxis()

    return title, draw


def _split(res: dict[str, Any]) -> Panel | None:
    main = res.get("main", {}).get("variants", {})
    names = [n for n in main if "split_frac" in main[n]]
    if not names:
        return None

    def draw(ax: Any) -> None:
        left = [0.0] * len(names)
        for key in SPLIT_KEYS:
            vals = [main[n]["split_frac"][key] * 100 for n in names]
            ax.barh(names, vals, left=left, color=_SPLIT_COLORS[key], label=SPLIT_LABELS[key])
            left = [a + b for a, b in zip(left, vals)]
        ax.set_xlabel("% of step time")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
        ax.invert_yaxis()

    return "Per-step time split", draw


def _length(res: dict[str, Any]) -> Panel | None:
    by_length = res.get("scaling_length", {}).get("by_length")
    if not by_length:
        return None

    def draw(ax: Any) -> None:
        lengths = [int(n) for n in by_length]
        for name in next(iter(by_length.values())):
            ax.plot(lengths, [by_length[str(n)][name]["token_s"] * 1e3 for n in lengths], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("compressed-view tokens")
        ax.set_ylabel("ms per emitted token (median)")
        ax.legend(fontsize=8)

    return "Per-token time vs prompt length", draw


def _k(res: dict[str, Any]) -> Panel | None:
    by_k = res.get("scaling_k", {}).get("by_k")
    labels = [lab for lab in by_k or {} if lab != "floor"]
    if not labels:
        return None

    def draw(ax: Any) -> None:
        ax.bar(labels, [by_k[lab]["ratio_to_floor"] or 0 for lab in labels], color="#3a7")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel("tokens/s ratio to Floor")
        ax.tick_params(axis="x", labelsize=7, rotation=30)

    return "Scaling with K", draw


def _batch(res: dict[str, Any]) -> list[Panel]:
    """The batch sweep's two panels: tokens/s ratio to the sequential loop, and step-time ratio, against B."""
    bt = res.get("batching")
    if not bt or not bt.get("by_variant"):
        return []
    # decode-only ratios where the whole-call tokens/s is missing (synthetic caches, a non-default row storage)
    key = "decode_ratio_to_seq" if bt["mode"] == "synthetic" or bt.get("batch_engine", "dynamic") != "dynamic" else "ratio_to_seq"

    def curves(ax: Any, field: str) -> None:
        for name, per in bt["by_variant"].items():
            sizes = [int(b) for b in per]
            ax.plot(sizes, [per[str(b)][field] or 0 for b in sizes], marker="o", label=name)
        ax.set_xlabel("batch size B")

    def rate(ax: Any) -> None:
        curves(ax, key)
        top = max(bt["sizes"])
        ax.plot([1, top], [1, top], color="#bbb", lw=0.8, ls="--", label="B x")
        ax.set_ylabel(("decode " if key.startswith("decode") else "") + "tokens/s ratio to the sequential loop")
        ax.legend(fontsize=8)

    def step(ax: Any) -> None:
        curves(ax, "step_ratio")
        ax.set_ylabel("step time / sequential step")
        ax.legend(fontsize=8)

    return [("Batched decoding: throughput", rate), ("Batched decoding: time per step", step)]


def chart_panels(res: dict[str, Any]) -> list[Panel]:
    """The panels the results have data for, in order: throughput ratio to Floor, per-step time split, per-token
    time against view length, ratio against K, then the batch sweep's throughput and step time."""
    single = (_throughput(res), _split(res), _length(res), _k(res))
    return [p for p in single if p is not None] + _batch(res)


def build_chart(res: dict[str, Any]) -> Any:
    """The chart's matplotlib figure: one axis per panel of :func:`chart_panels` (a note when none has data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = chart_panels(res)
    rows = max(1, (len(panels) + 1) // 2)
    fig = plt.figure(figsize=(13, 4.5 * rows))
    grid = fig.add_gridspec(rows, 2)
    for i, (title, draw) in enumerate(panels):
        last_alone = i == len(panels) - 1 and len(panels) % 2 == 1
        ax = fig.add_subplot(grid[i // 2, :] if last_alone else grid[i // 2, i % 2])
        draw(ax)
        ax.set_title(title, fontsize=10)
    if not panels:
        fig.text(0.5, 0.5, "nothing was measured (every part of the benchmark was skipped)", ha="center", va="center")
    meta = res["meta"]
    fig.suptitle(f"asymspec-mm bench: {meta['pair']} ({meta['device']}, {meta['dtype']})", fontsize=11)
    fig.tight_layout()
    return fig


def render_chart(res: dict[str, Any], path: str | Path) -> Path:
    """Save :func:`build_chart` of ``res`` as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = build_chart(res)
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
