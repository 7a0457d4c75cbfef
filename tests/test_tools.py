"""Tool calls (issue #30, first part): tools, assistant tool calls and tool results (with an image) rendered by the
real templates in both views; Qwen's ``<tool_call>`` output parsed, streamed deltas joining to the parsed calls;
``pipe.chat(tools=...)`` and the server's tool messages on real forwards; refusals naming the field."""

from __future__ import annotations

import json
import random

import pytest
from conftest import ADD_TOOL as ADD
from conftest import make_image

from asymspec_mm import AsymSpecConfig
from asymspec_mm.request.conversation import ConversationError, parse_messages, tool_call, view_messages, view_texts
from asymspec_mm.request.tools import ToolCallStream, ToolError, call_id, check_tool_choice, check_tools, parse_tool_calls, tool_call_spans

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
VIEW_1, VIEW_2 = "Image description: a bar chart", "Image description: the tool's plot"


def _conversation(img1, img2) -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "image", "image": img1}, {"type": "text", "text": "Add the two bars."}]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "5"}, {"type": "image", "image": img2}]},
    ]


def test_tools_calls_and_results_render_as_the_real_templates(standin_pipe):
    """Both views equal the templates over hand-written messages: the tools block, the call as the template writes
    it, the tool result with its image (compressed view: the image's labelled view first, then the text)."""
    proc, tok = standin_pipe.processor, standin_pipe.verifier_tokenizer
    vm = view_messages(parse_messages(_conversation(make_image(1), make_image(2))), {1: VIEW_1, 2: VIEW_2})
    got = view_texts(proc, tok, vm, tools=[ADD])
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    plain = [
        {"role": "user", "content": f"{VIEW_1}\n\nAdd the two bars."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"[Image 2]\n{VIEW_2}\n\n5"},
    ]
    vl = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in plain]
    full = [dict(m, content=list(m["content"])) for m in vl]
    full[0]["content"] = [{"type": "image"}, {"type": "text", "text": f"{VIEW_1}\n\nAdd the two bars."}]
    full[2]["content"] = [{"type": "image"}, {"type": "text", "text": f"[Image 2]\n{VIEW_2}\n\n5"}]
    assert got[0] == tok.apply_chat_template(plain, tools=[ADD], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert got[1] == proc.apply_chat_template(vl, tools=[ADD], tokenize=False, add_generation_prompt=True)
    assert got[2] == proc.apply_chat_template(full, tools=[ADD], tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in got[0]
    assert "<tool_response>" in got[0] and got[2].count("<|image_pad|>") == 2


def test_hand_written_answers_parse():
    one = parse_tool_calls('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', "x")
    assert one.content == "Let me add." and one.problem is None
    assert one.tool_calls == [{"id": call_id("x", 0), "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    two = parse_tool_calls(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"s": "}{"}}\n</tool_call>'
    )
    assert two.content is None and [c["function"]["name"] for c in two.tool_calls] == ["a", "b"]
    assert json.loads(two.tool_calls[1]["function"]["arguments"]) == {"s": "}{"}
    for bad, why in (
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "does not hold"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2}}', "not closed"),
        ('<tool_call>\n{"name": "add"}\n</tool_call>', "does not hold"),
    ):
        parsed = parse_tool_calls(bad)
        assert parsed.content == bad and parsed.tool_calls == [] and why in parsed.problem
    # text after a call used to make the whole answer content; a stream sends the call when its block closes, so
    # what follows cannot take it back (#43): the call stands and the text is left out, named in `problem`
    after = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call> and more')
    assert after.content is None and [c["function"]["name"] for c in after.tool_calls] == ["add"] and "left out" in after.problem
    assert parse_tool_calls("just text").content == "just text"


#: Arguments of every JSON kind as a model writes them (a tool whose parameters schema is a list, a number, ...),
#: and the arguments text OpenAI's shape carries: what was written, but a string holding an object (its content).
WRITTEN_ARGUMENTS = {
    "[1, 2]": "[1, 2]",
    '[{"a": [true, null]}, "x"]': '[{"a": [true, null]}, "x"]',
    "[]": "[]",
    "-2.5e3": "-2.5e3",
    "7": "7",
    "null": "null",
    "true": "true",
    '"hello"': '"hello"',
    '"{\\"a\\": 1}"': '{"a": 1}',
}


def test_arguments_of_every_json_kind_are_the_text_the_model_wrote(standin_pipe):
    """A list, a number, ``true`` or ``null`` as ``arguments`` is a call (as vLLM's hermes parser reads it:
    ``json.dumps`` of the value), its arguments the JSON text as written, streamed the same in any pieces, and
    where the parser says they stand; sent back as an earlier assistant call it renders through the real template
    as it was written (``-2.5e3``, not ``-2500.0``). A block without ``arguments`` stays no call."""
    tok = standin_pipe.verifier_tokenizer
    for written, carried in WRITTEN_ARGUMENTS.items():
        text = f'Calling.\n<tool_call>\n{{"name": "f", "arguments": {written}}}\n</tool_call>'
        parsed = parse_tool_calls(text, "x")
        assert parsed.problem is None and parsed.content == "Calling.", written
        assert parsed.tool_calls == [{"id": call_id("x", 0), "type": "function", "function": {"name": "f", "arguments": carried}}]
        ((a, b),) = tool_call_spans(text)
        assert text[a:b] == written
        stream = ToolCallStream("x")
        deltas = [d for cut in range(1, len(text) + 1) for d in stream.push(text[:cut])] + stream.finish(text, parsed)
        assert "".join(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", [])) == carried
        calls = [tool_call(c, "messages[1].tool_calls[0]") for c in parsed.tool_calls]  # as a later turn sends it back
        messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls}]
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert f'<tool_call>\n{{"name": "f", "arguments": {carried}}}\n</tool_call>' in rendered, (written, rendered)
    assert parse_tool_calls('<tool_call>\n{"name": "f", "argument": [1]}\n</tool_call>').tool_calls == []


