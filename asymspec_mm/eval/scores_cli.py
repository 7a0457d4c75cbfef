"""``asymspec-mm eval score`` (MathVista's official scoring of an output file), ``eval merge`` (shard records into
one run) and ``eval report`` (a run's outputs and report rewritten from its records)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError


def add_scores_parsers(sub: Any) -> None:
    """Register ``eval score``, ``eval merge`` and ``eval report`` on ``eval``'s subparsers."""
    s = sub.add_parser("score", help="official MathVista scoring of an output JSON")
    s.add_argument(
        "--input",
        required=True,
        help="output JSON keyed by pid (official format, e.g. the output_asymspec.json an eval mathvista run writes), "
        "a list, or a records JSONL",
    )
    s.add_argument("--out", default=None, help="scores JSON [default: scores_<name>.json next to the input]")
    s.add_argument(
        "--gt",
        default=None,
        help="problems JSON for missing answers/fields [default: testmini.json of $ASYMSPEC_MATHVISTA_DIR, else the "
        "copy shipped with the package]",
    )
    s.add_argument("--write-output", default=None, help="also save the output with prediction/true_false added")
    s.add_argument("--variant", default=None, help="with a records JSONL of several variants: the one to score")
    s.add_argument("--quiet", action="store_true")

    mg = sub.add_parser("merge", help="merge shard records and write outputs, scores and report")
    mg.add_argument("inputs", nargs="+", help="records*.jsonl files or run folders")
    mg.add_argument("--out", required=True, help="folder for the merged records.jsonl and outputs")
    mg.add_argument("--no-chart", action="store_true")

    rp = sub.add_parser("report", help="rewrite outputs, scores and report from a run folder's records")
    rp.add_argument("run_dir", help="a folder holding records*.jsonl")
    rp.add_argument("--no-chart", action="store_true")


def check_input_file(option: str, path: Path, what: str) -> None:
    """One line naming ``option``, the path and what to give instead, when ``path`` is no file."""
    if not path.is_file():
        problem = "is a folder" if path.is_dir() else "does not exist"
        raise AsymSpecError(f"{option} {path} {problem}: give {what}")


def _default_scores_path(inp: Path) -> Path:
    stem = inp.stem[len("output_") :] if inp.stem.startswith("output_") else inp.stem
    return inp.with_name(f"scores_{stem}.json")


def cmd_score(args: argparse.Namespace) -> int:
    from . import mathvista as mv
    from .scoring import format_scores, load_output, score_results, write_json

    inp = Path(args.input)
    gt_path = Path(args.gt) if args.gt else None
    check_input_file("--input", inp, "an output JSON an eval mathvista run wrote (e.g. runs/mathvista/output_asymspec.json)")
    if gt_path is not None:
        check_input_file("--gt", gt_path, "a problems JSON keyed by pid (MathVista's testmini.json)")
    elif (mv.default_text_dir() / "testmini.json").is_file():
        gt_path = mv.default_text_dir() / "testmini.json"
    try:  # a broken file is one line naming it, the line and the column
        results = load_output(inp, variant=args.variant)
        gt = load_output(gt_path) if gt_path is not None else None
    except ValueError as exc:
        raise AsymSpecError(str(exc)) from None
    # records JSONL rows keep the problem under "problem"
    for pid, entry in list(results.items()):
        if "problem" in entry and isinstance(entry["problem"], dict):
            merged = dict(entry["problem"])
            merged.update({k: v for k, v in entry.items() if k in ("response", "extraction")})
            results[pid] = merged
    scores = score_results(results, ground_truth=gt)
    out = Path(args.out) if args.out else _default_scores_path(inp)
    write_json(scores, out)
    if args.write_output:
        write_json(results, args.write_output)
    if not args.quiet:
        print(format_scores(scores, keys=["question_type", "answer_type", "task"]))
    print(f"scores -> {out}")
    return 0


def _finalize_from(records_files: list[Path], out_dir: Path, chart: bool) -> int:
    from . import mathvista as mv
    from .mathvista.identity import merged_identity, write_run_file

    # records of different runs are refused before anything is written
    identity = merged_identity(list(mv._iter_record_files(records_files)))
    records, dups, conflicts = mv.merge_records(records_files, out_dir / "records.jsonl")
    if dups:
        print(f"merge: {dups} duplicate (variant, pid) records dropped ({conflicts} with differing responses)")
    if not records:
        named = ", ".join(str(p) for p in records_files)
        raise AsymSpecError(f"no records found in {named}: give records*.jsonl files or the --out folders of eval mathvista runs")
    if identity is not None:
        write_run_file(out_dir / "records.jsonl", identity)
    mv.finalize_run(records, out_dir, chart=chart, identity=identity)
    print((out_dir / "report.md").read_text(encoding="utf-8"))
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    return _finalize_from([Path(p) for p in args.inputs], Path(args.out), not args.no_chart)


def cmd_report(args: argparse.Namespace) -> int:
    run = Path(args.run_dir)
    return _finalize_from([run], run, not args.no_chart)
