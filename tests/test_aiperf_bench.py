"""The AIPerf pass of the serving benchmark (``scripts/aiperf_bench.sh``: ``aiperf profile`` against
``asymspec-mm serve``, issue #49 item 11).

Without AIPerf: the table is built from the exports of a real run (tests/data/aiperf_bench: AIPerf 0.13.0's
``profile_export_aiperf.json`` and the server's ``/metrics`` before and after, 8 problems per method), where
AIPerf's acceptance totals, read from the answers' ``metrics.speculative_decoding``, equal the growth of the
server's ``vllm:spec_decode_*`` counters and its pooled histogram's tails equal the per-position counters; a
disagreement fails the table; bad options and a missing ``aiperf`` are one-line errors.

With AIPerf (``aiperf`` on PATH, ``.venv-aiperf`` or ``$AIPERF``; skipped otherwise): the script runs 2 problems and
AIPerf prints its Spec Decode table, whose totals equal the counters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asymspec_mm.bench.aiperf_pass import collect, format_table, main, write_dataset
from asymspec_mm.bench.serving import counter_delta, spec_counters

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "aiperf_bench.sh"
SAVED = ROOT / "tests" / "data" / "aiperf_bench"


def _aiperf() -> str | None:
    if os.environ.get("AIPERF"):
        return os.environ["AIPERF"]
    local = ROOT / ".venv-aiperf" / "bin" / "aiperf"
    return str(local) if local.exists() else shutil.which("aiperf")


needs_aiperf = pytest.mark.skipif(_aiperf() is None, reason="AIPerf is not installed (pip install aiperf into .venv-aiperf, or set AIPERF)")


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "VENV": str(Path(sys.prefix)), **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------- a saved run
def test_saved_run_aiperf_totals_equal_the_counters():
    rows = {r["method"]: r for r in collect(SAVED, ["asymspec", "sd"])}
    asym, sd = rows["asymspec"], rows["sd"]
    assert asym["aiperf_totals"] == asym["counters"] == {"steps": 170, "draft_tokens": 680, "accepted": 219}
    assert sd["aiperf_totals"] == sd["counters"] == {"steps": 176, "draft_tokens": 704, "accepted": 211}
    for method, row in rows.items():
        assert row["agree"] and row["requests"] == 8 and row["errors"] == 0 and row["aiperf_version"] == "0.13.0"
        pooled = row["pooled_histogram"]
        assert sum(pooled.values()) == row["counters"]["steps"] and sum(j * n for j, n in pooled.items()) == row["counters"]["accepted"]
        # the pooled histogram's tails (AIPerf, from the answers) are the per-position counters (the server's)
        before, after = (spec_counters((SAVED / f"{method}.{w}.prom").read_text()) for w in ("before", "after"))
        per_pos = counter_delta(before, after)["accepted_per_pos"]
        assert per_pos == [sum(n for j, n in pooled.items() if j > pos) for pos in range(4)]
        # AIPerf's token-weighted length is the counters' 1 + accepted / steps
        assert row["token_weighted_acceptance_length"] == pytest.approx(row["counters_acceptance_length"], abs=1e-12)
    assert asym["acceptance_length"] == pytest.approx({"avg": 2.3095, "p50": 2.3667, "min": 1.92, "max": 2.5789}, abs=5e-5)


def test_saved_run_markdown():
    table = format_table(collect(SAVED, ["asymspec", "sd"]))
    lines = table.splitlines()
    assert len(lines) == 4 and lines[1] == "|" + "---|" * 8
    assert lines[2].startswith("| asymspec | 8 (0 errors) | 2.31 / 2.37 / 1.92 / 2.58 | 2.29 | 32.7 / 32.2 | 170 / 680 / 219 |")
    assert "| 170 / 680 / 219 (2.29) | 0: 33% 1: 40% 2: 7% 3: 5% 4: 15% |" in lines[2]


def test_table_command_writes_summary_and_fails_on_disagreement(tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(SAVED, out)
    assert main(["table", "--out", str(out), "--methods", "asymspec,sd", "--command", "bash scripts/aiperf_bench.sh"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["method"] for r in summary["rows"]] == ["asymspec", "sd"] and (out / "table.md").read_text().startswith("| method |")
    capsys.readouterr()
    after = out / "sd.after.prom"
    counted = 'vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"} 227'  # 211 accepted during the run
    assert counted in after.read_text()
    after.write_text(after.read_text().replace(counted, counted[:-3] + "228"))
    assert main(["table", "--out", str(out), "--methods", "asymspec,sd"]) == 1
    assert capsys.readouterr().err == "aiperf_bench: AIPerf's totals differ from the server's counters for sd\n"
    assert main(["table", "--out", str(out), "--methods", "asymspec,floor"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiperf_bench: no AIPerf export for floor at ")


def test_dataset_is_aiperf_single_turn_with_inline_images(tmp_path):
    path = tmp_path / "d.jsonl"
    assert write_dataset(path, 3, 1, 48) == 3
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 3 and all(set(r) == {"text", "image", "output_length"} for r in records)
    assert all(r["image"].startswith("data:image/png;base64,") and r["output_length"] == 48 and r["text"] for r in records)
    with pytest.raises(ValueError, match="at least one prompt"):
        write_dataset(path, 0, 1, 48)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompts", "0"], "aiperf_bench: --prompts 0 must be an integer >= 1"),
        (["--concurrency", "1,2"], "aiperf_bench: --concurrency 1,2 must be an integer >= 1"),
        (["--methods", "floor"], "aiperf_bench: --methods: 'floor' drafts nothing to accept; choose from asymspec, sd"),
        (["--ocr", "yes"], "aiperf_bench: --ocr yes must be server or none"),
        (["--fast"], "aiperf_bench: unknown option --fast"),
    ],
)
def test_bad_options_are_one_line(args, message):
    proc = _run(args)
    assert proc.returncode == 2 and _one_line_error(proc).startswith(message)


def test_missing_aiperf_is_one_line(tmp_path):
    proc = _run(["--out", str(tmp_path / "x")], env={"AIPERF": str(tmp_path / "none" / "aiperf")})
    assert proc.returncode == 1
    assert _one_line_error(proc) == (
        "aiperf_bench: no aiperf: python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf (or set AIPERF)"
    )


# ---------------------------------------------------------------------------------------------- a real run (AIPerf)
@needs_aiperf
def test_script_run_aiperf_reads_the_acceptance(tmp_path):
    out = tmp_path / "bench"
    args = ["--prompts", "2", "--concurrency", "1", "--methods", "sd", "--max-tokens", "24", "--ocr", "none", "--out", str(out)]
    proc = _run(args, env={"AIPERF": _aiperf()}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "LLM Metrics: Spec Decode" in proc.stdout and "Accepted drafts per step (% of steps)" in proc.stdout
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["agree"] and row["requests"] == 2 and row["counters"]["steps"] > 0
    assert row["counters"]["draft_tokens"] == 4 * row["counters"]["steps"]  # the default K
