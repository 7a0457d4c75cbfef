"""MathVista's official normalisation and scoring (asymspec_mm.eval.scoring), checked against published results."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from asymspec_mm.eval import scoring as sc
from asymspec_mm.eval.cli import main as cli_main

FIXTURE = Path(__file__).resolve().parent / "data" / "mathvista_bard_slice.json"


def norm(extraction, choices=None, question_type="free_form", answer_type="integer", precision=None, **kw):
    return sc.normalize_extracted_answer(extraction, choices, question_type, answer_type, precision, **kw)


CHOICES = ["3/11", "8/11", "6/11", "3/5"]


def test_edit_distance_and_most_similar() -> None:
    assert sc.edit_distance("kitten", "sitting") == 3
    assert sc.edit_distance("", "abc") == 3 and sc.edit_distance("abc", "abc") == 0
    assert sc.most_similar_choice("92.5", ["97", "102", "107", "122"]) == "97"  # published pid 5
    assert sc.most_similar_choice("x", ["ab", "cd"]) == "ab"  # ties: the first choice


def test_multi_choice_normalisation() -> None:
    mc = dict(choices=CHOICES, question_type="multi_choice", answer_type="text")
    assert norm("B", **mc) == "8/11"
    assert norm(" D ", **mc) == "3/5"
    assert norm("(B) 8/11", **mc) == "8/11"  # letter in parentheses wins
    assert norm("(c)", **mc) == "6/11"  # lower-case letter in parentheses
    assert norm("6/11", **mc) == "6/11"  # the choice text itself
    assert norm("8/12", **mc) == "8/11"  # closest by edit distance
    assert norm("E", **mc) in CHOICES  # a letter beyond the options is matched as text
    assert norm("c", **mc) in CHOICES  # a bare lower-case letter is not an option letter
    # empty extraction: official behaviour picks the choice closest to "" (the shortest)
    assert norm("", **mc) == "3/5"
    assert norm("", ignore_empty=True, **mc) is None
    assert norm(None, **mc) in CHOICES  # str(None) is matched like any text
    # choices that are letters themselves (published pid 10)
    assert norm("E", choices=list("ABCDE"), question_type="multi_choice", answer_type="text") == "E"


def test_integer_float_list_normalisation() -> None:
    assert norm("3") == "3"
    assert norm("3.0") == "3" and norm("3.9") == "3"  # int(float(x)) truncates
    assert norm("-2") == "-2"
    assert norm("1,000") is None and norm("") is None and norm(None) is None and norm("three") is None
    f1 = dict(answer_type="float", precision=1)
    f2 = dict(answer_type="float", precision=2)
    assert norm("0.11", **f1) == "0.1"  # published pid 1
    assert norm("1.456", **f2) == "1.46"
    assert norm("2.5", **f2) == "2.5"  # no trailing zero, as str(round(...)) gives
    assert norm("7", **f1) == "7.0"
    assert norm("-4.25", **f1) == "-4.2"  # Python's round-half-even on the binary value
    assert norm("1.456", answer_type="float", precision=2.0) == "1.46"  # HF stores precision as float
    assert norm("abc", **f2) is None and norm("", **f1) is None
    assert norm("[2014, 2016]", answer_type="list") == "[2014, 2016]"
    assert norm([2014, 2016], answer_type="list") == "[2014, 2016]"


def test_score_problem_and_safe_equal() -> None:
    prob = {"choices": None, "question_type": "free_form", "answer_type": "float", "precision": 2, "answer": "0.21"}
    assert sc.score_problem(prob, "0.2099") == ("0.21", True)
    assert sc.score_problem(prob, "0.2") == ("0.2", False)
    assert sc.score_problem(prob, "") == (None, False)
    assert sc.safe_equal("1", "1") and not sc.safe_equal(1, "1") and not sc.safe_equal(None, "0")


def _problem(pid: str, tf: bool, task: str, skills: list[str], qt: str = "free_form") -> dict:
    return {
        "pid": pid,
        "true_false": tf,
        "question_type": qt,
        "answer_type": "integer",
        "metadata": {
            "task": task,
            "skills": skills,
            "language": "english",
            "source": "S",
            "category": "c",
            "context": "ctx",
            "grade": "g",
            "split": "testmini",
        },
    }


def test_compute_scores_shape_and_formatting() -> None:
    res = {
        "1": _problem("1", True, "geometry problem solving", ["a", "b"]),
        "2": _problem("2", False, "geometry problem solving", ["a"]),
        "3": _problem("3", True, "figure question answering", ["b"], qt="multi_choice"),
    }
    s = sc.compute_scores(res)
    assert list(s) == ["average", *sc.SCORE_KEYS]
    assert s["average"] == {"accuracy": "66.67", "correct": 2, "total": 3}
    assert s["task"] == {
        "figure question answering": {"accuracy": "100.00", "correct": 1, "total": 1},
        "geometry problem solving": {"accuracy": "50.00", "correct": 1, "total": 2},
    }
    assert list(s["task"]) == ["figure question answering", "geometry problem solving"]  # sorted by accuracy
    assert s["skills"] == {"b": {"accuracy": "100.00", "correct": 2, "total": 2}, "a": {"accuracy": "50.00", "correct": 1, "total": 2}}
    # average uses str(round(x, 2)) ("34.8"), breakdowns two decimals ("48.70"), as in scores_bard.json
    many = {str(i): _problem(str(i), i < 348, "t", ["s"]) for i in range(1000)}
    s2 = sc.compute_scores(many)
    assert s2["average"] == {"accuracy": "34.8", "correct": 348, "total": 1000}
    assert s2["task"]["t"]["accuracy"] == "34.80"


@pytest.fixture()
def published() -> dict:
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert "CC BY-SA 4.0" in doc["_license"]
    return doc["results"]


def _expected_scores(results: dict) -> dict:
    """Counts recomputed from the *published* true_false values, by plain counting."""
    avg_c = sum(1 for r in results.values() if r["true_false"])
    out = {"average": (avg_c, len(results))}
    for key in sc.SCORE_KEYS:
        tot, cor = Counter(), Counter()
        for r in results.values():
            v = r.get(key, r["metadata"].get(key))
            for x in v if isinstance(v, list) else [v]:
                tot[x] += 1
                cor[x] += bool(r["true_false"])
        out[key] = {x: (cor[x], tot[x]) for x in tot}
    return out


def test_published_bard_slice_is_reproduced(published: dict) -> None:
    expected = _expected_scores(published)
    assert expected["average"] == (12, 33)
    mine = copy.deepcopy(published)
    for r in mine.values():
        del r["prediction"], r["true_false"]
    scores = sc.score_results(mine)
    for pid, r in mine.items():  # every published prediction and verdict
        assert (r["prediction"], r["true_false"]) == (published[pid]["prediction"], published[pid]["true_false"]), pid
    assert scores["average"] == {"accuracy": "36.36", "correct": 12, "total": 33}
    for key in sc.SCORE_KEYS:
        got = {v: (s["correct"], s["total"]) for v, s in scores[key].items()}
        assert got == expected[key], key
        for s in scores[key].values():
            assert s["accuracy"] == "{:.2f}".format(100 * s["correct"] / s["total"])
    assert scores["task"]["geometry problem solving"] == {"accuracy": "55.56", "correct": 5, "total": 9}


def test_eval_score_cli_on_published_output(tmp_path: Path, published: dict) -> None:
    out_json = tmp_path / "output_bard_slice.json"
    out_json.write_text(json.dumps(published, ensure_ascii=False), encoding="utf-8")
    assert cli_main(["eval", "score", "--input", str(out_json), "--quiet", "--write-output", str(tmp_path / "scored.json")]) == 0
    scores = json.loads((tmp_path / "scores_bard_slice.json").read_text(encoding="utf-8"))
    assert scores["average"] == {"accuracy": "36.36", "correct": 12, "total": 33}
    scored = json.loads((tmp_path / "scored.json").read_text(encoding="utf-8"))
    assert all(scored[p]["true_false"] == published[p]["true_false"] for p in published)


def test_eval_score_cli_extracts_from_responses(tmp_path: Path) -> None:
    base = {"unit": None, "precision": None, "metadata": {"task": "math word problem", "skills": ["x"]}}
    results = {
        "1": dict(
            base,
            pid="1",
            question="q",
            choices=["Yes", "No"],
            answer="No",
            question_type="multi_choice",
            answer_type="text",
            response="The answer is (B). No.",
        ),
        "2": dict(
            base,
            pid="2",
            question="q",
            choices=None,
            answer="4",
            question_type="free_form",
            answer_type="integer",
            response="So there are 4 objects left.\n\nThe answer is 4.",
        ),
        "3": dict(
            base,
            pid="3",
            question="q",
            choices=None,
            answer="1.2",
            question_type="free_form",
            answer_type="float",
            precision=1,
            response="The distance is 0.11 m.",
        ),
    }
    inp = tmp_path / "out.json"
    inp.write_text(json.dumps(results), encoding="utf-8")
    assert cli_main(["eval", "score", "--input", str(inp), "--out", str(tmp_path / "s.json"), "--quiet"]) == 0
    scores = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert scores["average"] == {"accuracy": "66.67", "correct": 2, "total": 3}


def test_missing_answer_is_taken_from_ground_truth() -> None:
    res = {"7": {"pid": "7", "extraction": "B", "choices": None, "question_type": "free_form"}}
    gt = {
        "7": {
            "answer": "quarter",
            "choices": ["half", "quarter"],
            "question_type": "multi_choice",
            "answer_type": "text",
            "precision": None,
            "metadata": {"task": "math word problem"},
        }
    }
    # fields present in the output win (question_type free_form here), absent ones come from gt
    scores = sc.score_results(res, ground_truth=gt)
    assert res["7"]["answer"] == "quarter" and scores["average"]["total"] == 1
    with pytest.raises(KeyError):
        sc.score_results({"8": {"pid": "8", "extraction": "1"}})


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "out.json",
            '{\n "1": {"response": "A"},\n "2": {oops}\n}\n',
            "out.json: invalid JSON (Expecting property name enclosed in double quotes at line 3, column 8); fix the file",
        ),
        ("out.json", "", "out.json: invalid JSON (Expecting value at line 1, column 1)"),
        ("out.json", '["a", "b"]', "out.json: a list of problems needs a 'pid' in every item"),
        ("out.json", '{"1": "A"}', "out.json: expected an output JSON keyed by pid"),
        (
            "records.jsonl",
            '{"pid": "1", "variant": "floor"}\n{"pid": "2", "variant": \n',
            "records.jsonl:2: invalid JSON (Expecting value at column 25)",
        ),
        ("records.jsonl", '{"pid": "1"}\n[1, 2]\n', "records.jsonl:2: not a record (a JSON object with a 'pid')"),
    ],
)
def test_eval_score_on_a_broken_file_is_one_line_naming_it(tmp_path: Path, capsys, name: str, content: str, message: str) -> None:
    inp = tmp_path / name
    inp.write_text(content, encoding="utf-8")
    assert cli_main(["eval", "score", "--input", str(inp), "--out", str(tmp_path / "s.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / message}"), err
    assert not (tmp_path / "s.json").exists()


def test_eval_score_on_a_broken_ground_truth_names_it(tmp_path: Path, capsys) -> None:
    inp = tmp_path / "out.json"
    inp.write_text(json.dumps({"1": {"pid": "1", "extraction": "3"}}), encoding="utf-8")
    gt = tmp_path / "testmini.json"
    gt.write_bytes(b'{"1": {"answer": "3"},}')
    assert cli_main(["eval", "score", "--input", str(inp), "--gt", str(gt), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{gt}: invalid JSON (" in err and "line 1, column 23" in err, err
    gt.write_bytes(b'{"1": "\xff"}')
    assert cli_main(["eval", "score", "--input", str(inp), "--gt", str(gt), "--quiet"]) == 2
    assert f"{gt}: not UTF-8 text" in capsys.readouterr().err
