"""MiniVista's ``agent`` family: a bar chart and a task that needs a tool call whose arguments only the image holds.

"What is the red bar's value plus the blue bar's?" comes with two tools, ``add(a, b)`` and ``subtract(a, b)``. The
compressed view (caption: the bars' colours; OCR: the axis ticks) names no bar's value, so a blind verifier cannot
fill the arguments; the drafter reads them off the pixels. The gold conversation is the request, an assistant turn
that calls the tool with the two values (Qwen's ``<tool_call>`` format), the tool's result, and the final answer in
MathVista's integer style; some tasks add a follow-up user turn about the same image ("Which of the two bars is
taller?").

:func:`make_agent_problem` (also ``make_problem(seed, i, "agent")``) draws one task; :func:`run_tool` executes the
family's tools; :func:`gold_conversation` is the whole exchange as OpenAI-format messages (what an agent loop sends
and what training shows). Deterministic in ``(seed, index)``, like every MiniVista family.
"""

from __future__ import annotations

import base64
import io
import json
import random
from typing import Any

from ..base.checks import is_int
from .minivista_scenes import IMAGE_SIZE, _bar_chart, _join

AGENT_FAMILY = "agent"
#: The family's tools (OpenAI function tools): whole numbers, as the chart's values are.
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": what,
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 20, "description": "the first number"},
                    "b": {"type": "integer", "minimum": 0, "maximum": 20, "description": "the second number"},
                },
                "required": ["a", "b"],
            },
        },
    }
    for name, what in (("add", "Add two whole numbers: a + b."), ("subtract", "Subtract two whole numbers: a - b."))
]
HINT = "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end."
#: The share of tasks with a follow-up user turn about the same image.
FOLLOWUP_SHARE = 0.25


class AgentToolError(ValueError):
    """A call the family's tools cannot execute (unknown tool, missing or non-integer arguments): one line naming it."""


def run_tool(name: str, arguments: str | dict[str, Any]) -> str:
    """Execute one of :data:`TOOLS` on ``arguments`` (the call's JSON text or a dict); the result as the tool message's
    text (the number)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if name not in ("add", "subtract"):
        raise AgentToolError(f"unknown tool {name!r}; the agent family's tools are add and subtract")
    # a call's arguments may be any JSON value (a list, a number, null): only an object of two integers runs
    if not isinstance(args, dict) or set(args) != {"a", "b"} or not all(is_int(args[k]) for k in "ab"):
        raise AgentToolError(f"{name} takes two integers a and b, got {json.dumps(args)[:80]}")
    return str(args["a"] + args["b"] if name == "add" else args["a"] - args["b"])


def data_url(image: Any) -> str:
    """A PIL image as a PNG ``data:`` URL (how an agent sends it)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def tool_call_text(call: dict[str, Any]) -> str:
    """An assistant turn that makes ``call`` (``{"name", "arguments"}``) in Qwen's format."""
    return "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}) + "\n</tool_call>"


def make_agent_problem(seed: int, index: int) -> dict[str, Any]:
    """Task ``index`` of the agent set drawn with ``seed``: ``image``, ``messages`` (the first request, the image as a
    data URL), ``tools``, ``gold_call`` (``{"name", "arguments"}``), ``tool_result``, ``answer`` (the final number as
    text), ``response`` (the final turn), ``followup`` (``{"question", "answer", "response"}`` or None), the compressed
    view (``caption``, ``ocr``), ``scene`` and ``query`` (the request's text)."""
    rng = random.Random(f"minivista/{seed}/{AGENT_FAMILY}/{index}")
    cv, colors, values, _boxes = _bar_chart(rng)
    i, j = rng.sample(range(len(colors)), 2)
    kind = rng.choice(["add", "subtract"])
    if kind == "subtract" and values[i] < values[j]:
        i, j = j, i  # a difference of the taller bar and the shorter: positive
    x, y = values[i], values[j]
    verb = "plus" if kind == "add" else "minus"
    question = f"What is the {colors[i]} bar's value {verb} the {colors[j]} bar's?"
    query = f"{HINT}\nQuestion: {question}"
    call = {"name": kind, "arguments": {"a": x, "b": y}}
    result = run_tool(kind, call["arguments"])
    followup = None
    if rng.random() < FOLLOWUP_SHARE:
        taller = colors[i] if x > y else colors[j]
        followup = {
            "question": f"Which of the two bars is taller, the {colors[i]} one or the {colors[j]} one?",
            "answer": taller,
            "response": f"The {taller} bar is taller.",
        }
    return {
        "pid": f"agent-{index + 1}",
        "family": AGENT_FAMILY,
        "kind": kind,
        "image": cv.image,
        "image_size": IMAGE_SIZE,
        "question": question,
        "query": query,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(cv.image)}}, {"type": "text", "text": query}]}],
        "tools": TOOLS,
        "gold_call": call,
        "tool_result": result,
        "answer": result,
        "response": f"{colors[i].capitalize()} is {x}, {colors[j]} is {y}; the answer is {result}.",
        "followup": followup,
        "caption": f"A bar chart with {_join(colors)} bars.",
        "ocr": cv.ocr(),
        "scene": {"colors": colors, "values": values, "asked": [colors[i], colors[j]]},
        "seed": seed,
    }  # fmt: skip


