"""``eval mathvista --temperature T --samples N``: N seeded samples per problem, each a resumable variant, with the
request seed derived from the sample and the problem; the report's mean over samples; the settings in the run's
identity. The bundled tiny pair on MiniVista, in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asymspec_mm.eval.cli import main as cli_main
from asymspec_mm.eval.samples import base_name, problem_seed, sample_variants, sampled_summary
from asymspec_mm.frontend.variants import Variant

BASE = ["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "6", "--limit", "3", "--preset", "tiny"]
BASE += ["--max-new-tokens", "24", "--no-chart", "--no-progress", "--methods", "asymspec"]
SAMPLED = ["--temperature", "0.9", "--top-p", "0.9", "--samples", "2"]


def records_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sampled") / "run"
    assert cli_main([*BASE, *SAMPLED, "--out", str(out)]) == 0
    return out


def test_each_sample_is_a_variant_with_derived_seeds(sampled_run):
    records = records_of(sampled_run)
    assert sorted({r["variant"] for r in records}) == ["asymspec#s0", "asymspec#s1"] and len(records) == 6
    for r in records:
        index = base_name(r["variant"])[1]
        assert r["config"]["seed"] == index and r["config"]["temperature"] == 0.9 and r["config"]["top_p"] == 0.9
        assert r["stats"]["seed"] == problem_seed(index, str(r["pid"]))
    identity = json.loads((sampled_run / "run.json").read_text(encoding="utf-8"))["identity"]
    assert identity["variants"]["asymspec#s1"]["config"]["temperature"] == 0.9


def test_the_report_gives_the_mean_over_samples(sampled_run):
    summary = json.loads((sampled_run / "summary.json").read_text(encoding="utf-8"))
    s = summary["sampled"]["asymspec"]
    per_sample = [summary["variants"][f"asymspec#s{i}"]["accuracy"] for i in range(2)]
    assert s["samples"] == 2 and s["problems"] == 3
    assert s["accuracy"] == pytest.approx(np.mean(per_sample)) and s["per_sample"] == pytest.approx(per_sample)
    assert "## Accuracy under sampling" in (sampled_run / "report.md").read_text(encoding="utf-8")


def test_a_rerun_and_a_batched_run_draw_the_same_tokens(sampled_run, tmp_path):
    out = tmp_path / "batched"
    assert cli_main([*BASE, *SAMPLED, "--batch-size", "3", "--out", str(out)]) == 0
    key = lambda r: (r["variant"], str(r["pid"]))  # noqa: E731
    first = {key(r): r["response"] for r in records_of(sampled_run)}
    assert {key(r): r["response"] for r in records_of(out)} == first
    assert cli_main([*BASE, *SAMPLED, "--resume", "--out", str(out)]) == 0
    assert len(records_of(out)) == 6  # nothing new: every (sample, problem) pair was done


def test_samples_need_a_temperature(capsys):
    assert cli_main([*BASE, "--samples", "3", "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert "--samples 3 needs --temperature > 0" in err and len(err.strip().splitlines()) == 1


def test_sample_variants_and_the_summary():
    v = [Variant("floor", "floor", {}), Variant("asymspec@k=2", "asymspec", {"k": 2})]
    assert sample_variants(v, 1, False) == v
    assert [x.config["seed"] for x in sample_variants(v, 1, True)] == [0, 0]
    names = [x.name for x in sample_variants(v, 2, True)]
    assert names == ["floor#s0", "floor#s1", "asymspec@k=2#s0", "asymspec@k=2#s1"]
    assert base_name("asymspec@k=2#s1") == ("asymspec@k=2", 1) and base_name("floor") == ("floor", None)
    groups = {
        "m#s0": [{"pid": "1", "true_false": True}, {"pid": "2", "true_false": False}],
        "m#s1": [{"pid": "1", "true_false": True}, {"pid": "2", "true_false": True}, {"pid": "3", "true_false": True}],
        "floor": [{"pid": "1", "true_false": True}],
    }
    s = sampled_summary(groups)
    assert list(s) == ["m"] and s["m"]["problems"] == 2 and s["m"]["accuracy"] == pytest.approx(75.0)
    assert problem_seed(0, "1") != problem_seed(1, "1") != problem_seed(0, "2")
