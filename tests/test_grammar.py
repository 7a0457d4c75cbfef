"""Grammar-constrained decoding (issue #30): forced tool calls and JSON answers with xgrammar, for every method, on
real forwards of the tiny random pair. Every constrained output parses and validates against its schema (a
property test over generated schemas and prompts), a constrained row gives the same tokens alone, in a batch and
through the scheduler, and what the grammar engine cannot take is refused naming the problem."""

from __future__ import annotations

import json
import random

import pytest
from conftest import make_image

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from xgrammar.testing import _is_grammar_accept_string

from asymspec_mm import AsymSpecConfig
from asymspec_mm.request.grammar import output_grammar
from asymspec_mm.request.tools import ToolError

CFG = AsymSpecConfig(k=3, max_new_tokens=160)
METHODS = ("asymspec", "floor", "sd", "drafter")


def _value_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["integer", "enum", "boolean", "string", "number_enum"] + (["object", "array"] if depth < 1 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "blue", "green", "tall", "short", "A", "B"], rng.randint(1, 3))}
    if kind == "number_enum":
        return {"enum": rng.sample([1, 2.5, 10, -3], 2)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 8)}
    if kind == "array":
        return {"type": "array", "items": _value_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    return _object_schema(rng, depth + 1)


def _object_schema(rng: random.Random, depth: int = 0) -> dict:
    names = rng.sample(["answer", "color", "count", "label", "ok", "bars", "note"], rng.randint(1, 3))
    props = {n: _value_schema(rng, depth) for n in names}
    return {"type": "object", "properties": props, "required": names, "additionalProperties": False}


def _messages(i: int) -> list[dict]:
    questions = ["Which bar is the tallest?", "Describe the chart as JSON.", "How many shapes?", "What colour is it?"]
    return [{"role": "user", "content": [{"type": "image", "image": make_image(500 + i)}, questions[i % len(questions)]]}]


@pytest.mark.parametrize("seed", range(8))
def test_every_constrained_output_validates(tiny_pipe, seed):
    """A generated schema and prompt, every method: the answer ends (EOS after the grammar is complete), parses, and
    validates against the schema."""
    rng = random.Random(seed)
    schema = _object_schema(rng)
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{seed}", "schema": schema}}
    for method in METHODS:
        res = tiny_pipe.chat(_messages(seed), caption="a bar chart", ocr=False, method=method, response_format=fmt, config=CFG)
        assert res.finish_reason == "stop", (method, schema, res.text)
        jsonschema.validate(json.loads(res.text), schema)


def test_json_object_and_forced_tool_calls(tiny_pipe):
    tools = [
        {"type": "function", "function": {"name": "add", "parameters": _object_schema(random.Random(1))}},
        {"type": "function", "function": {"name": "lookup", "parameters": _object_schema(random.Random(2))}},
    ]
    for method in METHODS:
        obj = tiny_pipe.chat(_messages(1), caption="a chart", ocr=False, method=method, response_format={"type": "json_object"}, config=CFG)
        if obj.finish_reason == "stop":  # the random pair may also run out of budget inside a string
            assert isinstance(json.loads(obj.text), dict), obj.text
        else:
            assert obj.finish_reason == "length" and len(obj.token_ids) == CFG.max_new_tokens
            assert _is_grammar_accept_string(output_grammar([], "none", {"type": "json_object"}), obj.text, require_termination=False)
        for choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
            res = tiny_pipe.chat(_messages(2), caption="a chart", ocr=False, method=method, tools=tools, tool_choice=choice, config=CFG)
            assert res.finish_reason == "tool_calls" and res.tool_calls, (method, res.text)
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            for call in res.tool_calls:
                jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
            if isinstance(choice, dict):
                assert [c["function"]["name"] for c in res.tool_calls] == ["lookup"]


def test_a_constrained_row_is_the_same_alone_in_a_batch_and_through_the_scheduler(tiny_pipe):
    schema = _object_schema(random.Random(5))
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    tools = [{"type": "function", "function": {"name": "add", "parameters": _object_schema(random.Random(6))}}]
    requests = [
        {"messages": _messages(3), "caption": "a chart", "ocr": False},
        {"messages": _messages(4), "caption": "a chart", "ocr": False},
    ]
    alone = [tiny_pipe.chat(r["messages"], caption="a chart", ocr=False, config=CFG, response_format=fmt) for r in requests]
    free = tiny_pipe.chat(_messages(5), caption="a chart", ocr=False, config=CFG)
    forced = tiny_pipe.chat(_messages(6), caption="a chart", ocr=False, config=CFG, tools=tools, tool_choice="required")
    with tiny_pipe.scheduler(max_batch_size=4) as sched:
        handles = [sched.submit_chat(r["messages"], caption="a chart", ocr=False, config=CFG, response_format=fmt) for r in requests]
        handles.append(sched.submit_chat(_messages(5), caption="a chart", ocr=False, config=CFG))
        handles.append(sched.submit_chat(_messages(6), caption="a chart", ocr=False, config=CFG, tools=tools, tool_choice="required"))
        got = [h.result() for h in handles]
    assert [g.token_ids for g in got] == [a.token_ids for a in alone] + [free.token_ids, forced.token_ids]
    assert max(g.stats["batch_size"] for g in got) > 1
    assert got[3].tool_calls == forced.tool_calls


def test_what_the_grammar_engine_cannot_take_is_refused(tiny_pipe):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}
    with pytest.raises(ToolError, match="cannot be compiled"):
        tiny_pipe.chat(_messages(0), caption="c", ocr=False, response_format=bad, config=CFG)
    with pytest.raises(ToolError, match="must name one of the offered tools"):
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        tiny_pipe.chat(_messages(0), caption="c", ocr=False, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ToolError, match="no tools are offered"):
        tiny_pipe.chat(_messages(0), caption="c", ocr=False, tool_choice="required")
    with tiny_pipe.scheduler(max_batch_size=1) as sched:  # at submission, not at result(): nothing queues
        with pytest.raises(ToolError, match="cannot be compiled"):
            sched.submit_chat(_messages(0), caption="c", ocr=False, response_format=bad, config=CFG)
        assert sched.waiting == 0 and sched.steps == 0