def gold_conversation(problem: dict[str, Any], call_id: str = "call_0") -> list[dict[str, Any]]:
    """The whole gold exchange as OpenAI-format messages: the request, the assistant's tool call, the tool's result,
    the final answer, and the follow-up question and its answer when the task has one."""
    call = problem["gold_call"]
    messages = [
        *problem["messages"],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": problem["tool_result"]},
        {"role": "assistant", "content": problem["response"]},
    ]
    if problem["followup"] is not None:
        messages += [
            {"role": "user", "content": [{"type": "text", "text": problem["followup"]["question"]}]},
            {"role": "assistant", "content": problem["followup"]["response"]},
        ]
    return messages


def openai_requests(problem: dict[str, Any]) -> list[tuple[list[dict[str, Any]], str]]:
    """Each request of the gold exchange (:func:`gold_conversation`) with the answer it expects, in Qwen's text: the
    first request -> the tool call, the request with the tool's result -> the final answer, and the follow-up."""
    conv = gold_conversation(problem)
    targets = [tool_call_text(problem["gold_call"]), problem["response"]]
    ends = [1, 3]
    if problem["followup"] is not None:
        targets.append(problem["followup"]["response"])
        ends.append(5)
    return [(conv[:end], target) for end, target in zip(ends, targets)]


#: The system prompt a smolagents ``ToolCallingAgent`` runs the family with (its own is some 5,700 tokens, past the
#: tiny pair's 4,096-token window): what the tiny pair was trained on.
SMOLAGENTS_SYSTEM_PROMPT = "Call a tool for every step; call final_answer with the answer."
#: The family's tools as a smolagents ``ToolCallingAgent`` sends them: its schemas of ``add`` / ``subtract`` (written
#: as ``@tool`` functions with these descriptions) and its own ``final_answer``.
SMOLAGENTS_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "integer", "description": v["description"]} for k, v in t["function"]["parameters"]["properties"].items()},
                "required": ["a", "b"],
            },
        },
    }
    for t in TOOLS
] + [
    {
        "type": "function",
        "function": {
            "name": "final_answer",
            "description": "Provides a final answer to the given problem.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The final answer to the problem"}},
                "required": ["answer"],
            },
        },
    }
]  # fmt: skip


def smolagents_requests(problem: dict[str, Any], call_id: str | None = None) -> list[tuple[list[dict[str, Any]], str]]:
    """The two requests a smolagents ``ToolCallingAgent`` (with :data:`SMOLAGENTS_SYSTEM_PROMPT`) makes for the task,
    as it sends them, and the call each expects: the tool call, then ``final_answer`` with the result. smolagents
    writes its earlier call back as assistant text (``Calling tools:`` and the calls' Python repr) and the tool's
    result as a user message that repeats the task's image. ``call_id``: the id the server gave the call (default: one
    in the server's format)."""
    from ..request.tools import call_id as server_call_id

    call_id = call_id or server_call_id(str(problem["pid"]), 0)
    url = data_url(problem["image"])
    call = problem["gold_call"]
    first = [
        {"role": "system", "content": [{"type": "text", "text": SMOLAGENTS_SYSTEM_PROMPT}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "New task:\n" + problem["question"]}, {"type": "image_url", "image_url": {"url": url}}],
        },
    ]
    made = [{"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": dict(call["arguments"])}}]
    second = first + [
        {"role": "assistant", "content": [{"type": "text", "text": "Calling tools:\n" + str(made)}]},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Observation:\n" + problem["tool_result"]},
            ],
        },
    ]
    answer = {"name": "final_answer", "arguments": {"answer": problem["tool_result"]}}
    return [(first, tool_call_text(call)), (second, tool_call_text(answer))]  # fmt: skip


def agent_problems(n: int, seed: int) -> list[dict[str, Any]]:
    """The first ``n`` agent tasks of ``seed`` (``make_problem(seed, i, "agent")``), pids ``agent-1`` ..."""
    return [make_agent_problem(seed, i) for i in range(n)]
