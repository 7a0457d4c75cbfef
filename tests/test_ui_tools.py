"""Agent tools in the steering inspector: the tools a run offers, their checks, and the tool-call panel that shows
each argument's value as the tokens that produced it (accepted drafts, fused, bonus, ...). Pure rendering on
hand-made traces; real forwards on the tiny random pair, through DemoApp and through gradio_client."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import saved_case  # noqa: E402
from test_ui import RUN_DEFAULTS, demo_args, run_args  # noqa: E402

from asymspec_mm.decode import TokenEvent  # noqa: E402
from ui.app import RUN_OUTPUTS, DemoInputError, outputs_as_dict  # noqa: E402
from ui.outputs import NO_TOOLS, TOOLS_OFF, TOOLS_PENDING  # noqa: E402
from ui.tool_calls import ARGUMENTS_KEY, NO_CALL_TEXT, argument_spans, render_tool_calls_html, token_offsets  # noqa: E402
from ui.tool_inputs import EXAMPLE_TOOLS, MAX_TOOLS_CHARS, check_tool_inputs, example_tools_text, tool_choice_info  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio

CONFIG_FIELDS = ("k", "beta", "gamma", "gate", "delta", "bonus", "max_new_tokens", "drafter_view")
#: Enough tokens for the tiny pair's character-level call to ``add`` with two bounded integers.
MAX_NEW = 96


# ------------------------------------------------------------------------------------------ helpers


class ToolCallParser(HTMLParser):
    """The tool-call panel as data: its calls (name, arguments), each argument's attributes and token spans."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.panel: dict = {}
        self.calls: list[dict] = []
        self.notes: list[str] = []
        self._stack: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        role = None
        if "asym-tool-calls" in classes:
            self.panel = a
        elif "asym-tool-call" in classes:
            self.calls.append({"name": a["data-name"], "args": []})
        elif "asym-tool-arg" in classes:
            self.calls[-1]["args"].append({"attrs": a, "tokens": [], "summary": ""})
        elif "tok" in classes and "data-token-id" in a:
            self.calls[-1]["args"][-1]["tokens"].append({"attrs": a, "classes": set(classes), "text": "", "tip": ""})
        elif "tok-text" in classes:
            role = "text"
        elif "tok-tip" in classes:
            role = "tip"
        elif "asym-tool-summary" in classes:
            role = "summary"
        elif "asym-empty" in classes:
            role = "note"
        self._stack.append(role)

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()

    def handle_data(self, data):
        role = next((r for r in reversed(self._stack) if r), None)
        if role == "note":
            self.notes.append(data)
        elif role == "summary":
            self.calls[-1]["args"][-1]["summary"] += data
        elif role in ("text", "tip"):
            self.calls[-1]["args"][-1]["tokens"][-1][role] += data


def read_panel(html_text: str) -> ToolCallParser:
    p = ToolCallParser()
    p.feed(html_text)
    p.close()
    return p


def arg_of(panel: ToolCallParser, call: int, key: str) -> dict:
    return next(a for a in panel.calls[call]["args"] if a["attrs"]["data-arg"] == key)


def event(i: int, text: str, source: str, steered: bool = False, token_id: int | None = None) -> TokenEvent:
    return TokenEvent(
        index=i,
        token_id=100 + i if token_id is None else token_id,
        text=text,
        source=source,
        step=i + 1,
        position=1,
        p_verifier=0.5,
        verifier_argmax=7 if steered else 100 + i,
        steered=steered,
    )


def call_trace(pieces: list[tuple[str, str, bool]]) -> list[TokenEvent]:
    return [event(i, text, source, steered) for i, (text, source, steered) in enumerate(pieces)]


#: ``<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>`` in tokens: ``' 1'`` starts the
#: value of a with a space, ``', "b": 3'`` ends in b's value.
ADD_CALL = [
    ("<tool_call>", "accepted", False),
    ("\n", "accepted", False),
    ('{"name": "add", "arguments": {"a":', "accepted", False),
    (" 1", "fused", True),
    ("2", "bonus", False),
    (', "b": 3', "accepted", False),
    ("0}}", "fused", False),
    ("\n</tool_call>", "accepted", False),
]


