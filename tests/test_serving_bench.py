"""The serving benchmark (``scripts/serving_bench.sh``: ``vllm bench serve`` against ``asymspec-mm serve``).

Without vLLM: the table is built from results saved by a real run of the script (tests/data/serving_bench: vLLM's
result JSONs and the server's ``/metrics`` before and after each run), and its acceptance figures, read from the
counters here, equal the ones vLLM's own client computed from the same counters; the dataset is MiniVista's
problems, images and queries; bad options and missing venvs are one-line errors.

With the vLLM venv (``$VLLM_VENV`` or ``.venv-vllm``; elsewhere skipped, and ``ASYMSPEC_REQUIRE_VLLM=1`` turns the
skip into a failure): the script runs 4 prompts at concurrency 2 for AsymSpec and Floor; every request completes,
the result holds the latency and throughput metrics, and the counters' difference across the run equals the sum
of the per-request ``asymspec.speculative_decoding`` objects of the same requests sent one by one with the
``openai`` client to a fresh server (as do the generated tokens). A busy port and a server slower than ``READY_S``
are one-line errors.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import start_serve, stop_serve
from PIL import Image

from asymspec_mm.bench.serving import (
    acceptance_length,
    chat_body,
    collect,
    counter_delta,
    dataset_records,
    format_table,
    main,
    spec_counters,
    table_row,
)
from asymspec_mm.eval.minivista import make_problem

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serving_bench.sh"
SAVED = ROOT / "tests" / "data" / "serving_bench"
VENV = Path(sys.prefix)  # this interpreter's venv serves


def _vllm_venv() -> Path:
    return Path(os.environ.get("VLLM_VENV") or ROOT / ".venv-vllm")


_VLLM = _vllm_venv()
_SKIP = "" if (_VLLM / "bin" / "python").exists() else f"no vLLM venv at {_VLLM}: run bash scripts/vllm_venv.sh (or set VLLM_VENV)"
if _SKIP and os.environ.get("ASYMSPEC_REQUIRE_VLLM", "") not in ("", "0"):
    raise RuntimeError(f"ASYMSPEC_REQUIRE_VLLM is set but the serving benchmark cannot run: {_SKIP}")
needs_vllm = pytest.mark.skipif(bool(_SKIP), reason=_SKIP or "vLLM venv available")


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "VENV": str(VENV), "VLLM_VENV": str(_VLLM), **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("serving_bench: "), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------- the table (no vLLM)
def test_saved_results_table_rows():
    """The saved run: each row's figures are vLLM's, and the acceptance from the counters equals vLLM's own."""
    rows = {r["method"]: r for r in collect(SAVED)}
    assert sorted(rows) == ["asymspec", "floor"]
    for method, row in rows.items():
        result = json.loads((SAVED / f"{method}-c2.json").read_text())
        assert (row["concurrency"], row["completed"], row["prompts"], row["failed"]) == (2, 4, 4, 0)
        assert row["output_tokens"] == result["total_output_tokens"] == sum(result["output_lens"])
        assert row["mean_ttft_ms"] == pytest.approx(sum(result["ttfts"]) / 4 * 1000)
        assert row["p99_itl_ms"] == result["p99_itl_ms"] and row["output_throughput"] == result["output_throughput"]
    spec = rows["asymspec"]["spec_decode"]
    vllm_own = json.loads((SAVED / "asymspec-c2.json").read_text())  # vLLM's client read the same counters itself
    assert spec["num_drafts"] == vllm_own["spec_decode_num_drafts"] == 15
    assert spec["num_draft_tokens"] == vllm_own["spec_decode_draft_tokens"] == 60
    assert spec["num_accepted_tokens"] == vllm_own["spec_decode_accepted_tokens"] == 34
    assert spec["accepted_per_pos"] == [11, 9, 7, 7]
    assert [n / spec["num_drafts"] for n in spec["accepted_per_pos"]] == vllm_own["spec_decode_per_position_acceptance_rates"]
    assert rows["asymspec"]["acceptance_length"] == vllm_own["spec_decode_acceptance_length"] == 1 + 34 / 15
    # Floor drafts nothing: its counters do not move (vLLM's client then reports no spec-decode figures at all)
    assert rows["floor"]["spec_decode"] == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    assert rows["floor"]["acceptance_length"] is None
    assert not any(k.startswith("spec_decode") for k in json.loads((SAVED / "floor-c2.json").read_text()))
    assert (rows["asymspec"]["load_before"], rows["asymspec"]["load_after"]) == ("1.54", "1.73")


