"""The shape every MiniVista agent family's command shares (``--families agent``, ``agent-log``): the plan line, a
dry run's stop, the run's identity and pipeline, the records, then ``report.md`` and ``summary.json`` in ``--out``
and the report printed. Each family gives its own plan line, run and report."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..frontend.variants import Variant

#: The MiniVista tasks a command is given (all of them, and those ``--limit`` / ``--shard`` select).
Tasks = Sequence[Mapping[str, Any]]
#: ``(pipe, records_path, *, identity, resume, overwrite, on_error) -> records``: a family's run of the selected tasks.
FamilyRun = Callable[..., list]
#: ``(records, out_dir, identity) -> None``: a family's report and summary written under ``out_dir``.
FamilyReport = Callable[[Sequence[Mapping[str, Any]], Path, Mapping[str, Any]], Any]


def run_family_command(
    args: Any,
    problems: Tasks,
    variants: Sequence[Variant],
    identity_and_pipeline: Callable,
    *,
    family: str,
    plan: str,
    run: FamilyRun,
    report: FamilyReport,
) -> int:
    """Print ``plan``; unless ``--dry-run``, load the run's identity and pipeline for ``family`` (records in
    ``--out``/records.jsonl), ``run`` it (with :func:`record_options`), write its ``report`` and print
    ``report.md``. 0 when done."""
    out_dir = Path(args.out)
    records_path = out_dir / "records.jsonl"
    print(plan)
    if args.dry_run:
        return 0
    identity, pipe = identity_and_pipeline(args, records_path, problems=problems, variants=variants, text=None, tasks=[family])
    records = run(pipe, records_path, identity=identity, **record_options(args))
    report(records, out_dir, identity)
    print((out_dir / "report.md").read_text(encoding="utf-8"))
    return 0


def write_report(out_dir: str | Path, report_md: str, identity: Mapping[str, Any] | None, key: str, summary: Any) -> None:
    """``report.md`` (``report_md``) and ``summary.json`` (``{"run": identity, key: summary}``) under ``out_dir``."""
    out_dir = Path(out_dir)
    (out_dir / "report.md").write_text(report_md, encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps({"run": identity, key: summary}, indent=1), encoding="utf-8")


def record_options(args: Any) -> dict[str, Any]:
    """What a family's run takes from the command line about its records: ``resume``, ``overwrite``, ``on_error``."""
    return {"resume": args.resume, "overwrite": args.overwrite, "on_error": args.on_error}
