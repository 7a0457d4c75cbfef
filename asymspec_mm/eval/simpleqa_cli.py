"""``asymspec-mm eval simpleqa``: SimpleQA through the paper's agent harness (:mod:`.simpleqa`: the smolagents
ReAct loop with the cached web tools, per-turn compression), over OpenAI's ``simple_qa_test_set.csv`` or the bundled
SimpleQA-shaped questions (``--bundled``: a protocol check, not a score), against a running server (``--url``) or an
``asymspec-mm serve`` it starts with the model options. Graded by normalized match, a stand-in for the official LLM
grader (see the module). Writes ``records.jsonl``, ``run.json``, ``summary.json`` and ``table4.md`` (the paper's
Table 4 layout) into ``--out``; ``--resume`` continues a run cut short.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from .gaia_cli import add_harness_parser, harness_settings, parse_rows, served

DEFAULT_OUT = "runs/simpleqa"


def add_simpleqa_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``eval simpleqa`` on ``eval``'s subparsers."""
    from .simpleqa import MAX_STEPS

    g, d, _ = add_harness_parser(
        sub,
        "simpleqa",
        "SimpleQA through the paper's agent harness (ReAct loop, per-turn compression): Table 4",
        __doc__,
        max_steps=MAX_STEPS,
        out=DEFAULT_OUT,
    )
    d.add_argument(
        "--simpleqa-csv",
        default=None,
        help="OpenAI's simple_qa_test_set.csv [default: the local Hugging Face cache of basicv8vc/SimpleQA; never downloaded]",
    )
    d.add_argument("--sample", type=int, default=None, help="a random N of the questions (the paper's 500) [default: all]")
    d.add_argument("--seed", type=int, default=0, help="the --sample draw's seed [default: %(default)s]")
    return g


def cmd_simpleqa(args: argparse.Namespace) -> int:
    """Run ``eval simpleqa``; a bad option or a missing dataset is one line (``run_eval`` prints it)."""
    from .gaia import run_identity
    from .gaia_data import ToolCache
    from .gaia_runs import open_run, run_rows, write_summary
    from .simpleqa import GRADER_NOTE, describe, find_csv, grade_counts, load_simpleqa, run_task, sample_tasks, table, write_bundled_tasks

    if args.bundled and args.simpleqa_csv:
        raise AsymSpecError("give --simpleqa-csv FILE or --bundled, not both")
    rows = parse_rows(args.rows)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = find_csv(write_bundled_tasks(tmp) if args.bundled else args.simpleqa_csv)
        tasks = sample_tasks(load_simpleqa(csv_path), args.sample, args.seed)[: args.limit]
        if not tasks:
            raise AsymSpecError("no SimpleQA question selected: check --sample / --limit")
        settings = harness_settings(args)
        cache_file = Path(args.tool_cache) if args.tool_cache else csv_path.parent / "tool_cache.json"
        if args.tool_cache and not cache_file.is_file():
            raise AsymSpecError(f"--tool-cache {cache_file} does not exist: give the cached web_search / visit_webpage returns")
        if not cache_file.is_file():
            print(f"note: no tool cache at {cache_file}: every web_search and visit_webpage call is a miss (the harness never fetches)")
        cache = ToolCache.load(cache_file)
        note = "Bundled SimpleQA-shaped questions: a protocol check, not a SimpleQA score.\n\n" if args.bundled else ""
        note += GRADER_NOTE + "\n\n"
        print(f"{len(tasks)} questions x {len(rows)} rows: {', '.join(rows)}")
        with served(args, settings) as (url, settings):
            done = open_run(out, run_identity("simpleqa", [csv_path, cache_file], settings), args.resume)

            def write_table(records: Any) -> None:
                (out / "table4.md").write_text(note + table(records) + "\n", encoding="utf-8")

            records = run_rows(tasks, rows, lambda row, task: run_task(url, row, task, cache, settings), out, done, write_table)
    write_summary(out, records, bundled=args.bundled, grader="normalized-match", grades=grade_counts(records), selection=describe(tasks))
    print(table(records))
    return 0
