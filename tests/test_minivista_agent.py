"""MiniVista's agent family: deterministic tasks whose tool-call arguments only the image holds, the family's tools,
and the gold conversation rendered by the real Qwen3 / Qwen3-VL chat templates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asymspec_mm.eval.minivista import make_problem
from asymspec_mm.eval.minivista_agent import TOOLS, AgentToolError, gold_conversation, make_agent_problem, run_tool, tool_call_text
from asymspec_mm.request.tools import check_tools, parse_tool_calls


def bar_values_from_pixels(image, colors) -> list[int]:
    """Each bar's value read back from the picture (the painter's layout: value v -> top at y = 116 - 10 v)."""
    from asymspec_mm.eval.minivista_scenes import BAR_SLOT, COLORS

    px = np.asarray(image.convert("RGB"))
    out = []
    for i, c in enumerate(colors):
        column = px[:, i * BAR_SLOT + 22]
        rows = np.where((column == np.array(COLORS[c])).all(axis=1))[0]
        out.append(round((116 - rows.min()) / 10))
    return out


def test_tasks_are_deterministic_and_need_the_image():
    seen_kinds, followups = set(), 0
    for i in range(60):
        p, again = make_agent_problem(7, i), make_problem(7, i, "agent")
        assert p["messages"] == again["messages"] and p["gold_call"] == again["gold_call"]
        a, b = p["gold_call"]["arguments"]["a"], p["gold_call"]["arguments"]["b"]
        values = dict(zip(p["scene"]["colors"], bar_values_from_pixels(p["image"], p["scene"]["colors"])))
        assert [values[c] for c in p["scene"]["asked"]] == [a, b]  # the arguments are the pixels' values
        assert str(a) not in p["caption"] and p["ocr"] == "10 8 6 4 2 0"  # the compressed view names no bar's value
        assert p["answer"] == str(a + b if p["kind"] == "add" else a - b) and int(p["answer"]) >= 0
        assert p["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
        seen_kinds.add(p["kind"])
        followups += p["followup"] is not None
    assert seen_kinds == {"add", "subtract"} and 5 <= followups <= 30
    assert make_agent_problem(7, 0)["gold_call"] != make_agent_problem(8, 0)["gold_call"] or make_agent_problem(7, 1) != make_agent_problem(
        8, 1
    )


def test_the_tools_run_and_refuse_bad_calls():
    assert check_tools(TOOLS) and [t["function"]["name"] for t in TOOLS] == ["add", "subtract"]
    assert run_tool("add", '{"a": 3, "b": 4}') == "7" and run_tool("subtract", {"a": 9, "b": 2}) == "7"
    for name, args, words in (
        ("multiply", {"a": 1, "b": 2}, "unknown tool"),
        ("add", {"a": 1}, "two integers"),
        ("add", {"a": 1.5, "b": 2}, "two integers"),
        ("add", "[1, 2]", "two integers"),  # a call's arguments may be any JSON: a list is refused, not a TypeError
        ("subtract", "null", "two integers"),
    ):
        with pytest.raises(AgentToolError, match=words):
            run_tool(name, args)


def test_the_gold_call_parses_back_and_validates():
    jsonschema = pytest.importorskip("jsonschema")
    p = make_agent_problem(3, 5)
    parsed = parse_tool_calls(tool_call_text(p["gold_call"]))
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == p["gold_call"]["name"] and json.loads(call["function"]["arguments"]) == p["gold_call"]["arguments"]
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == p["gold_call"]["name"])
    jsonschema.validate(p["gold_call"]["arguments"], schema)


def test_the_gold_conversation_renders_with_the_real_templates(standin_pipe):
    """Both views of the exchange (request, tool call, tool result, answer, the follow-up question) through the pipeline's
    conversation rendering and the real Qwen3 / Qwen3-VL templates: the call and its result appear in both, the image
    only in the full view, and the compressed view holds the caption and OCR text, no bar's value."""
    from asymspec_mm.request.conversation import parse_messages, view_messages, view_texts

    p = next(q for q in (make_agent_problem(4, i) for i in range(40)) if q["followup"] is not None)
    messages = gold_conversation(p)[:-1]  # up to the follow-up question: the turn an agent would ask for next
    view = f"Image description: {p['caption']}\nImage detected text: {p['ocr']}"
    verifier, comp, full = view_texts(
        standin_pipe.processor, standin_pipe.verifier_tokenizer, view_messages(parse_messages(messages), {1: view}), tools=TOOLS
    )
    call = '"name": "' + p["gold_call"]["name"] + '", "arguments": ' + json.dumps(p["gold_call"]["arguments"])
    for rendered in (verifier, comp, full):
        assert call in rendered and f"<tool_response>\n{p['tool_result']}\n</tool_response>" in rendered
        assert p["response"] in rendered and p["followup"]["question"] in rendered
    assert full.count("<|image_pad|>") >= 1 and "<|image_pad|>" not in verifier and p["caption"] in verifier


def test_an_agent_loop_calls_executes_and_answers(tiny_pipe):
    """The loop on the tiny random pair with the first call forced (the grammar makes it valid): the call is executed,
    its result goes back as a tool message, the next turn reuses the conversation's KV and equals pipe.chat of the
    messages the loop sent, and the run says what it did."""
    from asymspec_mm.eval.agent_loop import call_is_valid, final_number, run_agent_task

    p = make_agent_problem(5, 2)  # a task with a follow-up question
    run = run_agent_task(tiny_pipe, p, "asymspec", tool_choice="required", max_turns=2, max_new_tokens=72)
    assert run.turns == 3 and len(run.calls) == 1 and run.call_valid and run.final is not None
    assert run.arguments_correct == (run.calls[0] == p["gold_call"])
    assert run.cached_tokens[1] > run.cached_tokens[0] and run.cached_tokens[2] > run.cached_tokens[1]  # each reuses the last
    tool = run.messages[-4]  # then the final answer, the follow-up question and its answer
    assert tool["role"] == "tool" and tool["content"] == run_tool(run.calls[0]["name"], run.calls[0]["arguments"])
    again = tiny_pipe.chat(run.messages[:-3], tools=TOOLS, caption=p["caption"], ocr=p["ocr"], max_new_tokens=72)
    assert again.text == run.final and run.messages[-3] == {"role": "assistant", "content": run.final}
    assert run.messages[-2]["content"] == [{"type": "text", "text": p["followup"]["question"]}]
    assert run.messages[-1] == {"role": "assistant", "content": run.followup}
    assert run.correct == (final_number(run.final) == p["answer"])
    assert not call_is_valid({"name": "add", "arguments": {"a": 99, "b": 1}}, TOOLS)  # out of the schema's range
    assert not call_is_valid({"name": "divide", "arguments": {"a": 1, "b": 1}}, TOOLS)
    assert final_number("Red is 4, blue is 3; the answer is 7.") == "7" and final_number("no digits") is None
