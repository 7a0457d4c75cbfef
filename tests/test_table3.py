"""The report's comparison with the paper's Table 3: shown for the paper protocol on the paper's 587 problems,
left out otherwise; and a small ``--protocol paper`` run end to end on the tiny pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval.cli import main as cli_main
from asymspec_mm.eval.paper_extraction import paper_extract, paper_is_correct

SHARED_MV = mv.SHIPPED_DIR  # the MathVista text data shipped with the package

SHORT = {"geometry problem solving": "GPS", "visual question answering": "VQA", "figure question answering": "FQA"}
# correct answers per task of each method: GPS has 208 problems, VQA 110, FQA 269
CORRECT = {"drafter": (111, 62, 182), "floor": (129, 54, 78), "sd": (129, 51, 77), "asymspec": (130, 65, 123)}


def subset() -> list[dict[str, Any]]:
    problems = json.loads((SHARED_MV / "testmini.json").read_text(encoding="utf-8"))
    captions = json.loads((SHARED_MV / "captions_bard.json").read_text(encoding="utf-8"))["texts"]
    return [{**p, "pid": pid} for pid, p in problems.items() if p["metadata"]["task"] in SHORT and pid in captions]


def records_of(
    method: str, problems: list[dict], *, protocol: str = "paper", config: dict | None = None, name: str | None = None
) -> list[dict]:
    """Records in the runner's shape; the first CORRECT[method][task] problems of each task are right."""
    seen = {"GPS": 0, "VQA": 0, "FQA": 0}
    out = []
    for p in problems:
        task = SHORT[p["metadata"]["task"]]
        right = seen[task] < CORRECT[method][("GPS", "VQA", "FQA").index(task)]
        seen[task] += 1
        out.append(
            {
                "pid": p["pid"],
                "variant": name or method,
                "method": method,
                "config": config or {"max_new_tokens": 1024},
                "compressed": "official",
                "protocol": protocol,
                "scoring": "paper" if protocol == "paper" else "mathvista",
                "paper_subset": True,
                "response": "x",
                "extraction": "x",
                "prediction": "x",
                "true_false": right,
                "task": p["metadata"]["task"],
                "stats": {},
                "problem": {k: p.get(k) for k in ("pid", "question_type", "answer_type", "choices", "answer", "metadata")},
            }
        )
    return out


def expected_row(label: str, variant: str, method: str, paper: tuple[float, ...]) -> str:
    totals = (208, 110, 269)
    run = [100 * c / t for c, t in zip(CORRECT[method], totals)] + [100 * sum(CORRECT[method]) / 587]
    cells = [f"{r:.1f} / {p:.1f} ({round(r - p, 1) + 0.0:+.1f})" for r, p in zip(run, paper)]
    return f"| {label} | {variant} | " + " | ".join(cells) + " |"


def test_table3_beside_a_paper_run(tmp_path: Path) -> None:
    problems = subset()
    assert len(problems) == 587
    records = [r for m in ("drafter", "floor", "sd", "asymspec") for r in records_of(m, problems)]
    records += records_of("asymspec", problems, config={"k": 2, "max_new_tokens": 1024}, name="asymspec@k=2")
    summary = mv.finalize_run(records, tmp_path, chart=False, log=lambda s: None)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Against the paper's Table 3" in report
    lines = report.splitlines()
    assert expected_row("VL drafter alone", "drafter", "drafter", (53.4, 56.4, 67.7, 60.5)) in lines
    assert expected_row("Floor", "floor", "floor", (62.0, 49.1, 29.0, 44.5)) in lines
    assert expected_row("SD", "sd", "sd", (62.0, 46.4, 28.6, 43.8)) in lines
    assert expected_row("AsymSpec", "asymspec", "asymspec", (62.1, 59.1, 45.7, 53.9)) in lines
    # hand-computed: 130/208 = 62.5, 65/110 = 59.09, 123/269 = 45.72, 318/587 = 54.17
    assert "| AsymSpec | asymspec | 62.5 / 62.1 (+0.4) | 59.1 / 59.1 (+0.0) | 45.7 / 45.7 (+0.0) | 54.2 / 53.9 (+0.3) |" in lines
    assert "- asymspec@k=2: settings differ from Table 3's (k=2)" in lines
    rows = {r["variant"]: r for r in summary["table3"]}
    assert set(rows) == {"drafter", "floor", "sd", "asymspec", "asymspec@k=2"}
    assert rows["floor"]["diff"]["All"] == pytest.approx(100 * 261 / 587 - 44.5)
    # the official outputs keep the paper's scores
    out = json.loads((tmp_path / "output_asymspec.json").read_text(encoding="utf-8"))
    assert sum(e["true_false"] for e in out.values()) == 318