def _fresh_options(name: str) -> tuple[list, dict]:
    """A tool and a response format no other test compiles (the pipeline keeps compiled grammars by options, so a
    grammar seen before is not compiled, nor built, again)."""
    params = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": name, "parameters": params}}]
    return tools, {"type": "json_schema", "json_schema": {"name": name, "schema": params}}


def test_a_requests_grammar_is_built_once_on_the_direct_path_and_through_the_scheduler(tiny_pipe, grammar_builds):
    """The grammar the check at submission builds (to refuse a bad schema before any model work) is the one the
    set-up compiles: one build per request, on the direct path (``pipe.chat``: it was 2, the set-up's check then
    its compile) and through the scheduler (it was 3: submission, the set-up's check, the compile)."""
    cfg = AsymSpecConfig(k=2, max_new_tokens=6)
    _, fmt = _fresh_options("built_once_direct")
    tiny_pipe.chat(_messages(7), caption="c", ocr=False, response_format=fmt, config=cfg)
    assert [f["json_schema"]["name"] for _, f in grammar_builds] == ["built_once_direct"]
    grammar_builds.clear()
    tools, _ = _fresh_options("built_once_scheduled")
    choice = {"type": "function", "function": {"name": "built_once_scheduled"}}
    with tiny_pipe.scheduler(max_batch_size=1) as sched:
        res = sched.submit_chat(_messages(8), caption="c", ocr=False, tools=tools, tool_choice=choice, config=cfg).result()
    assert res.finish_reason in ("tool_calls", "length") and [c for c, _ in grammar_builds] == [choice]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"a": 1, "b": [true, null, "x"]}', True),
        ("{}", True),
        ('{"a": {"b": -2.5e3}}', True),
        ('{"a":1}', False),  # the separators are fixed: ", " and ": "
        ('{ "a": 1}', False),  # no free whitespace, which let the tiny pair fill its budget with spaces
        ('{"a": 1}\n\n', False),
        ("[1, 2]", False),  # an object, as OpenAI's json_object asks
    ],
)
def test_json_object_is_json_with_fixed_separators_and_no_free_whitespace(text, ok):
    assert _is_grammar_accept_string(output_grammar([], "none", {"type": "json_object"}), text) is ok
