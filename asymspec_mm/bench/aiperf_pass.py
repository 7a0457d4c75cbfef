"""The pieces of ``scripts/aiperf_bench.sh`` (NVIDIA's AIPerf, ``aiperf profile``, against ``asymspec-mm serve``)
that run in this project's venv: the dataset and the table.

AIPerf reads each answer's ``metrics.speculative_decoding`` (vLLM's per-request object, which this server sends,
:mod:`~asymspec_mm.serve.request_metrics`) into its Spec Decode table; the table here sets AIPerf's figures beside
the growth of the server's ``vllm:spec_decode_*`` counters across the same run, which count the same steps.

``python -m asymspec_mm.bench.aiperf_pass dataset --out FILE --prompts N`` writes N held-out MiniVista problems as
AIPerf's ``single_turn`` JSONL (``{"text": query, "image": PNG data URL, "output_length": max tokens}``).
``... table --out DIR`` reads, for each method M run by the script, ``M/profile_export_aiperf.json`` (AIPerf's
aggregate export) and ``M.before.prom`` / ``M.after.prom`` (``GET /metrics`` around the run), and writes
``summary.json`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..frontend.help import terminal_text
from .serving import acceptance_length, counter_delta, dataset_records, spec_counters


def write_dataset(path: str | Path, n: int, seed: int, max_tokens: int) -> int:
    """Write ``n`` MiniVista problems (``seed``) as AIPerf ``single_turn`` records to ``path``; returns ``n``."""
    if n < 1:
        raise ValueError(f"--prompts {n}: the dataset needs at least one prompt")
    records = dataset_records(n, seed)
    lines = [json.dumps({"text": r["prompt"], "image": r["image_files"][0], "output_length": max_tokens}) for r in records]
    Path(path).write_text("\n".join(lines) + "\n")
    return n


def _avg(export: dict[str, Any], name: str) -> float | None:
    value = export.get(name)
    return value.get("avg") if isinstance(value, dict) else None


def method_row(method: str, export: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """One method's row: AIPerf's acceptance figures (its per-request distribution and its totals over the run)
    and the counters' growth over the same run; ``agree`` is whether AIPerf's totals equal the counters'."""
    totals = {
        "steps": _avg(export, "total_spec_decode_steps"),
        "draft_tokens": _avg(export, "total_draft_tokens"),
        "accepted": _avg(export, "total_accepted_draft_tokens"),
    }
    counters = {"steps": delta["num_drafts"], "draft_tokens": delta["num_draft_tokens"], "accepted": delta["num_accepted_tokens"]}
    length = export.get("spec_decode_acceptance_length") or {}
    pooled = {int(j): n for j, n in (export.get("pooled_spec_decode_acceptance_histogram") or {}).items()}
    return {
        "method": method,
        "requests": _avg(export, "completed_request_count"),
        "errors": len(export.get("error_summary") or []),
        "acceptance_length": {stat: length.get(stat) for stat in ("avg", "p50", "min", "max")},
        "token_weighted_acceptance_length": _avg(export, "spec_decode_token_weighted_acceptance_length"),
        "draft_acceptance_rate_pct": _avg(export, "spec_decode_draft_acceptance_rate"),
        "overall_draft_acceptance_rate_pct": _avg(export, "spec_decode_overall_draft_acceptance_rate"),
        "pooled_histogram": pooled,
        "aiperf_totals": totals,
        "counters": counters,
        "counters_acceptance_length": acceptance_length(delta),
        "agree": all(totals[k] is not None and int(totals[k]) == counters[k] for k in counters),
        "output_tokens_per_s": _avg(export, "output_token_throughput"),
        "aiperf_version": export.get("aiperf_version"),
    }


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _shares(pooled: dict[int, int]) -> str:
    steps = sum(pooled.values())
    return " ".join(f"{j}: {100 * n / steps:.0f}%" for j, n in sorted(pooled.items())) if steps else "–"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`method_row` rows."""
    head = [
        "method",
        "requests",
        "AIPerf acceptance length (avg / p50 / min / max)",
        "AIPerf token-weighted length",
        "AIPerf draft acceptance % (avg / overall)",
        "AIPerf steps / drafts / accepted",
        "counters: steps / drafts / accepted (1 + acc/steps)",
        "accepted drafts per step (% of steps)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        al, t, c = r["acceptance_length"], r["aiperf_totals"], r["counters"]
        cells = [
            r["method"],
            f"{_num(r['requests'], '{:.0f}')} ({r['errors']} errors)",
            " / ".join(_num(al[s]) for s in ("avg", "p50", "min", "max")),
            _num(r["token_weighted_acceptance_length"]),
            f"{_num(r['draft_acceptance_rate_pct'], '{:.1f}')} / {_num(r['overall_draft_acceptance_rate_pct'], '{:.1f}')}",
            " / ".join(_num(t[k], "{:.0f}") for k in ("steps", "draft_tokens", "accepted")),
            " / ".join(str(c[k]) for k in ("steps", "draft_tokens", "accepted")) + f" ({_num(r['counters_acceptance_length'])})",
            _shares(r["pooled_histogram"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collect(out: str | Path, methods: list[str]) -> list[dict[str, Any]]:
    """The rows of the methods the script ran in ``out`` (a method without AIPerf's export is a one-line error)."""
    out, rows = Path(out), []
    for m in methods:
        export_path = out / m / "profile_export_aiperf.json"
        if not export_path.exists():
            raise FileNotFoundError(f"no AIPerf export for {m} at {export_path}: did `aiperf profile` run?")
        before, after = (spec_counters((out / f"{m}.{when}.prom").read_text()) for when in ("before", "after"))
        rows.append(method_row(m, json.loads(export_path.read_text()), counter_delta(before, after)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.aiperf_pass", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dataset", help="write the MiniVista problems as AIPerf's single_turn JSONL")
    d.add_argument("--out", required=True)
    d.add_argument("--prompts", type=int, required=True)
    d.add_argument("--max-tokens", type=int, default=64)
    d.add_argument("--seed", type=int, default=1, help="MiniVista seed [default: 1, the tiny pair's held-out set]")
    t = sub.add_parser("table", help="collect the methods' AIPerf exports and counters in --out")
    t.add_argument("--out", required=True)
    t.add_argument("--methods", required=True, help="the methods run, comma-separated")
    t.add_argument("--command", default="", help="the command line, for the record")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "dataset":
            write_dataset(args.out, args.prompts, args.seed, args.max_tokens)
            return 0
        rows = collect(args.out, args.methods.split(","))
    except (ValueError, OSError) as exc:
        print(f"aiperf_bench: {exc}", file=sys.stderr)
        return 1
    table = format_table(rows)
    Path(args.out, "summary.json").write_text(json.dumps({"command": args.command, "rows": rows}, indent=1) + "\n")
    Path(args.out, "table.md").write_text(table + "\n")
    print(terminal_text(table))
    disagree = [r["method"] for r in rows if not r["agree"]]
    if disagree:
        print(f"aiperf_bench: AIPerf's totals differ from the server's counters for {', '.join(disagree)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