@pytest.mark.parametrize("case", ["mathvista_protocol", "one_problem_short", "mathvista_scoring", "not_in_subset", "own_captions"])
def test_table3_left_out_unless_the_paper_setting(tmp_path: Path, case: str) -> None:
    problems = subset()
    protocol = "mathvista" if case == "mathvista_protocol" else "paper"
    records = [r for m in ("floor", "asymspec") for r in records_of(m, problems, protocol=protocol)]
    if case == "one_problem_short":
        records = [r for r in records if r["pid"] != problems[-1]["pid"]]
    if case == "mathvista_scoring":  # --protocol paper with --extract rules
        records = [{**r, "scoring": "mathvista"} for r in records]
    if case == "own_captions":  # --compressed auto: the pipeline's captions, not Bard's
        records = [{**r, "compressed": "auto"} for r in records]
    if case == "not_in_subset":
        records[0]["paper_subset"] = False
        records[587]["paper_subset"] = False
    summary = mv.finalize_run(records, tmp_path, chart=False, log=lambda s: None)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Table 3" not in report.replace("in the style of the paper's Table 3", "") and "table3" not in summary
    title = "MathVista-format" + ("" if protocol == "mathvista" else " (paper protocol)")  # the records name no dataset
    assert report.startswith(f"# {title} results\n\n| Method |")


def test_only_the_variants_on_the_paper_setting_are_compared(tmp_path: Path) -> None:
    problems = subset()
    records = records_of("floor", problems) + records_of("asymspec", problems[:100])
    mv.finalize_run(records, tmp_path, chart=False, log=lambda s: None)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| Floor | floor |" in report and "| AsymSpec |" not in report


def test_paper_protocol_end_to_end_on_the_tiny_pair(tiny_dirs, tmp_path: Path) -> None:
    """``eval mathvista --protocol paper`` on three real MathVista problems (one per task) with rendered images:
    records carry the protocol, the paper's extraction and score; three problems are not Table 3's setting."""
    from PIL import Image

    problems = json.loads((SHARED_MV / "testmini.json").read_text(encoding="utf-8"))
    data = tmp_path / "data"
    chosen = {pid: problems[pid] for pid in ("499", "779", "202")}  # GPS, VQA, FQA
    for i, p in enumerate(chosen.values()):
        path = data / p["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (60 * i, 120, 200)).save(path)
    (data / "testmini.json").write_text(json.dumps(chosen), encoding="utf-8")
    drafter, verifier = tiny_dirs

    def run(out: Path, *extra: str) -> list[dict]:
        rc = cli_main(
            ["eval", "mathvista", "--protocol", "paper", "--data-dir", str(data), "--text-dir", str(SHARED_MV), "--require-caption"]
            + ["--methods", "drafter,asymspec", "--max-new-tokens", "6", "--out", str(out), "--no-progress", "--no-chart", *extra]
            + ["--drafter", str(drafter), "--verifier", str(verifier), "--device", "cpu", "--ocr-engine", "none"]
        )
        assert rc == 0
        return [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines()]

    out = tmp_path / "run"
    records = run(out)
    batched = run(tmp_path / "batched", "--batch-size", "3")  # generate_batch prepares with the pipeline's style too
    keep = ("variant", "pid", "response", "extraction", "true_false", "new_tokens", "protocol", "scoring")
    assert [{k: r[k] for k in keep} for r in batched] == [{k: r[k] for k in keep} for r in records]
    assert sorted((r["variant"], r["pid"]) for r in records) == sorted((v, p) for v in ("drafter", "asymspec") for p in chosen)
    for r in records:
        assert (r["protocol"], r["scoring"], r["paper_subset"]) == ("paper", "paper", True)
        ext = paper_extract(r["response"], r["problem"])
        assert (r["extraction"], r["extraction_rule"], r["prediction"]) == (ext.answer, ext.rule, ext.answer)
        assert r["true_false"] is paper_is_correct(ext.answer, r["problem"])
        assert r["new_tokens"] <= 6
    assert "Table 3" not in (out / "report.md").read_text(encoding="utf-8").replace("in the style of the paper's Table 3", "")