class ByteTokenizer:
    """A byte-level tokenizer: each id is a few bytes (a token may end inside a UTF-8 character); id 0 is special."""

    all_special_ids = [0]

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=False):
        data = b"".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == 0))
        return data.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ pure functions


def test_argument_values_are_drawn_as_their_tokens_with_their_sources():
    trace = call_trace(ADD_CALL)
    panel = read_panel(render_tool_calls_html(trace))
    assert panel.panel["data-calls"] == "1" and panel.panel["data-tool-state"] == "calls"
    assert [c["name"] for c in panel.calls] == ["add"]
    a, b = arg_of(panel, 0, "a"), arg_of(panel, 0, "b")
    assert json.loads(a["attrs"]["data-value"]) == 12 and json.loads(b["attrs"]["data-value"]) == 30
    # each value's characters, drawn as the tokens that produced them (the part inside the value)
    assert [(t["attrs"]["data-source"], t["text"]) for t in a["tokens"]] == [("fused", "1"), ("bonus", "2")]
    assert [(t["attrs"]["data-source"], t["text"]) for t in b["tokens"]] == [("accepted", "3"), ("fused", "0")]
    assert [int(t["attrs"]["data-index"]) for t in a["tokens"]] == [3, 4]
    assert a["attrs"]["data-sources"] == "fused,bonus" and b["attrs"]["data-sources"] == "accepted,fused"
    # the answer panel's classes and hover box: the whole token in the box, the steered mark
    assert a["tokens"][0]["classes"] == {"tok", "tok-fused", "tok-steered"} and "token     ' 1'" in a["tokens"][0]["tip"]
    assert b["tokens"][0]["classes"] == {"tok", "tok-accepted"} and "STEERED" not in b["tokens"][0]["tip"]
    assert a["summary"].startswith("1 fused, 1 bonus") and "steered" in a["summary"] and a["attrs"]["data-steered"] == "1"
    assert b["summary"] == "1 accepted, 1 fused" and b["attrs"]["data-steered"] == "0"


def test_a_token_across_two_values_is_shown_once_in_the_first():
    pieces = [(t, s, st) for t, s, st in ADD_CALL]
    pieces[4:6] = [('2, "b": 3', "accepted", False)]  # ends a's value and starts b's
    panel = read_panel(render_tool_calls_html(call_trace(pieces)))
    a, b = arg_of(panel, 0, "a"), arg_of(panel, 0, "b")
    assert [(t["attrs"]["data-source"], t["text"]) for t in a["tokens"]] == [("fused", "1"), ("accepted", "2")]
    assert [(t["attrs"]["data-source"], t["text"]) for t in b["tokens"]] == [("fused", "0")]
    assert b["summary"] == "1 fused"


def test_a_close_tag_inside_a_string_and_string_arguments_are_placed_where_the_parser_read_them():
    """The panel finds each call's arguments where the parser read them: a ``</tool_call>`` inside a JSON string does
    not end the block, and arguments written as a JSON string are drawn as the tokens of that string."""
    pieces = [
        ("<tool_call>\n", "accepted", False),
        ('{"name": "say", "arguments": {"text": "a </tool_call>', "accepted", False),
        (' b"', "fused", True),
        ("}}\n</tool_call>\n<tool_call>\n", "accepted", False),
        ('{"name": "add", "arguments": "{\\"a\\": 4', "bonus", False),
        ('}"}\n</tool_call>', "accepted", False),
    ]
    panel = read_panel(render_tool_calls_html(call_trace(pieces)))
    assert [c["name"] for c in panel.calls] == ["say", "add"]
    text = arg_of(panel, 0, "text")
    assert json.loads(text["attrs"]["data-value"]) == "a </tool_call> b"
    assert [(t["attrs"]["data-source"], t["text"]) for t in text["tokens"]] == [("accepted", '"a </tool_call>'), ("fused", ' b"')]
    a = arg_of(panel, 1, "a")
    assert json.loads(a["attrs"]["data-value"]) == 4 and [t["attrs"]["data-source"] for t in a["tokens"]] == ["bonus", "accepted"]


