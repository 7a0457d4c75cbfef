"""The scripts under examples/ run as a user runs them (a subprocess from the repository root) and print
what the library computes for the same request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from argv_runs import Outcome, run_commands

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "asymspec_mm" / "examples_data"
EXAMPLES = json.loads((DATA / "examples.json").read_text(encoding="utf-8"))
TIMEOUT_S = 300


def example_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the examples run in: on the CPU and offline, the checkout first on the path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    pythonpath = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    # No GPU, so that `auto` means the bundled tiny pair and the in-process reference (on the CPU) matches.
    base.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="", PYTHONPATH=pythonpath)
    base.update(env or {})
    return base


def run_example(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``examples/<script>`` on the CPU and offline, as a user would from the repository root."""
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args],
        cwd=REPO,
        env=example_env(env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def mathvista_tables(folder: Path) -> Path:
    """``folder/texts`` with problem 5's caption and OCR in MathVista's layouts: Bard captions (with the chat preface
    the official clean-up removes) and EasyOCR results as Python literals of (box, text, confidence)."""
    texts = folder / "texts"
    texts.mkdir()
    (texts / "captions_bard.json").write_text(json.dumps({"model": "bard", "texts": {"5": "Sure. A bar chart with four coloured bars."}}))
    (texts / "ocrs_easyocr.json").write_text(
        json.dumps(
            {
                "model": "easyocr",
                "texts": {"5": "[([[0, 0], [9, 0], [9, 9], [0, 9]], '10', 0.9), ([[0, 20], [9, 20], [9, 29], [0, 29]], '5', 0.8)]"},
            }
        )
    )
    return texts


NO_OCR = next(e for e in EXAMPLES if not e["ocr"])  # a bundled example without OCR text: the verifier gets none


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory) -> dict[str, tuple[Outcome, Path | None]]:
    """The example scripts' runs whose claims are what they print and their exit status (not how the process
    starts), all in one process (:mod:`argv_runs`: one start-up for all); name -> (what it did, the texts folder)."""
    texts = mathvista_tables(tmp_path_factory.mktemp("examples"))
    view, real = REPO / "examples" / "precomputed_view.py", REPO / "examples" / "real_models.py"
    image = DATA / EXAMPLES[0]["image"]
    runs = {
        "pid": (view, ["--pid", NO_OCR["pid"], "--preset", "tiny", "--max-new-tokens", "24"]),
        "tables": (view, [str(texts), "5", str(image), "--preset", "tiny", "--max-new-tokens", "24"]),
        "bad-pid": (view, ["--pid", "999"]),
        "missing-texts": (view, [str(REPO / "missing-texts")]),
        "real-help": (real, ["--help"]),
    }
    outcomes = run_commands(list(runs.values()), cwd=REPO, env=example_env(), timeout=TIMEOUT_S)
    return {name: (outcome, texts) for name, outcome in zip(runs, outcomes)}


@pytest.fixture(scope="module")
def tiny():
    """The bundled tiny pair, as the examples load it (on the CPU, like :func:`run_example`)."""
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none", device="cpu")


def test_examples_folder_is_covered():
    assert sorted(p.name for p in (REPO / "examples").glob("*.py")) == ["precomputed_view.py", "quickstart.py", "real_models.py"]


def test_quickstart_prints_each_method_and_the_provenance(tiny):
    from asymspec_mm import AsymSpecConfig

    proc = run_example("quickstart.py")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ex = EXAMPLES[0]
    cfg = AsymSpecConfig(max_new_tokens=64)
    for i, method in enumerate(("floor", "drafter", "asymspec")):
        res = tiny.generate(DATA / ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"] or False, method=method, config=cfg)
        assert lines[i] == f"{method:9s} {res.text!r}"
    trace_lines = lines[3:-1]
    assert len(trace_lines) == len(res.trace) > 0
    marks = {"accepted": "draft accepted", "fused": "fused at rejection", "bonus": "verifier bonus"}
    for line, ev in zip(trace_lines, res.trace):
        assert line.lstrip().startswith(repr(ev.text)) and marks[ev.source] in line
        assert f"p_verifier={ev.p_verifier:.2f}" in line
        assert ("(verifier alone:" in line) == ev.steered
    assert lines[-1].startswith("{'steps': ") and f"'new_tokens': {len(res.trace)}" in lines[-1]


def test_precomputed_view_runs_without_arguments_on_a_bundled_example(tiny):
    proc = run_example("precomputed_view.py")
    assert proc.returncode == 0, proc.stderr
    assert "using the 'tiny' pair" in proc.stderr  # `auto` without a GPU
    ex = EXAMPLES[0]
    res = tiny.generate(DATA / ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"] or False)
    assert res.text.strip()
    assert proc.stdout == res.text + "\n"


def test_precomputed_view_picks_a_bundled_example_by_pid(tiny, script_runs):
    proc, _ = script_runs["pid"]
    assert proc.returncode == 0, proc.stderr
    res = tiny.generate(DATA / NO_OCR["image"], NO_OCR["question"], caption=NO_OCR["caption"], ocr=False, max_new_tokens=24)
    assert proc.stdout == res.text + "\n"


def test_precomputed_view_reads_mathvista_tables(tiny, script_runs):
    proc, texts = script_runs["tables"]
    assert proc.returncode == 0, proc.stderr
    from captioning import StaticOCR

    ocr_text = StaticOCR(texts / "ocrs_easyocr.json").text_for("5")
    assert "10" in ocr_text and "5" in ocr_text
    res = tiny.generate(
        DATA / EXAMPLES[0]["image"],
        "What is shown in the figure?",
        caption="A bar chart with four coloured bars.",
        ocr=ocr_text,
        max_new_tokens=24,
    )
    assert proc.stdout == res.text + "\n"


def test_precomputed_view_refuses_bad_arguments_with_a_usage_line(script_runs):
    proc, _ = script_runs["bad-pid"]
    assert proc.returncode == 2 and "no bundled example has pid 999" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc, _ = script_runs["missing-texts"]
    assert proc.returncode == 2 and "give the problem id and its image" in proc.stderr


def test_real_models_help_names_its_arguments(script_runs):
    proc, _ = script_runs["real-help"]
    assert proc.returncode == 0, proc.stderr
    assert "image" in proc.stdout and "question" in proc.stdout and "Qwen/Qwen3-32B" in proc.stdout


def test_real_models_without_checkpoints_fails_in_one_line(tmp_path):
    # An empty hub cache, offline: the paper's checkpoints cannot be there, whatever this machine has cached.
    cache = tmp_path / "hf"
    proc = run_example(
        "real_models.py",
        str(DATA / EXAMPLES[0]["image"]),
        "Which bar is the tallest?",
        env={"HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub")},
    )
    assert proc.returncode == 1 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: cannot load Qwen/Qwen3-VL-2B-Instruct + Qwen/Qwen3-32B: ")
