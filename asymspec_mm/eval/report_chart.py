"""The report's bar chart: accuracy per task and overall, one bar per variant with its 95% CI.

The legend sits below the axes (it never covers a bar); a bar of 0% is labelled "0" and a missing one
(the variant has no problem of that task) "n/a", so the two cannot be confused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .mathvista.tasks import TASK_ALIASES

#: MathVista's tasks in the report's order (columns, bars); others follow in the order first seen
TASK_ORDER = tuple(TASK_ALIASES)


def task_columns(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The tasks of ``summaries`` in report order: MathVista's first, then any other as first seen."""
    tasks: list[str] = []
    for s in summaries.values():
        tasks += [t for t in s["tasks"] if t not in tasks]
    return [t for t in TASK_ORDER if t in tasks] + [t for t in tasks if t not in TASK_ORDER]


def bar_values(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], dict[str, list[dict[str, Any] | None]]]:
    """``(groups, {variant: [cell or None per group]})``: the tasks then ``All``; None where the variant has
    no problem of that task."""
    groups = task_columns(summaries) + ["All"]
    out: dict[str, list[dict[str, Any] | None]] = {}
    for name, s in summaries.items():
        cells: list[dict[str, Any] | None] = [s["tasks"].get(t) for t in groups[:-1]]
        cells.append({"accuracy": s["accuracy"], "total": s["n"], "ci95": s.get("ci95")})
        out[name] = cells
    return groups, out


def bar_label(cell: Mapping[str, Any] | None) -> str | None:
    """The text written on a bar: "n/a" for a missing one, "0" for 0%, else None (the axis tells)."""
    if cell is None:
        return "n/a"
    return "0" if cell["accuracy"] == 0 else None


def build_chart(summaries: Mapping[str, Mapping[str, Any]], title: str = "MathVista accuracy") -> Any:
    """The chart as a matplotlib figure (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    groups, cells = bar_values(summaries)
    names = list(cells)
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(groups) * max(1, len(names)) + 3), 5.0))
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        vals = [c["accuracy"] if c is not None else 0.0 for c in cells[name]]
        err = [
            [max(0.0, v - c["ci95"][0]) if c and c.get("ci95") else 0.0 for v, c in zip(vals, cells[name])],
            [max(0.0, c["ci95"][1] - v) if c and c.get("ci95") else 0.0 for v, c in zip(vals, cells[name])],
        ]
        ax.bar(xs, vals, width=width, label=name, yerr=err, capsize=2, error_kw={"elinewidth": 0.8, "alpha": 0.7})
        for x, c in zip(xs, cells[name]):
            text = bar_label(c)
            if text is not None:
                ax.text(x, 1.0, text, ha="center", va="bottom", fontsize="x-small", color="0.3", rotation=90 if len(text) > 1 else 0)
    ax.set_xticks(list(range(len(groups))))
    ax.set_xticklabels(groups)
    ax.set_ylabel("accuracy (%), 95% CI")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ncol = min(len(names), 4)
    ax.legend(fontsize="small", ncol=max(1, ncol), loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    fig.tight_layout()
    return fig


def accuracy_chart(summaries: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "MathVista accuracy") -> Path:
    """Write :func:`build_chart` as a PNG."""
    import matplotlib.pyplot as plt

    fig = build_chart(summaries, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
