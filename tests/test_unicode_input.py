"""Text that is not valid Unicode (a lone surrogate: JSON's ``"\\ud800"``, or an undecodable byte kept by
``surrogateescape``) is refused where the request is built, naming the field, at every edge: the server (a 400 and
it goes on serving), the Python API (a one-line ``ValueError``), the CLI (one line, exit 2, no traceback). The
server's ``stop`` takes at most 4 strings, as OpenAI's."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import make_case

from asymspec_mm.base.errors import InvalidTextError, UnknownOptionError
from asymspec_mm.base.unicode_check import check_text_fields, find_bad_text, text_problem

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
BAD = "@BAD@"  # where a body's JSON text gets the escape \ud800
PROBLEM = "not valid Unicode text (lone surrogate U+D800 at character 0); send UTF-8 text"


# ---------------------------------------------------------------------------------------------- the pure check
def test_the_first_bad_string_is_named_by_its_path():
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": "a\ud800"}]}],
        "tools": [{"function": {"description": "\udce9"}}],
    }
    assert find_bad_text(body) == ("messages[0].content[1].text", "lone surrogate U+D800 at character 1")
    assert find_bad_text({"tools": body["tools"]}) == (
        "tools[0].function.description",
        "lone surrogate U+DCE9 (undecodable byte 0xe9) at character 0",
    )
    assert find_bad_text({"schema": {"properties": {"\ud800": {}}}}) == ("schema.properties (key '\\ud800')", text_problem("\ud800"))
    assert find_bad_text({"schema": {"a b": ["x", "\ud800"]}}) == ('schema["a b"][1]', text_problem("\ud800"))
    assert find_bad_text({"n": 3, "img": b"\xff", "deep": [["ok", ["\ud800"]]]}) == ("deep[0][1][0]", text_problem("\ud800"))
    assert find_bad_text({"fine": "caf\u00e9 \U0001f600", "none": None, "flag": False}) is None
    with pytest.raises(InvalidTextError) as info:
        check_text_fields({"question": "\ud800 x"}, prefix="requests[3]")
    assert str(info.value) == f"requests[3].question: {PROBLEM}" and info.value.param == "requests[3].question"
    assert isinstance(info.value, ValueError)


def test_a_deeply_nested_body_does_not_exhaust_the_stack():
    value: list = ["\ud800"]
    for _ in range(5000):
        value = [value]
    assert find_bad_text({"x": value})[0].startswith("x[0][0]")


# ---------------------------------------------------------------------------------------------- the server
def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server_options():
    return {"max_batch_size": 4, "max_queue": 16}


_QUESTION = {"type": "text", "text": "What is the largest value?"}


def _body(**fields) -> dict:
    """A cheap request: one image with its caption given, no OCR, the verifier alone for 2 tokens; ``fields``
    replace the body's (``messages`` without an image: no caption)."""
    case = make_case(7)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(case["image"])}}, _QUESTION]}],
        "max_tokens": 2,
        "asymspec": {"caption": "a chart", "ocr": False, "method": "floor"},
    }
    if "messages" in fields:
        body["asymspec"] = {"ocr": False, "method": "floor"}
    body.update(fields)
    return body


_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
_TOOL = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}}


