"""The compact summary ``scripts/gpu_paper_slice.sh`` prints: per variant of an ``eval mathvista`` run, how many
problems finished, accuracy per task and overall, acceptance, mean accepted length and decoding speed.

It reads the run's ``records.jsonl`` directly (one JSON object per finished (variant, problem) pair), so a run cut
short by its time budget is summarised as far as it got, with each variant's count of finished problems.

``python -m asymspec_mm.bench.paper_slice RUN_DIR`` prints the table and writes ``RUN_DIR/slice_summary.md``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base.checks import is_number

TASK_ORDER = ("GPS", "VQA", "FQA")
TASK_NAMES = {
    "geometry problem solving": "GPS",
    "visual question answering": "VQA",
    "figure question answering": "FQA",
    "math word problem": "MWP",
    "textbook question answering": "TQA",
}


def task_code(record: Mapping[str, Any]) -> str:
    """A record's task as MathVista's short code (``GPS``, ``VQA``, ...); ``?`` when the record has none."""
    task = record.get("task") or (record.get("problem") or {}).get("task") or "?"
    return TASK_NAMES.get(str(task).lower(), str(task))


def _number(x: Any) -> float | None:
    return float(x) if is_number(x) else None


def summarize_slice(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant (in the records' first-seen order): ``n``, ``correct``, ``tasks`` {code: [correct, total]},
    ``acceptance`` (accepted / drafted, None when nothing was drafted), ``mal`` (new tokens / steps, only where
    something was drafted), ``tokens_per_s`` (new tokens over generation seconds, of the records that have both)
    and ``new_tokens``."""
    acc: dict[str, dict[str, Any]] = {}
    for r in records:
        v = acc.setdefault(
            str(r.get("variant")),
            {"n": 0, "correct": 0, "tasks": {}, "drafted": 0.0, "accepted": 0.0, "steps": 0.0, "new": 0.0, "tok": 0.0, "wall": 0.0},
        )
        ok = r.get("true_false") is True
        v["n"] += 1
        v["correct"] += ok
        t = v["tasks"].setdefault(task_code(r), [0, 0])
        t[0] += ok
        t[1] += 1
        st = r.get("stats") or {}
        for key, field in (("drafted", "drafted"), ("accepted", "accepted"), ("steps", "steps")):
            v[key] += _number(st.get(field)) or 0.0
        tokens = _number(r.get("new_tokens"))
        v["new"] += tokens or 0.0
        seconds = _number(st.get("wall_s")) or _number(r.get("wall_s"))
        if tokens is not None and seconds:
            v["tok"] += tokens
            v["wall"] += seconds
    out = {}
    for name, v in acc.items():
        drafted = v["drafted"] > 0
        out[name] = {
            "n": v["n"],
            "correct": v["correct"],
            "tasks": v["tasks"],
            "acceptance": v["accepted"] / v["drafted"] if drafted else None,
            "mal": v["new"] / v["steps"] if drafted and v["steps"] else None,
            "tokens_per_s": v["tok"] / v["wall"] if v["wall"] else None,
            "new_tokens": int(v["new"]),
        }
    return out


def _pct(correct: int, total: int) -> str:
    return f"{100.0 * correct / total:.1f} ({correct}/{total})" if total else "–"


def slice_table(summary: Mapping[str, Mapping[str, Any]], tasks: Sequence[str] = TASK_ORDER) -> str:
    """The summary as a Markdown table: accuracy in percent with (correct/total) per task and overall."""
    others = sorted({t for s in summary.values() for t in s["tasks"]} - set(tasks))
    cols = [*tasks, *others]
    lines = [
        "| variant | problems | " + " | ".join(cols) + " | overall | acceptance | MAL | tokens/s |",
        "|---|---:|" + "---:|" * len(cols) + "---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        cells = [_pct(*s["tasks"].get(t, (0, 0))) for t in cols]
        acc = "–" if s["acceptance"] is None else f"{s['acceptance']:.2f}"
        mal = "–" if s["mal"] is None else f"{s['mal']:.2f}"
        tps = "–" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.1f}"
        lines.append(f"| {name} | {s['n']} | " + " | ".join(cells) + f" | {_pct(s['correct'], s['n'])} | {acc} | {mal} | {tps} |")
    return "\n".join(lines)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a partly written last line, from a run stopped mid-write, is left out)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in out if isinstance(r, dict)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asymspec_mm.bench.paper_slice RUN_DIR``: print the slice's table and write it to the run folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m asymspec_mm.bench.paper_slice RUN_DIR (the --out folder of asymspec-mm eval mathvista)", file=sys.stderr)
        return 2
    run = Path(args[0])
    records_file = run / "records.jsonl"
    if not records_file.is_file():
        print(f"error: {records_file} does not exist: no problem finished (see the run's log)", file=sys.stderr)
        return 1
    table = slice_table(summarize_slice(read_records(records_file)))
    (run / "slice_summary.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