@pytest.mark.parametrize("seed", range(6))
def test_streamed_deltas_join_to_the_parsed_calls(seed):
    """The text fed in random pieces (as decode steps commit them): the content deltas join to the parsed content,
    each call's first delta has its id and name, and its argument deltas join to its arguments."""
    rng = random.Random(seed)
    args = [{"a": rng.randint(0, 99), "note": "x}{y" * rng.randint(0, 2)}, {}, {"nested": {"k": [1, 2, {"z": None}]}}]
    text = "Thinking about it." * rng.randint(0, 1) + "".join(
        f'\n<tool_call>\n{{"name": "f{i}", "arguments": {json.dumps(a)}}}\n</tool_call>' for i, a in enumerate(args[: rng.randint(1, 3)])
    )
    parsed = parse_tool_calls(text, "cmpl")
    stream, deltas, cut = ToolCallStream("cmpl"), [], 0
    while cut < len(text):
        cut = min(len(text), cut + rng.randint(1, 7))
        deltas += stream.push(text[:cut])
    deltas += stream.finish(text, parsed)
    content = "".join(d.get("content", "") for d in deltas)
    assert content == (parsed.content or "")
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            got = calls.setdefault(c["index"], {"id": c.get("id"), "name": c["function"].get("name"), "arguments": ""})
            got["arguments"] += c["function"].get("arguments", "")
    assert [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()] == (
        parsed.tool_calls
    )


