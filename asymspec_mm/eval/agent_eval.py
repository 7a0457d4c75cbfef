"""MiniVista's ``agent`` family as an evaluation: every (task, method variant) pair run as an agent loop
(:func:`.agent_loop.run_agent_task`), one durable record each, resumable, reported per method.

``asymspec-mm eval mathvista --dataset minivista --families agent`` runs it; the report gives, per variant, the final
answer's accuracy, the share of first calls that parse and validate against their tool's schema, the share whose
arguments are the image's values, the turns, and the verifier's reused prompt tokens at each turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base.config import AsymSpecConfig
from ..base.errors import UnknownOptionError
from ..frontend.variants import Variant
from .agent_loop import run_agent_task
from .family_command import Tasks, run_family_command, write_report
from .mathvista.identity import bind_identity
from .mathvista.outputs import group_by_variant
from .mathvista.records import RecordStore, log_failure
from .samples import request_config

AGENT_FAMILY = "agent"
DEFAULT_MAX_TURNS = 3


def add_agent_arguments(group: Any) -> None:
    """``eval mathvista``'s ``--families``, ``--max-turns`` and ``--tool-choice`` (on an argparse group)."""
    group.add_argument(
        "--families",
        default=None,
        help="MiniVista families: a comma list of figure, visual, geometry, mixed, or 'agent' alone (each task an agent "
        "loop with tools: asymspec_mm.eval.agent_eval), or 'agent-log' alone (a question about a long tool output the "
        "verifier's compressed view drops: asymspec_mm.eval.log_eval) [default: the four in rotation]",
    )
    group.add_argument("--max-turns", type=int, default=3, help="agent family: requests per task at most [default: %(default)s]")
    group.add_argument(
        "--compression",
        action="append",
        default=None,
        help="agent-log family: the verifier's view, one of truncate, llmlingua2, question-only (the family's settings; "
        "llmlingua2 on the shipped tiny classifier) or a 'method,key=value,...' spec; repeat for several [default: the three]",
    )
    group.add_argument(
        "--tool-choice",
        choices=["auto", "required"],
        default="auto",
        help="agent family: the first request's tool_choice (required: a grammar keeps the answer a call) [default: %(default)s]",
    )


def minivista_families(spec: str | None, dataset: str, *, shard: str | None = None, dump_prompts: str | None = None) -> list[str] | None:
    """``--families`` as a list (None: not given), checked: MiniVista's four families, or ``agent`` alone (which
    takes neither ``--shard`` nor ``--dump-prompts``)."""
    from ..base.errors import AsymSpecError
    from .minivista import FAMILIES

    if not spec:
        return None
    fams = [f.strip() for f in spec.split(",") if f.strip()]
    if dataset != "minivista":
        raise AsymSpecError(f"--families {spec} needs --dataset minivista (MathVista's own subsets are --tasks)")
    for alone in ("agent", "agent-log"):
        if alone in fams and fams != [alone]:
            raise AsymSpecError(f"--families {spec}: run the {alone} family on its own (--families {alone})")
        if fams == [alone] and (shard or dump_prompts):
            flag = "--shard" if shard else "--dump-prompts"
            raise AsymSpecError(f"{flag} does not apply to --families {alone} (each task is a conversation): leave it out")
    bad = [f for f in fams if f not in (*FAMILIES, "agent", "agent-log")]
    if bad or not fams:
        raise AsymSpecError(f"--families {spec}: choose among {', '.join(FAMILIES)}, or agent alone, or agent-log alone")
    return fams


def agent_record(variant: Variant, problem: Mapping[str, Any], run: Any, wall_s: float) -> dict[str, Any]:
    """One finished pair as a records-file line: the run's outcome, the gold call and answer, the conversation's text
    (images left out: they are the task's)."""
    out = dataclasses.asdict(run)
    out["messages"] = [
        {**m, "content": [p for p in m["content"] if p.get("type") == "text"]} if isinstance(m.get("content"), list) else m
        for m in out["messages"]
    ]
    return {
        "variant": variant.name,
        "pid": str(problem["pid"]),
        "family": AGENT_FAMILY,
        "method": variant.method,
        "config": dict(variant.config),
        "question": problem["question"],
        "gold_call": problem["gold_call"],
        "has_followup": problem["followup"] is not None,
        "answer": problem["answer"],
        "true_false": run.correct,
        "wall_s": round(wall_s, 4),
        **{k: v for k, v in out.items() if k not in ("pid", "method")},
    }


