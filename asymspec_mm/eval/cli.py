"""``asymspec-mm eval ...`` subcommands.

* ``eval mathvista``: run method variants over MathVista testmini (or MiniVista), appending
  records as they finish, then write official output/scores JSON per variant and a report (:mod:`.mathvista_cli`).
* ``eval gaia``: the paper's GAIA harness (:mod:`.gaia_cli`), Table 4's rows.
* ``eval simpleqa``: SimpleQA through the same agent harness (:mod:`.simpleqa_cli`), Table 4's rows.
* ``eval score --input OUTPUT.json [--out SCORES.json]``: MathVista's official scoring of an
  output file (uses ``extraction``; extracts from ``response`` by rules when it is missing).
* ``eval merge INPUT... --out DIR``: merge shard record files and write the outputs.
* ``eval report RUN_DIR``: rewrite outputs and report from a run's ``records.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..base.errors import AsymSpecError
from ..frontend.help import documented_parser
from .gaia_cli import add_gaia_parser, cmd_gaia
from .mathvista_cli import add_mathvista_parser, cmd_mathvista
from .scores_cli import add_scores_parsers, cmd_merge, cmd_report, cmd_score
from .simpleqa_cli import add_simpleqa_parser, cmd_simpleqa

COMMANDS = ("mathvista", "gaia", "simpleqa", "score", "merge", "report")


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``eval`` (with :data:`COMMANDS`) on a subparsers object."""
    p = documented_parser(subparsers, "eval", "benchmarks: run MathVista, GAIA, SimpleQA, score outputs, merge shards", __doc__)
    sub = p.add_subparsers(dest="eval_command", metavar="{" + ",".join(COMMANDS) + "}")
    sub.required = True
    add_mathvista_parser(sub)
    add_gaia_parser(sub)
    add_simpleqa_parser(sub)
    add_scores_parsers(sub)
    p.set_defaults(func=run_eval)
    return p


def run_eval(args: argparse.Namespace) -> int:
    """Dispatch an ``eval`` subcommand; user errors print one line and return 2, Ctrl-C returns 130."""
    handlers = {
        "mathvista": cmd_mathvista,
        "gaia": cmd_gaia,
        "simpleqa": cmd_simpleqa,
        "score": cmd_score,
        "merge": cmd_merge,
        "report": cmd_report,
    }
    try:
        return handlers[args.eval_command](args)
    except (AsymSpecError, FileExistsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m asymspec_mm.eval.cli eval ...``)."""
    parser = argparse.ArgumentParser(prog="asymspec-mm")
    add_eval_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
