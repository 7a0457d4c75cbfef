"""The MathVista runner's bookkeeping (records, resume, errors, shards) and its outputs/report.

Bookkeeping tests drive the harness with ``ScriptedPipe``, a small deterministic class with the
pipeline's ``generate`` signature: they test the harness, not a model. The end-to-end test runs
the real pipeline on random-weight tiny checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval.cli import main as cli_main
from asymspec_mm.eval.scoring import compute_scores

TASKS = ["geometry problem solving", "visual question answering", "figure question answering"]


def make_problems(n: int = 6) -> list[dict[str, Any]]:
    """MathVista-format problems with small Pillow images (alternating multiple choice / integer)."""
    problems = []
    for i in range(1, n + 1):
        mc = i % 2 == 1
        problems.append(
            {
                "pid": str(i),
                "question": f"How many red squares are in figure {i}?" if not mc else f"Which colour dominates figure {i}?",
                "image": f"images/{i}.png",
                "decoded_image": Image.new("RGB", (24, 16), (40 * i % 255, 90, 160)),
                "choices": ["red", "green", "blue"] if mc else None,
                "unit": None,
                "precision": None,
                "answer": ["red", "green", "blue"][i % 3] if mc else str(i % 4),
                "question_type": "multi_choice" if mc else "free_form",
                "answer_type": "text" if mc else "integer",
                "metadata": {
                    "split": "testmini",
                    "language": "english",
                    "source": "Synthetic",
                    "category": "math-targeted-vqa",
                    "task": TASKS[i % 3],
                    "context": "synthetic scene",
                    "grade": "elementary school",
                    "skills": ["arithmetic reasoning"] if mc else ["arithmetic reasoning", "statistical reasoning"],
                },
            }
        )
    return problems


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: dict[str, Any]


@dataclass
class ScriptedPipe:
    """Deterministic ``generate`` keyed on (question, method, config); can fail on a given call."""

    fail_on_call: int | None = None
    exc: type[BaseException] = KeyboardInterrupt
    fail_pids: tuple[str, ...] = ()
    calls: list[dict[str, Any]] = field(default_factory=list)

    def generate(
        self, image: Any, question: str, caption: Any = None, ocr: Any = None, method: str = "asymspec", config: Any = None
    ) -> Result:
        self.calls.append(
            {
                "question": question,
                "caption": caption,
                "ocr": ocr,
                "method": method,
                "config": dict(config or {}),
                "image_size": getattr(image, "size", None),
            }
        )
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise self.exc()
        if any(f"figure {pid}?" in question for pid in self.fail_pids):
            raise RuntimeError("CUDA out of memory (simulated)")
        h = int(hashlib.sha256(f"{question}|{method}|{sorted(dict(config or {}).items())}".encode()).hexdigest(), 16)
        answer = "ABC"[h % 3] if "Choices:" in question else str(h % 4)
        drafted = 0 if method in ("floor", "drafter") else 8
        accepted = 0 if not drafted else h % 9
        n_tok = 10 + h % 5
        stats = {
            "steps": 3,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_length": 1 + accepted / 3,
            "new_tokens": n_tok,
            "wall_s": 0.5,
            "tokens_per_s": n_tok / 0.5,
            "accepted_per_position": [1.0, 0.5],
        }
        return Result(f"Let me look at the figure.\nThe answer is {answer}.", list(range(n_tok)), stats)


VOLATILE = ("time", "wall_s")


def stable(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {mv.record_key(r): {k: v for k, v in r.items() if k not in VOLATILE} for r in records}


def run(pipe: Any, problems: list[dict], variants: list[mv.Variant], path: Path, **kw: Any) -> mv.RunSummary:
    kw.setdefault("compressed", "none")
    return mv.run_mathvista(pipe, problems, variants, path, config_factory=dict, progress=False, log=lambda s: None, **kw)


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_interrupt_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    problems = make_problems(6)
    variants = mv.build_variants("asymspec,floor,sd", k=[2], common={"max_new_tokens": 32})
    total = len(problems) * len(variants)

    full = run(ScriptedPipe(), problems, variants, tmp_path / "a" / "records.jsonl")
    assert full.new == total and len(full.records) == total

    path = tmp_path / "b" / "records.jsonl"
    crashing = ScriptedPipe(fail_on_call=8)
    with pytest.raises(KeyboardInterrupt):
        run(crashing, problems, variants, path)
    assert len(lines_of(path)) == 7  # everything finished before Ctrl-C is on disk

    with pytest.raises(FileExistsError):
        run(ScriptedPipe(), problems, variants, path)  # neither --resume nor --overwrite
    second = ScriptedPipe()
    resumed = run(second, problems, variants, path, resume=True)
    assert resumed.skipped == 7 and resumed.new == total - 7
    assert len(second.calls) == total - 7  # no finished pair is generated again

    lines = lines_of(path)
    keys = [mv.record_key(r) for r in lines]
    assert len(keys) == len(set(keys)) == total  # no duplicates
    assert stable(lines) == stable(full.records)  # identical to the uninterrupted run
    assert stable(resumed.records) == stable(full.records)

    third = ScriptedPipe()
    again = run(third, problems, variants, path, resume=True)
    assert again.new == 0 and third.calls == [] and len(lines_of(path)) == total


def test_partial_last_line_from_a_crash_is_repaired(tmp_path: Path) -> None:
    problems = make_problems(3)
    variants = mv.build_variants("asymspec")
    path = tmp_path / "records.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run(ScriptedPipe(fail_on_call=3), problems, variants, path)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"pid": "3", "variant": "asymspec", "respo')  # a write cut short
    done = run(ScriptedPipe(), problems, variants, path, resume=True)
    assert done.new == 1
    lines = lines_of(path)  # every line parses
    assert sorted(r["pid"] for r in lines) == ["1", "2", "3"]


def test_overwrite_starts_over(tmp_path: Path) -> None:
    problems = make_problems(2)
    variants = mv.build_variants("floor")
    path = tmp_path / "records.jsonl"
    run(ScriptedPipe(), problems, variants, path)
    redo = run(ScriptedPipe(), problems, variants, path, overwrite=True)
    assert redo.new == 2 and len(lines_of(path)) == 2


def test_failed_generations_are_logged_and_retried_on_resume(tmp_path: Path) -> None:
    problems = make_problems(4)
    variants = mv.build_variants("asymspec,floor")
    path = tmp_path / "records.jsonl"
    first = run(ScriptedPipe(fail_pids=("2",)), problems, variants, path)
    assert len(first.errors) == 2 and first.new == 6
    errors = lines_of(tmp_path / "errors.jsonl")
    assert {e["pid"] for e in errors} == {"2"} and "out of memory" in errors[0]["error"]
    assert ("asymspec", "2") not in {mv.record_key(r) for r in lines_of(path)}
    retry = ScriptedPipe()
    second = run(retry, problems, variants, path, resume=True)
    assert second.new == 2 and len(retry.calls) == 2 and len(lines_of(path)) == 8
    with pytest.raises(RuntimeError):
        run(ScriptedPipe(fail_pids=("1",)), problems, variants, tmp_path / "c" / "records.jsonl", on_error="raise")


def test_resume_with_changed_settings_is_refused(tmp_path: Path) -> None:
    problems = make_problems(2)
    path = tmp_path / "records.jsonl"
    run(ScriptedPipe(), problems, mv.build_variants("asymspec", common={"max_new_tokens": 32}), path)
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(ScriptedPipe(), problems, mv.build_variants("asymspec", common={"max_new_tokens": 64}), path, resume=True)


def test_pipeline_receives_official_query_and_view(tmp_path: Path) -> None:
    problems = make_problems(2)
    text = mv.TextData(
        queries={},
        captions={"1": "Sure. A chart with three coloured bars."},
        ocrs={"1": "[([[3, 4], [9, 4], [9, 9], [3, 9]], 'red', 0.9)]", "2": "[]"},
    )
    pipe = ScriptedPipe()
    run(pipe, problems, mv.build_variants("asymspec,fixed,beta0"), tmp_path / "r.jsonl", text=text, compressed="official")
    first = pipe.calls[0]
    assert first["question"] == mv.build_query(problems[0])
    assert first["caption"] == "A chart with three coloured bars."
    assert first["ocr"] == "[([3, 4], 'red')]"
    assert first["image_size"] == (24, 16)
    assert [c["method"] for c in pipe.calls[:3]] == ["asymspec"] * 3
    assert pipe.calls[1]["config"] == {"gate": "fixed"} and pipe.calls[2]["config"] == {"beta": 0.0}
    assert pipe.calls[3]["caption"] == "" and pipe.calls[3]["ocr"] is False  # pid 2: no caption, empty OCR
    auto = ScriptedPipe()
    run(auto, problems[:1], mv.build_variants("floor"), tmp_path / "auto.jsonl", compressed="auto")
    assert auto.calls[0]["caption"] is None and auto.calls[0]["ocr"] is None


def test_finalize_writes_official_outputs_scores_report_and_chart(tmp_path: Path) -> None:
    problems = make_problems(6)
    variants = mv.build_variants("asymspec,floor,drafter")
    summary = run(ScriptedPipe(), problems, variants, tmp_path / "records.jsonl")
    rec = summary.records[0]
    assert {"pid", "variant", "response", "extraction", "prediction", "true_false", "stats", "wall_s", "problem"} <= set(rec)
    assert rec["stats"]["accepted_per_position"] == [1.0, 0.5]
    result = mv.finalize_run(summary.records, tmp_path, variant_order=[v.name for v in variants], log=lambda s: None)

    output = json.loads((tmp_path / "output_asymspec.json").read_text(encoding="utf-8"))
    assert list(output) == [str(i) for i in range(1, 7)]
    entry = output["1"]
    for key in (*mv.PROBLEM_FIELDS, "query", "response", "extraction", "prediction", "true_false"):
        assert key in entry, key
    assert "decoded_image" not in entry and entry["query"] == mv.build_query(problems[0])
    scores = json.loads((tmp_path / "scores_asymspec.json").read_text(encoding="utf-8"))
    assert scores == json.loads(json.dumps(compute_scores(output)))
    assert scores["average"]["total"] == 6 and set(scores["task"]) == set(TASKS)
    by_variant = {r["pid"]: r for r in summary.records if r["variant"] == "asymspec"}
    assert scores["average"]["correct"] == sum(r["true_false"] for r in by_variant.values())

    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    for token in ("| Method |", "GPS", "VQA", "FQA", "All", "Recovery", "Accept.", "Tok/s", "| asymspec |", "| floor |", "| drafter |"):
        assert token in md
    png = (tmp_path / "accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    s = result["variants"]
    assert s["floor"]["acceptance_rate"] is None and s["asymspec"]["acceptance_rate"] is not None
    assert s["asymspec"]["tokens_per_s"] == pytest.approx(sum(r["stats"]["new_tokens"] for r in by_variant.values()) / (0.5 * 6))
    if s["drafter"]["accuracy"] - s["floor"]["accuracy"] >= 2:
        assert s["floor"]["recovery"] == pytest.approx(0.0) and s["drafter"]["recovery"] == pytest.approx(1.0)
    else:  # the rule of the report: no ratio over a gap that small, and the reason in the cell
        assert s["floor"]["recovery"] is None and s["floor"]["recovery_cell"] in ("drafter not above Floor", "gap < 2 pts")
    assert json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))["files"]["floor"]["scores"].endswith("scores_floor.json")
    # `eval score` on the records JSONL needs --variant when it holds several
    records = str(tmp_path / "records.jsonl")
    assert cli_main(["eval", "score", "--input", records, "--quiet"]) == 2
    assert cli_main(["eval", "score", "--input", records, "--variant", "floor", "--out", str(tmp_path / "s.json"), "--quiet"]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads((tmp_path / "scores_floor.json").read_text())


def test_shards_merge_into_the_unsharded_result(tmp_path: Path) -> None:
    problems = make_problems(7)
    variants = mv.build_variants("asymspec,sd")
    whole = run(ScriptedPipe(), problems, variants, tmp_path / "whole" / "records.jsonl")
    shard_dir = tmp_path / "shards"
    for i in range(3):
        part = mv.select_problems(problems, shard=(i, 3))
        run(ScriptedPipe(), part, variants, shard_dir / mv.records_filename((i, 3)))
    # a shard re-run by mistake into a second folder: duplicates are dropped by merge
    run(ScriptedPipe(), mv.select_problems(problems, shard=(0, 3)), variants, tmp_path / "dup" / "records.jsonl")
    assert cli_main(["eval", "merge", str(shard_dir), str(tmp_path / "dup"), "--out", str(shard_dir), "--no-chart"]) == 0
    merged = lines_of(shard_dir / "records.jsonl")
    assert stable(merged) == stable(whole.records)
    assert (shard_dir / "scores_sd.json").is_file() and (shard_dir / "report.md").is_file()
    # `eval report` rebuilds the outputs from a run folder
    (shard_dir / "report.md").unlink()
    assert cli_main(["eval", "report", str(shard_dir), "--no-chart"]) == 0
    assert (shard_dir / "report.md").stat().st_size > 0
    assert stable(lines_of(shard_dir / "records.jsonl")) == stable(whole.records)


def _has_testing() -> bool:
    try:
        from asymspec_mm.checkpoints.small import build_tiny_checkpoints  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_testing(), reason="needs asymspec_mm.checkpoints.small")
def test_end_to_end_tiny(tmp_path: Path) -> None:
    """The real pipeline (random-weight tiny checkpoints) through the harness: two methods, then resume."""
    from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
    from asymspec_mm.checkpoints.small import build_tiny_checkpoints

    drafter, verifier = build_tiny_checkpoints(tmp_path / "ckpt")
    pipe = AsymSpecPipeline.from_pretrained(drafter=drafter, verifier=verifier, device="cpu")
    problems = make_problems(3)
    for p in problems:  # images rendered with Pillow, given as files like a local MathVista copy
        img = p.pop("decoded_image")
        path = tmp_path / "data" / p["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path)
    (tmp_path / "data" / "testmini.json").write_text(json.dumps({p["pid"]: p for p in problems}), encoding="utf-8")
    loaded = mv.load_problems("local", data_dir=tmp_path / "data")
    mv.check_images(loaded)
    text = mv.TextData(captions={"1": "A blue rectangle."}, ocrs={"1": "[([[1, 1], [5, 1], [5, 5], [1, 5]], '3', 0.9)]"})
    variants = mv.build_variants("asymspec,floor", common={"max_new_tokens": 6})
    out = tmp_path / "run"
    records = out / "records.jsonl"
    with pytest.raises(KeyboardInterrupt):
        mv.run_mathvista(_InterruptAfter(pipe, 3), loaded, variants, records, text=text, progress=False, log=lambda s: None)
    assert len(lines_of(records)) == 3
    summary = mv.run_mathvista(pipe, loaded, variants, records, text=text, resume=True, progress=False, log=lambda s: None)
    assert summary.new == 3 and len(summary.records) == 6
    assert isinstance(AsymSpecConfig(**dict(variants[0].config)), AsymSpecConfig)
    for r in summary.records:
        assert isinstance(r["response"], str) and r["stats"]["new_tokens"] <= 6
        assert r["true_false"] in (True, False)
    asym = [r for r in summary.records if r["variant"] == "asymspec"]
    assert all("acceptance_rate" in r["stats"] for r in asym)
    mv.finalize_run(summary.records, out, log=lambda s: None)
    assert (out / "scores_asymspec.json").is_file() and (out / "accuracy.png").stat().st_size > 0


class _InterruptAfter:
    """Wraps a real pipeline and raises KeyboardInterrupt on the call after ``n`` successful ones."""

    def __init__(self, pipe: Any, n: int) -> None:
        self.pipe, self.n = pipe, n

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.n == 0:
            raise KeyboardInterrupt
        self.n -= 1
        return self.pipe.generate(*args, **kwargs)
