"""Tool-call streams that never contradict the answer (#43, item 2): for any model output, whole or cut anywhere, fed
token by token, character by character or in any chunks, the deltas of :class:`ToolCallStream` joined are what
:func:`parse_tool_calls` reads from the final text: the content (``parsed.content or ""``: a ``None`` content streams
as no content) and the calls with their ids, names and arguments. Plus vLLM's hermes parser tests, ported as data
(``tests/data/vllm_hermes_tool_parser_cases.yaml``), and the finish reason of an answer the budget cut."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asymspec_mm.request.session import MMResult
from asymspec_mm.request.tools import CLOSE, OPEN, ToolCallStream, call_id, parse_tool_calls, tool_call_spans
from asymspec_mm.serve.chat_answers import finish_reason, message_of
from asymspec_mm.serve.streaming import ChoiceDeltas

PREFIX = "chatcmpl-test"
CASES = yaml.safe_load((Path(__file__).parent / "data" / "vllm_hermes_tool_parser_cases.yaml").read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def qwen():
    """Qwen3's tokenizer (Qwen/Qwen3-32B's, built from the shipped files): the one vLLM's hermes tests use."""
    from tokenizers import Tokenizer

    from asymspec_mm.checkpoints.qwen_files import tokenizer_json_bytes

    return Tokenizer.from_str(tokenizer_json_bytes().decode("utf-8"))


def token_prefixes(tok, text: str, every: int = 1) -> tuple[list[str], str]:
    """The text as a server sees it decoding ``every`` tokens at a time (an unfinished character held back), and the
    final text (the whole decode: what the answer is)."""
    ids = tok.encode(text).ids
    cuts = list(range(every, len(ids), every)) + [len(ids)]
    return [tok.decode(ids[:k]).rstrip("\ufffd") for k in cuts], tok.decode(ids)


def stream(prefixes: list[str], final: str, prefix: str = PREFIX, *, finished: bool = False) -> tuple[list[dict], list[list[dict]]]:
    """Feed ``prefixes`` (each extending the last, as the server's text deltas do) then ``final`` (read with
    ``finished``: the model ended it): all the deltas, and those of each push (the last entry: :meth:`ToolCallStream.finish`)."""
    s, per_push, sent = ToolCallStream(prefix), [], ""
    for text in prefixes:
        if text.startswith(sent):  # as TextDeltas: a prefix that would take text back is not pushed
            per_push.append(s.push(text))
            sent = text
    per_push.append(s.finish(final, parse_tool_calls(final, prefix, finished=finished)))
    return [d for ds in per_push for d in ds], per_push


def joined(deltas: list[dict]) -> tuple[str, list[dict]]:
    """The content and calls the deltas make, checking their OpenAI shape on the way: a call's first delta has its
    index (the next one), id, type and name, its later deltas only arguments; no content after a call."""
    content, calls, seen_call = "", [], False
    for d in deltas:
        assert len(d) == 1 and set(d) <= {"content", "tool_calls"}, d
        if "content" in d:
            assert isinstance(d["content"], str) and d["content"] and not seen_call, deltas
            content += d["content"]
            continue
        seen_call = True
        (c,) = d["tool_calls"]
        if "id" in c:
            assert c["index"] == len(calls) and c["type"] == "function" and set(c["function"]) == {"name", "arguments"}, c
            calls.append({"id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": ""}})
        else:
            assert c["index"] == len(calls) - 1 and set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}, c
        calls[-1]["function"]["arguments"] += c["function"]["arguments"]
    return content, calls


def assert_streams_as_parsed(prefixes: list[str], final: str) -> None:
    parsed = parse_tool_calls(final, PREFIX)
    assert joined(stream(prefixes, final)[0]) == (parsed.content or "", parsed.tool_calls), (prefixes, final)


def chars(text: str) -> list[str]:
    return [text[:i] for i in range(1, len(text) + 1)]


def block(name: str, args: str, before: str = "\n", after: str = "\n") -> str:
    return f'{OPEN}{before}{{"name": {json.dumps(name)}, "arguments": {args}}}{after}{CLOSE}'


# ---------------------------------------------------------------------------------------------------------------
# the measured problems


