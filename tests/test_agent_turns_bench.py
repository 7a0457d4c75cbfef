"""The 10-turn agent conversation benchmark (asymspec_mm.bench.agent_turns), shortened to two turns on the tiny
random pair: every arm reads the same history, the compressed arm's verifier prompt is the uncompressed one's
divided by its ratio, each arm reuses only its own earlier turns, and the table is its records side by side."""

from __future__ import annotations

import pytest

from asymspec_mm.bench.agent_turns import agent_history, format_table, run_bench, summarize

TRUNCATE = "truncate,limit=12,keep_last_turns=2"


@pytest.fixture(scope="module")
def runs(tiny_pipe):
    return run_bench(tiny_pipe, ["none", TRUNCATE], reps=1, turns=2, rows=3, max_new_tokens=2)


def test_each_arm_reads_the_same_history_its_own_way(runs, tiny_pipe):
    assert sorted(runs) == sorted(f"{c}|{m}" for c in ("none", TRUNCATE) for m in ("asymspec", "floor"))
    none, squeezed = runs["none|asymspec"][0], runs[f"{TRUNCATE}|asymspec"][0]
    tok = tiny_pipe.verifier_tokenizer
    for turn, (a, b) in enumerate(zip(none, squeezed), start=1):
        text = tok.apply_chat_template(agent_history(turn, 3), tokenize=False, add_generation_prompt=True, enable_thinking=False)
        assert a["prompt_tokens"] == len(tok(text, add_special_tokens=False)["input_ids"])  # the whole history, rendered
        assert b["prompt_tokens_full"] == a["prompt_tokens"] and a["compression_ratio"] == 1.0
        assert b["compression_ratio"] == pytest.approx(b["prompt_tokens_full"] / b["prompt_tokens"])
    assert all(b["prompt_tokens"] < a["prompt_tokens"] for a, b in zip(none, squeezed))  # the system prompt and task too
    for arm in runs.values():  # each arm starts from an empty prefix store, then reuses its own earlier turns
        turns = arm[0]
        assert turns[0]["cached_tokens"] == 0 and all(t["cached_tokens"] > 0 for t in turns[1:])
        assert all(t["cached_tokens"] < t["prompt_tokens"] for t in turns)
    # without compression the previous turn is reused whole; with it, only up to the message that aged out
    assert all(n["cached_tokens"] > s["cached_tokens"] for n, s in zip(none[1:], squeezed[1:]))
    assert all(t["steps"] >= 1 for arm in runs.values() for t in arm[0])


def test_the_table_puts_the_arms_side_by_side(runs):
    table = format_table(summarize(runs), ["none", TRUNCATE]).splitlines()
    assert table[0].startswith("| turn | verifier prompt tokens (none / truncate) | cached tokens (none / truncate) |")
    assert len(table) == 2 + 2
    n, s, nf, sf = (runs[k][0][1] for k in ("none|asymspec", f"{TRUNCATE}|asymspec", "none|floor", f"{TRUNCATE}|floor"))
    assert table[3] == (
        f"| 2 | {n['prompt_tokens']} / {s['prompt_tokens']} | {n['cached_tokens']} / {s['cached_tokens']} "
        f"| {n['ttft_s'] * 1000:.0f} / {s['ttft_s'] * 1000:.0f} | 1.00 / {s['compression_ratio']:.2f} "
        f"| {n['steps']} / {s['steps']} | {nf['steps']} / {sf['steps']} |"
    )