def test_offsets_follow_the_tokenizers_text_across_split_characters():
    # {"city": "Zürich", "n": [1, 2]}: the token '"Z\xc3' ends inside "ü", the next one finishes it; id 0 ends the answer
    pieces = [
        b"<end>",
        b"<tool_call>\n",
        b'{"name": "find", "arguments": {"city": ',
        b'"Z\xc3',
        b'\xbcrich"',
        b', "n": [1, ',
        b"2]}}\n</tool_call>",
    ]
    tok = ByteTokenizer(pieces)
    ids = [*range(1, len(pieces)), 0]
    trace = [event(i, tok.decode([t]), "accepted" if i % 2 else "fused", token_id=t) for i, t in enumerate(ids)]
    text, spans = token_offsets(trace, tok)
    assert text == tok.decode(ids, skip_special_tokens=True) and "Zürich" in text and "<end>" not in text
    produced = ["<tool_call>\n", '{"name": "find", "arguments": {"city": ', '"Z', 'ürich"', ', "n": [1, ', "2]}}\n</tool_call>", ""]
    assert [text[s:e] for s, e in spans] == produced
    panel = read_panel(render_tool_calls_html(trace, tok))
    city, n = arg_of(panel, 0, "city"), arg_of(panel, 0, "n")
    assert json.loads(city["attrs"]["data-value"]) == "Zürich" and [t["text"] for t in city["tokens"]] == ['"Z', 'ürich"']
    assert json.loads(n["attrs"]["data-value"]) == [1, 2] and [t["text"] for t in n["tokens"]] == ["[1, ", "2]"]
    assert [t["attrs"]["data-source"] for t in n["tokens"]] == ["fused", "accepted"]


def test_arguments_that_are_one_value_are_one_row_of_their_tokens():
    """A call whose arguments are a list (a tool whose parameters are an array) shows them as one row, the value
    drawn as the tokens that wrote it (before, such a block read as no call)."""
    trace = call_trace(
        [
            ("<tool_call>\n", "accepted", False),
            ('{"name": "pick", "arguments": [1, ', "fused", True),
            ("2]}\n</tool_call>", "accepted", False),
        ]
    )
    ((row,),) = [c["args"] for c in read_panel(render_tool_calls_html(trace)).calls]
    assert row["attrs"]["data-arg"] == ARGUMENTS_KEY and json.loads(row["attrs"]["data-value"]) == [1, 2]
    assert [t["text"] for t in row["tokens"]] == ["[1, ", "2]"] and row["attrs"]["data-steered"] == "1"


def test_no_call_and_unreadable_calls_say_so():
    for trace in ([], call_trace([("The answer is 5.", "accepted", False)])):
        panel = read_panel(render_tool_calls_html(trace))
        assert panel.calls == [] and panel.notes == [NO_CALL_TEXT] and panel.panel["data-tool-state"] == "empty"
    assert read_panel(render_tool_calls_html([], empty="nothing <here>")).notes == ["nothing <here>"]
    unclosed = call_trace(ADD_CALL[:-1])
    panel = read_panel(render_tool_calls_html(unclosed))
    assert panel.calls == [] and panel.panel["data-tool-state"] == "problem"
    assert panel.notes == ["The tool call could not be read: a <tool_call> block is not closed."]
    ended = read_panel(render_tool_calls_html(unclosed, finished=True))  # the model ended it there: a call (#49 item 10)
    assert [c["name"] for c in ended.calls] == ["add"] and [t["attrs"]["data-index"] for t in arg_of(ended, 0, "a")["tokens"]] == ["3", "4"]
    no_args = call_trace([("<tool_call>\n", "accepted", False), ('{"name": "add"}\n</tool_call>', "fused", False)])
    assert "does not hold" in read_panel(render_tool_calls_html(no_args)).notes[0]
    two = read_panel(render_tool_calls_html(call_trace([*ADD_CALL, ("\n", "bonus", False), *ADD_CALL])))
    assert [c["name"] for c in two.calls] == ["add", "add"]
    assert [t["attrs"]["data-index"] for t in arg_of(two, 1, "a")["tokens"]] == ["12", "13"]
    html_text = render_tool_calls_html(
        call_trace([("<tool_call>\n", "accepted", False), ('{"name": "x", "arguments": {"<b>": "<i>"}}\n</tool_call>', "fused", False)])
    )
    assert "<b>" not in html_text and "<i>" not in html_text and read_panel(html_text).calls[0]["args"][0]["attrs"]["data-arg"] == "<b>"
    assert argument_spans('{"a": {"b": [1, "}"]}, "c": null}') == [("a", {"b": [1, "}"]}, (6, 21)), ("c", None, (28, 32))]
    assert argument_spans("[1]") == [] and argument_spans("{}") == []