def test_a_forced_call_cut_by_the_budget_is_content_streamed_and_not(qwen):
    """#43 problem 1 through the server's ChoiceDeltas: a call cut by max_tokens (its header complete) went out as a
    call *and* as content; now the stream, like the message, has the content only, at every cut of the call."""
    full = block("add", '{"a": 3, "b": 4}')
    ids = qwen.encode(full).ids
    assert qwen.decode(ids[:16]) == '<tool_call>\n{"name": "add", "arguments": {"a": 3'  # the answer
    for n in range(1, len(ids) + 1):
        choice = ChoiceDeltas(qwen, (), PREFIX, tools=True)
        deltas = [d for i in ids[:n] for d in choice.step([i])]
        text = qwen.decode(ids[:n])
        res = SimpleNamespace(text=text, tool_calls=parse_tool_calls(text).tool_calls, cut_by_budget=True)
        deltas += choice.finish(res)
        msg = message_of(res, PREFIX)
        assert joined(deltas) == (msg["content"] or "", msg.get("tool_calls", [])), text
        assert bool(msg.get("tool_calls")) == (n == len(ids)), text


def test_a_close_tag_inside_a_json_string_does_not_end_the_block():
    """#43 problem 2: the block's end is found by reading the JSON, so a forced call whose argument holds the close
    tag is a call (it was content)."""
    text = block("say", '{"text": "a </tool_call> b", "n": "}{"}')
    parsed = parse_tool_calls(text, PREFIX)
    assert parsed.problem is None and json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"text": "a </tool_call> b", "n": "}{"}
    assert_streams_as_parsed(chars(text), text)
    a, b = tool_call_spans(text)[0]
    assert text[a:b] == parsed.tool_calls[0]["function"]["arguments"]


def test_arguments_written_as_a_json_string_are_read_as_vllm_reads_them():
    """#43 problem 3: ``"arguments": "{\\"a\\": 1}"`` is a call whose arguments are that object's JSON (the string's
    content); #49 item 10: any other string is a call too, its arguments the string's JSON literal (vLLM's
    ``bare_string_arguments``); arguments that are a list, a number or null are a call too, their text as written
    (vLLM's ``json.dumps`` of the value). Streamed, nothing that is not JSON goes out."""
    text = block("add", json.dumps(json.dumps({"a": 1, "s": 'x"y'})))
    parsed = parse_tool_calls(text, PREFIX)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [("add", {"a": 1, "s": 'x"y'})]
    assert_streams_as_parsed(chars(text), text)
    for literal in ('"hello"', '"[1, 2]"', '"{\\"a\\": NaN}"'):
        called = block("add", literal)
        assert [c["function"]["arguments"] for c in parse_tool_calls(called).tool_calls] == [literal], literal
        assert_streams_as_parsed(chars(called), called)
    for value in ("[1]", "null", "3"):
        called = block("add", value)
        assert [c["function"]["arguments"] for c in parse_tool_calls(called).tool_calls] == [value], value
        assert_streams_as_parsed(chars(called), called)


# ---------------------------------------------------------------------------------------------------------------
# the rule: what goes out when


def test_a_call_goes_out_when_its_block_closes_and_stays():
    """A call is sent by the push that completes its ``</tool_call>``, not before (its block may still fail) and
    not later; what the model writes after it (text, a broken or unclosed block) is left out and takes nothing
    back."""
    first = "Let me add.\n" + block("add", '{"a": 2, "b": 3}')
    for rest in ("", "\nDone.", "\n" + OPEN + "\n{oops}\n" + CLOSE, "\n" + OPEN + '\n{"name": "sub", "argu', " x " + block("b", "{}")):
        text = first + rest
        _, per_push = stream(chars(text), text)
        sent_at = [i for i, ds in enumerate(per_push) if any("tool_calls" in d for d in ds)]
        assert sent_at[0] == len(first) - 1, rest  # the push of text[: len(first)]
        parsed = parse_tool_calls(text, PREFIX)
        assert parsed.content == "Let me add." and parsed.tool_calls[0]["function"]["name"] == "add"
        assert (parsed.problem is None) == (rest == ""), (rest, parsed.problem)
        assert [c["function"]["name"] for c in parsed.tool_calls] == (
            ["add", "b"] if rest.endswith(CLOSE) and "oops" not in rest else ["add"]
        )
        assert_streams_as_parsed(chars(text), text)


