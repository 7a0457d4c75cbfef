"""The tiny pair on MiniVista's agent tasks: the ``## Agent tasks`` section of ``RESULTS.md``.

    python -m asymspec_mm.tiny.agent_results --n 40 --seed 1 [--smolagents FILE]

Each held-out task runs as an agent loop (:func:`~asymspec_mm.eval.agent_loop.run_agent_task`, the path of ``eval
mathvista --dataset minivista --families agent``) with every method, tools offered with ``tool_choice="auto"`` (no
grammar: the calls are the models' own) and, for AsymSpec, also ``"required"``. ``--smolagents FILE``: the JSON
lines of ``python -m asymspec_mm.eval.agent_smolagents`` (a ToolCallingAgent against ``serve --preset tiny``), added
as its own table. The section replaces the one in ``--out`` (the rest of the file is ``results.py``'s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..eval.agent_eval import agent_record, agent_table, summarize_agent
from ..eval.agent_loop import run_agent_task
from ..eval.minivista_agent import make_agent_problem
from ..frontend.help import terminal_text
from ..frontend.variants import Variant
from .results import RESULTS_MD, load_pipeline

HEADING = "## Agent tasks"
#: (variant name, method, first request's tool_choice)
RUNS = (
    ("Floor (verifier alone)", "floor", "auto"),
    ("Drafter alone (full view)", "drafter", "auto"),
    ("SD (K=4)", "sd", "auto"),
    ("AsymSpec", "asymspec", "auto"),
    ("AsymSpec, tool_choice=required", "asymspec", "required"),
)
MAX_NEW_TOKENS = 64


def run_all(pipe: Any, n: int, seed: int) -> dict[str, dict[str, Any]]:
    """Every task with every run of :data:`RUNS`: :func:`~asymspec_mm.eval.agent_eval.summarize_agent`'s summary per
    run."""
    records = []
    for i in range(n):
        problem = make_agent_problem(seed, i)
        for name, method, choice in RUNS:
            variant = Variant(name, method, {"max_new_tokens": MAX_NEW_TOKENS})
            run = run_agent_task(pipe, problem, method, tool_choice=choice, max_new_tokens=MAX_NEW_TOKENS)
            records.append(agent_record(variant, problem, run, 0.0))
    return summarize_agent(records)


def smolagents_rows(path: Path) -> tuple[int, int, int]:
    """(tasks, solved, first call correct) of an ``agent_smolagents`` run's JSON lines."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return len(rows), sum(r["correct"] for r in rows), sum(r["arguments_correct"] for r in rows)


def section(summary: dict[str, dict[str, Any]], n: int, seed: int, smolagents: tuple[int, int, int] | None) -> str:
    """The Markdown section."""
    lines = [
        HEADING,
        "",
        f"`python -m asymspec_mm.tiny.agent_results --n {n} --seed {seed}` (held-out seed {seed}, {n} tasks of the `agent` "
        "family: a bar chart and \"What is the X bar's value plus/minus the Y bar's?\" with the tools `add(a, b)` and "
        "`subtract(a, b)`; a quarter add a follow-up question). Each task is an agent loop: the request with the tools, the "
        "call executed, its result sent back as a tool message, the final answer read (at most 3 requests), then the "
        "follow-up question when the task has one; caption and "
        "OCR text are the generator's, so the compressed view names the colours and the axis ticks, never a bar's value. "
        "valid = the first call parses and validates against its tool's JSON schema; arguments = it is the gold call; "
        "cached = the verifier's prompt tokens reused from earlier requests, mean per request.",
        "",
    ]
    lines += agent_table(summary, "method")
    if smolagents is not None:
        tasks, solved, first = smolagents
        lines += [
            "",
            "smolagents' `ToolCallingAgent` (its `tool_choice=\"required\"` on every step) with the family's tools against "
            "`asymspec-mm serve --preset tiny` (AsymSpec; the drafter captions each image, RapidOCR reads it): "
            "`python -m asymspec_mm.eval.agent_smolagents --n 20 --seed 1`",
            "",
            "| agent | tasks | solved (final_answer correct) | first call correct |",
            "| --- | ---: | ---: | ---: |",
            f"| smolagents ToolCallingAgent | {tasks} | {solved} ({100 * solved / tasks:.0f}%) | {first} ({100 * first / tasks:.0f}%) |",
        ]
    return "\n".join(lines) + "\n"


def replace_section(text: str, new: str) -> str:
    """``text`` (a RESULTS.md) with its :data:`HEADING` section (to the end of the file) replaced by ``new``."""
    head = text.split("\n" + HEADING + "\n", 1)[0].rstrip("\n")
    return head + "\n\n" + new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pair", default=None, help="a directory with drafter/ and verifier/ (default: the shipped tiny preset)")
    ap.add_argument("--smolagents", default=None, help="JSON lines of `python -m asymspec_mm.eval.agent_smolagents`")
    ap.add_argument("--out", default=str(RESULTS_MD), help="the RESULTS.md whose agent section to replace ('-': stdout only)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    pair = Path(args.pair) if args.pair else None
    pipe = load_pipeline(str(pair / "drafter") if pair else None, str(pair / "verifier") if pair else None)
    summary = run_all(pipe, args.n, args.seed)
    md = section(summary, args.n, args.seed, smolagents_rows(Path(args.smolagents)) if args.smolagents else None)
    print(md)
    if args.out != "-":
        out = Path(args.out)
        out.write_text(replace_section(out.read_text() if out.is_file() else "", md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
