"""MiniVista's ``agent-log`` family: the answer sits in an earlier, long tool output that the verifier's compressed
view drops.

An agent is asked to read a log of bar values; it calls ``read_log()``, the tool returns a table of 20-30 lines
(``bar 17: 42``, in order), the agent says it is done, and the user then asks for the latest reading ("What is the
value of the last bar?" -> ``Bar 40: 42.``). With the paper's per-turn compression (the last two messages verbatim,
everything older compressed) the table is compressed before the question arrives: truncation keeps its first lines
(the last one never among them), question-only drops it, LLMLingua-2 at rate 0.3 keeps a third of its words (the
shipped tiny classifier drops the values). The verifier then cannot know the value (100 possible, so chance is 1 %);
the drafter's full view reads the whole history.

The question asks for the last line, not a line named by its key: a lookup by key (find ``bar 17`` in the table and
copy the value after it) did not form in the tiny drafter (4 layers, 96 wide) in 17,000 examples, nor on tables of
two lines in 24,000; the latest reading it learns in about a thousand steps (``asymspec_mm/tiny/README.md``). A real
drafter does both.

No image: the family is text only, like the paper's long-context settings. :func:`make_log_problem` draws one task
(deterministic in ``(seed, index)``, as every MiniVista family); :func:`log_requests` gives the three requests an
agent loop makes with the answer each expects; :data:`LOG_COMPRESSIONS` are the three compressors the family is
measured with.
"""

from __future__ import annotations

import random
from typing import Any

LOG_FAMILY = "agent-log"
#: The family's one tool (an OpenAI function tool, as the openai-agents SDK sends a ``@function_tool`` with no
#: arguments).
READ_LOG_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_log",
        "description": "Read the log of bar values.",
        "parameters": {"properties": {}, "title": "read_log_args", "type": "object", "additionalProperties": False, "required": []},
        "strict": True,
    },
}
TASK = "Read the log of bar values."
DONE = "Done."
ROWS = (20, 30)  # lines in a log, inclusive
VALUES = 100  # a value is 0..99: chance is 1 %
#: The verifier's view in the family's measurements: the paper's agent setting (keep the last 2 turns) with each of
#: three compressors; truncation keeps the table's header and first few lines (the last line is never among them).
LOG_COMPRESSIONS: dict[str, dict[str, Any]] = {
    "truncate": {"method": "truncate", "limit": 40, "keep": "head", "keep_last_turns": 2},
    "llmlingua2": {"method": "llmlingua2", "rate": 0.3, "keep_last_turns": 2},
    "question-only": {"method": "question-only", "keep_last_turns": 2},
}
QUESTION = "What is the value of the last bar?"


def log_table(keys: list[int], values: list[int]) -> str:
    """The tool's output: a header, then one ``bar K: V`` line per key."""
    return f"Log of {len(keys)} bars:\n" + "\n".join(f"bar {k}: {v}" for k, v in zip(keys, values))


def make_log_problem(seed: int, index: int, rows: tuple[int, int] = ROWS) -> dict[str, Any]:
    """Task ``index`` of the family drawn with ``seed``: ``messages`` (the whole history up to the question, OpenAI
    format), ``tools`` (the call's; the question is asked with none), ``table`` (the tool's output), ``question``,
    ``answer`` (the last line's value, as text), ``response`` (``"Bar 40: 42."``), ``asked`` (the last line's key)
    and ``line`` (its text in the table); ``rows``: the table's length range (training starts on one-line tables)."""
    rng = random.Random(f"minivista/{seed}/{LOG_FAMILY}/{index}")
    n = rng.randint(*rows)
    first = rng.randint(1, 60)
    keys = list(range(first, first + n))
    values = [rng.randrange(VALUES) for _ in keys]
    row = n - 1
    table = log_table(keys, values)
    question = QUESTION
    return {
        "pid": f"agent-log-{index + 1}",
        "family": LOG_FAMILY,
        "table": table,
        "question": question,
        "query": question,
        "answer": str(values[row]),
        "response": f"Bar {keys[row]}: {values[row]}.",
        "asked": keys[row],
        "line": f"bar {keys[row]}: {values[row]}",
        "tools": [READ_LOG_TOOL],
        "messages": log_history(table) + [{"role": "user", "content": question}],
        "seed": seed,
    }  # fmt: skip


def log_history(table: str, call_id: str = "call_0") -> list[dict[str, Any]]:
    """The conversation before the question: the task, the ``read_log`` call, its output, the agent's reply."""
    return [
        {"role": "user", "content": TASK},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "read_log", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": table},
        {"role": "assistant", "content": DONE},
    ]


def read_log_call_text() -> str:
    """The assistant turn that calls ``read_log`` in Qwen's format."""
    return '<tool_call>\n{"name": "read_log", "arguments": {}}\n</tool_call>'


def log_requests(problem: dict[str, Any]) -> list[tuple[list[dict[str, Any]], str, str, list[dict[str, Any]]]]:
    """The three requests of one task as an agent loop sends them, each with the answer it expects, its name and the
    tools it offers: the task -> the call (``log-call``), the tool's output -> ``Done.`` (``log-done``), both with
    ``read_log``; the question after the whole history -> the value (``log-answer``), with no tools (the agent that
    answers it has none: the log is read)."""
    history = problem["messages"]
    return [
        (history[:1], read_log_call_text(), "log-call", [READ_LOG_TOOL]),
        (history[:3], DONE, "log-done", [READ_LOG_TOOL]),
        (history, problem["response"], "log-answer", []),
    ]


def log_problems(n: int, seed: int) -> list[dict[str, Any]]:
    """The first ``n`` tasks of ``seed``."""
    return [make_log_problem(seed, i) for i in range(n)]