def test_content_waits_only_while_it_could_change():
    s = ToolCallStream(PREFIX)
    assert s.push("Hi") == [{"content": "Hi"}]
    assert s.push("Hi \n<tool_") == []  # blanks and a possible tag: the content if a call follows is "Hi"
    assert s.push("Hi \n<tool_call>\n{") == []
    # the block can no longer be a call ('<' cannot stand there in JSON): the answer is content, all of it
    assert s.push("Hi \n<tool_call>\n{<") == [{"content": " \n<tool_call>\n{<"}]
    assert s.push("Hi \n<tool_call>\n{<b>") == [{"content": "b>"}]
    assert s.finish("Hi \n<tool_call>\n{<b>", parse_tool_calls("Hi \n<tool_call>\n{<b>", PREFIX)) == []


def test_hand_written_answers_read_by_the_rules():
    """The reading rules on examples: blanks and member order, extra members ignored, several calls, text between
    calls left out, the first block that is not a call ends the calls."""
    two = block("a", "{}") + "\nand then\n" + block("b", '{"s": "</tool_call>"}', before="", after="  ")
    parsed = parse_tool_calls(two, "x")
    assert parsed.content is None and [c["function"]["name"] for c in parsed.tool_calls] == ["a", "b"]
    assert [c["id"] for c in parsed.tool_calls] == [call_id("x", 0), call_id("x", 1)] and "left out" in parsed.problem
    reordered = OPEN + '{"arguments": {"k": [1, {"z": null}]}, "extra": 1, "name": "f"}' + CLOSE
    assert parse_tool_calls(reordered).tool_calls[0]["function"] == {"name": "f", "arguments": '{"k": [1, {"z": null}]}'}
    for bad in ('{"name": "", "arguments": {}}', '{"arguments": {}}', '{"name": "f"}', '{"name": "f", "arguments": {}} x', "f(1)", ""):
        text = "Hi " + OPEN + bad + CLOSE + block("g", "{}")
        assert parse_tool_calls(text).content == text and parse_tool_calls(text).tool_calls == [], bad


def test_every_cut_of_an_answer_streams_as_it_reads(qwen):
    """Each answer below, cut at every character (as the budget or a stop string may cut it), fed character by
    character and token by token."""
    answers = [
        "I'll look both up. 你好 😀\n\n" + block("search", '{"q": "cats </tool_call> <tool_call>", "n": 2}') + "\n" + block("f", "{}"),
        block("add", json.dumps(json.dumps({"a": 1}))) + "\n" + OPEN + '\n{"name": "g", "arguments": {"x": "}"}}\n' + CLOSE + " tail",
        "No call here, only <tool_ text and {braces}.",
        OPEN + "\n{not json}\n" + CLOSE + " then text",
    ]
    for text in answers:
        for cut in range(len(text) + 1):
            final = text[:cut]
            assert_streams_as_parsed(chars(final), final)
        prefixes, final = token_prefixes(qwen, text)
        assert_streams_as_parsed(prefixes, final)


# ---------------------------------------------------------------------------------------------------------------
# property: any output, any feeding

PIECES = list('ab Z\n\t{}[]":,\\/<>_0-') + ["é", "你好", "😀", "tool_call", OPEN, CLOSE, "<tool_", "</tool", "true", "NaN"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
KEYS = st.sampled_from(["a", "text", "q", "</tool_call>", "é", 'k"ey'])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-99, 99) | st.floats(allow_nan=False, allow_infinity=False, width=32) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
BLANK = st.sampled_from(["", "\n", " ", "\n\n", "\t"])


@st.composite
def call_block(draw) -> str:
    """A block as a model may write it: well formed (members in either order, blanks, separators and escapes
    varying, arguments sometimes a JSON string), or broken in one of the ways models break them."""
    args = draw(st.dictionaries(KEYS, JSON, max_size=3))
    seps = draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,", " : ")]))
    ascii_only = draw(st.booleans())
    args_json = json.dumps(args, separators=seps, ensure_ascii=ascii_only)
    kind = draw(st.sampled_from(["call", "call", "call", "string_args", "array_args", "no_name", "garbage", "text_inside", "nan"]))
    if kind == "string_args":
        args_json = json.dumps(args_json)
    elif kind == "array_args":
        args_json = json.dumps(list(args))
    elif kind == "nan":
        args_json = '{"x": NaN}'
    name = draw(st.sampled_from(["add", "get_weather", "a.b-c", "名"]))
    members = [f'"name"{seps[1]}{json.dumps(name)}', f'"arguments"{seps[1]}{args_json}']
    if kind == "no_name":
        members = members[1:]
    if draw(st.booleans()):
        members.reverse()
    body = "{" + seps[0].join(members) + "}"
    if kind == "garbage":
        body = draw(TEXT)
    elif kind == "text_inside":
        body += draw(TEXT.filter(lambda t: t.strip() != ""))
    return OPEN + draw(BLANK) + body + draw(BLANK) + CLOSE