def test_tool_inputs_are_checked_with_one_line_errors():
    assert check_tool_inputs("", "auto") == (None, None)
    assert check_tool_inputs(None, None) == (None, None)
    assert check_tool_inputs("  [] ", "none") == (None, None)
    tools, choice = check_tool_inputs(example_tools_text(), "required")
    assert [t["function"]["name"] for t in tools] == ["add"] and choice == "required"
    assert json.loads(example_tools_text()) == EXAMPLE_TOOLS and "\n  " in example_tools_text()  # pretty-printed
    assert check_tool_inputs(example_tools_text(), "add")[1] == {"type": "function", "function": {"name": "add"}}
    assert check_tool_inputs(example_tools_text(), "")[1] == "auto"
    named = '{"type": "function", "function": {"name": "add"}}'
    assert check_tool_inputs(example_tools_text(), named)[1] == json.loads(named)
    bad = [
        ('[{"type": "function",\n  "function": {"name": "add"}', "auto", r"^the tools field is not valid JSON \(line 2, column \d+\)"),
        ('{"type": "function"}', "auto", r"^the tools field: tools must be a list"),
        ('[{"type": "function", "function": {"name": "a b"}}]', "auto", r"^the tools field: tools\[0\]\.function\.name"),
        ("", "required", r"^the tool choice: .*no tools are offered; add a tool to the tools field first$"),
        (example_tools_text(), "multiply", r"^the tool choice: .*must name one of the offered tools; choose .* one of: add$"),
        (example_tools_text(), "{nope", r"^the tool choice is not valid JSON"),
        ("[" + " " * MAX_TOOLS_CHARS + "]", "auto", rf"limit is {MAX_TOOLS_CHARS}$"),
    ]
    for tools_text, choice, pattern in bad:
        with pytest.raises(DemoInputError) as err:
            check_tool_inputs(tools_text, choice)
        assert re.search(pattern, str(err.value)) and "\n" not in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ through DemoApp


def user(question: str, image=None) -> dict:
    content = ([{"type": "image", "image": image}] if image is not None else []) + [{"type": "text", "text": question}]
    return {"role": "user", "content": content}


def chat_reference(pipe, messages, case, method="asymspec", **kw):
    """``pipe.chat`` with the example tool forced, the caption, OCR text and settings the demo sends for ``case``."""
    o = {**RUN_DEFAULTS, "max_new_tokens": MAX_NEW, **kw}
    return pipe.chat(
        messages,
        tools=EXAMPLE_TOOLS,
        tool_choice="required",
        caption=case["caption"],
        ocr=case["ocr"] or False,
        method=method,
        **{f: o[f] for f in CONFIG_FIELDS},
    )


def value_tokens(res, key: str, special: set[int]) -> list[tuple[str, int]]:
    """(source, token id) of the tokens whose characters fall in ``key``'s value, found in ``res``'s own text and
    trace (the tiny pair's tokens are plain ASCII: their texts, special tokens aside, join to the answer)."""
    trace = [ev for ev in res.trace if ev.token_id not in special]
    assert "".join(ev.text for ev in trace) == res.text
    match = re.search(rf'"{key}": (-?\d+)', res.text)
    start, end = match.span(1)
    out, pos = [], 0
    for ev in trace:
        lo, pos = pos, pos + len(ev.text)
        if lo < end and pos > start:
            out.append((ev.source, ev.token_id))
    return out


@pytest.fixture
def image_case(tmp_path):
    return saved_case(tmp_path, 80, "tools.png")


def check_calls_match(html_text: str, res, special: set[int]) -> None:
    """The panel shows ``res``'s calls: the names, the argument values, and each value's tokens with their sources."""
    panel = read_panel(html_text)
    assert res.tool_calls, res.text
    assert [c["name"] for c in panel.calls] == [c["function"]["name"] for c in res.tool_calls]
    for shown, call in zip(panel.calls, res.tool_calls):
        args = json.loads(call["function"]["arguments"])
        assert {a["attrs"]["data-arg"]: json.loads(a["attrs"]["data-value"]) for a in shown["args"]} == args
    for key in ("a", "b"):
        arg = arg_of(panel, 0, key)
        got = [(t["attrs"]["data-source"], int(t["attrs"]["data-token-id"])) for t in arg["tokens"]]
        assert got == value_tokens(res, key, special), key
        assert "".join(t["text"] for t in arg["tokens"]) == str(args[key])
        assert all(f"tok-{source}" in t["classes"] for t, (source, _) in zip(arg["tokens"], got))


