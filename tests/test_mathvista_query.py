"""MathVista data handling: official query text, compressed view, selection counts, loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asymspec_mm.base.errors import DatasetUnavailableError, MissingCompressedViewError, UnknownOptionError
from asymspec_mm.eval import mathvista as mv

MV_DATA = mv.SHIPPED_DIR


@pytest.fixture(scope="module")
def testmini() -> dict:
    return json.loads((MV_DATA / "testmini.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def text() -> mv.TextData:
    return mv.TextData.load(MV_DATA)


def test_build_query_reproduces_official_query_json(testmini: dict, text: mv.TextData) -> None:
    assert len(testmini) == 1000
    mismatched = [pid for pid, prob in testmini.items() if mv.build_query(prob) != text.queries[pid]]
    assert mismatched == []
    # official_query prefers query.json, then the builder
    prob = dict(testmini["5"])
    assert mv.official_query(prob, None) == text.queries["5"]


def test_query_layout_details(testmini: dict) -> None:
    q = mv.build_query(testmini["5"])
    assert q.splitlines() == [
        "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.",
        "Question: Find $m\\angle H$",
        "Choices:",
        "(A) 97",
        "(B) 102",
        "(C) 107",
        "(D) 122",
    ]
    assert mv.build_query(testmini["2"]).endswith("Question: what is the total volume of the measuring cup? (Unit: g)")
    # build_query.py's prompt layout: question, choices, caption, OCR, hint, "Solution: "
    p = mv.build_query(testmini["5"], layout="prompt", caption="A rhombus.", ocr="[([1, 2], 'H')]")
    lines = p.splitlines()
    assert lines[0] == "Question: Find $m\\angle H$"
    assert lines[6:] == [
        "Image description: A rhombus.",
        "Image detected text: [([1, 2], 'H')]",
        mv.HINTS["multi_choice"],
        "Solution:",
    ]
    with pytest.raises(UnknownOptionError):
        mv.build_query(testmini["5"], layout="other")


def test_hints_by_answer_type() -> None:
    base = {"question": "q", "unit": None, "choices": None, "question_type": "free_form"}
    assert mv.hint_text(dict(base, answer_type="integer")) == mv.HINTS["integer"]
    assert mv.hint_text(dict(base, answer_type="float", precision=1)) == mv.HINTS["float1"]
    assert mv.hint_text(dict(base, answer_type="float", precision=2.0)) == mv.HINTS["float2"]
    assert mv.hint_text(dict(base, answer_type="list")) == mv.HINTS["list"]
    assert mv.hint_text(dict(base, question_type="multi_choice", answer_type="text")) == mv.HINTS["multi_choice"]
    assert mv.hint_text(dict(base, answer_type="integer"), shot_type="code") == mv.HINTS["code"]


def test_refine_caption_and_ocr() -> None:
    assert mv.refine_caption("Sure. The image shows  a cat. I hope this helps!") == "The image shows a cat."
    assert mv.refine_caption(None) == ""
    raw = "[([[161, 39], [766, 39], [766, 120], [161, 120]], 'The spring force does', 0.91), ([[5.0, 3], [9, 3], [9, 9], [5, 9]], \"it's\", 0.5)]"
    plain = mv.refine_ocr(raw)
    assert plain == "[([161, 39], 'The spring force does'), ([5, 3], \"it's\")]"
    assert mv.refine_ocr(plain) == plain  # idempotent on MathVista's plain form
    assert mv.refine_ocr("") == "" and mv.refine_ocr("[]") == "" and mv.refine_ocr(None) == ""
    # parsed as a literal, never evaluated
    assert mv.refine_ocr("__import__('os').system('echo hacked')") == ""


def test_official_view_for_a_problem(testmini: dict, text: mv.TextData) -> None:
    prob = testmini["1"]
    caption, ocr = mv.view_for(prob, "official", text)
    assert caption.startswith("The image shows a free body diagram")  # "Sure. " removed
    assert isinstance(ocr, str) and ocr.startswith("[([161, 39], 'The spring force does'),")
    assert mv.view_for(prob, "auto", text) == (None, None)
    assert mv.view_for(prob, "none", text) == ("", False)
    # a problem whose EasyOCR output is empty gets ocr=False (no OCR line), not None (= run OCR)
    empty_ocr = next(pid for pid in testmini if text.ocrs.get(pid) == "[]")
    assert mv.view_for(testmini[empty_ocr], "official", text)[1] is False
    with pytest.raises(MissingCompressedViewError):
        mv.view_for({"pid": "x"}, "official", None, dataset="minivista")
    with pytest.raises(UnknownOptionError):
        mv.view_for(prob, "bogus", text)


def test_paper_subset_counts(testmini: dict, text: mv.TextData) -> None:
    problems = mv.load_local_problems(MV_DATA)
    assert len(problems) == 1000
    tasks = mv.resolve_tasks("GPS,VQA,FQA")
    assert tasks == mv.resolve_tasks(list(mv.DEFAULT_TASKS))
    assert len(mv.select_problems(problems, tasks=tasks)) == 656
    subset = mv.select_problems(problems, tasks=tasks, require_caption=True, text=text)
    assert len(subset) == 587  # the paper's subset
    # 7 of them are Bard refusals that MathVista's caption clean-up empties
    assert sum(1 for p in subset if not text.caption(p["pid"])) == 7
    assert len(mv.select_problems(problems, require_caption=True, text=text)) == 930
    assert len(mv.select_problems(problems, tasks=mv.resolve_tasks("all"))) == 1000
    by_task = {t: len(mv.select_problems(problems, tasks=(t,), require_caption=True, text=text)) for t in tasks}
    assert sum(by_task.values()) == 587


def test_limit_and_shards_partition_the_selection(text: mv.TextData) -> None:
    problems = mv.load_local_problems(MV_DATA)
    tasks = mv.resolve_tasks("GPS,VQA,FQA")
    full = mv.select_problems(problems, tasks=tasks, require_caption=True, text=text, limit=50)
    assert len(full) == 50
    pids = [p["pid"] for p in full]
    assert pids == sorted(pids, key=int)
    shards = [mv.select_problems(problems, tasks=tasks, require_caption=True, text=text, limit=50, shard=(i, 3)) for i in range(3)]
    flat = [p["pid"] for s in shards for p in s]
    assert sorted(flat, key=int) == pids and len(set(flat)) == 50
    again = mv.select_problems(problems, tasks=tasks, require_caption=True, text=text, limit=50, shard=(1, 3))
    assert [p["pid"] for p in again] == [p["pid"] for p in shards[1]]


def test_parse_shard_and_tasks() -> None:
    assert mv.parse_shard("0/4") == (0, 4) and mv.parse_shard(None) is None
    for bad in ("4/4", "1", "a/b", "1/0"):
        with pytest.raises(UnknownOptionError):
            mv.parse_shard(bad)
    assert mv.resolve_tasks("gps, geometry problem solving") == ("geometry problem solving",)
    with pytest.raises(UnknownOptionError):
        mv.resolve_tasks("XYZ")


def test_build_variants_names_and_configs() -> None:
    vs = mv.build_variants("asymspec,floor,tuned,beta0,sd,raw", k=[2, 4], beta=[0.5], lam=[0.1], common={"max_new_tokens": 64})
    names = [v.name for v in vs]
    assert names == [
        "asymspec@k=2,beta=0.5",
        "asymspec@k=4,beta=0.5",
        "floor",
        "tuned@k=2,beta=0.5,lam=0.1",
        "tuned@k=4,beta=0.5,lam=0.1",
        "beta0@k=2",
        "beta0@k=4",
        "sd@k=2",
        "sd@k=4",
        "raw@k=2,beta=0.5",
        "raw@k=4,beta=0.5",
    ]
    by = {v.name: v for v in vs}
    assert by["floor"].method == "floor" and dict(by["floor"].config) == {"max_new_tokens": 64}
    assert dict(by["tuned@k=2,beta=0.5,lam=0.1"].config) == {"max_new_tokens": 64, "gate": "tuned", "k": 2, "beta": 0.5, "lam": 0.1}
    assert dict(by["beta0@k=4"].config)["beta"] == 0.0 and by["beta0@k=4"].method == "asymspec"
    assert dict(by["raw@k=2,beta=0.5"].config)["delta"] == "raw"
    assert [v.name for v in mv.build_variants(["asymspec", "scd", "fixed", "drafter"])] == ["asymspec", "scd", "fixed", "drafter"]
    assert mv.parse_list("2, 4,8", int) == [2, 4, 8]
    with pytest.raises(UnknownOptionError):
        mv.build_variants("asymspec,magic")


def test_local_folder_loading_and_images(tmp_path: Path) -> None:
    from PIL import Image

    probs = {
        "1": {
            "pid": "1",
            "question": "How many?",
            "image": "images/1.png",
            "choices": None,
            "unit": None,
            "precision": None,
            "answer": "3",
            "question_type": "free_form",
            "answer_type": "integer",
            "metadata": {"task": "figure question answering"},
        },
        "2": {
            "pid": "2",
            "question": "Which?",
            "image": "images/2.png",
            "choices": ["a", "b"],
            "unit": None,
            "precision": None,
            "answer": "a",
            "question_type": "multi_choice",
            "answer_type": "text",
            "metadata": {"task": "math word problem"},
        },
    }
    (tmp_path / "testmini.json").write_text(json.dumps(probs), encoding="utf-8")
    (tmp_path / "images").mkdir()
    Image.new("P", (4, 3)).save(tmp_path / "images" / "1.png")
    loaded = mv.load_problems("local", data_dir=tmp_path)
    assert [p["pid"] for p in loaded] == ["1", "2"]
    with pytest.raises(DatasetUnavailableError, match="--images-dir"):
        mv.check_images(loaded)
    mv.check_images([loaded[0]])
    img = mv.load_image(loaded[0])
    assert img.mode == "RGB" and img.size == (4, 3)
    # images given separately (flat folder) are found too
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (2, 2)).save(flat / "2.png")
    loaded2 = mv.load_problems("auto", data_dir=tmp_path / "testmini.json", images_dir=flat)
    mv.check_images([loaded2[1]])
    with pytest.raises(DatasetUnavailableError, match="--data-dir"):
        mv.load_local_problems(tmp_path / "nothing-here")


def test_hf_source_without_datasets_says_how_to_provide_data() -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DatasetUnavailableError, match="pip install datasets"):
            mv.load_problems("hf")
    else:
        pytest.skip("`datasets` is installed; loading would try the network")


def test_minivista_loader() -> None:
    try:
        import asymspec_mm.eval.minivista  # noqa: F401
    except ImportError:
        pytest.skip("asymspec_mm.eval.minivista is not present")
    problems = mv.load_minivista_problems(4, seed=0)
    assert len(problems) == 4
    for p in problems:
        assert isinstance(p["pid"], str)
        assert p.get("decoded_image") is not None or p.get("image")
        assert mv.build_query(p) if "question_type" in p else True


def test_cli_dry_run_counts_the_paper_subset(capsys: pytest.CaptureFixture[str]) -> None:
    from asymspec_mm.eval.cli import main

    args = ["eval", "mathvista", "--source", "local", "--data-dir", str(MV_DATA), "--text-dir", str(MV_DATA), "--dry-run"]
    assert main(args + ["--require-caption"]) == 0
    assert capsys.readouterr().out.startswith("587 problems (mathvista, tasks=GPS,VQA,FQA, require_caption=True) x 4 variants")
    assert main(args + ["--tasks", "all", "--methods", "asymspec,floor", "--k", "2,4"]) == 0
    assert "1000 problems" in capsys.readouterr().out
    # without images a real run stops before loading any model, saying how to provide them
    assert main(args[:-1] + ["--require-caption", "--limit", "2", "--out", "/nonexistent/never-written"]) == 2
    assert "--images-dir" in capsys.readouterr().err
