"""The pieces of ``scripts/serving_bench.sh`` (``vllm bench serve`` against ``asymspec-mm serve``) that run in this
project's venv: the image dataset, the warm-up requests and the table.

``python -m asymspec_mm.bench.serving dataset --out FILE --prompts N`` writes N held-out MiniVista problems as a
JSONL file in the shape of vLLM's ``custom_image`` dataset (``{"prompt": query, "image_files": [data URL]}``, the
PNG inline, so the client reads no file and the server needs no ``--allow-local-images``).
``... warmup --url URL --asymspec JSON`` sends a few other problems one by one (other images, so no image the
measured requests carry is cached by them) so that first-use costs (the OCR worker's start, allocator growth) stay
out of the measurement.
``... table --out DIR`` reads every cell the script left in DIR: ``STEM.json`` (``vllm bench serve --save-result``,
``--metadata method=M``), ``STEM.before.prom`` / ``STEM.after.prom`` (``GET /metrics`` around the run) and
``STEM.load`` (``/proc/loadavg`` before and after), and writes ``summary.json`` and ``table.md``.

The acceptance figures are the difference of the server's ``vllm:spec_decode_*`` counters across the run, read
here from the saved ``/metrics`` texts (the mean acceptance length, 1 + accepted / drafts, as vLLM defines it).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..frontend.help import terminal_text
from ..frontend.prometheus import parse_prometheus

#: The vLLM counters summed over their labels, by the names of vLLM's ``speculative_decoding`` object.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: The latency metrics of the table, and the statistics of each (vLLM's result keys: ``{stat}_{metric}_ms``).
LATENCIES = ("ttft", "tpot", "itl")
STATS = ("mean", "p50", "p99")
#: Warm-up problems come from here on (the measured ones are indices 0..N-1 of the same seed).
WARMUP_START = 10_000


def chat_content(problem: dict[str, Any]) -> tuple[str, str]:
    """(the MathVista query, the image as a PNG data URL) of a MiniVista problem."""
    buf = io.BytesIO()
    problem["decoded_image"].save(buf, format="PNG")
    return problem["query"], "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def dataset_records(n: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` MiniVista problems (indices ``start..start+n-1`` of ``seed``, the families rotating) as records of
    vLLM's ``custom_image`` dataset."""
    from ..eval.minivista import make_problem

    records = []
    for i in range(start, start + n):
        query, url = chat_content(make_problem(seed, i))
        records.append({"prompt": query, "image_files": [url]})
    return records


def write_dataset(path: str | Path, n: int, seed: int, start: int = 0) -> int:
    """Write :func:`dataset_records` as JSONL to ``path``; returns ``n``."""
    if n < 1:
        raise ValueError(f"--prompts {n}: the dataset needs at least one prompt")
    lines = [json.dumps(r) for r in dataset_records(n, seed, start)]
    Path(path).write_text("\n".join(lines) + "\n")
    return n


def chat_body(record: dict[str, Any], asymspec: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The chat completion ``vllm bench serve``'s ``openai-chat`` backend sends for a ``custom_image`` record (the
    text, then the image), greedy and non-streamed."""
    content = [{"type": "text", "text": record["prompt"]}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in record["image_files"]]
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_completion_tokens": max_tokens,
        "temperature": 0,
        "asymspec": asymspec,
    }


def warm_up(url: str, asymspec: dict[str, Any], n: int, seed: int, max_tokens: int, timeout: float = 120.0) -> int:
    """Send ``n`` problems from :data:`WARMUP_START` on, one after another; returns the tokens they generated."""
    tokens = 0
    for record in dataset_records(n, seed, WARMUP_START):
        body = json.dumps(chat_body(record, asymspec, max_tokens)).encode()
        req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            tokens += int(json.load(resp)["usage"]["completion_tokens"])
    return tokens


def http_reason(exc: OSError) -> str:
    """One line for a failed request: the server's own error message when it sent one, else the reason."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            return f"HTTP {exc.code}: {json.loads(exc.read())['error']['message']}"
        except (ValueError, KeyError, TypeError, OSError):
            return f"HTTP {exc.code} {exc.reason}"
    return str(getattr(exc, "reason", None) or exc)


