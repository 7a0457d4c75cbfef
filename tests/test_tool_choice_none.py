"""``tool_choice="none"`` (#41): the model does not call a tool. On requests where ``auto`` makes the shipped tiny
pair call one (MiniVista's agent family), ``none`` gives a message with no ``<tool_call>`` markup and no calls,
through ``pipe.chat`` and through the server with the ``openai`` client, streamed and not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asymspec_mm.eval.minivista import make_problem
from asymspec_mm.request.tools import OPEN

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
PROBLEMS = [make_problem(0, i, "agent") for i in range(2)]
OPTIONS = {"max_new_tokens": 40}


def test_the_rule_keeps_tools_out_of_the_prompt_and_stops_at_call_markup():
    from asymspec_mm.request.tools import answer_stop_strings, prompt_tools

    tools = PROBLEMS[0]["tools"]
    assert prompt_tools(tools, "none") == [] and prompt_tools(tools, "auto") == tools
    assert answer_stop_strings(("x",), tools, "none") == ("x", OPEN)
    assert answer_stop_strings(("x",), tools, "auto") == ("x",) and answer_stop_strings((), [], "none") == ()


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p["pid"])
def test_pipe_chat_with_none_calls_no_tool_where_auto_does(shipped_tiny, problem):
    kw = {"caption": problem["caption"], "ocr": problem["ocr"], "tools": problem["tools"], **OPTIONS}
    auto = shipped_tiny.chat(problem["messages"], tool_choice="auto", **kw)
    assert auto.tool_calls, auto.text  # the request is one the pair answers with a call
    res = shipped_tiny.chat(problem["messages"], tool_choice="none", **kw)
    assert OPEN not in res.text and "tool_call" not in res.text, res.text
    assert not res.tool_calls and res.finish_reason != "tool_calls"


def test_a_call_after_earlier_calls_in_the_conversation_ends_the_answer(shipped_tiny):
    """The gold exchange's second request (a call and its result in the history): under ``none`` no markup either."""
    from asymspec_mm.eval.minivista_agent import openai_requests

    problem = PROBLEMS[0]
    messages, _ = openai_requests(problem)[1]
    res = shipped_tiny.chat(messages, caption=problem["caption"], ocr=problem["ocr"], tools=problem["tools"], tool_choice="none", **OPTIONS)
    assert OPEN not in res.text and not res.tool_calls


def test_server_with_none_answers_without_calls(served_tiny):
    pytest.importorskip("openai")
    from openai import OpenAI

    client = OpenAI(base_url=served_tiny + "/v1", api_key="none")
    for problem in PROBLEMS:
        body = {"model": "tiny", "messages": problem["messages"], "tools": problem["tools"], "max_tokens": OPTIONS["max_new_tokens"]}
        extra = {"asymspec": {"caption": problem["caption"], "ocr": problem["ocr"]}}
        auto = client.chat.completions.create(**body, tool_choice="auto", extra_body=extra)
        assert auto.choices[0].message.tool_calls, auto.choices[0].message
        resp = client.chat.completions.create(**body, tool_choice="none", extra_body=extra)
        msg = resp.choices[0].message
        assert msg.content is not None and OPEN not in msg.content and "tool_call" not in msg.content, msg.content
        assert not msg.tool_calls and resp.choices[0].finish_reason == "stop"
        stream = client.chat.completions.create(**body, tool_choice="none", extra_body=extra, stream=True)
        deltas = [c.choices[0].delta for c in stream if c.choices]
        text = "".join(d.content or "" for d in deltas)
        assert text == msg.content and not any(d.tool_calls for d in deltas)
