"""MiniVista's ``agent-log`` family as an evaluation: each task's whole history (the ``read_log`` call, the long tool
output, the agent's reply, the question) sent to ``pipe.chat`` with a compressed view for the verifier, one durable
record per (compressor, variant, task), reported in the paper's Table 17 layout per compressor.

``asymspec-mm eval mathvista --dataset minivista --families agent-log`` runs it, by default with the family's three
compressors (:data:`~.minivista_log.LOG_COMPRESSIONS`: truncate, LLMLingua-2 with the shipped tiny classifier,
question-only); ``--compression NAME`` (repeatable: one of those, or any ``method,key=value,...`` setting) chooses.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base.config import AsymSpecConfig
from ..frontend.variants import Variant
from .agent_loop import final_number
from .family_command import Tasks, run_family_command, write_report
from .mathvista.identity import bind_identity
from .mathvista.records import RecordStore, log_failure
from .minivista_log import LOG_COMPRESSIONS, LOG_FAMILY
from .samples import request_config


def log_compression(name: str) -> dict[str, Any]:
    """The settings a ``--compression`` value names: one of :data:`LOG_COMPRESSIONS` (``llmlingua2`` on the shipped
    tiny classifier), else the value as a compression spec (``method,key=value,...``)."""
    from ..request.compression import Compression
    from ..request.llmlingua2 import TINY_CLASSIFIER

    if name in LOG_COMPRESSIONS:
        settings = dict(LOG_COMPRESSIONS[name])
        if settings["method"] == "llmlingua2":
            settings["model"] = TINY_CLASSIFIER
        return settings
    c = Compression.of(name, "--compression")
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "summarizer"}


def run_log_task(pipe: Any, problem: Mapping[str, Any], method: str, compression: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """One task: its history to ``pipe.chat`` (the verifier's view compressed; no tools: the question is answered
    from the log already read); the answer and what it cost."""
    res = pipe.chat(problem["messages"], method=method, compression=dict(compression), config=config)
    st = res.stats
    return {
        "text": res.text,
        "true_false": final_number(res.text) == problem["answer"] and not res.tool_calls,
        "acceptance_rate": st.get("acceptance_rate"),
        "mean_accepted_length": st.get("mean_accepted_length"),
        "compression_ratio": st.get("compression_ratio"),
        "line_in_view": problem["line"] in "\n".join(v["text"] for v in st.get("compressed_view", [])),
    }


def run_log_eval(
    pipe: Any,
    problems: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    compressions: Sequence[str],
    records_path: str | Path,
    *,
    identity: Mapping[str, Any],
    resume: bool = False,
    overwrite: bool = False,
    on_error: str = "skip",
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every (compressor, variant, task) not yet in ``records_path``, its record appended as it finishes; returns the
    run's records. A record's ``variant`` is ``COMPRESSOR/VARIANT``."""
    store = RecordStore(records_path, resume=resume, overwrite=overwrite)
    bind_identity(records_path, identity, resuming=resume and len(store) > 0, log=log)
    settings = {name: log_compression(name) for name in compressions}
    todo = [(c, v, p) for c in compressions for v in variants for p in problems if (f"{c}/{v.name}", str(p["pid"])) not in store]
    log(f"{len(todo)} to run")
    with store:
        for k, (comp, variant, problem) in enumerate(todo, 1):
            cfg = request_config(AsymSpecConfig, variant, str(problem["pid"]))
            t0 = time.perf_counter()
            try:
                out = run_log_task(pipe, problem, variant.method, settings[comp], cfg)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - a failed task must not lose the run
                if on_error == "raise":
                    raise
                log_failure(Path(records_path), str(problem["pid"]), f"{comp}/{variant.name}", exc, log)
                continue
            store.append(
                {
                    "variant": f"{comp}/{variant.name}",
                    "pid": str(problem["pid"]),
                    "family": LOG_FAMILY,
                    "compression": comp,
                    "method": variant.method,
                    "answer": problem["answer"],
                    "wall_s": round(time.perf_counter() - t0, 4),
                    **out,
                }
            )
            if k % 20 == 0 or k == len(todo):
                log(f"[{k}/{len(todo)}] agent-log tasks run")
    wanted = {(f"{c}/{v.name}", str(p["pid"])) for c in compressions for v in variants for p in problems}
    return [r for key, r in store.records.items() if key in wanted]