def test_refusals_name_the_problem():
    with pytest.raises(ToolError, match=r"tools\[0\]"):
        check_tools([{"type": "function"}])
    with pytest.raises(ToolError, match="offered twice"):
        check_tools([ADD, ADD])
    assert check_tool_choice("required", check_tools([ADD])) == "required"
    with pytest.raises(ToolError, match="must name one of the offered tools"):
        check_tool_choice({"type": "function", "function": {"name": "sub"}}, check_tools([ADD]))
    with pytest.raises(ToolError, match="no tools are offered"):
        check_tool_choice("required", [])
    assert check_tool_choice(None, []) == "none" and check_tool_choice(None, check_tools([ADD])) == "auto"
    with pytest.raises(ConversationError, match="tool_call_id of an earlier assistant tool call"):
        parse_messages([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nope", "content": "5"}])
    with pytest.raises(ConversationError, match="not valid JSON"):
        parse_messages([{"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "add", "arguments": "{"}}]}])


def test_chat_with_tools_decodes_the_rendered_prompt(tiny_pipe):
    """pipe.chat with tools and a tool result: the verifier's prompt is the template's with the tools block, the
    answer is read for calls (the random tiny pair makes none: its text is the content); tool_choice none keeps the
    tools out of the prompt (#41) and reads nothing, ``<tool_call>`` one of its stop strings."""
    img1, img2 = make_image(11), make_image(12)
    cfg = AsymSpecConfig(k=3, max_new_tokens=8)
    res = tiny_pipe.chat(_conversation(img1, img2), tools=[ADD], caption=["a chart", "a plot"], ocr=False, config=cfg)
    prompt = tiny_pipe.verifier_tokenizer.decode(res.prompts.verifier_ids[0])
    assert "<tools>" in prompt and '"name": "add"' in prompt and "<tool_response>" in prompt
    assert res.tool_calls == parse_tool_calls(res.text).tool_calls and res.finish_reason == (
        "tool_calls" if res.tool_calls else res.finish_reason
    )
    off = tiny_pipe.chat(_conversation(img1, img2), tools=[ADD], tool_choice="none", caption=["a chart", "a plot"], ocr=False, config=cfg)
    off_prompt = tiny_pipe.verifier_tokenizer.decode(off.prompts.verifier_ids[0])
    assert "<tools>" not in off_prompt and "<tool_response>" in off_prompt
    assert off.tool_calls is None and off.config.stop_strings == ("<tool_call>",)


#: An earlier call's arguments as a client sends them back, in spellings that parsing them and writing them again
#: would change: an exponent, a float's trailing zero, an escaped character.
SENT_BACK = '{"a": -2.5e3, "b": [1.50, 2E-2], "c": "\\u00e9"}'


def _history(arguments: str) -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return [
        {"role": "user", "content": "Add them."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]


def test_arguments_sent_back_are_in_every_prompt_as_the_client_wrote_them(tiny_pipe):
    """An assistant turn's ``tool_calls[].function.arguments`` (JSON text) reaches the three prompts that the real
    Qwen3 and Qwen3-VL templates render (the tiny pair's, byte for byte) as the client wrote it: ``-2.5e3`` stays
    ``-2.5e3`` (it was parsed, then written by the template's ``tojson`` as ``-2500.0``)."""
    session = tiny_pipe.prepare_chat(_history(SENT_BACK), max_new_tokens=1, prefill=False)
    block = f'<tool_call>\n{{"name": "add", "arguments": {SENT_BACK}}}\n</tool_call>'
    p = session.prompts
    for tok, ids in (
        (tiny_pipe.verifier_tokenizer, p.verifier_ids),
        (tiny_pipe.tokenizer, p.drafter_comp_ids),
        (tiny_pipe.tokenizer, p.drafter_full_ids),
    ):
        assert block in tok.decode(ids[0]), tok.decode(ids[0])


def test_a_template_that_always_rewrites_the_arguments_gets_them_parsed(tiny_pipe):
    """A template that writes every ``arguments`` through ``tojson`` (no string branch) would quote JSON text as a
    string: it gets the parsed arguments instead, and writes them as JSON; the real Qwen3 template gets the text."""
    import copy

    from asymspec_mm.request.tool_support import template_messages, writes_argument_text

    real = tiny_pipe.verifier_tokenizer
    rewriting = copy.copy(real)
    rewriting.chat_template = real.chat_template.replace("{%- if tool_call.arguments is string %}", "{%- if false %}")
    assert rewriting.chat_template != real.chat_template
    assert writes_argument_text(real) and not writes_argument_text(rewriting)
    rendered = rewriting.apply_chat_template(template_messages(rewriting, _history(SENT_BACK)), tokenize=False)
    assert '"arguments": {"a": -2500.0, "b": [1.5, 0.02], "c": "\u00e9"}}' in rendered, rendered
    assert template_messages(real, _history(SENT_BACK)) == _history(SENT_BACK)