def test_the_tool_choice_says_what_its_value_does():
    """#41: the label read "(required: the answer must call a tool)" whatever the choice; the line under it now says
    what the chosen value does, and follows it."""
    import gradio as gr

    from ui.tool_inputs import _tool_choice_update, build_tool_inputs

    with gr.Blocks():
        _, choice = build_tool_inputs()
    assert "must call" not in choice.label and choice.info == tool_choice_info("auto")
    assert "decides" in tool_choice_info("auto") and "must call a tool" not in tool_choice_info("auto")
    assert tool_choice_info("required") == "required: the answer must call a tool."
    assert "no tool is called" in tool_choice_info("none") and tool_choice_info(None) == tool_choice_info(" ")
    assert tool_choice_info("add") == "add: the answer must call the tool add."
    assert "function it names" in tool_choice_info('{"type": "function", "function": {"name": "add"}}')
    assert _tool_choice_update("none")["info"] == tool_choice_info("none")


def test_a_forced_call_shows_its_arguments_with_their_provenance(tiny_pipe, state, image_case):
    path, case = image_case
    run = state.run(*demo_args(path, case, max_new_tokens=MAX_NEW), False, example_tools_text(), "required", session="t")
    outs = [outputs_as_dict(o) for o in run]
    out = outs[-1]
    assert 'data-status="ok"' in out["status"], out["status"]
    assert read_panel(outs[0]["tool_calls_html"]).notes == [TOOLS_PENDING]  # the first update: not done yet
    assert all(not isinstance(o["tool_calls_html"], str) for o in outs[1:-1])  # streamed updates leave it alone
    want = chat_reference(tiny_pipe, [user(case["question"], case["pil"])], case)
    assert want.finish_reason == "tool_calls", want.text
    assert out["result_json"]["main"]["token_ids"] == want.token_ids and out["answer_text"] == want.text
    assert out["result_json"]["main"]["tool_calls"] == want.tool_calls
    check_calls_match(out["tool_calls_html"], want, set(tiny_pipe.tokenizer.all_special_ids))
    # the comparisons answer the same request with the same tools
    floor = chat_reference(tiny_pipe, [user(case["question"], case["pil"])], case, method="floor")
    assert out["result_json"]["floor"]["token_ids"] == floor.token_ids

    # a follow-up with the tools: the conversation goes on (the recorded answer is the call's text)
    follow = {**case, "question": "And the other bar?"}
    second = outputs_as_dict(
        list(state.run(*demo_args(path, follow, max_new_tokens=MAX_NEW), True, example_tools_text(), "required", session="t"))[-1]
    )
    assert 'data-status="ok"' in second["status"] and read_panel(second["tool_calls_html"]).calls
    assert [t.question for t in state.conversations.turns("t")] == [case["question"], follow["question"]]
    messages = [user(case["question"], case["pil"]), {"role": "assistant", "content": want.text}, user(follow["question"])]
    assert second["result_json"]["main"]["token_ids"] == chat_reference(tiny_pipe, messages, case).token_ids


def test_without_tools_the_panel_says_so_and_the_run_is_unchanged(tiny_pipe, state, image_case):
    from test_ui import reference

    path, case = image_case
    for extra in ((), (False,), (False, "", "auto"), (False, "[]", "none")):
        out = outputs_as_dict(list(state.run(*demo_args(path, case), *extra))[-1])
        assert read_panel(out["tool_calls_html"]).notes == [NO_TOOLS]
        assert (
            out["result_json"]["main"]["token_ids"] == reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"]).token_ids
        )
    # tools offered but tool_choice none: the answer is not read for calls
    out = outputs_as_dict(list(state.run(*demo_args(path, case), False, example_tools_text(), "none"))[-1])
    assert read_panel(out["tool_calls_html"]).notes == [TOOLS_OFF] and out["result_json"]["main"]["tool_calls"] is None


