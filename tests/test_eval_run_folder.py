"""What a MiniVista eval run leaves in its folder, through `asymspec-mm eval mathvista` with the bundled tiny pair
(2 problems, Floor and AsymSpec, 8 tokens): every image the output JSON names is there and is the problem's image,
and the progress bar ends on the report's acceptance, named as the pooled rate it is."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval.cli import main as cli_main

ARGS = ["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "4", "--limit", "2", "--preset", "tiny"]
ARGS += ["--max-new-tokens", "8", "--no-chart", "--methods", "floor,asymspec", "--seed", "0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    """The finished run's folder and what its progress bar wrote (stderr)."""
    out = tmp_path_factory.mktemp("minivista") / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # tqdm writes the bar to stderr
        assert cli_main([*ARGS, "--out", str(out)]) == 0
    return out, err.getvalue()


def test_every_image_the_output_json_names_is_in_the_run_folder(run) -> None:
    out, _ = run
    problems = {p["pid"]: p for p in mv.load_minivista_problems(4, 0)}
    for variant in ("floor", "asymspec"):
        output = json.loads((out / f"output_{variant}.json").read_text(encoding="utf-8"))
        assert sorted(output) == ["1", "2"]
        for pid, entry in output.items():
            path = out / entry["image"]
            assert path.is_file(), f"{variant} pid {pid}: {entry['image']} is not in the run folder"
            with Image.open(path) as img:
                assert img.convert("RGB").tobytes() == problems[pid]["decoded_image"].convert("RGB").tobytes()
    assert sorted(p.name for p in (out / "images").iterdir()) == ["1.png", "2.png"]  # the selected problems only


def test_the_progress_bar_ends_on_the_reports_pooled_acceptance(run) -> None:
    out, err = run
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rate = summary["variants"]["asymspec"]["acceptance_rate"]
    assert summary["variants"]["floor"]["acceptance_rate"] is None
    shown = re.findall(r"accept \(pooled\) asymspec (\d\.\d{3})", err)
    assert shown and shown[-1] == f"{rate:.3f}", err[-2000:]
    assert re.search(r"\| asymspec \| 2 \|.*\| " + re.escape(f"{rate:.3f}") + r" \|", (out / "report.md").read_text(encoding="utf-8"))
    assert "pooled acceptance" in (out / "report.md").read_text(encoding="utf-8")
