"""SimpleQA through the paper's agent harness (asymspec_mm.eval.simpleqa): the normalized-match grader, the one-line
error when the dataset is absent, the official CSV's columns, the paper's random subset, and the bundled questions
run end to end through ``asymspec-mm eval simpleqa``, the real smolagents CodeAgent, the cached tools and the server
(tiny pair): a protocol check, not a score; a run resumes only itself."""

from __future__ import annotations

import csv
import json

import pytest

from asymspec_mm.cli.main import main as cli_main
from asymspec_mm.eval.gaia_data import ToolCache, ToolCacheMiss
from asymspec_mm.eval.simpleqa import GRADER_NOTE, grade, load_simpleqa, sample_tasks, topic_of, write_bundled_tasks


@pytest.mark.parametrize(
    ("answer", "truth", "verdict"),
    [
        ("Michio Sugeno", "Michio Sugeno", "correct"),
        ("It was michio sugeno.", "Michio Sugeno", "correct"),  # the gold answer's words as one run
        ("Sugeno", "Michio Sugeno", "incorrect"),  # part of it only
        ("The Beatles", "Beatles", "correct"),  # articles left out
        ("José Martí", "Jose Marti", "correct"),  # accents folded
        ("1,024 copies", "1024", "correct"),  # thousands separators dropped
        ("10245", "1024", "incorrect"),  # a word, not a substring
        ("1985", "1986", "incorrect"),
        ("I don't know.", "1986", "not_attempted"),
        ("", "1986", "not_attempted"),
        (None, "1986", "not_attempted"),
    ],
)
def test_the_normalized_match_grades_by_the_gold_answers_words(answer, truth, verdict):
    assert grade(answer, truth) == verdict


def test_the_official_csv_loads_with_its_topics_and_the_paper_subset_is_a_seeded_draw(tmp_path):
    path = tmp_path / "simple_qa_test_set.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["metadata", "problem", "answer"])
        writer.writeheader()
        for i in range(10):
            meta = {"topic": "Art" if i % 2 else "Music", "answer_type": "Date", "urls": ["https://a.example/x?topic='y'"]}
            writer.writerow({"metadata": repr(meta), "problem": f"Question {i}?", "answer": str(1900 + i)})
    tasks = load_simpleqa(path)
    assert [(t.task_id, t.question, t.answer, t.topic) for t in tasks[:2]] == [
        ("simpleqa-0", "Question 0?", "1900", "Music"),
        ("simpleqa-1", "Question 1?", "1901", "Art"),
    ]
    four = sample_tasks(tasks, 4, seed=3)
    assert [t.task_id for t in four] == [t.task_id for t in sample_tasks(tasks, 4, seed=3)]  # the same draw again
    assert len(four) == 4 and four == sorted(four, key=lambda t: int(t.task_id.split("-")[1]))  # in file order
    assert sample_tasks(tasks, None) == tasks and topic_of("not a dict") == ""


def test_a_missing_dataset_is_one_line_naming_where_to_get_it(tmp_path, capsys):
    with pytest.raises(Exception) as err:
        load_simpleqa(tmp_path / "nowhere.csv")
    message = str(err.value)
    assert "\n" not in message and "simple_qa_test_set.csv is not at" in message
    assert "openaipublic.blob.core.windows.net/simple-evals/simple_qa_test_set.csv" in message and "basicv8vc/SimpleQA" in message
    assert "--bundled" in message
    argv = ["eval", "simpleqa", "--simpleqa-csv", str(tmp_path / "nowhere.csv"), "--url", "http://127.0.0.1:9"]
    assert cli_main(argv) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_a_tool_cache_miss_is_one_line_and_never_a_fetch(tmp_path):
    write_bundled_tasks(tmp_path)
    cache = ToolCache.load(tmp_path / "tool_cache.json")
    assert "KQ-7 station history" in cache.search("kq-7 weather HISTORY")
    with pytest.raises(ToolCacheMiss) as err:
        cache.search("population of Mars")
    assert str(err.value) == (
        "web_search('population of Mars'): not in the tool cache (3 cached queries share no word with it); "
        "this harness reads its cache and never searches the web"
    )
    with pytest.raises(ToolCacheMiss, match=r"^visit_webpage\('https://elsewhere.example/'\): not in the tool cache \(3 cached pages\)"):
        cache.visit("https://elsewhere.example/")


def run_bundled(server, out, *more):
    argv = ["eval", "simpleqa", "--bundled", "--url", server.url, "--out", str(out), "--system-prompt", "short", "--rows", "asymspec"]
    argv += ["--compression", "truncate,limit=16,keep_last_turns=2", "--max-steps", "1", "--max-tokens", "8", *more]
    return cli_main(argv)


def test_bundled_questions_run_through_smolagents_and_the_server_and_resume_only_their_own_run(server, tmp_path, capsys):
    """The AsymSpec row over the bundled questions: each CodeAgent step sends the whole history, which the verifier
    reads compressed (older than the last two messages); the table is Table 4's SimpleQA block. A rerun into the
    same folder is refused without --resume, and with another setting; --resume with a wider selection runs only
    the questions the folder does not hold."""
    out = tmp_path / "run"
    assert run_bundled(server, out, "--limit", "1") == 0
    capsys.readouterr()
    assert run_bundled(server, out, "--limit", "1") == 2
    assert "already holds results: pass --resume to continue that run" in capsys.readouterr().err
    assert run_bundled(server, out, "--k", "3", "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume: this run differs from the records in" in err and "settings.k 2 -> 3" in err
    assert run_bundled(server, out, "--limit", "2", "--resume") == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [(r["row"], r["task_id"]) for r in records] == [("asymspec", "simpleqa-0"), ("asymspec", "simpleqa-1")]
    for r in records:
        assert r["error"] is None and r["grade"] == grade(r["answer"], r["truth"]) and r["correct"] == (r["grade"] == "correct")
        assert len(r["requests"]) >= 2  # a step, then the final-answer request
        full = [q["stats"].get("prompt_tokens_full", q["prompt_tokens"]) for q in r["requests"]]
        assert full == sorted(full) and full[-1] > full[0]  # the history grows step by step
        assert all(q["prompt_tokens"] < q["stats"]["prompt_tokens_full"] for q in r["requests"][1:])  # older messages compressed
        assert all(q["stats"]["drafted"] > 0 for q in r["requests"])
    table = (out / "table4.md").read_text().splitlines()
    assert table[0].startswith("Bundled SimpleQA-shaped questions") and table[2] == GRADER_NOTE
    assert table[4] == "| Setting | Method | n | Acc | ratio | AR | MAL |" and table[6].startswith("| Aggregate | AsymSpec | 2 |")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grader"] == "normalized-match" and sum(summary["grades"]["asymspec"].values()) == 2