def test_bad_tools_are_refused_in_the_status_and_the_app_keeps_serving(state, image_case):
    import gradio as gr

    path, case = image_case
    for tools_text, choice, message in (
        ("[{", "auto", "the tools field is not valid JSON (line 1, column 3)"),
        (example_tools_text(), "multiply", "must name one of the offered tools"),
    ):
        outs = []
        with pytest.raises(gr.Error, match=re.escape(message)):
            for o in state.run(*demo_args(path, case), False, tools_text, choice):
                outs.append(outputs_as_dict(o))
        assert len(outs) == 1 and 'data-status="error"' in outs[0]["status"] and message in outs[0]["status"]
        assert all(not isinstance(outs[0][k], str) for k in RUN_OUTPUTS[1:])  # the last answer stays
    out = outputs_as_dict(list(state.run(*demo_args(path, case, max_new_tokens=MAX_NEW), False, example_tools_text(), "add"))[-1])
    assert 'data-status="ok"' in out["status"] and [c["name"] for c in read_panel(out["tool_calls_html"]).calls] == ["add"]


# ------------------------------------------------------------------------------------------ through gradio_client


def test_api_tools_are_the_last_inputs(served_demo, tiny_pipe, image_case):
    from gradio_client.exceptions import AppError

    _, client = served_demo
    path, case = image_case
    args = run_args(path, case["question"], case["caption"], case["ocr"], max_new_tokens=MAX_NEW)
    out = outputs_as_dict(client.predict(*args, False, example_tools_text(), "required", api_name="/run"))
    assert list(out) == list(RUN_OUTPUTS) and RUN_OUTPUTS[-1] == "tool_calls_html"
    want = chat_reference(tiny_pipe, [user(case["question"], case["pil"])], case)
    check_calls_match(out["tool_calls_html"], want, set(tiny_pipe.tokenizer.all_special_ids))
    with pytest.raises(AppError, match=re.escape("the tools field is not valid JSON")):
        client.predict(*args, False, "not json", "auto", api_name="/run")
    # a caller that sends only the inputs before the tools: no tools
    out = outputs_as_dict(
        client.predict(*run_args(path, case["question"], case["caption"], case["ocr"], max_new_tokens=4), api_name="/run")
    )
    assert 'data-status="ok"' in out["status"] and read_panel(out["tool_calls_html"]).notes == [NO_TOOLS]


def test_the_agent_example_calls_with_the_values_the_drafter_read():
    """The demo's agent example on the shipped tiny pair: the call is the gold call, its two values come from the
    image (accepted drafts of the drafter, which reads the pixels), and the blind verifier alone guesses other values."""
    from PIL import Image

    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.eval.minivista_agent import make_agent_problem
    from ui import app as ui_app
    from ui.examples import load_agent_examples

    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    examples = load_agent_examples()
    assert examples, "the bundled agent examples are missing"
    app = ui_app.DemoApp(pipe, stream_interval=0.0)
    try:
        for ex in examples:
            task = make_agent_problem(int(ex["seed"]), int(ex["index"]))
            assert (ex["question"], ex["caption"], ex["ocr"]) == (task["query"], task["caption"], task["ocr"])  # the example is that task
            assert Image.open(ex["image"]).convert("RGB").tobytes() == task["image"].convert("RGB").tobytes()
            case = {"question": ex["question"], "caption": ex["caption"], "ocr": ex["ocr"]}
            run = app.run(*demo_args(ex["image"], case, max_new_tokens=64), False, ex["tools"], ex["tool_choice"], session="agent")
            out = outputs_as_dict(list(run)[-1])
            assert 'data-status="ok"' in out["status"], out["status"]
            panel = read_panel(out["tool_calls_html"])
            assert [c["name"] for c in panel.calls] == [task["gold_call"]["name"]]
            shown = {a["attrs"]["data-arg"]: json.loads(a["attrs"]["data-value"]) for a in panel.calls[0]["args"]}
            assert shown == task["gold_call"]["arguments"]
            for key in ("a", "b"):
                assert [t["attrs"]["data-source"] for t in arg_of(panel, 0, key)["tokens"]] == ["accepted"], key
            floor = out["result_json"]["floor"]["tool_calls"]
            assert not floor or json.loads(floor[0]["function"]["arguments"]) != task["gold_call"]["arguments"]
    finally:
        app.close()
