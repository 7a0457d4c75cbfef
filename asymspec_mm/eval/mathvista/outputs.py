"""A run's outputs: MathVista's official output and scores JSON per variant, a summary and the report."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..scoring import compute_scores, score_problem, write_json
from .problems import pid_key


def safe_name(name: str) -> str:
    """A variant name usable in a file name."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def group_by_variant(records: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by variant (first-appearance order), each list sorted by pid."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r["variant"]), []).append(dict(r))
    return {k: sorted(v, key=lambda r: pid_key(r["pid"])) for k, v in groups.items()}


def official_output(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """MathVista's output JSON for one variant: pid -> problem fields + query + response + extraction
    + prediction + true_false (rescored here by MathVista's rules; kept as recorded for records scored by
    the paper's), plus ``stats``."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: pid_key(r["pid"])):
        entry = dict(r.get("problem") or {})
        entry.setdefault("pid", str(r["pid"]))
        entry["response"] = r.get("response", "")
        entry["extraction"] = r.get("extraction", "")
        if r.get("scoring") == "paper":  # scored by the paper's rules when recorded, which MathVista's would change
            entry["prediction"], entry["true_false"] = r.get("prediction"), r.get("true_false")
        else:
            entry["prediction"], entry["true_false"] = score_problem(entry, entry["extraction"])
        if r.get("stats"):
            entry["stats"] = r["stats"]
        out[str(r["pid"])] = entry
    return out


def finalize_run(
    records: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    variant_order: Sequence[str] | None = None,
    chart: bool = True,
    log: Callable[[str], None] = print,
    identity: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``output_<variant>.json``, ``scores_<variant>.json``, ``summary.json``, ``report.md`` and
    ``accuracy.png`` (when matplotlib is installed) under ``out_dir``; return the summary.

    ``identity``: the run's (default: ``out_dir/run.json`` when there is one); it names the dataset in the
    report's titles and is stored in ``summary.json`` under ``"run"``."""
    from ..report import dataset_label, summarize_variants, write_report
    from ..samples import sampled_section, sampled_summary
    from ..table3 import table3_section
    from .identity import stored_identity

    out_dir = Path(out_dir)
    records = list(records)
    if identity is None:
        identity = stored_identity(out_dir / "records.jsonl")
    groups = group_by_variant(records)
    if variant_order:
        order = [v for v in variant_order if v in groups] + [v for v in groups if v not in variant_order]
        groups = {v: groups[v] for v in order}
    files: dict[str, dict[str, str]] = {}
    for name, recs in groups.items():
        output = official_output(recs)
        scores = compute_scores(output)
        o = write_json(output, out_dir / f"output_{safe_name(name)}.json")
        s = write_json(scores, out_dir / f"scores_{safe_name(name)}.json")
        files[name] = {"output": str(o), "scores": str(s)}
    summaries = summarize_variants(groups)
    table3, table3_rows = table3_section(groups, summaries)  # only for the paper protocol on the paper's subset
    sampled = sampled_summary(groups)
    sections = [x for x in (table3, sampled_section(sampled)) if x]
    paths = write_report(summaries, out_dir, chart=chart, dataset=dataset_label(identity, records), log=log, sections=sections)
    summary = {"run": identity, "variants": summaries, "files": files, "report": {k: str(v) for k, v in paths.items()}}
    if sampled:
        summary["sampled"] = sampled
    if table3_rows:
        summary["table3"] = table3_rows
    write_json(summary, out_dir / "summary.json")
    return summary