def _tool_turns(call: dict, result: str = "3") -> list:
    return [
        {"role": "user", "content": "Add one."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


#: name -> (body with BAD where the escape goes, the field the 400 names)
SURROGATE_BODIES = {
    "user_string": ({"messages": [{"role": "user", "content": f"{BAD} x"}]}, "messages[0].content"),
    "text_part": (None, "messages[0].content[1].text"),
    "system": ({"messages": [{"role": "system", "content": f"{BAD}"}, {"role": "user", "content": "Hi?"}]}, "messages[0].content"),
    "tool_call_name": (
        {"messages": _tool_turns({**_CALL, "function": {"name": f"{BAD}", "arguments": "{}"}}), "tools": [_TOOL]},
        "messages[1].tool_calls[0].function.name",
    ),
    "tool_call_arguments": (
        {"messages": _tool_turns({**_CALL, "function": {"name": "add", "arguments": f'{{"a": "{BAD}"}}'}}), "tools": [_TOOL]},
        "messages[1].tool_calls[0].function.arguments",
    ),
    "tool_result": ({"messages": _tool_turns(_CALL, f"{BAD}"), "tools": [_TOOL]}, "messages[2].content"),
    "tool_description": (
        {"tools": [{**_TOOL, "function": {**_TOOL["function"], "description": f"{BAD}"}}]},
        "tools[0].function.description",
    ),
    "schema_string": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"a": {"description": f"{BAD}"}}}},
            }
        },
        "response_format.json_schema.schema.properties.a.description",
    ),
    "stop": ({"stop": ["ok", f"{BAD}"]}, "stop[1]"),
    "caption": ({"asymspec": {"caption": f"{BAD}", "ocr": False}}, "asymspec.caption"),
    "ocr": ({"asymspec": {"caption": "a chart", "ocr": f"{BAD}"}}, "asymspec.ocr"),
}


def _raw(name: str, text: str = "\\ud800", **extra) -> bytes:
    """The request's JSON text with ``text`` where BAD was: the escape ``\\ud800`` (json.dumps would write it the
    same), or good text."""
    fields, _ = SURROGATE_BODIES[name]
    body = _body(**(fields or {}), **extra)
    if name == "text_part":
        body["messages"][0]["content"][1] = {"type": "text", "text": BAD + " What is the largest value?"}
    dumped = json.dumps(body)
    assert BAD in dumped
    return dumped.replace(BAD, text).encode()


def _post(server, content: bytes) -> httpx.Response:
    return httpx.post(server.url + CHAT, content=content, headers={"content-type": "application/json"}, timeout=300)


@pytest.mark.parametrize("name", sorted(SURROGATE_BODIES))
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server, name):
    r = _post(server, _raw(name))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    param = SURROGATE_BODIES[name][1]
    assert error["param"] == param and error["code"] == "invalid_text", error
    assert error["message"].startswith(f"{param}: not valid Unicode text (lone surrogate U+D800 at character")
    assert error["message"].endswith("; send UTF-8 text") and "\n" not in error["message"]
    r = _post(server, _raw(name, "ok"))  # the surrogate was the only problem, and the server goes on
    assert r.status_code == 200, r.text


