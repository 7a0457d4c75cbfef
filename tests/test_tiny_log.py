"""MiniVista's ``agent-log`` family: the answer sits in an earlier, long tool output that the verifier's compressed view
drops, and the drafter reads whole.

- the family's tasks are deterministic per seed, and each of its three compressors (truncate, LLMLingua-2 through the
  real ``llmlingua`` package on the shipped tiny classifier, question-only) really drops the asked line from the
  verifier's view, while the last two messages stay verbatim;
- the shipped tiny classifier runs offline through the package's own ``PromptCompressor`` (and the released
  ``microsoft/llmlingua-2-xlm-roberta-large-meetingbank`` when it is in the local cache);
- ``eval mathvista --dataset minivista --families agent-log`` on a held-out slice: AsymSpec recovers the Floor ->
  drafter gap (the figures in asymspec_mm/tiny/RESULTS.md);
- the openai-agents SDK against ``serve --preset tiny`` reads the log with the tool, and then answers the question
  from its whole history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asymspec_mm.eval.minivista_log import LOG_COMPRESSIONS, log_requests, make_log_problem
from asymspec_mm.pipeline.presets import TINY_DIR
from asymspec_mm.request.llmlingua2 import TINY_CLASSIFIER

#: The figure the held-out slice must reach (RESULTS.md's truncate row on 10 problems, less a margin): recovery in %.
SLICE_RECOVERY_AT_LEAST = 60.0


@pytest.fixture(scope="module")
def verifier_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_DIR / "verifier")


def test_tasks_are_deterministic_per_seed_and_ask_a_line_of_the_table():
    a, b = make_log_problem(1, 3), make_log_problem(1, 3)
    assert a == b
    assert make_log_problem(2, 3)["table"] != a["table"]
    lines = a["table"].split("\n")
    assert 21 <= len(lines) <= 31 and a["line"] in lines[9:]  # past the lines truncation keeps
    assert a["answer"] == a["line"].split(": ")[1] and a["response"] == f"Bar {a['asked']}: {a['answer']}."
    assert [m["role"] for m in a["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    assert [name for _, _, name, _ in log_requests(a)] == ["log-call", "log-done", "log-answer"]


@pytest.mark.parametrize("name", list(LOG_COMPRESSIONS))
def test_each_compressor_drops_the_asked_line_from_the_verifiers_view(name, verifier_tokenizer):
    from asymspec_mm.eval.log_eval import log_compression
    from asymspec_mm.request.compression import Compression, compress_turns
    from asymspec_mm.request.conversation import parse_messages

    comp = Compression.of(log_compression(name))
    for i in range(4):
        p = make_log_problem(1, i)
        turns = parse_messages(p["messages"])
        squeezed = compress_turns(turns, comp, verifier_tokenizer)
        tool_text = "\n".join(squeezed.turns[2].texts)
        assert p["line"] not in tool_text and f": {p['answer']}" not in tool_text.split(str(p["asked"]))[-1][:6]
        assert squeezed.turns[3:] == turns[3:]  # the last two messages verbatim
        assert 2 in squeezed.indices


def test_the_shipped_classifier_runs_through_the_real_llmlingua_package_offline():
    pytest.importorskip("llmlingua")
    from asymspec_mm.request.llmlingua2 import PackageCompressor, token_classifier

    size = sum(f.stat().st_size for f in Path(TINY_CLASSIFIER).iterdir())
    assert size < 2_000_000
    classifier = token_classifier(TINY_CLASSIFIER)
    assert isinstance(classifier, PackageCompressor)
    p = make_log_problem(1, 0)
    direct = classifier.compressor.compress_prompt_llmlingua2([p["table"]], rate=0.3)
    assert classifier.compress(p["table"], 0.3) == direct["compressed_prompt"].strip()
    kept = direct["compressed_prompt"].split()
    assert 0 < len(kept) < 0.5 * len(p["table"].split())
    assert p["answer"] not in kept or kept.count(p["answer"]) < p["table"].split().count(p["answer"])


def test_the_released_meetingbank_classifier_runs_when_it_is_cached():
    pytest.importorskip("llmlingua")
    from asymspec_mm.request.llmlingua2 import DEFAULT_MODEL, PackageCompressor, model_is_local, token_classifier

    if not model_is_local(DEFAULT_MODEL):
        pytest.skip(f"{DEFAULT_MODEL} is not in the local Hugging Face cache")
    classifier = token_classifier(DEFAULT_MODEL)
    assert isinstance(classifier, PackageCompressor)
    out = classifier.compress(make_log_problem(1, 0)["table"], 0.3)
    assert 0 < len(out.split()) < len(make_log_problem(1, 0)["table"].split())


def test_the_familys_questions_are_in_the_tiny_pairs_domain():
    from asymspec_mm.request.domain import question_problems

    p = make_log_problem(1, 0)
    assert question_problems(p["question"]) == [] and question_problems(p["messages"][0]["content"]) == []
    assert question_problems("What is the value of bar seventeen?")  # only the family's own form