OUTPUT = st.lists(st.one_of(TEXT, call_block(), BLANK), max_size=6).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=OUTPUT, data=st.data())
def test_any_output_streams_as_it_reads(qwen, text, data):
    """Random mixes of text, well-formed and broken blocks (close tags in strings, string arguments, unicode), whole
    or cut anywhere, fed character by character, in random chunks and token by token (Qwen3's tokenizer)."""
    final = text[: data.draw(st.integers(0, len(text)), label="cut")] if data.draw(st.booleans(), label="cut it") else text
    assert_streams_as_parsed(chars(final), final)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(final))), max_size=8), label="chunks"))
    assert_streams_as_parsed([final[:c] for c in cuts], final)
    prefixes, decoded = token_prefixes(qwen, final, data.draw(st.sampled_from([1, 2, 5]), label="tokens per step"))
    assert_streams_as_parsed(prefixes, decoded)


# ---------------------------------------------------------------------------------------------------------------
# vLLM's hermes parser tests, ported as data

#: Deliberate differences from vLLM's hermes parser, with the reason; each case's own outcome is asserted below. None
#: since #49 item 10: a block the model ended without </tool_call> is a call (non_streaming_tool_call_until_eos), and
#: string arguments that hold no object are passed on as their JSON literal (the bare_string_arguments cases). Every
#: case is a whole output the model ended, so it is read with finished=True.
DIFFERENCES: dict[str, str] = {}


def case_feed(case: dict, qwen) -> tuple[list[str], str]:
    """The prefixes a case's stream sees and its final text, fed as vLLM's test feeds it."""
    if case["mode"] == "chunks":
        pieces = case["chunks"]
        return ["".join(pieces[: i + 1]) for i in range(len(pieces))], "".join(pieces)
    if case["mode"] == "tokens":
        return token_prefixes(qwen, case["output"], case["stream_interval"])
    return chars(case["output"]), case["output"]  # vLLM parses it whole; the stream is checked anyway


def agrees(case: dict, parsed) -> bool:
    """Whether our reading meets everything vLLM's test asserts for the case."""
    want = case["expect"]
    if bool(parsed.tool_calls) != want["tools_called"]:
        return False
    if "content" in want and (parsed.content or "") != want["content"]:
        return False
    calls = want.get("calls", [])
    if want["tools_called"] and len(parsed.tool_calls) != len(calls):
        return False
    for got, exp in zip(parsed.tool_calls, calls):
        fn = got["function"]
        if fn["name"] != exp.get("name", fn["name"]) or json.loads(fn["arguments"]) != exp["arguments"]:
            return False
        if "arguments_text" in exp and fn["arguments"] != exp["arguments_text"]:
            return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_vllm_hermes_case(qwen, case):
    prefixes, final = case_feed(case, qwen)
    parsed = parse_tool_calls(final, PREFIX, finished=True)
    assert joined(stream(prefixes, final, finished=True)[0]) == (parsed.content or "", parsed.tool_calls)
    assert agrees(case, parsed), (case["id"], parsed)
    for call in parsed.tool_calls:  # OpenAI's arguments are JSON text, whatever the model wrote
        json.loads(call["function"]["arguments"])


def test_vllm_hermes_agreement(qwen):
    """All 45 ported cases agree (25 of 26 before #49 item 10 and its 19 newer cases)."""
    agreeing = [c["id"] for c in CASES if agrees(c, parse_tool_calls(case_feed(c, qwen)[1], PREFIX, finished=True))]
    assert len(CASES) == 45 and len(agreeing) == len(CASES) and not DIFFERENCES


