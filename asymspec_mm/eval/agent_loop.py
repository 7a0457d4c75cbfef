"""One MiniVista agent task as an agent loop: ask, execute the tool call, send its result, read the final answer.

:func:`run_agent_task` drives ``pipe.chat`` over the task's conversation (:mod:`.minivista_agent`): each turn is a
request with the task's tools; a turn that calls a tool has the call executed by :func:`~.minivista_agent.run_tool`
and its result sent back as a ``tool`` message; the first turn without a call is the final answer. The run records
what an agent benchmark scores: whether the call parsed and validated against its tool's schema, whether its
arguments were the image's values, whether the final answer is right, and the KV the conversation reused at each
turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .minivista_agent import AgentToolError, run_tool


@dataclass
class AgentRun:
    """The outcome of one task: ``calls`` (each ``{"name", "arguments"}`` as the model wrote them), ``call_valid``
    (the first call named a tool and its arguments validate against that tool's schema), ``arguments_correct`` (the
    first call is the gold call), ``final`` (the final answer's text, None when the turn cap came first), ``correct``
    (its last integer is the gold answer), ``followup`` (the answer to the task's follow-up question, asked after the
    final answer; None without one) and ``followup_correct`` (it names the gold colour), ``cached_tokens`` (the
    verifier's reused prompt tokens, per request), ``turns`` (requests made) and ``messages`` (the conversation as the
    loop sent it, the last answer last)."""

    pid: str
    method: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    call_valid: bool = False
    arguments_correct: bool = False
    final: str | None = None
    correct: bool = False
    followup: str | None = None
    followup_correct: bool = False
    cached_tokens: list[int] = field(default_factory=list)
    turns: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


def final_number(text: str) -> str | None:
    """The last integer of an answer's text (MathVista's integer answers end with the value), or None."""
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


def first_colour(text: str) -> str | None:
    """The first of MiniVista's colour words in ``text`` (how a follow-up's answer names a bar), or None."""
    from .minivista import COLORS

    return next((w for w in re.findall(r"[a-z]+", (text or "").lower()) if w in COLORS), None)


def call_is_valid(call: dict[str, Any], tools: list[dict[str, Any]]) -> bool:
    """Whether ``call`` names one of ``tools`` and its arguments validate against that tool's JSON schema."""
    import jsonschema

    schema = next((t["function"].get("parameters", {}) for t in tools if t["function"]["name"] == call["name"]), None)
    if schema is None:
        return False
    try:
        jsonschema.validate(call["arguments"], schema)
    except jsonschema.ValidationError:
        return False
    return True


def run_agent_task(
    pipe: Any, problem: dict[str, Any], method: str = "asymspec", *, tool_choice: Any = "auto", max_turns: int = 3, **settings: Any
) -> AgentRun:
    """Run ``problem`` (a :func:`~.minivista_agent.make_agent_problem` task) as an agent loop with ``method`` for at
    most ``max_turns`` requests before the final answer, then the follow-up question when the task has one (``auto``);
    ``tool_choice`` applies to the first request (later ones are ``auto``), ``settings`` go to ``pipe.chat`` (config
    fields, ``config=``)."""
    run = AgentRun(str(problem["pid"]), method)
    messages = [dict(m) for m in problem["messages"]]
    view = {"caption": problem["caption"], "ocr": problem["ocr"]}
    for turn in range(max_turns):
        choice = tool_choice if turn == 0 else "auto"
        res = pipe.chat(messages, tools=problem["tools"], tool_choice=choice, method=method, **view, **settings)
        run.turns += 1
        run.cached_tokens.append(int(res.stats.get("cached_tokens", {}).get("verifier", 0)))
        if not res.tool_calls:
            run.final = res.text
            run.correct = final_number(res.text) == problem["answer"]
            messages.append({"role": "assistant", "content": res.text})
            break
        call_id = f"call_{turn}"
        first = res.tool_calls[0]["function"]
        call = {"name": first["name"], "arguments": json.loads(first["arguments"])}
        run.calls.append(call)
        if len(run.calls) == 1:
            run.call_valid = call_is_valid(call, problem["tools"])
            run.arguments_correct = call == problem["gold_call"]
        try:
            result = run_tool(call["name"], call["arguments"])
        except AgentToolError as exc:
            result = f"error: {exc}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": dict(first)}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]
    if run.final is not None and problem.get("followup"):
        messages.append({"role": "user", "content": [{"type": "text", "text": problem["followup"]["question"]}]})
        res = pipe.chat(messages, tools=problem["tools"], tool_choice="auto", method=method, **view, **settings)
        run.turns += 1
        run.cached_tokens.append(int(res.stats.get("cached_tokens", {}).get("verifier", 0)))
        run.followup = res.text
        run.followup_correct = not res.tool_calls and first_colour(res.text) == problem["followup"]["answer"]
        messages.append({"role": "assistant", "content": res.text})
    run.messages = messages
    return run