def test_streamed_too_and_the_server_goes_on(server):
    r = _post(server, _raw("user_string", stream=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = _post(server, _raw("user_string", "ok", stream=True))
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text


def test_more_than_four_stop_strings_are_refused_by_name(client):
    openai = pytest.importorskip("openai")
    body = _body()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=body["messages"], max_tokens=2, stop=["a", "b", "c", "d", "e"], extra_body={"asymspec": body["asymspec"]}
        )
    assert err.value.body["param"] == "stop" and "stop has 5 strings; at most 4" in err.value.body["message"]
    resp = client.chat.completions.create(
        model="tiny", messages=body["messages"], max_tokens=2, stop=["a", "b", "c", "d"], extra_body={"asymspec": body["asymspec"]}
    )
    assert resp.choices[0].message.content is not None  # four are fine, and the server went on


# ---------------------------------------------------------------------------------------------- the Python API
def _one_line_error(call, error=ValueError) -> ValueError:
    with pytest.raises(error) as info:
        call()
    assert "\n" not in str(info.value)
    return info.value


def test_the_python_api_names_the_field(tiny_pipe):
    case = make_case(3)
    img = case["image"]
    err = _one_line_error(lambda: tiny_pipe.chat([{"role": "user", "content": "\ud800 x"}], ocr=False), InvalidTextError)
    assert str(err) == f"messages[0].content: {PROBLEM}" and err.param == "messages[0].content"
    parts = [{"type": "image", "image": img}, {"type": "text", "text": "ok"}, {"type": "text", "text": "\ud800"}]
    err = _one_line_error(lambda: tiny_pipe.chat([{"role": "user", "content": parts}], caption="c", ocr=False), InvalidTextError)
    assert err.param == "messages[0].content[2].text"
    err = _one_line_error(lambda: tiny_pipe.generate(img, "What?", caption="\ud800", ocr=False), InvalidTextError)
    assert err.param == "caption"
    err = _one_line_error(lambda: tiny_pipe.generate(img, "What?", caption="c", ocr="x\ud800"), InvalidTextError)
    assert str(err).startswith("ocr: not valid Unicode text (lone surrogate U+D800 at character 1)")
    # one rule for the question whatever the path (the request object checks it once): the field, by name
    err = _one_line_error(lambda: tiny_pipe.generate(img, "\ud800 x", caption="c", ocr=False), InvalidTextError)
    assert str(err) == f"question: {PROBLEM}" and err.param == "question"
    err = _one_line_error(lambda: tiny_pipe.generate(img, "What?", caption="c", ocr=False, stop_strings=("\ud800",)), InvalidTextError)
    assert err.param == "stop_strings[0]"
    tools = [{**_TOOL, "function": {**_TOOL["function"], "description": "\ud800"}}]
    err = _one_line_error(lambda: tiny_pipe.chat([{"role": "user", "content": "Add."}], tools=tools), InvalidTextError)
    assert err.param == "tools[0].function.description"
    err = _one_line_error(lambda: tiny_pipe.complete("\ud800"), InvalidTextError)
    assert err.param == "prompt"


def test_generate_batch_names_the_request_and_runs_nothing(tiny_pipe):
    case = make_case(3)
    good = {"image": case["image"], "question": "What?", "caption": "c", "ocr": False}
    err = _one_line_error(lambda: tiny_pipe.generate_batch([good, {**good, "question": "\ud800 x"}], max_new_tokens=2), InvalidTextError)
    assert str(err) == f"requests[1].question: {PROBLEM}"
    chat = {"messages": [{"role": "system", "content": "\ud800"}, {"role": "user", "content": "Hi?"}], "ocr": False}
    err = _one_line_error(lambda: tiny_pipe.generate_batch([good, chat], max_new_tokens=2), InvalidTextError)
    assert err.param == "requests[1].messages[0].content"


def test_the_scheduler_refuses_in_the_callers_thread(tiny_pipe):
    """The demo submits its rows through a scheduler: the error comes back at once, for the page to show."""
    case = make_case(3)
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        err = _one_line_error(lambda: sched.submit(case["image"], "What?", caption="\ud800", ocr=False), InvalidTextError)
        assert err.param == "caption"
        err = _one_line_error(lambda: sched.submit_chat([{"role": "user", "content": "\ud800"}], ocr=False), InvalidTextError)
        assert err.param == "messages[0].content"
        assert sched.submit(case["image"], "What?", caption="c", ocr=False, max_new_tokens=2).result().token_ids


def test_stop_strings_in_the_python_api():
    """Any number of stop strings (the server's limit of 4 is OpenAI's API), but never an empty one: "" is in every
    text, so the answer would stop after its first step."""
    from asymspec_mm import AsymSpecConfig

    assert AsymSpecConfig(stop_strings=tuple("abcdefg")).validated().stop_strings == tuple("abcdefg")
    with pytest.raises(UnknownOptionError, match="empty"):
        AsymSpecConfig(stop_strings=("a", "")).validated()


# ---------------------------------------------------------------------------------------------- the CLI
def _cli(*args: str | bytes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "asymspec_mm.cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=300)


@pytest.mark.parametrize("option", ["--caption", "--ocr"])
def test_the_cli_refuses_an_undecodable_option_in_one_line(option):
    # the UTF-8 bytes of U+D800 (invalid UTF-8): the command line keeps them as three lone surrogates
    chart = str(ROOT / "examples" / "chart.png")
    proc = _cli("generate", "--image", chart, "--question", "What?", option, b"\xed\xa0\x80 x", "--preset", "tiny")
    err = proc.stderr.decode()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0] == (
        f"error: {option}: not valid Unicode text (lone surrogate U+DCED (undecodable byte 0xed) at character 0); send UTF-8 text"
    )
    assert "loading the models" not in err