def _mean(values: Sequence[Any]) -> float | None:
    seen = [v for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def summarize_log(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per compressor: each method's accuracy (%), the answer line's survival in the verifier's view (%), and
    AsymSpec's recovery of the Floor -> drafter gap, acceptance, accepted length and compression ratio."""
    out: dict[str, dict[str, Any]] = {}
    for comp in dict.fromkeys(r["compression"] for r in records):
        rows = [r for r in records if r["compression"] == comp]
        acc = {}
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["method"] == method]
            acc[method] = round(100.0 * sum(bool(r["true_false"]) for r in mine) / len(mine), 1)
        asym = [r for r in rows if r["method"] == "asymspec"]
        floor, drafter, ours = acc.get("floor"), acc.get("drafter"), acc.get("asymspec")
        gap = drafter - floor if floor is not None and drafter is not None else None
        out[comp] = {
            "n": len(asym) or len(rows),
            "accuracy": acc,
            "recovery": round(100.0 * (ours - floor) / gap, 1) if gap and gap > 0 and ours is not None else None,
            "acceptance_rate": _mean([r["acceptance_rate"] for r in asym]),
            "mean_accepted_length": _mean([r["mean_accepted_length"] for r in asym]),
            "compression_ratio": _mean([r["compression_ratio"] for r in rows]),
            "line_in_view": round(100.0 * sum(bool(r["line_in_view"]) for r in rows) / len(rows), 1),
        }
    return out


def _cell(v: Any, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def log_table(summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The paper's Table 17 layout, one row per compressor."""
    lines = [
        "| compressor | tasks | Floor (%) | drafter alone (%) | AsymSpec (%) | recovery | acceptance | accepted length "
        "| compression ratio | answer line in the verifier's view (%) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for comp, s in summary.items():
        a = s["accuracy"]
        lines.append(
            f"| {comp} | {s['n']} | {_cell(a.get('floor'), '{:.1f}')} | {_cell(a.get('drafter'), '{:.1f}')} "
            f"| {_cell(a.get('asymspec'), '{:.1f}')} | {_cell(s['recovery'], '{:.0f}%')} | {_cell(s['acceptance_rate'], '{:.2f}')} "
            f"| {_cell(s['mean_accepted_length'], '{:.2f}')} | {_cell(s['compression_ratio'], '{:.2f}')} | {s['line_in_view']:.0f} |"
        )
    return lines


def log_report(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's Markdown."""
    head = [
        "# MiniVista agent-log tasks",
        "",
        "Each task's whole history (the read_log call, a 20-30 line tool output, the agent's reply, the question about "
        "one line) through pipe.chat; the verifier reads it with every message before the last two compressed. Recovery "
        "= (AsymSpec - Floor) / (drafter - Floor); compression ratio = the verifier's prompt tokens of the full history "
        "over those it read.",
        "",
    ]
    return "\n".join(head + log_table(summary)) + "\n"


def finalize_log_run(records: Sequence[Mapping[str, Any]], out_dir: str | Path, identity: Mapping[str, Any] | None = None) -> dict:
    """Write ``summary.json`` and ``report.md`` (Table 17's layout per compressor) under ``out_dir``; the summary."""
    summary = summarize_log(records)
    write_report(out_dir, log_report(summary), identity, "compressors", summary)
    return summary


def log_command(args: Any, problems: Tasks, selected: Tasks, variants: Sequence[Variant], identity_and_pipeline: Callable) -> int:
    """``eval mathvista --dataset minivista --families agent-log``: the ``selected`` tasks with each variant under each
    ``--compression`` (default the family's three), then ``report.md`` / ``summary.json`` in ``--out``; 0 when done."""
    compressions = list(args.compression or LOG_COMPRESSIONS)
    for name in compressions:
        log_compression(name)  # a bad setting fails before any model loads

    def run(pipe: Any, records_path: Path, **options: Any) -> list[dict]:
        return run_log_eval(pipe, selected, variants, compressions, records_path, **options)

    plan = (
        f"{len(selected)} agent-log tasks (minivista seed {args.seed}) x {len(variants)} variants x compressors {', '.join(compressions)}"
    )
    return run_family_command(
        args, problems, variants, identity_and_pipeline, family=LOG_FAMILY, plan=plan, run=run, report=finalize_log_run
    )