def test_a_block_left_unclosed_is_a_call_only_when_the_model_ended_the_answer(qwen):
    """#49 item 10, vLLM's until_eos case: the model wrote a whole call object and its end-of-turn token (or a stop
    string) instead of ``</tool_call>``: a call, streamed and not, also after earlier calls. Cut by the token budget
    (``finished=False``) the same text stays content, and so does an unfinished object or text after the object."""
    until_eos = next(c["output"] for c in CASES if c["id"] == "non_streaming_tool_call_until_eos")
    two = block("add", '{"a": 1}') + "\n" + until_eos + "\n"
    for text, names in ((until_eos, ["final_answer"]), (two, ["add", "final_answer"])):
        ended, cut = parse_tool_calls(text, PREFIX, finished=True), parse_tool_calls(text, PREFIX)
        assert [c["function"]["name"] for c in ended.tool_calls] == names and ended.problem is None
        assert ended.tool_calls[-1]["function"]["arguments"] == '{"trigger": true}'
        assert [c["function"]["name"] for c in cut.tool_calls] == names[:-1] and "not closed" in cut.problem
        a, b = tool_call_spans(text, finished=True)[-1]
        assert text[a:b] == '{"trigger": true}' and len(tool_call_spans(text)) == len(names) - 1
        for finished, parsed in ((True, ended), (False, cut)):
            prefixes, final = token_prefixes(qwen, text, 2)
            assert joined(stream(prefixes, final, finished=finished)[0]) == (parsed.content or "", parsed.tool_calls)
    for unfinished in (until_eos[:-1], until_eos + " and more", until_eos + "\n</tool_"):
        assert parse_tool_calls(unfinished, finished=True).tool_calls == []


# ---------------------------------------------------------------------------------------------------------------
# the finish reason


def _result(text: str, stopped_by: str) -> MMResult:
    parsed = parse_tool_calls(text, finished=stopped_by != "max_new_tokens")
    return MMResult(text, [], [], {"stopped_by": stopped_by}, None, None, tool_calls=parsed.tool_calls, content=parsed.content)


def test_the_budget_ends_an_answer_with_length():
    """A forced call cut by the budget: ``length``, its text as the content and no call; calls read before the cut
    stay (they were streamed), still ``length``. Ended by EOS: ``tool_calls`` with calls, else ``stop`` (a cut
    object is no call however the answer ended)."""
    one, cut = block("add", '{"a": 3, "b": 4}'), block("add", '{"a": 3, "b": 4}')[:-20]
    assert (finish_reason(_result(cut, "max_new_tokens")), _result(cut, "max_new_tokens").tool_calls) == ("length", [])
    assert message_of(_result(cut, "max_new_tokens"), PREFIX) == {"role": "assistant", "content": cut}
    two = _result(one + "\n" + cut, "max_new_tokens")
    assert finish_reason(two) == "length" and [c["function"]["name"] for c in two.tool_calls] == ["add"]
    assert finish_reason(_result(one, "eos")) == "tool_calls" and finish_reason(_result(cut, "eos")) == "stop"
    assert finish_reason(_result("plain", "stop_string")) == "stop" and finish_reason(_result("plain", "max_new_tokens")) == "length"
    unclosed = one.removesuffix(CLOSE)  # a whole call object, then the end of the answer (#49 item 10)
    for stopped_by, reason, content, calls in (
        ("eos", "tool_calls", None, 1),
        ("stop_string", "tool_calls", None, 1),
        ("max_new_tokens", "length", unclosed, 0),
    ):
        res = _result(unclosed, stopped_by)
        assert (finish_reason(res), len(res.tool_calls), message_of(res, PREFIX)["content"]) == (reason, calls, content), stopped_by


def test_a_stream_reads_each_block_about_once(monkeypatch):
    """The server pushes the whole text at every step: reading resumes after the calls already read, so a push
    reads the block still open (and those just closed), not every block again. A long answer with many calls,
    pushed a few characters at a time, reads blocks about once per push (without resuming: some 20 times)."""
    from asymspec_mm.request import tools

    reads = []
    monkeypatch.setattr(tools, "_block", lambda text, at, _read=tools._block: reads.append(at) or _read(text, at))
    text = "x" * 500 + "".join("\n" + block(f"f{i}", json.dumps({"s": "y" * 50, "i": i})) for i in range(40))
    rng, cut, s, deltas, pushes = random.Random(0), 0, ToolCallStream(PREFIX), [], 0
    while cut < len(text):
        cut = min(len(text), cut + rng.randint(1, 3))
        deltas += s.push(text[:cut])
        pushes += 1
    deltas += s.finish(text, parse_tool_calls(text, PREFIX))
    assert len(joined(deltas)[1]) == 40 and len(reads) < 1.2 * pushes, (len(reads), pushes)
