"""The GPU scripts on a machine without a GPU: they parse, their dry runs load no model, and the paper slice's
summary (what the device run prints) is exact on hand-made records."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from asymspec_mm.bench.paper_slice import main as slice_main
from asymspec_mm.bench.paper_slice import slice_table, summarize_slice
from asymspec_mm.eval.mathvista import SHIPPED_DIR

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("scripts/gpu_bench.sh", "scripts/gpu_paper_slice.sh")
NO_PROTOCOL = "gpu_paper_slice.sh: this checkout's 'asymspec-mm eval mathvista' has no --protocol (issue #22 item 1): nothing to run"


def _text_dir() -> Path:
    return SHIPPED_DIR  # the MathVista text data shipped with the package


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path / "empty-hf-cache"),  # no model is cached here
        "OUT": str(tmp_path / "out"),
    }
    return subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def _help_has_protocol() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "asymspec_mm.cli", "eval", "mathvista", "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return "--protocol" in out.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_gpu_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", script], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_paper_slice_command_is_the_papers_protocol(tmp_path):
    text = _text_dir()
    proc = _run(["scripts/gpu_paper_slice.sh", "--print-command", "--text-dir", str(text)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    assert cmd[:5] == [sys.executable, "-m", "asymspec_mm.cli", "eval", "mathvista"]
    flags = " ".join(cmd[5:])
    for part in (
        "--protocol paper --dataset mathvista --tasks GPS,VQA,FQA --require-caption --limit 30",
        "--methods drafter,floor,sd,asymspec --max-new-tokens 1024",
        "--drafter Qwen/Qwen3-VL-2B-Instruct --verifier Qwen/Qwen3-32B --device cuda --dtype bf16",
        f"--text-dir {text} --batch-size 10 --out {tmp_path / 'out' / 'paper-slice'} --resume",
        "--source hf",
    ):
        assert part in flags
    local = _run(
        ["scripts/gpu_paper_slice.sh", "--print-command", "--text-dir", str(text), "--images-dir", "/data/mv", "--limit", "12"], tmp_path
    )
    assert f"--source local --data-dir {text}/testmini.json --images-dir /data/mv" in " ".join(shlex.split(local.stdout))
    assert "--limit 12 " in " ".join(shlex.split(local.stdout))


def test_paper_slice_dry_run_loads_no_model(tmp_path):
    text = _text_dir()
    proc = _run(["scripts/gpu_paper_slice.sh", "--dry-run", "--text-dir", str(text)], tmp_path)
    if not _help_has_protocol():  # before issue #22's --protocol lands, the script says so and stops
        assert proc.returncode == 2 and proc.stderr.strip() == NO_PROTOCOL
        return
    assert proc.returncode == 0, proc.stderr
    assert "30 problems (mathvista, tasks=GPS,VQA,FQA, require_caption=True) x 4 variants: " in proc.stdout
    assert not (tmp_path / "out").exists()  # nothing written


def test_paper_slice_refuses_bad_options(tmp_path):
    proc = _run(["scripts/gpu_paper_slice.sh", "--limit", "x"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu_paper_slice.sh: 'x' is not a whole number (--limit/--budget/--batch-size/--max-new-tokens)"
    proc = _run(["scripts/gpu_paper_slice.sh", "--text-dir", str(tmp_path)], tmp_path)
    assert proc.returncode == 2 and "no MathVista text data (captions_bard.json)" in proc.stderr


def test_gpu_bench_dry_run_plans_the_phases(tmp_path):
    proc = _run(["scripts/gpu_bench.sh", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "paper slice skipped: Qwen/Qwen3-VL-2B-Instruct and Qwen/Qwen3-32B are not both in the local Hugging Face cache",
        "gaia harness skipped: GAIA_DIR does not name a GAIA split (a folder holding metadata.jsonl and its files)",
        "simpleqa harness skipped: SIMPLEQA_CSV and SIMPLEQA_TOOL_CACHE do not both name files (the questions' CSV, the web tools' cache)",
        "dry run: gaia harness: no (240s)",
        "dry run: simpleqa harness: no (120s)",
        "dry run: paper slice: no (300s); shape phases: 1, 1b (cost curve), 2, 2b, 3, 4 in the time left",
        # the static-slot phase's options, parsed by the bench's own parser
        "phase 2b: batch sweep at B=1,8,32 on static-compile rows (1024 columns), asymspec",
    ]
    text = _text_dir()
    only = _run(["scripts/gpu_bench.sh", "--dry-run", "--paper-slice-only", "--", "--text-dir", str(text), "--limit", "12"], tmp_path)
    assert only.stdout.splitlines()[:3] == [
        "dry run: gaia harness: no (240s)",
        "dry run: simpleqa harness: no (120s)",
        "dry run: paper slice: only (510s); shape phases: none",
    ]
    if _help_has_protocol():
        assert only.returncode == 0, only.stderr
        assert "12 problems (mathvista, tasks=GPS,VQA,FQA, require_caption=True)" in only.stdout
    else:
        assert only.returncode == 2 and only.stderr.strip() == NO_PROTOCOL
    bad = _run(["scripts/gpu_bench.sh", "--bogus"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("gpu_bench.sh: unknown option --bogus")


NOT_CACHED = "Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3-32B and microsoft/llmlingua-2-xlm-roberta-large-meetingbank are not all in the local Hugging Face cache"


def _harness_step(tmp_path: Path, env: dict[str, str], name: str, off: str, seconds: int):
    """An agent harness' step of gpu_bench.sh's dry run (``name``: gaia or simpleqa; ``off``: the other's
    ``--no-...``): skipped without the models in the cache (named), then, forced, its command parsed by the CLI's own
    parser (the parsed arguments)."""
    from asymspec_mm.cli.main import build_parser

    skipped = _run_env(["scripts/gpu_bench.sh", "--dry-run", "--no-paper-slice", off], tmp_path, env)
    assert skipped.stdout.splitlines()[0] == f"{name} harness skipped: {NOT_CACHED}"
    forced = _run_env(["scripts/gpu_bench.sh", "--dry-run", "--no-paper-slice", off, f"--{name}"], tmp_path, env)
    assert forced.returncode == 0, forced.stderr
    line = next(x for x in forced.stdout.splitlines() if x.startswith(f"dry run: {name} harness: "))
    assert line.startswith(f"dry run: {name} harness: yes ({seconds}s): ")
    cmd = line.split(f"({seconds}s): ", 1)[1].split()
    assert cmd[1:5] == ["-m", "asymspec_mm.cli", "eval", name]
    return build_parser().parse_args(cmd[3:])


def test_gpu_bench_gaia_step_is_the_papers_harness_on_the_real_pair(tmp_path):
    """The GAIA step: skipped without the models and the classifier in the cache (named), and, forced, the harness'
    command on the real pair, which ``asymspec-mm eval gaia`` parses."""
    from asymspec_mm.eval.gaia_data import write_bundled_tasks

    split = write_bundled_tasks(tmp_path / "split")
    args = _harness_step(tmp_path, {**os.environ, "GAIA_DIR": str(split), "GAIA_LIMIT": "6"}, "gaia", "--no-simpleqa", 240)
    assert (args.gaia_dir, args.limit, args.rows, args.drafter, args.verifier) == (
        str(split),
        6,
        "floor,asymspec",
        "Qwen/Qwen3-VL-2B-Instruct",
        "Qwen/Qwen3-32B",
    )
    assert (args.compression, args.k, args.beta, args.max_steps, args.max_tokens, args.file_limit) == (
        "llmlingua2,rate=0.3,keep_last_turns=2",
        2,
        1.0,
        8,
        1024,
        2000,
    )  # the paper's settings are the command's defaults
    assert args.out == str(tmp_path / "out" / "gaia")


def _run_env(args: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**env, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OUT": str(tmp_path / "out")}
    env["HF_HUB_CACHE"] = str(tmp_path / "empty-hf-cache")
    return subprocess.run(["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def _record(variant: str, task: str, ok: bool, tokens: int, seconds: float, **stats) -> dict:
    return {"variant": variant, "task": task, "true_false": ok, "new_tokens": tokens, "wall_s": seconds, "stats": stats}


RECORDS = [
    _record("floor", "geometry problem solving", True, 100, 4.0, drafted=0, accepted=0, steps=100),
    _record("floor", "figure question answering", False, 60, 2.0, drafted=0, accepted=0, steps=60),
    _record("asymspec", "geometry problem solving", True, 100, 2.0, drafted=160, accepted=60, steps=40),
    _record("asymspec", "figure question answering", True, 60, 1.0, drafted=96, accepted=36, steps=24),
    _record("asymspec", "visual question answering", False, 40, 2.0, drafted=64, accepted=24, steps=16),
]


def test_slice_summary_counts_and_rates():
    s = summarize_slice(RECORDS)
    assert list(s) == ["floor", "asymspec"]
    assert s["floor"] == {
        "n": 2,
        "correct": 1,
        "tasks": {"GPS": [1, 1], "FQA": [0, 1]},
        "acceptance": None,
        "mal": None,
        "tokens_per_s": 160 / 6.0,
        "new_tokens": 160,
    }
    a = s["asymspec"]
    assert (a["n"], a["correct"], a["tasks"]) == (3, 2, {"GPS": [1, 1], "FQA": [1, 1], "VQA": [0, 1]})
    assert a["acceptance"] == 120 / 320 and a["mal"] == 200 / 80 and a["tokens_per_s"] == 200 / 5.0


def test_slice_table_exact():
    assert slice_table(summarize_slice(RECORDS)) == (
        "| variant | problems | GPS | VQA | FQA | overall | acceptance | MAL | tokens/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| floor | 2 | 100.0 (1/1) | – | 0.0 (0/1) | 50.0 (1/2) | – | – | 26.7 |\n"
        "| asymspec | 3 | 100.0 (1/1) | 0.0 (0/1) | 100.0 (1/1) | 66.7 (2/3) | 0.38 | 2.50 | 40.0 |"
    )


def test_slice_summary_of_a_run_cut_short(tmp_path, capsys):
    lines = [json.dumps(r) for r in RECORDS[:3]] + ['{"variant": "asymspec", "task": "vis']  # killed mid-write
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    assert slice_main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == (tmp_path / "slice_summary.md").read_text().strip()
    assert printed.splitlines()[-1] == "| asymspec | 1 | 100.0 (1/1) | – | – | 100.0 (1/1) | 0.38 | 2.50 | 50.0 |"
    assert slice_main([str(tmp_path / "missing")]) == 1


def test_gpu_bench_simpleqa_step_is_the_papers_harness_on_the_real_pair(tmp_path):
    """The SimpleQA step: skipped without the models in the cache (named), and, forced, ``eval simpleqa``'s command
    on the real pair with the paper's harness settings, which the CLI's own parser reads."""
    csv, cache = tmp_path / "simple_qa_test_set.csv", tmp_path / "tool_cache.json"
    csv.write_text("metadata,problem,answer\n")
    cache.write_text("{}")
    env = {**os.environ, "SIMPLEQA_CSV": str(csv), "SIMPLEQA_TOOL_CACHE": str(cache), "SIMPLEQA_N": "5"}
    args = _harness_step(tmp_path, env, "simpleqa", "--no-gaia", 120)
    assert (args.simpleqa_csv, args.tool_cache, args.sample, args.rows, args.drafter, args.verifier) == (
        str(csv),
        str(cache),
        5,
        "floor,asymspec",
        "Qwen/Qwen3-VL-2B-Instruct",
        "Qwen/Qwen3-32B",
    )
    assert (args.compression, args.k, args.beta) == ("llmlingua2,rate=0.3,keep_last_turns=2", 2, 1.0)
    assert args.out == str(tmp_path / "out" / "simpleqa")