def spec_counters(text: str) -> dict[str, Any]:
    """The ``vllm:spec_decode_*`` counters of a ``/metrics`` text, summed over their labels (as vLLM's client
    reads them): ``{"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos": {pos: n}}``."""
    out: dict[str, Any] = {name: 0 for name in SPEC_COUNTERS.values()}
    out["accepted_per_pos"] = {}
    for key, value in parse_prometheus(text).items():
        name = key.split("{", 1)[0]
        if name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[name]] += int(value)
        elif name == PER_POS:
            pos = int(re.search(r'position="(\d+)"', key).group(1))
            out["accepted_per_pos"][pos] = out["accepted_per_pos"].get(pos, 0) + int(value)
    return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` of two :func:`spec_counters` readings; ``accepted_per_pos`` as a list from position 0."""
    delta = {name: after[name] - before[name] for name in SPEC_COUNTERS.values()}
    positions = range(max([*after["accepted_per_pos"], *before["accepted_per_pos"], -1]) + 1)
    delta["accepted_per_pos"] = [after["accepted_per_pos"].get(p, 0) - before["accepted_per_pos"].get(p, 0) for p in positions]
    return delta


def acceptance_length(delta: dict[str, Any]) -> float | None:
    """vLLM's mean acceptance length, 1 + accepted / drafts (each draft round also yields the verifier's token);
    None when nothing was drafted (Floor)."""
    return 1 + delta["num_accepted_tokens"] / delta["num_drafts"] if delta["num_drafts"] else None


def table_row(result: dict[str, Any], delta: dict[str, Any], load: tuple[str, str] = ("", "")) -> dict[str, Any]:
    """One row of the table from a ``vllm bench serve --save-result`` JSON (with ``--metadata method=M`` and
    ``--metric-percentiles 50,99``), the counters' difference across its run and the load before and after."""
    keys = [f"{stat}_{metric}_ms" for metric in LATENCIES for stat in STATS]
    missing = [k for k in ("method", "max_concurrency", "completed", "num_prompts", *keys) if k not in result]
    if missing:
        raise ValueError(
            f"the result lacks {missing[0]}: run vllm bench serve with --metadata method=M --max-concurrency N "
            "--metric-percentiles 50,99 --save-result"
        )
    row: dict[str, Any] = {
        "method": result["method"],
        "concurrency": int(result["max_concurrency"]),
        "completed": int(result["completed"]),
        "prompts": int(result["num_prompts"]),
        "failed": int(result.get("failed", 0)),
        "output_tokens": int(result["total_output_tokens"]),
        "request_throughput": float(result["request_throughput"]),
        "output_throughput": float(result["output_throughput"]),
        "acceptance_length": acceptance_length(delta),
        "spec_decode": delta,
        "load_before": load[0],
        "load_after": load[1],
    }
    row.update({k: float(result[k]) for k in keys})
    return row


def _trio(row: dict[str, Any], metric: str) -> str:
    return " / ".join(f"{row[f'{stat}_{metric}_ms']:.1f}" for stat in STATS)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: per method and concurrency, TTFT, TPOT and ITL (mean / p50 / p99 ms), throughput and the
    mean acceptance length from the counters."""
    lines = [
        "| method | concurrency | completed | output tokens / request | TTFT ms (mean / p50 / p99) | TPOT ms (mean / p50 / p99) "
        "| ITL ms (mean / p50 / p99) | requests/s | output tokens/s | mean acceptance length (drafts) | load before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["method"] != "asymspec", r["method"])):
        acc = f"{r['acceptance_length']:.2f} ({r['spec_decode']['num_drafts']})" if r["acceptance_length"] is not None else "– (0)"
        per_request = r["output_tokens"] / r["completed"] if r["completed"] else 0.0
        lines.append(
            f"| {r['method']} | {r['concurrency']} | {r['completed']}/{r['prompts']} | {per_request:.1f} | {_trio(r, 'ttft')} "
            f"| {_trio(r, 'tpot')} | {_trio(r, 'itl')} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | {acc} "
            f"| {r['load_before'] or '?'} → {r['load_after'] or '?'} |"
        )
    return "\n".join(lines)


def read_cell(out: Path, stem: str) -> dict[str, Any]:
    """The :func:`table_row` of the cell ``stem`` the script left in ``out``."""
    result = json.loads((out / f"{stem}.json").read_text())
    before = spec_counters((out / f"{stem}.before.prom").read_text())
    after = spec_counters((out / f"{stem}.after.prom").read_text())
    load_file = out / f"{stem}.load"
    loads = load_file.read_text().split("\n") if load_file.exists() else []
    load = tuple((loads + ["", ""])[i].split(" ", 1)[0] for i in range(2))
    return table_row(result, counter_delta(before, after), load)  # type: ignore[arg-type]


def collect(out: str | Path) -> list[dict[str, Any]]:
    """Every cell in ``out`` (a ``STEM.json`` beside its ``STEM.before.prom``), as table rows."""
    out = Path(out)
    stems = sorted(p.name.removesuffix(".before.prom") for p in out.glob("*.before.prom"))
    if not stems:
        raise FileNotFoundError(f"no benchmark results in {out} (no *.before.prom): run scripts/serving_bench.sh first")
    return [read_cell(out, stem) for stem in stems]


def machine() -> str:
    """The CPU model and its core count, for the record."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), "")
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.serving", description=terminal_text(__doc__.split("\n\n")[0]))
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dataset", help="write the MiniVista problems as a custom_image JSONL")
    d.add_argument("--out", required=True)
    d.add_argument("--prompts", type=int, required=True)
    d.add_argument("--seed", type=int, default=1, help="MiniVista seed [default: 1, the tiny pair's held-out set]")
    w = sub.add_parser("warmup", help="send a few other problems to the server, one after another")
    w.add_argument("--url", required=True)
    w.add_argument("--asymspec", default="{}", help="the requests' asymspec object (JSON)")
    w.add_argument("--requests", type=int, default=2)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--max-tokens", type=int, default=64)
    t = sub.add_parser("table", help="collect the cells in --out into summary.json and table.md")
    t.add_argument("--out", required=True)
    t.add_argument("--command", default="", help="the command line, for the record")
    args = ap.parse_args(argv)
    if args.cmd == "dataset":
        write_dataset(args.out, args.prompts, args.seed)
        return 0
    if args.cmd == "warmup":
        try:
            warm_up(args.url, json.loads(args.asymspec), args.requests, args.seed, args.max_tokens)
        except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
            print(f"serving_bench: a warm-up request to {args.url} failed: {http_reason(exc)} (see the server's log)", file=sys.stderr)
            return 1
        return 0
    try:
        rows = collect(args.out)
    except (OSError, ValueError) as exc:
        print(f"serving_bench: {exc}", file=sys.stderr)
        return 1
    table = format_table(rows)
    out = Path(args.out)
    summary = {"machine": machine(), "command": args.command, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "table.md").write_text(table + "\n")
    print(table)
    failed = [r for r in rows if r["completed"] < r["prompts"]]
    if failed:
        r = failed[0]
        print(
            f"serving_bench: {r['method']} at concurrency {r['concurrency']}: {r['prompts'] - r['completed']} of {r['prompts']} "
            f"requests failed (the errors are in {out}/{r['method']}-c{r['concurrency']}.json and the server's log)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
