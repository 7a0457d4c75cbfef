"""Per-variant summaries, a Markdown table in the style of the paper's Table 3, and a bar chart.

Columns: accuracy per task (short names GPS/VQA/FQA/...), overall accuracy, *recovery* =
(variant - floor) / (drafter - floor) on overall accuracy when both a ``floor`` and a ``drafter``
variant are present, acceptance rate (accepted / drafted tokens), mean accepted length and
tokens/s (new tokens / wall seconds, summed over problems).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .mathvista.tasks import TASK_ALIASES, TASK_SHORT

_TASK_ORDER = tuple(TASK_ALIASES)


def _task_of(record: Mapping[str, Any]) -> str:
    task = record.get("task")
    if task is None:
        task = ((record.get("problem") or {}).get("metadata") or {}).get("task")
    task = str(task) if task is not None else "unknown"
    return TASK_SHORT.get(task, task)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def summarize_records(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy (overall and per task, in percent), acceptance, accepted length and speed of one variant."""
    n = len(records)
    correct = sum(1 for r in records if r.get("true_false") is True)
    tasks: dict[str, list[int]] = {}
    for r in records:
        c = tasks.setdefault(_task_of(r), [0, 0])
        c[0] += r.get("true_false") is True
        c[1] += 1
    order = [t for t in _TASK_ORDER if t in tasks] + sorted(t for t in tasks if t not in _TASK_ORDER)
    per_task = {t: {"accuracy": 100.0 * tasks[t][0] / tasks[t][1], "correct": tasks[t][0], "total": tasks[t][1]} for t in order}

    drafted = accepted = 0.0
    have_counts = False
    rates: list[float] = []
    mal_w = mal_steps = 0.0
    mals: list[float] = []
    tok = wall = 0.0
    for r in records:
        st = r.get("stats") or {}
        d, a = _num(st.get("drafted")), _num(st.get("accepted"))
        if d is not None and a is not None:
            have_counts = True
            drafted += d
            accepted += a
        if (rate := _num(st.get("acceptance_rate"))) is not None:
            rates.append(rate)
        mal, steps = _num(st.get("mean_accepted_length")), _num(st.get("steps"))
        if mal is not None:
            mals.append(mal)
            if steps:
                mal_w += mal * steps
                mal_steps += steps
        nt = _num(r.get("new_tokens")) if r.get("new_tokens") is not None else _num(st.get("new_tokens"))
        ws = _num(st.get("wall_s")) if _num(st.get("wall_s")) else _num(r.get("wall_s"))
        if nt is not None and ws:
            tok += nt
            wall += ws
    if drafted > 0:
        acceptance: float | None = accepted / drafted
    elif have_counts:
        acceptance = None  # nothing was drafted (floor / drafter-only methods)
    else:
        acceptance = sum(rates) / len(rates) if rates else None
    if mal_steps > 0:
        mean_len: float | None = mal_w / mal_steps
    else:
        mean_len = sum(mals) / len(mals) if mals else None
    first = records[0] if records else {}
    return {
        "method": first.get("method"),
        "config": first.get("config"),
        "n": n,
        "correct": correct,
        "accuracy": 100.0 * correct / n if n else 0.0,
        "tasks": per_task,
        "acceptance_rate": acceptance,
        "mean_accepted_length": mean_len,
        "tokens_per_s": tok / wall if wall > 0 else None,
    }


def summarize_variants(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:func:`summarize_records` per variant plus ``recovery`` (``None`` without floor and drafter)."""
    summaries = {name: summarize_records(recs) for name, recs in groups.items()}
    floor = next((s for s in summaries.values() if s["method"] == "floor"), None)
    drafter = next((s for s in summaries.values() if s["method"] == "drafter"), None)
    for s in summaries.values():
        s["recovery"] = None
        if floor is not None and drafter is not None:
            gap = drafter["accuracy"] - floor["accuracy"]
            if abs(gap) > 1e-12:
                s["recovery"] = (s["accuracy"] - floor["accuracy"]) / gap
    return summaries


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def markdown_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Table 3-style Markdown: one row per variant."""
    tasks: list[str] = []
    for s in summaries.values():
        for t in s["tasks"]:
            if t not in tasks:
                tasks.append(t)
    tasks = [t for t in _TASK_ORDER if t in tasks] + [t for t in tasks if t not in _TASK_ORDER]
    header = ["Method", "n"] + tasks + ["All", "Recovery", "Accept.", "Mean acc. len", "Tok/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for name, s in summaries.items():
        row = [name.replace("|", "\\|"), str(s["n"])]
        row += [_fmt(s["tasks"][t]["accuracy"], ".1f") if t in s["tasks"] else "—" for t in tasks]
        row += [
            _fmt(s["accuracy"], ".1f"),
            _fmt(None if s.get("recovery") is None else 100.0 * s["recovery"], ".0f") + ("%" if s.get("recovery") is not None else ""),
            _fmt(s["acceptance_rate"], ".3f"),
            _fmt(s["mean_accepted_length"], ".2f"),
            _fmt(s["tokens_per_s"], ".1f"),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def accuracy_chart(summaries: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "MathVista accuracy") -> Path:
    """Grouped bar chart (PNG) of accuracy per task and overall, one bar per variant."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = list(summaries)
    tasks: list[str] = []
    for s in summaries.values():
        tasks += [t for t in s["tasks"] if t not in tasks]
    tasks = [t for t in _TASK_ORDER if t in tasks] + [t for t in tasks if t not in _TASK_ORDER]
    groups = tasks + ["All"]
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(names)) * 0.5 + 3), 4.5))
    for i, name in enumerate(names):
        s = summaries[name]
        vals = [s["tasks"][t]["accuracy"] if t in s["tasks"] else 0.0 for t in tasks] + [s["accuracy"]]
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, vals, width=width, label=name)
    ax.set_xticks(list(range(len(groups))))
    ax.set_xticklabels(groups)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=max(1, len(names) // 6 + 1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    summaries: Mapping[str, Mapping[str, Any]],
    out_dir: str | Path,
    *,
    chart: bool = True,
    log: Callable[[str], None] = print,
    sections: Sequence[str] = (),
) -> dict[str, Path]:
    """Write ``report.md`` (and ``accuracy.png`` unless ``chart=False`` or matplotlib is missing); ``sections``
    (Markdown) follow the table."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    md = out_dir / "report.md"
    md.write_text("# MathVista results\n\n" + markdown_table(summaries) + "".join("\n" + x for x in sections), encoding="utf-8")
    paths["markdown"] = md
    if chart and summaries:
        try:
            paths["chart"] = accuracy_chart(summaries, out_dir / "accuracy.png")
        except ImportError:
            log("note: matplotlib is not installed; skipping accuracy.png (pip install matplotlib)")
    return paths