def test_saved_results_markdown():
    lines = format_table(collect(SAVED)).splitlines()
    assert lines[0].startswith("| method | concurrency | completed | output tokens / request | TTFT ms (mean / p50 / p99) |")
    assert lines[2] == (
        "| asymspec | 2 | 4/4 | 11.5 | 777.7 / 801.4 / 1002.3 | 11.3 / 5.9 / 28.6 | 16.8 / 20.0 / 36.1 | 1.99 | 22.9 | 3.27 (15) "
        "| 1.54 → 1.73 |"
    )
    assert lines[3] == (
        "| floor | 2 | 4/4 | 11.5 | 750.0 / 771.6 / 914.8 | 7.0 / 8.1 / 8.5 | 5.4 / 3.9 / 15.1 | 2.13 | 24.4 | – (0) | 1.75 → 2.03 |"
    )
    assert len(lines) == 4


def test_table_command_writes_summary_and_flags_failures(tmp_path, capsys):
    out = tmp_path / "cells"
    shutil.copytree(SAVED, out)
    assert main(["table", "--out", str(out), "--command", "bash scripts/serving_bench.sh --prompts 4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["command"] == "bash scripts/serving_bench.sh --prompts 4" and len(summary["rows"]) == 2
    assert (out / "table.md").read_text() == format_table(collect(SAVED)) + "\n"
    floor = json.loads((out / "floor-c2.json").read_text())
    floor.update(completed=3, failed=1)
    (out / "floor-c2.json").write_text(json.dumps(floor))
    capsys.readouterr()
    assert main(["table", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"serving_bench: floor at concurrency 2: 1 of 4 requests failed (the errors are in {out}/floor-c2.json and the server's log)"
    )


def test_table_errors_name_the_fix(tmp_path, capsys):
    assert main(["table", "--out", str(tmp_path)]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"serving_bench: no benchmark results in {tmp_path} (no *.before.prom): run scripts/serving_bench.sh first"
    )
    result = json.loads((SAVED / "asymspec-c2.json").read_text())
    del result["p50_tpot_ms"]
    with pytest.raises(ValueError, match=r"^the result lacks p50_tpot_ms: run vllm bench serve with .*--metric-percentiles 50,99"):
        table_row(result, counter_delta(spec_counters(""), spec_counters("")))


def test_counters_sum_labels_and_difference():
    """Counters summed over their labels, as vLLM's client sums them; a position first seen after the run counts."""
    before = spec_counters(
        '# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{model_name="a"} 2\n'
        'vllm:spec_decode_num_drafts_total{model_name="b"} 3\nvllm:spec_decode_num_draft_tokens_total{model_name="a"} 20\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} 7\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="0"} 5\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="b",position="0"} 1\n'
        "asymspec_drafted_tokens_total 999\nvllm:spec_decode_num_drafts_created 1.7e9\n"
    )
    assert before == {"num_drafts": 5, "num_draft_tokens": 20, "num_accepted_tokens": 7, "accepted_per_pos": {0: 6}}
    after = spec_counters(
        'vllm:spec_decode_num_drafts_total{model_name="a"} 9\nvllm:spec_decode_num_draft_tokens_total{model_name="a"} 36\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} 15\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="0"} 10\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="2"} 2\n'
    )
    delta = counter_delta(before, after)
    assert delta == {"num_drafts": 4, "num_draft_tokens": 16, "num_accepted_tokens": 8, "accepted_per_pos": [4, 0, 2]}
    assert acceptance_length(delta) == 3.0
    assert acceptance_length(counter_delta(before, before)) is None


def test_dataset_is_minivista_with_inline_images():
    records = dataset_records(3, seed=1)
    assert len(records) == 3
    for i, record in enumerate(records):
        problem = make_problem(1, i)
        assert record["prompt"] == problem["query"] and len(record["image_files"]) == 1
        head, _, data = record["image_files"][0].partition(",")
        assert head == "data:image/png;base64"
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        assert image.tobytes() == problem["decoded_image"].convert(image.mode).tobytes()
    body = chat_body(records[0], {"method": "floor"}, 16)
    assert body["messages"][0]["content"][0] == {"type": "text", "text": records[0]["prompt"]}
    assert body["messages"][0]["content"][1]["image_url"]["url"] == records[0]["image_files"][0]
    assert (body["max_completion_tokens"], body["temperature"], body["asymspec"]) == (16, 0, {"method": "floor"})


def test_warm_up_failure_is_one_line(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["warmup", "--url", f"http://127.0.0.1:{port}", "--requests", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"serving_bench: a warm-up request to http://127.0.0.1:{port} failed: [Errno 111] Connection refused")


# ---------------------------------------------------------------------------------------------- the script's errors
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompts", "0"], "serving_bench: --prompts 0 must be an integer >= 1"),
        (["--concurrency", "1,x"], "serving_bench: --concurrency 1,x must be integers >= 1 separated by commas, e.g. 1,4,16"),
        (["--methods", "asymspec,fast"], "serving_bench: --methods: unknown method 'fast'; choose from asymspec, floor, drafter, sd"),
        (["--ocr", "easy"], "serving_bench: --ocr easy must be server or none"),
        (["--threads", "0"], "serving_bench: --threads 0 must be an integer >= 1"),
        (["--port"], "serving_bench: --port needs a value"),
        (["--warm"], "serving_bench: unknown option --warm"),
    ],
)
def test_bad_options_are_one_line(args, message):
    proc = _run(args, timeout=60)
    assert proc.returncode == 2
    assert _one_line_error(proc).startswith(message)


def test_missing_venvs_are_one_line(tmp_path):
    proc = _run(["--out", str(tmp_path / "out")], env={"VLLM_VENV": str(tmp_path / "no-vllm")}, timeout=60)
    assert proc.returncode == 1
    assert _one_line_error(proc) == f"serving_bench: no vLLM in {tmp_path / 'no-vllm'}: run `bash scripts/vllm_venv.sh` (or set VLLM_VENV)"
    proc = _run(["--out", str(tmp_path / "out")], env={"VENV": str(tmp_path / "no-venv")}, timeout=60)
    assert proc.returncode == 1
    assert (
        _one_line_error(proc)
        == f"serving_bench: no {tmp_path / 'no-venv'}/bin/python: run `make setup` (or set VENV to this project's venv)"
    )


# ---------------------------------------------------------------------------------------------- a real run (vLLM)
@needs_vllm
@pytest.mark.vllm
def test_script_run_counters_equal_per_request_objects(tmp_path, capsys):
    out = tmp_path / "bench"
    # no OCR: the vLLM venv, where CI runs this, has no OCR engine (the counters do not depend on it)
    # --ignore-eos: every answer runs to its budget (vLLM's flag, which the server takes)
    proc = _run(["--prompts", "4", "--concurrency", "2", "--max-tokens", "48", "--ignore-eos", "--ocr", "none", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["method"]: r for r in summary["rows"]}
    assert sorted(rows) == ["asymspec", "floor"]
    for row in rows.values():
        assert (row["concurrency"], row["completed"], row["prompts"], row["failed"]) == (2, 4, 4, 0)
        for metric in ("ttft", "tpot", "itl"):
            assert 0 < row[f"p50_{metric}_ms"] <= row[f"p99_{metric}_ms"] < 60_000
        assert row["request_throughput"] > 0 and row["output_throughput"] > 0
    assert (out / "table.md").read_text().strip() in proc.stdout

    # the same requests one by one, on a fresh server, through the openai client
    openai = pytest.importorskip("openai")
    records = [json.loads(line) for line in (out / "dataset.jsonl").read_text().splitlines()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    proc_srv, url = start_serve([sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0"], ROOT, env)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        for method, row in rows.items():
            summed = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
            tokens = 0
            for record in records:
                body = chat_body(record, {"method": method, "ocr": False}, 48)
                resp = client.chat.completions.create(
                    **{k: v for k, v in body.items() if k != "asymspec"}, extra_body={"asymspec": body["asymspec"], "ignore_eos": True}
                )
                spec = resp.model_extra["asymspec"]["speculative_decoding"]
                for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                    summed[key] += spec[key]
                for pos, n in enumerate(spec["num_accepted_tokens_per_pos"]):
                    summed["accepted_per_pos"] += [0] * (pos + 1 - len(summed["accepted_per_pos"]))
                    summed["accepted_per_pos"][pos] += n
                tokens += resp.usage.completion_tokens
            assert row["spec_decode"] == summed, method
            assert row["output_tokens"] == tokens == 4 * 48, method
        assert rows["asymspec"]["spec_decode"]["num_drafts"] > 0 and rows["floor"]["spec_decode"]["num_drafts"] == 0
        assert sum(rows["asymspec"]["spec_decode"]["accepted_per_pos"]) == rows["asymspec"]["spec_decode"]["num_accepted_tokens"]
        # a refused warm-up request is one line carrying the server's own message
        assert main(["warmup", "--url", url, "--asymspec", '{"method": "fast"}', "--requests", "1"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith(f'serving_bench: a warm-up request to {url} failed: HTTP 400: asymspec.method="fast" is not valid; choose')
    finally:
        stop_serve(proc_srv)


@needs_vllm
@pytest.mark.vllm
def test_busy_port_and_slow_server_are_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        proc = _run(
            ["--prompts", "1", "--concurrency", "1", "--methods", "floor", "--port", str(port), "--out", str(tmp_path / "a")], timeout=300
        )
    assert proc.returncode == 1
    line = _one_line_error(proc)
    assert line.startswith(f"serving_bench: the server exited before it was ready: error: port {port} on 127.0.0.1 is already in use")
    proc = _run(
        ["--prompts", "1", "--concurrency", "1", "--methods", "floor", "--ocr", "none", "--out", str(tmp_path / "b")],
        env={"READY_S": "1"},
        timeout=300,
    )
    assert proc.returncode == 1
    assert _one_line_error(proc).startswith("serving_bench: the server was not ready within 1 s (log: ")
