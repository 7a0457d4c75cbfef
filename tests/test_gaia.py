"""The paper's GAIA harness (asymspec_mm.eval.gaia): GAIA's scorer by its published rules, the one-line error when
the gated dataset is absent, and the bundled GAIA-shaped tasks run end to end through ``asymspec-mm eval gaia``, the
real smolagents CodeAgent and the server (tiny random pair): a protocol check, not a score."""

from __future__ import annotations

import json

import pytest

from asymspec_mm.cli.main import main as cli_main
from asymspec_mm.eval.gaia_data import load_gaia, write_bundled_tasks
from asymspec_mm.eval.gaia_score import final_answer_of, gaia_match


@pytest.mark.parametrize(
    ("answer", "truth", "right"),
    [
        ("17", "17", True),
        ("$1,700", "1700", True),
        ("17.0 %", "17", True),
        ("seventeen", "17", False),
        ("17 km", "17", False),  # a unit the rule does not strip: not a number
        ("Saint Petersburg", "saint petersburg", True),
        ("St. Petersburg!", "St Petersburg", True),  # punctuation and spaces dropped for a string
        ("Paris", "Lyon", False),
        ("a, b, 3", "A,B,3.0", True),
        ("a; b", "a, b", True),  # either separator
        ("a, b", "a, b, c", False),  # lengths differ
        ("a.b, 2", "ab, 2", False),  # list elements keep their punctuation
        (None, "17", False),
    ],
)
def test_gaia_quasi_exact_match_follows_the_published_rules(answer, truth, right):
    assert gaia_match(answer, truth) is right


def test_the_final_answer_is_the_last_final_answer_line():
    assert final_answer_of("Thinking.\nFINAL ANSWER: 12\nmore\nFinal answer:  Paris \n") == "Paris"
    assert final_answer_of("  just 4 ") == "just 4" and final_answer_of(None) is None


def test_a_missing_gaia_folder_is_one_line_naming_how_to_get_it(tmp_path, capsys):
    with pytest.raises(Exception) as err:
        load_gaia(tmp_path / "nowhere")
    message = str(err.value)
    assert "\n" not in message and "metadata.jsonl" in message
    assert "gaia-benchmark/GAIA" in message and "huggingface-cli download" in message and "--bundled" in message
    assert cli_main(["eval", "gaia", "--gaia-dir", str(tmp_path / "nowhere"), "--url", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_bundled_tasks_run_through_smolagents_and_the_server_in_table4_format(server, tmp_path):
    """Two rows of Table 4 over the three bundled tasks: the CodeAgent's steps each send the whole history, which the
    AsymSpec row's verifier reads compressed (older than the last two messages) and the full-context row reads whole;
    the chart reaches the drafter as pixels and the verifier as its caption; the CSV is truncated for the verifier."""
    out = tmp_path / "run"
    caption = load_gaia(write_bundled_tasks(tmp_path / "tasks"))[1].caption
    args = ["eval", "gaia", "--bundled", "--url", server.url, "--rows", "asymspec,verifier-full", "--out", str(out)]
    args += ["--compression", "truncate,limit=16,keep_last_turns=2", "--file-limit", "40", "--max-steps", "1", "--max-tokens", "8"]
    assert cli_main([*args, "--system-prompt", "short"]) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [(r["row"], r["task_id"]) for r in records] == [
        (row, t) for row in ("asymspec", "verifier-full") for t in ("bundled-web-1", "bundled-image-1", "bundled-file-1")
    ]
    by = {(r["row"], r["task_id"]): r for r in records}
    for row in ("asymspec", "verifier-full"):
        web = by[row, "bundled-web-1"]["requests"]
        assert len(web) >= 2 and all(r["error"] is None for r in records)  # a step, then the final-answer request
        full = [q["stats"].get("prompt_tokens_full", q["prompt_tokens"]) for q in web]
        assert full == sorted(full) and full[-1] > full[0]  # the history grows step by step
        image = by[row, "bundled-image-1"]["requests"]
        assert len(image) == 1 and image[0]["stats"]["images"] == 1
        assert image[0]["view"]["caption"] == caption  # the verifier read the pre-computed caption
    squeezed, whole = by["asymspec", "bundled-web-1"]["requests"], by["verifier-full", "bundled-web-1"]["requests"]
    assert squeezed[0]["prompt_tokens"] == squeezed[0]["stats"]["prompt_tokens_full"]  # two messages: both verbatim
    assert all(q["prompt_tokens"] < q["stats"]["prompt_tokens_full"] for q in squeezed[1:])  # older messages compressed
    assert all("prompt_tokens_full" not in q["stats"] for q in whole)  # nothing compressed: the verifier read it all
    csv = by["asymspec", "bundled-file-1"]["requests"][0]
    assert csv["prompt_tokens"] < csv["stats"]["prompt_tokens_full"]  # the file's text truncated for the verifier
    assert all(q["stats"]["drafted"] > 0 for r in records if r["row"] == "asymspec" for q in r["requests"])
    assert all(q["stats"]["drafted"] == 0 for r in records if r["row"] == "verifier-full" for q in r["requests"])
    table = (out / "table4.md").read_text().splitlines()
    assert table[0].startswith("Bundled GAIA-shaped tasks") and table[2] == "| Setting | Method | n | Acc | ratio | AR | MAL |"
    reqs = [q for r in records if r["row"] == "asymspec" for q in r["requests"]]
    ratio = sum(q["stats"].get("prompt_tokens_full", q["prompt_tokens"]) for q in reqs) / sum(q["prompt_tokens"] for q in reqs)
    ar = sum(q["stats"]["accepted"] for q in reqs) / sum(q["stats"]["drafted"] for q in reqs)
    mal = sum(q["stats"]["new_tokens"] for q in reqs) / sum(q["stats"]["steps"] for q in reqs)
    acc = 100 * sum(r["correct"] for r in records if r["row"] == "asymspec") / 3
    assert f"| Full | AsymSpec | 3 | {acc:.1f} | {ratio:.2f}x | {ar:.2f} | {mal:.2f} |" in table
    assert (
        "| Full | Verifier, full context | 3 |" in next(line for line in table if "Full | Verifier" in line)
        and "| 1.00x | — | — |" in table[-1]
    )
    assert json.loads((out / "summary.json").read_text())["rows"]["asymspec"]["requests"] == len(reqs)


def test_bundled_tasks_load_as_gaia_tasks(tmp_path):
    tasks = load_gaia(write_bundled_tasks(tmp_path))
    assert [(t.subset, t.has_image, t.level) for t in tasks] == [("web", False, 1), ("file", True, 1), ("file", False, 1)]
    assert tasks[1].caption and tasks[2].file.name == "inventory.csv"
    assert gaia_match(tasks[2].answer, str((17 * 13) % 50))
