"""The demo's bundled examples say truthfully what the shipped tiny pair does with them: each one is run with
AsymSpec, Floor and the drafter alone, and the answers extracted as MiniVista's eval does must equal the
answers its label claims."""

from __future__ import annotations

import html
import json
import re

import pytest

from asymspec_mm.eval.extraction import rule_extract
from asymspec_mm.eval.minivista import make_problem
from asymspec_mm.eval.scoring import score_problem
from ui.examples import (
    EXAMPLES_DIR,
    LABEL_CHARS,
    TINY_PAIR_ANSWERS,
    TINY_PAIR_MAX_NEW_TOKENS,
    load_examples,
    outcome_text,
    render_examples_table,
)


@pytest.fixture(scope="module")
def shipped_pipe():
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.pipeline.presets import TINY_DIR

    if not (TINY_DIR / "drafter" / "config.json").is_file():
        pytest.skip("the shipped tiny pair is not in this checkout")
    return AsymSpecPipeline.from_preset("tiny", ocr="none")


def test_every_shown_example_is_recorded_and_labelled_with_its_answer():
    raw = {str(e["pid"]): e for e in json.loads((EXAMPLES_DIR / "examples.json").read_text(encoding="utf-8"))}
    shown = load_examples()
    assert [e["pid"] for e in shown] == list(TINY_PAIR_ANSWERS)  # exactly the recorded ones, in that order
    for ex in shown:
        answer = raw[ex["pid"]]["answer"]
        assert ex["answer"] == answer and ex["tiny_pair"] == TINY_PAIR_ANSWERS[ex["pid"]]
        assert ex["label"].endswith(f" \u2192 {answer}") and len(ex["label"]) <= LABEL_CHARS  # Gradio cuts longer ones
    table = render_examples_table(shown)
    for ex in shown:
        row = re.search(rf'<tr data-pid="{ex["pid"]}">(.*?)</tr>', table).group(1)
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        claims = ex["tiny_pair"]
        expect = [html.escape(ex["label"]), ex["answer"], claims["asymspec"], claims["floor"], claims["drafter"]]
        assert cells == expect + [html.escape(outcome_text(ex["answer"], claims))]
        assert ex["ocr"], "an example without OCR text would have its view filled by the demo's OCR engine"


def test_outcome_text():
    assert outcome_text("5", {"asymspec": "5", "floor": "11", "drafter": "14"}) == "only AsymSpec answers it (Floor: 11, the drafter: 14)"
    assert outcome_text("g", {"asymspec": "g", "floor": "b", "drafter": "g"}) == "AsymSpec and the drafter answer it (Floor: b)"
    assert outcome_text("g", {"asymspec": "g", "floor": "g", "drafter": "g"}) == "all three answer it"
    assert outcome_text("y", {"asymspec": "b", "floor": "r", "drafter": "b"}) == "all three miss it (AsymSpec: b, Floor: r, the drafter: b)"


@pytest.mark.parametrize("pid", list(TINY_PAIR_ANSWERS))
def test_the_tiny_pair_answers_each_example_as_its_label_says(shipped_pipe, pid):
    ex = next(e for e in load_examples() if e["pid"] == pid)
    problem = make_problem(int(ex["seed"]), int(pid) - 1, ex["family"])
    assert problem["query"] == ex["question"] and problem["answer"] == ex["answer"]  # the example is that problem
    actual = {}
    for method in ("asymspec", "floor", "drafter"):
        res = shipped_pipe.generate(
            ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"], method=method, max_new_tokens=TINY_PAIR_MAX_NEW_TOKENS
        )
        actual[method], _ = score_problem(problem, rule_extract(res.text, problem).answer)
    assert actual == ex["tiny_pair"]
