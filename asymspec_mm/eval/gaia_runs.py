"""The agent harnesses' runs (``eval gaia``, ``eval simpleqa``): their records, run folder, resume rule and tables.

A run folder holds ``records.jsonl`` (one :class:`TaskRecord` a line, appended as each (row, task) finishes),
``run.json`` (the run's identity: the benchmark, a hash of the data and the tool cache, the harness settings, the
served model) and the table, rewritten after every task so that a run cut short keeps it. ``--resume`` continues
the records only when the identity is the same (the rows and the task selection may change: a new row or task
adds records, the finished ones are skipped); any other difference is refused in one line naming it, so one
folder never mixes two runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from ..frontend.identity import identity_diff, read_identity_file, show_value, write_identity_file

RECORDS = "records.jsonl"
RUN_FILE = "run.json"
FORMAT = "asymspec-mm agent harness"
FORMAT_VERSION = 1
#: Table 4's row names
LABELS = {"floor": "Floor", "verifier-full": "Verifier, full context", "sd": "SD", "asymspec": "AsymSpec"}
_FIX = "give another --out"


@dataclass
class TaskRecord:
    """One (row, task) outcome: the answer, its score (``grade``: the grader's verdict where it has more than
    right and wrong), and each request's server figures (``requests``: prompt tokens, cached tokens, the
    ``asymspec`` stats)."""

    row: str
    task_id: str
    subset: str
    level: int
    truth: str
    answer: str | None = None
    correct: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    grade: str | None = None


def files_sha256(paths: Iterable[str | Path]) -> str:
    """One hash of the files' bytes (a missing file counts as empty): what the records of a run depend on."""
    digest = hashlib.sha256()
    for path in paths:
        p = Path(path)
        digest.update(p.read_bytes() if p.is_file() else b"")
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def load_records(path: str | Path) -> list[TaskRecord]:
    """The records of a ``records.jsonl`` (keys it does not know are ignored)."""
    known = {f.name for f in fields(TaskRecord)}
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(TaskRecord(**{k: v for k, v in json.loads(line).items() if k in known}))
    return out


def open_run(folder: str | Path, identity: Mapping[str, Any], resume: bool) -> list[TaskRecord]:
    """Bind ``folder`` to the run ``identity`` and return the records it already holds (``resume``) or none.
    Records there without ``resume``, or a stored identity that differs, are an :class:`AsymSpecError`."""
    folder = Path(folder)
    identity = json.loads(json.dumps(identity))  # as run.json stores it (tuples as lists), so equal runs compare equal
    records_path = folder / RECORDS
    started = records_path.is_file() and records_path.stat().st_size > 0
    if started and not resume:
        raise AsymSpecError(f"{records_path} already holds results: pass --resume to continue that run, or {_FIX}")
    records: list[TaskRecord] = []
    if started:
        old = read_identity_file(folder / RUN_FILE, FORMAT, _FIX)
        if old is None:
            raise AsymSpecError(f"--resume: {folder} has no {RUN_FILE}, so its records cannot be checked against this run: {_FIX}")
        diffs = identity_diff(old, identity)
        if diffs:
            named = ", ".join(f"{key} {show_value(a)} -> {show_value(b)}" for key, a, b in diffs)
            raise AsymSpecError(f"--resume: this run differs from the records in {folder}: {named}; {_FIX}")
        records = load_records(records_path)
    write_identity_file(folder / RUN_FILE, FORMAT, FORMAT_VERSION, identity)
    return records


def run_rows(
    tasks: Sequence[Any],
    rows: Sequence[str],
    run_one: Callable[[str, Any], TaskRecord],
    folder: str | Path,
    done: Sequence[TaskRecord] = (),
    table: Callable[[Sequence[TaskRecord]], Any] = lambda records: None,
    log: Callable[[str], Any] = print,
) -> list[TaskRecord]:
    """``run_one(row, task)`` for every row and task (row by row) that ``done`` does not hold yet: each record
    appended to ``folder/records.jsonl`` as it finishes, then ``table(records)`` called (it rewrites the run's
    table) and a line logged. Returns ``done`` and the new records."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = list(done)
    finished = {(r.row, r.task_id) for r in records}
    for row in rows:
        for task in tasks:
            if (row, task.task_id) in finished:
                continue
            rec = run_one(row, task)
            records.append(rec)
            with (folder / RECORDS).open("a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(rec)) + "\n")
            table(records)
            error = f", {rec.error}" if rec.error else ""
            log(f"{row} {task.task_id} ({rec.subset}): {'right' if rec.correct else 'wrong'}, {len(rec.requests)} requests{error}")
    return records


def row_summary(records: Sequence[TaskRecord]) -> dict[str, Any]:
    """Accuracy (%), the token compression ratio over all requests (sum of |x_full| over sum of |x_comp|),
    the acceptance rate (accepted / drafted drafts) and mean accepted length (tokens per decoding step)."""
    reqs = [r for rec in records for r in rec.requests]
    stats = [r["stats"] for r in reqs]
    full = sum(s.get("prompt_tokens_full", r["prompt_tokens"]) for s, r in zip(stats, reqs))
    comp = sum(r["prompt_tokens"] for r in reqs)
    drafted, accepted = sum(s.get("drafted", 0) for s in stats), sum(s.get("accepted", 0) for s in stats)
    steps = sum(s.get("steps", 0) for s in stats)
    tokens = sum(s.get("mean_accepted_length", 0.0) * s.get("steps", 0) for s in stats)
    return {
        "n": len(records),
        "accuracy": 100.0 * sum(r.correct for r in records) / len(records) if records else 0.0,
        "compression_ratio": full / comp if comp else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": tokens / steps if steps and drafted else None,
        "requests": len(reqs),
        "errors": sum(r.error is not None for r in records),
    }


def results_table(records: Sequence[TaskRecord], subsets: Sequence[tuple[str, str | None]]) -> str:
    """Table 4's layout: per subset (``(label, subset)``; None: every record) and row, the accuracy, compression
    ratio, acceptance rate (AR) and mean accepted length (MAL)."""
    f = lambda v, fmt: "—" if v is None else fmt.format(v)  # noqa: E731
    lines = ["| Setting | Method | n | Acc | ratio | AR | MAL |", "|---|---|---|---|---|---|---|"]
    rows = list(dict.fromkeys(r.row for r in records))
    for label, subset in subsets:
        for row in rows:
            mine = [r for r in records if r.row == row and (subset is None or r.subset == subset)]
            if not mine:
                continue
            s = row_summary(mine)
            lines.append(
                f"| {label} | {LABELS[row]} | {s['n']} | {s['accuracy']:.1f} | {f(s['compression_ratio'], '{:.2f}x')} "
                f"| {f(s['acceptance_rate'], '{:.2f}')} | {f(s['mean_accepted_length'], '{:.2f}')} |"
            )
    return "\n".join(lines)


def write_summary(folder: str | Path, records: Sequence[TaskRecord], **extra: Any) -> dict[str, Any]:
    """``summary.json``: :func:`row_summary` per row of ``records`` and ``extra``; returns what it wrote."""
    rows = list(dict.fromkeys(r.row for r in records))
    summary = {"rows": {row: row_summary([r for r in records if r.row == row]) for row in rows}, **extra}
    (Path(folder) / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary
