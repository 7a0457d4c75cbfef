"""Per-variant summaries and a Markdown table in the style of the paper's Table 3 (the chart: :mod:`.report_chart`).

Columns: accuracy per task (short names GPS/VQA/FQA/...; MiniVista's ``mixed`` family by its name) and overall, each with its 95% bootstrap confidence
interval (:func:`bootstrap_ci`) and n; *recovery* = (variant - Floor) / (drafter - Floor) on overall accuracy
under the rule of :func:`recovery` (needs a ``floor`` and a ``drafter`` variant); acceptance rate (accepted /
drafted tokens) and mean accepted length for speculative methods only (Floor and the drafter draft nothing);
tokens/s (new tokens / wall seconds, summed over problems).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base.checks import is_number
from .mathvista.tasks import TASK_SHORT
from .minivista import REPORT_LABELS as MINIVISTA_LABELS
from .report_chart import TASK_ORDER, task_columns

#: Methods that draft nothing: no acceptance rate, no mean accepted length.
NON_SPECULATIVE = ("floor", "drafter")
#: Recovery is reported only where the drafter leads Floor by at least this many accuracy points.
MIN_RECOVERY_GAP = 2.0
#: Bootstrap settings of every confidence interval in the report.
CI_LEVEL, CI_RESAMPLES, CI_SEED = 0.95, 1000, 0
DATASET_NAMES = {"mathvista": "MathVista", "minivista": "MiniVista"}


def bootstrap_ci(
    outcomes: Sequence[bool], *, resamples: int = CI_RESAMPLES, seed: int = CI_SEED, level: float = CI_LEVEL
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the accuracy (in %) of ``outcomes`` (one bool per problem).

    ``resamples`` resamples of the n problems with replacement (numpy's generator seeded with ``seed``, so
    the interval is the same on every call); the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of their accuracies. None for no problems.
    """
    import numpy as np

    n = len(outcomes)
    if n == 0:
        return None
    x = np.asarray([bool(o) for o in outcomes], dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1) * 100.0
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def recovery(acc: float, floor: float, drafter: float, min_gap: float = MIN_RECOVERY_GAP) -> tuple[float | None, str]:
    """``((acc - floor) / (drafter - floor), cell text)`` where the gap is meaningful, else ``(None, why not)``.

    Accuracies in points. The ratio is reported only when the drafter leads Floor by ``min_gap`` points or
    more ("drafter not above Floor" / "gap < 2 pts" otherwise); above the drafter it reads "above drafter"
    (a ratio over 100% would only measure how small the drafter's lead is).
    """
    gap = drafter - floor
    if gap <= 1e-9:
        return None, "drafter not above Floor"
    if gap < min_gap - 1e-9:
        return None, f"gap < {min_gap:g} pts"
    ratio = (acc - floor) / gap
    return ratio, "above drafter" if acc > drafter + 1e-9 else f"{100 * ratio:.0f}%"


def dataset_label(identity: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]] = ()) -> str:
    """The dataset actually run (``MiniVista``, ``MathVista testmini``), from the run's identity or its records."""
    ds = (identity or {}).get("dataset") or {}
    name = ds.get("name") if isinstance(ds, Mapping) else None
    if name is None:
        names = sorted({str(r["dataset"]) for r in records if r.get("dataset")})
        name = names[0] if len(names) == 1 else None
    label = "MathVista-format" if name is None else DATASET_NAMES.get(name, name)
    if name == "mathvista" and isinstance(ds, Mapping) and ds.get("split"):
        label += f" {ds['split']}"
    protocol = (identity or {}).get("protocol")
    if protocol is None:
        protocols = {str(r["protocol"]) for r in records if r.get("protocol")}
        protocol = protocols.pop() if len(protocols) == 1 else None
    if protocol and protocol != "mathvista":
        label += f" ({protocol} protocol)"
    return label


