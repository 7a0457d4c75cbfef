"""The MathVista text data ships with the package (issue #27, point 3): MathVista's bytes with their licence,
the default of every eval command, overridden by ``--text-dir`` / ``--data-dir`` / ``$ASYMSPEC_MATHVISTA_DIR``,
and every "not found" a single line naming those options and the variable."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from asymspec_mm.base.errors import DatasetUnavailableError
from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
TINY_VERIFIER = ROOT / "asymspec_mm" / "presets_data" / "tiny" / "verifier"
DATA_FILES = ("testmini.json", "query.json", "captions_bard.json", "ocrs_easyocr.json")
# three of the paper's 587 problems (GPS, VQA, FQA with a Bard caption), and two others
SOME_CAPTIONED = ("5", "158", "202")


def _env_without_variable() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != mv.ENV_TEXT_DIR}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _text_folder(folder: Path, pids: tuple[str, ...], *, problems: bool = True) -> Path:
    """A MathVista-like folder: testmini.json (when ``problems``) and a captions_bard.json of only ``pids``."""
    folder.mkdir(parents=True, exist_ok=True)
    if problems:
        shutil.copy(mv.SHIPPED_DIR / "testmini.json", folder / "testmini.json")
    captions = json.loads((mv.SHIPPED_DIR / "captions_bard.json").read_text(encoding="utf-8"))
    captions["texts"] = {pid: captions["texts"][pid] for pid in pids}
    (folder / "captions_bard.json").write_text(json.dumps(captions), encoding="utf-8")
    return folder


def _dumped_pids(out: Path) -> list[str]:
    return [json.loads(line)["pid"] for line in out.read_text(encoding="utf-8").splitlines()]


def _dump(tmp_path: Path, *options: str) -> tuple[int, Path]:
    out = tmp_path / "prompts.jsonl"
    argv = ["eval", "mathvista", "--protocol", "paper", "--require-caption", "--dump-prompts", str(out)]
    return cli_main([*argv, "--verifier", str(TINY_VERIFIER), *options]), out


# ----------------------------------------------------------------------------------------- the shipped files


def test_the_shipped_files_are_mathvistas_bytes_with_their_licence():
    mv.check_shipped()  # every recorded digest matches
    assert sorted(mv.SHA256) == sorted(DATA_FILES)
    assert sorted(p.name for p in mv.SHIPPED_DIR.iterdir()) == sorted([*DATA_FILES, "NOTICE.md"])
    for name, digest in mv.SHA256.items():
        assert hashlib.sha256((mv.SHIPPED_DIR / name).read_bytes()).hexdigest() == digest
    notice = (mv.SHIPPED_DIR / "NOTICE.md").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in notice and "https://github.com/lupantech/MathVista" in notice
    assert all(f"`{name}`" in notice for name in DATA_FILES)


def test_a_damaged_copy_is_named(tmp_path):
    for name in DATA_FILES:
        shutil.copy(mv.SHIPPED_DIR / name, tmp_path / name)
    mv.check_shipped(tmp_path)
    (tmp_path / "query.json").write_bytes((tmp_path / "query.json").read_bytes()[:-1])
    (tmp_path / "testmini.json").unlink()
    with pytest.raises(DatasetUnavailableError) as info:
        mv.check_shipped(tmp_path)
    message = str(info.value)
    assert "testmini.json is missing" in message and "query.json differs from MathVista's" in message
    assert "captions_bard.json" not in message and "reinstall asymspec-mm" in message


def test_the_wheel_carries_the_data(tmp_path):
    """A wheel built from a copy of the sources (the build's scratch files stay out of the checkout)."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for package in ("asymspec_mm", "captioning", "vision_cache", "ui"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = wheels.glob("asymspec_mm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        for name, digest in mv.SHA256.items():
            assert hashlib.sha256(zf.read(f"asymspec_mm/eval/mathvista/data/{name}")).hexdigest() == digest
        assert "CC BY-SA 4.0" in zf.read("asymspec_mm/eval/mathvista/data/NOTICE.md").decode()


def test_the_issue_command_runs_from_a_copy_of_the_package(tmp_path):
    """The package copied away from any checkout (no shared data folder beside it), no variable set, no --text-dir:
    ``--protocol paper --require-caption --dump-prompts`` writes the paper's 587 prompts."""
    install = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__", "presets_data", "examples_data")
    for package in ("asymspec_mm", "captioning", "vision_cache"):
        shutil.copytree(ROOT / package, install / package, ignore=ignore)
    work = tmp_path / "work"
    work.mkdir()
    cmd = [sys.executable, "-m", "asymspec_mm.eval.cli", "eval", "mathvista", "--protocol", "paper", "--require-caption"]
    cmd += ["--dump-prompts", "prompts.jsonl", "--verifier", str(TINY_VERIFIER)]
    env = {**_env_without_variable(), "PYTHONPATH": str(install)}
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines() == [
        "587 prompts (paper protocol) -> prompts.jsonl",
        "verifier prompt: longest 1,950 tokens (pid 340), median 770, 0 over 32,704",  # the tiny pair's 728-token tokenizer
    ]
    assert len(_dumped_pids(work / "prompts.jsonl")) == 587


# ----------------------------------------------------------------------------------------- which folder wins


def test_data_dir_folder_holding_the_texts_is_read_for_them(tmp_path, monkeypatch):
    """``--data-dir`` at a folder with testmini.json and captions_bard.json: its captions choose the subset."""
    monkeypatch.delenv(mv.ENV_TEXT_DIR, raising=False)
    folder = _text_folder(tmp_path / "mathvista", SOME_CAPTIONED)
    rc, out = _dump(tmp_path, "--data-dir", str(folder))
    assert rc == 0 and _dumped_pids(out) == list(SOME_CAPTIONED)
    rc, out = _dump(tmp_path, "--data-dir", str(folder / "testmini.json"))  # the problems file: its folder's texts
    assert rc == 0 and _dumped_pids(out) == list(SOME_CAPTIONED)


def test_the_options_win_over_the_variable_which_wins_over_the_shipped_copy(tmp_path, monkeypatch):
    monkeypatch.setenv(mv.ENV_TEXT_DIR, str(_text_folder(tmp_path / "from-variable", ("5",))))
    rc, out = _dump(tmp_path)
    assert rc == 0 and _dumped_pids(out) == ["5"]
    rc, out = _dump(tmp_path, "--text-dir", str(_text_folder(tmp_path / "from-option", ("158", "202"))))
    assert rc == 0 and _dumped_pids(out) == ["158", "202"]
    rc, out = _dump(tmp_path, "--data-dir", str(_text_folder(tmp_path / "data", ("202",))))
    assert rc == 0 and _dumped_pids(out) == ["202"]
    monkeypatch.delenv(mv.ENV_TEXT_DIR)
    rc, out = _dump(tmp_path)
    assert rc == 0 and len(_dumped_pids(out)) == 587


def test_data_dir_without_texts_reads_the_default_texts(tmp_path, monkeypatch):
    monkeypatch.delenv(mv.ENV_TEXT_DIR, raising=False)
    (tmp_path / "problems").mkdir()
    shutil.copy(mv.SHIPPED_DIR / "testmini.json", tmp_path / "problems" / "testmini.json")
    rc, out = _dump(tmp_path, "--data-dir", str(tmp_path / "problems"))
    assert rc == 0 and len(_dumped_pids(out)) == 587


# ----------------------------------------------------------------------------------------- "not found" names the fix


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Errno" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "case, words",
    [
        ("text-dir missing", "MathVista text folder {tmp}/nowhere not found"),
        ("text-dir empty", "no query.json, captions_bard.json or ocrs_easyocr.json in {tmp}/empty (nor its texts/)"),
        ("variable missing", "MathVista text folder {tmp}/nowhere (from $ASYMSPEC_MATHVISTA_DIR) not found"),
        ("data-dir missing", "MathVista problems: {tmp}/nowhere not found"),
        ("texts without problems", "MathVista problems: {tmp}/texts holds no testmini.json"),
        ("no captions", "--require-caption needs captions_bard.json, which {tmp}/queries (nor its texts/) does not hold"),
    ],
)
def test_every_not_found_names_the_options_and_the_variable(case, words, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(mv.ENV_TEXT_DIR, raising=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "queries").mkdir()
    shutil.copy(mv.SHIPPED_DIR / "testmini.json", tmp_path / "queries" / "testmini.json")
    shutil.copy(mv.SHIPPED_DIR / "query.json", tmp_path / "queries" / "query.json")
    options = {
        "text-dir missing": ["--text-dir", str(tmp_path / "nowhere")],
        "text-dir empty": ["--text-dir", str(tmp_path / "empty")],
        "variable missing": [],
        "data-dir missing": ["--data-dir", str(tmp_path / "nowhere")],
        "texts without problems": ["--text-dir", str(_text_folder(tmp_path / "texts", ("5",), problems=False))],
        "no captions": ["--text-dir", str(tmp_path / "queries")],
    }[case]
    if case == "variable missing":
        monkeypatch.setenv(mv.ENV_TEXT_DIR, str(tmp_path / "nowhere"))
    rc, _ = _dump(tmp_path, *options)
    line = _one_error(capsys)
    assert rc == 2 and words.format(tmp=tmp_path) in line
    assert "--text-dir" in line and "--data-dir" in line and "$ASYMSPEC_MATHVISTA_DIR" in line


def test_score_of_a_missing_file_is_one_line_naming_a_real_one(tmp_path, capsys):
    assert cli_main(["eval", "score", "--input", str(tmp_path / "output_bard.json")]) == 2
    line = _one_error(capsys)
    assert line == (
        f"error: --input {tmp_path / 'output_bard.json'} does not exist: give an output JSON an eval mathvista run "
        "wrote (e.g. runs/mathvista/output_asymspec.json)"
    )
    output = tmp_path / "output_x.json"
    output.write_text(json.dumps({"1": {"pid": "1", "response": "B", "extraction": "B"}}), encoding="utf-8")
    assert cli_main(["eval", "score", "--input", str(output), "--gt", str(tmp_path)]) == 2
    assert f"--gt {tmp_path} is a folder: give a problems JSON" in _one_error(capsys)


def test_merge_and_report_of_nothing_name_what_to_give(tmp_path, capsys):
    assert cli_main(["eval", "merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist: give records*.jsonl files or the --out folders of eval mathvista runs" in _one_error(capsys)
    assert cli_main(["eval", "report", str(tmp_path)]) == 2
    assert f"no records found in {tmp_path}: give records*.jsonl files" in _one_error(capsys)