def run_agent_eval(
    pipe: Any,
    problems: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    records_path: str | Path,
    *,
    identity: Mapping[str, Any],
    resume: bool = False,
    overwrite: bool = False,
    max_turns: int = DEFAULT_MAX_TURNS,
    tool_choice: Any = "auto",
    on_error: str = "skip",
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every (problem, variant) pair not yet in ``records_path`` and append its record as it finishes; returns
    every record of the run's pairs (those resumed included). ``on_error="skip"``: a task that fails is logged to
    ``errors.jsonl`` beside the records and the run goes on (a resumed run retries it); ``"raise"``: it stops."""
    if on_error not in ("skip", "raise"):
        raise UnknownOptionError(f"on_error={on_error!r}: expected 'skip' or 'raise'")
    store = RecordStore(records_path, resume=resume, overwrite=overwrite)
    bind_identity(records_path, identity, resuming=resume and len(store) > 0, log=log)
    wanted = {(v.name, str(p["pid"])) for v in variants for p in problems}
    todo = [(p, v) for p in problems for v in variants if (v.name, str(p["pid"])) not in store]
    log(f"{len(todo)} to run, {len(wanted) - len(todo)} already done")
    with store:
        for k, (problem, variant) in enumerate(todo, 1):
            cfg = request_config(AsymSpecConfig, variant, str(problem["pid"]))
            t0 = time.perf_counter()
            try:
                run = run_agent_task(pipe, problem, variant.method, tool_choice=tool_choice, max_turns=max_turns, config=cfg)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:  # noqa: BLE001 - a failed task must not lose the run
                if on_error == "raise":
                    raise
                log_failure(Path(records_path), str(problem["pid"]), variant.name, exc, log)
                continue
            store.append(agent_record(variant, problem, run, time.perf_counter() - t0))
            if k % 10 == 0 or k == len(todo):
                log(f"[{k}/{len(todo)}] agent tasks run")
    return [r for key, r in store.records.items() if key in wanted]


def summarize_agent(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: ``n``, ``accuracy``, ``call_valid``, ``arguments_correct`` (shares, in %), ``called`` (tasks whose
    first answer was a call, %), ``followups`` (tasks with a follow-up question) and ``followup_correct`` (% of them,
    None without any), ``turns`` (mean requests) and ``cached_tokens`` (mean reused verifier tokens at
    turn 1, 2, ...; over the tasks that reached that turn)."""
    out = {}
    for name, recs in group_by_variant(records).items():
        n = len(recs)

        def share(key: str, rows: list = recs) -> float:
            return round(100.0 * sum(bool(r[key]) for r in rows) / len(rows), 1)

        longest = max(len(r["cached_tokens"]) for r in recs)
        cached = []
        for t in range(longest):
            seen = [r["cached_tokens"][t] for r in recs if len(r["cached_tokens"]) > t]
            cached.append(round(sum(seen) / len(seen), 1))
        with_followup = [r for r in recs if r.get("has_followup")]
        out[name] = {
            "method": recs[0]["method"],
            "n": n,
            "accuracy": share("true_false"),
            "followups": len(with_followup),
            "followup_correct": share("followup_correct", with_followup) if with_followup else None,
            "called": share("calls"),
            "call_valid": share("call_valid"),
            "arguments_correct": share("arguments_correct"),
            "turns": round(sum(r["turns"] for r in recs) / n, 2),
            "cached_tokens": cached,
        }
    return out


def followup_cell(summary: Mapping[str, Any]) -> str:
    """``"90.0 (of 10)"``: the follow-up accuracy and how many tasks had one ("–" for none)."""
    if not summary["followups"]:
        return "–"
    return f"{summary['followup_correct']:.1f} (of {summary['followups']})"


def agent_table(summary: Mapping[str, Mapping[str, Any]], first: str = "variant") -> list[str]:
    """The Markdown table of :func:`summarize_agent`'s summary, one row per variant (its name in column ``first``)."""
    lines = [
        f"| {first} | tasks | final answer correct (%) | called a tool (%) | valid call (%) | arguments correct (%) "
        "| follow-up correct (%) | requests | cached tokens per request |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, s in summary.items():
        cached = " / ".join(f"{c:.0f}" for c in s["cached_tokens"])
        lines.append(
            f"| {name} | {s['n']} | {s['accuracy']:.1f} | {s['called']:.1f} | {s['call_valid']:.1f} | {s['arguments_correct']:.1f} "
            f"| {followup_cell(s)} | {s['turns']:.2f} | {cached} |"
        )
    return lines


def agent_report(summary: Mapping[str, Mapping[str, Any]], title: str = "MiniVista agent tasks") -> str:
    """The report's Markdown: one row per variant."""
    lines = [
        f"# {title}",
        "",
        "Each task is an agent loop: the request with the tools, the call executed, its result sent back, the final answer "
        "read (at most the turn cap of requests). valid call = the first call parses and validates against its tool's "
        "schema; arguments = it is the gold call (the image's values); cached = the verifier's prompt tokens reused from "
        "earlier requests (the tools block, the conversation's earlier turns), mean per request.",
        "",
    ]
    lines += agent_table(summary)
    return "\n".join(lines) + "\n"


def finalize_agent_run(records: Sequence[Mapping[str, Any]], out_dir: str | Path, identity: Mapping[str, Any] | None = None) -> dict:
    """Write ``summary.json`` and ``report.md`` under ``out_dir``; returns the summary."""
    summary = summarize_agent(records)
    write_report(out_dir, agent_report(summary), identity, "variants", summary)
    return summary


def agent_command(args: Any, problems: Tasks, selected: Tasks, variants: Sequence[Variant], identity_and_pipeline: Callable) -> int:
    """``eval mathvista --dataset minivista --families agent``: the ``selected`` tasks of ``problems`` (``--limit``,
    ``--shard``) with each variant, at most ``--max-turns`` requests each, then ``report.md`` / ``summary.json`` in
    ``--out``; 0 when done."""
    from ..base.errors import AsymSpecError

    if args.max_turns < 1:
        raise AsymSpecError(f"--max-turns {args.max_turns}: give 1 or more requests per task")

    def run(pipe: Any, records_path: Path, **options: Any) -> list[dict]:
        return run_agent_eval(pipe, selected, variants, records_path, max_turns=args.max_turns, tool_choice=args.tool_choice, **options)

    plan = f"{len(selected)} agent tasks (minivista seed {args.seed}) x {len(variants)} variants: {', '.join(v.name for v in variants)}"
    return run_family_command(
        args, problems, variants, identity_and_pipeline, family=AGENT_FAMILY, plan=plan, run=run, report=finalize_agent_run
    )