def _task_of(record: Mapping[str, Any]) -> str:
    """The record's column: MathVista's short task name (GPS, FQA, ...), a MiniVista family by its own name
    where that name would misname it (``mixed``, not MWP), else the task as written."""
    task = record.get("task")
    if task is None:
        task = ((record.get("problem") or {}).get("metadata") or {}).get("task")
    task = str(task) if task is not None else "unknown"
    if record.get("dataset") == "minivista" and task in MINIVISTA_LABELS:
        return MINIVISTA_LABELS[task]
    return TASK_SHORT.get(task, task)


def _num(x: Any) -> float | None:
    return float(x) if is_number(x) else None


def _cell(outcomes: list[bool]) -> dict[str, Any]:
    n, correct = len(outcomes), sum(outcomes)
    return {"accuracy": 100.0 * correct / n if n else 0.0, "correct": correct, "total": n, "ci95": bootstrap_ci(outcomes)}


def speculation_summary(records: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """(acceptance rate, mean accepted length) over the records: token-weighted where counts are there.

    The rate is pooled, accepted / drafted tokens summed over the records (the paper's measure), not the mean of
    the per-problem rates, which gives a short answer's few drafts the weight of a long one's many."""
    drafted = accepted = 0.0
    have_counts = False
    rates: list[float] = []
    mal_w = mal_steps = 0.0
    mals: list[float] = []
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
    if drafted > 0:
        acceptance: float | None = accepted / drafted
    elif have_counts:
        acceptance = None  # nothing was drafted
    else:
        acceptance = sum(rates) / len(rates) if rates else None
    mean_len = mal_w / mal_steps if mal_steps > 0 else (sum(mals) / len(mals) if mals else None)
    return acceptance, mean_len


def summarize_records(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy (overall and per task, in percent, with n and a 95% bootstrap CI), acceptance, accepted length
    (None for methods that draft nothing) and speed of one variant."""
    outcomes = [r.get("true_false") is True for r in records]
    by_task: dict[str, list[bool]] = {}
    for r, ok in zip(records, outcomes):
        by_task.setdefault(_task_of(r), []).append(ok)
    order = [t for t in TASK_ORDER if t in by_task] + sorted(t for t in by_task if t not in TASK_ORDER)
    first = records[0] if records else {}
    speculative = first.get("method") not in NON_SPECULATIVE
    acceptance, mean_len = speculation_summary(records) if speculative else (None, None)
    tok = wall = 0.0
    for r in records:
        st = r.get("stats") or {}
        nt = _num(r.get("new_tokens")) if r.get("new_tokens") is not None else _num(st.get("new_tokens"))
        ws = _num(st.get("wall_s")) if _num(st.get("wall_s")) else _num(r.get("wall_s"))
        if nt is not None and ws:
            tok += nt
            wall += ws
    overall = _cell(outcomes)
    return {
        "method": first.get("method"),
        "config": first.get("config"),
        "n": overall["total"],
        "correct": overall["correct"],
        "accuracy": overall["accuracy"],
        "ci95": overall["ci95"],
        "tasks": {t: _cell(by_task[t]) for t in order},
        "acceptance_rate": acceptance,
        "mean_accepted_length": mean_len,
        "tokens_per_s": tok / wall if wall > 0 else None,
    }


def summarize_variants(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:func:`summarize_records` per variant plus ``recovery`` and ``recovery_cell`` (:func:`recovery`; both
    None without a floor and a drafter variant)."""
    summaries = {name: summarize_records(recs) for name, recs in groups.items()}
    floor = next((s for s in summaries.values() if s["method"] == "floor"), None)
    drafter = next((s for s in summaries.values() if s["method"] == "drafter"), None)
    for s in summaries.values():
        s["recovery"], s["recovery_cell"] = None, None
        if floor is not None and drafter is not None:
            s["recovery"], s["recovery_cell"] = recovery(s["accuracy"], floor["accuracy"], drafter["accuracy"])
    return summaries


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _acc_cell(cell: Mapping[str, Any] | None, with_n: bool) -> str:
    if cell is None:
        return "n/a"
    text = f"{cell['accuracy']:.1f}"
    if cell.get("ci95") is not None:
        lo, hi = cell["ci95"]
        text += f" [{lo:.1f}, {hi:.1f}]"
    return text + (f" (n={cell['total']})" if with_n else "")


def markdown_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Table 3-style Markdown: one row per variant. A column's n is in its header when every variant has the
    same, else in each cell; "n/a": the variant has no problem of that task."""
    tasks = task_columns(summaries)
    cells = {
        name: {**{t: s["tasks"].get(t) for t in tasks}, "All": {"accuracy": s["accuracy"], "total": s["n"], "ci95": s.get("ci95")}}
        for name, s in summaries.items()
    }
    cols = tasks + ["All"]
    ns = {c: {cells[name][c]["total"] for name in cells if cells[name][c] is not None} for c in cols}
    uniform = {c: len(ns[c]) == 1 for c in cols}
    show_recovery = any(s.get("recovery_cell") is not None for s in summaries.values())
    header = ["Method", "n"] + [f"{c} (n={next(iter(ns[c]))})" if uniform[c] else c for c in cols]
    header += (["Recovery"] if show_recovery else []) + ["Accept.", "Mean acc. len", "Tok/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for name, s in summaries.items():
        row = [name.replace("|", "\\|"), str(s["n"])] + [_acc_cell(cells[name][c], not uniform[c]) for c in cols]
        row += [s["recovery_cell"] or ""] if show_recovery else []
        row += [_fmt(s["acceptance_rate"], ".3f"), _fmt(s["mean_accepted_length"], ".2f"), _fmt(s["tokens_per_s"], ".1f")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def report_notes(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The rules behind the table's numbers, as Markdown bullet points."""
    lines = [
        f"- Accuracy in %, with its {CI_LEVEL:.0%} bootstrap confidence interval in brackets "
        f"({CI_RESAMPLES} resamples of the problems with replacement, seed {CI_SEED}); n: problems.",
    ]
    floor = next((s for s in summaries.values() if s["method"] == "floor"), None)
    drafter = next((s for s in summaries.values() if s["method"] == "drafter"), None)
    rule = (
        f"- Recovery = (method - Floor) / (drafter - Floor) on overall accuracy, reported only where the drafter "
        f'leads Floor by at least {MIN_RECOVERY_GAP:g} points; "above drafter" where the method beats the drafter.'
    )
    if floor is not None and drafter is not None:
        gap = drafter["accuracy"] - floor["accuracy"]
        why = recovery(0.0, floor["accuracy"], drafter["accuracy"])[0] is None
        lines.append(rule + f" Here drafter - Floor = {gap:+.1f} points" + (": not reported." if why else "."))
    else:
        lines.append("- Recovery needs a floor and a drafter variant: not reported.")
    lines.append(
        "- Accept.: pooled acceptance, accepted / drafted tokens summed over the problems (the paper's measure; the "
        "progress bar shows the same number); Accept. and Mean acc. len: speculative methods only (Floor and the "
        "drafter draft nothing)."
    )
    return "\n".join(lines) + "\n"


def write_report(
    summaries: Mapping[str, Mapping[str, Any]],
    out_dir: str | Path,
    *,
    chart: bool = True,
    dataset: str = "MathVista",
    log: Callable[[str], None] = print,
    sections: Sequence[str] = (),
) -> dict[str, Path]:
    """Write ``report.md`` (and ``accuracy.png`` unless ``chart=False`` or matplotlib is missing); ``dataset``
    names the data actually run in the titles; ``sections`` (Markdown) follow the table and its notes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    md = out_dir / "report.md"
    md.write_text(
        f"# {dataset} results\n\n" + markdown_table(summaries) + "\n" + report_notes(summaries) + "".join("\n" + x for x in sections),
        encoding="utf-8",
    )
    paths["markdown"] = md
    if chart and summaries:
        from .report_chart import accuracy_chart

        try:
            paths["chart"] = accuracy_chart(summaries, out_dir / "accuracy.png", title=f"{dataset} accuracy")
        except ImportError:
            log("note: matplotlib is not installed; skipping accuracy.png (pip install matplotlib)")
    return paths
