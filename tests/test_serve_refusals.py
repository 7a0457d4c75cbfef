"""What ``asymspec-mm serve`` tells a client it refuses, and how it counts them (issue #49, items 7, 8, 9 and 14).

Every refusal goes through the real ``openai`` client against the shipped tiny pair on a free loopback port: the
table :data:`REFUSALS` holds each request and the error it must get (status, ``param`` as the client spelled the
field, ``code``, a fragment of the message). The counters are read from the real ``/metrics`` after real requests.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import httpx
import pytest
from conftest import make_case

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")

from asymspec_mm.frontend.prometheus import parse_prometheus

LIMIT = "over the limit of 67,108,864 pixels"  # the documented 64 MP default (ASYMSPEC_MAX_INPUT_PIXELS unset)
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "nonsense"}}}  # valid JSON, no grammar: xgrammar refuses it


# ---------------------------------------------------------------------------------------------- inputs
def png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels in its header and holds none: a few dozen bytes on the wire, a
    decompression bomb to a decoder that trusts the header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def chart_url() -> str:
    buf = io.BytesIO()
    make_case(9)["image"].save(buf, "PNG")
    return data_url(buf.getvalue())


def user(text: str = "What is the largest value?", *urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def chat(**fields):
    """A chat request (one chart and a question, 4 tokens) with ``fields`` replacing or adding to it."""
    body = {"model": "tiny", "messages": user("What is the largest value?", chart_url()), "max_tokens": 4}
    extra = {k: fields.pop(k) for k in ("asymspec", "structured_outputs") if k in fields}
    body.update(fields)
    return lambda c: c.chat.completions.create(**body, extra_body=extra or None)


def responses(**fields):
    body = {"model": "tiny", "input": "What is the largest value?", "max_output_tokens": 4}
    extra = {k: fields.pop(k) for k in ("asymspec",) if k in fields}
    body.update(fields)
    return lambda c: c.responses.create(**body, extra_body=extra or None)


def function(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, **({"parameters": parameters} if parameters else {})}}


# ---------------------------------------------------------------------------------------------- the table
#: name -> (request, status, param, code, message fragment)
REFUSALS = {
    "ocr_list_longer_than_the_images": (
        chat(asymspec={"ocr": ["12", "34"]}),
        400,
        "asymspec.ocr",
        "invalid_value",
        "asymspec.ocr is a list of 2 but this request has 1 image: send one OCR text (or false for none) per image",
    ),
    "caption_string_with_two_images": (
        chat(messages=user("Compare them.", chart_url(), chart_url()), asymspec={"caption": "a chart"}),
        400,
        "asymspec.caption",
        "invalid_value",
        "asymspec.caption is a string, which fits a request with one image, but this request has 2 images",
    ),
    "responses_ocr_without_an_image": (
        responses(asymspec={"ocr": ["12"]}),
        400,
        "asymspec.ocr",
        "invalid_value",
        "asymspec.ocr is a list of 1 but this request has no image: leave it out",
    ),
    "completions_ocr_without_an_image": (
        lambda c: c.completions.create(model="tiny", prompt="Hello", max_tokens=4, extra_body={"asymspec": {"ocr": "12"}}),
        400,
        "asymspec.ocr",
        "invalid_value",
        "asymspec.ocr is a string, which fits a request with one image, but this request has no image",
    ),
    "uncompilable_json_schema": (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}),
        400,
        "response_format.json_schema.schema",
        "invalid_json_schema",
        'response_format.json_schema.schema: the JSON schema cannot be compiled to a grammar: Unsupported type "nonsense"',
    ),
    "uncompilable_tool_parameters": (
        chat(tools=[function("f", BAD_SCHEMA)], tool_choice="required"),
        400,
        "tools[0].function.parameters",
        "invalid_json_schema",
        "tools[0].function.parameters: the JSON schema cannot be compiled",
    ),
    "uncompilable_parameters_of_the_named_tool": (
        chat(tools=[function("g"), function("f", BAD_SCHEMA)], tool_choice={"type": "function", "function": {"name": "f"}}),
        400,
        "tools[1].function.parameters",
        "invalid_json_schema",
        "tools[1].function.parameters: the JSON schema cannot be compiled",
    ),
    "uncompilable_structured_outputs_json": (
        chat(structured_outputs={"json": BAD_SCHEMA}),
        400,
        "structured_outputs.json",
        "invalid_json_schema",
        "structured_outputs.json: the JSON schema cannot be compiled",
    ),
    "uncompilable_structured_outputs_regex": (
        chat(structured_outputs={"regex": "(unclosed"}),
        400,
        "structured_outputs.regex",
        "invalid_grammar",
        "structured_outputs.regex: the regex cannot be compiled",
    ),
    "responses_uncompilable_text_format": (
        responses(text={"format": {"type": "json_schema", "name": "x", "schema": BAD_SCHEMA}}),
        400,
        "text.format.schema",
        "invalid_json_schema",
        "text.format.schema: the JSON schema cannot be compiled",
    ),
    "responses_uncompilable_tool_parameters": (
        responses(tools=[{"type": "function", "name": "f", "parameters": BAD_SCHEMA}], tool_choice="required"),
        400,
        "tools[0].parameters",
        "invalid_json_schema",
        "tools[0].parameters: the JSON schema cannot be compiled",
    ),
    "tool_call_arguments_not_json": (
        chat(
            messages=[
                *user("What is the largest value?", chart_url()),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{1: 2}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "3"},
            ]
        ),
        400,
        "messages[1].tool_calls[0].function.arguments",
        "invalid_value",
        "messages[1].tool_calls[0].function.arguments is not valid JSON (Expecting property name enclosed in double quotes)",
    ),
    "context_overflow": (chat(max_tokens=100000), 400, "max_tokens", "context_length_exceeded", "context window is 4096"),
    "image_over_the_limit": (
        chat(messages=user("What is the largest value?", data_url(png_header(10000, 10000)))),
        400,
        "messages[0].content[0].image_url",
        "invalid_image",
        f"is 10000x10000 = 100,000,000 pixels, {LIMIT}; downscale it before sending it (the server's operator can raise "
        "the limit by starting the server with ASYMSPEC_MAX_INPUT_PIXELS",
    ),
    "image_over_pillows_own_guard": (  # 400 MP: Pillow refuses the header before our check sees it
        chat(messages=user("What is the largest value?", data_url(png_header(20000, 20000)))),
        400,
        "messages[0].content[0].image_url",
        "invalid_image",
        f"is 400,000,000 pixels, {LIMIT}; downscale it before sending it",
    ),
    "responses_image_over_the_limit": (
        responses(
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": data_url(png_header(20000, 20000))},
                        {"type": "input_text", "text": "What is the largest value?"},
                    ],
                }
            ]
        ),
        400,
        "input[0].content[0].image_url",
        "invalid_image",
        f"is 400,000,000 pixels, {LIMIT}",
    ),
}
#: Words of the Python API that an HTTP client cannot act on.
PYTHON_WORDS = ("None", "max_pixels_in", "decompression bomb DOS", "--choices")


@pytest.fixture(scope="module")
def server_pipe(shipped_tiny):
    return shipped_tiny


@pytest.fixture(scope="module")
def server_options():
    return {}


def metrics(server) -> dict[str, float]:
    return parse_prometheus(httpx.get(server.url + "/metrics", timeout=30).text)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_each_refusal_names_the_field_as_the_client_spelled_it(client, name):
    call, status, param, code, fragment = REFUSALS[name]
    with pytest.raises(openai.APIStatusError) as info:
        call(client)
    err = info.value.body
    assert (info.value.status_code, err["param"], err["code"]) == (status, param, code), err
    assert fragment in err["message"] and "\n" not in err["message"], err["message"]
    assert not any(word in err["message"] for word in PYTHON_WORDS), err["message"]


# ---------------------------------------------------------------------------------------------- metrics
def test_refused_requests_are_not_server_errors_in_the_metrics(client, server, shipped_tiny):
    """A 400 found at set-up (a prompt over the context window) is ``refused``, never ``error``; a schema xgrammar
    cannot compile is refused before the scheduler takes the request (a refused 400 that no request outcome counts);
    a finished answer is ``ok`` and counted by vLLM's ``finished_reason``."""
    before = metrics(server)
    for name in ("context_overflow", "uncompilable_json_schema", "uncompilable_tool_parameters"):
        with pytest.raises(openai.BadRequestError):
            REFUSALS[name][0](client)
    answer = chat(max_tokens=3, asymspec={"caption": "", "ocr": False})(client)
    after = metrics(server)
    delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)  # noqa: E731
    outcome = lambda o: delta(f'asymspec_requests_total{{outcome="{o}"}}')  # noqa: E731
    assert (outcome("ok"), outcome("refused"), outcome("error"), outcome("cancelled")) == (1, 1, 0, 0)
    assert delta('asymspec_refused_requests_total{status="400"}') == 3
    reason = {"length": "length", "stop": "stop", "tool_calls": "stop"}[answer.choices[0].finish_reason]
    vllm = {
        r: delta(f'vllm:request_success_total{{model_name="tiny",finished_reason="{r}"}}') for r in ("stop", "length", "abort", "error")
    }
    assert vllm == {"stop": 0, "length": 0, "abort": 0, "error": 0, reason: 1}
    assert after["asymspec_requests_in_flight"] == 0


#: The refusals the set-up used to find after the request had queued (and its image had been captioned).
BEFORE_THE_QUEUE = sorted(name for name in REFUSALS if "uncompilable" in name)


def test_what_the_set_up_would_refuse_is_refused_before_the_request_queues(client, server):
    """A forced tool call or a response format whose grammar cannot be built is a 400 at submission: the scheduler
    never takes the request (no request outcome moves, nothing is added to it), so a client gets the 400 at once
    rather than after waiting its turn and the captioning of its image; the refusal reads as the table says."""
    sched = server.state.scheduler
    before, steps = metrics(server), sched.steps
    for name in BEFORE_THE_QUEUE:
        call, status, param, code, fragment = REFUSALS[name]
        with pytest.raises(openai.BadRequestError) as info:
            call(client)
        assert (info.value.body["param"], info.value.body["code"]) == (param, code) and fragment in info.value.body["message"]
    after = metrics(server)
    delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)  # noqa: E731
    assert len(BEFORE_THE_QUEUE) == 7 and delta('asymspec_refused_requests_total{status="400"}') == len(BEFORE_THE_QUEUE)
    assert [delta(f'asymspec_requests_total{{outcome="{o}"}}') for o in ("ok", "refused", "error", "cancelled")] == [0, 0, 0, 0]
    assert sched.steps == steps and after["asymspec_requests_in_flight"] == 0


def test_a_forced_tool_calls_grammar_is_built_once_for_all_its_choices(client, grammar_builds):
    """The grammar the server's check builds at submission is the one the scheduler's rows compile: one build for a
    request of two choices (it was 7: the server's check, then the scheduler's and the set-up's for each choice,
    and the compile's)."""
    params = {"type": "object", "properties": {"built_once_served": {"type": "integer"}}, "required": ["built_once_served"]}
    answer = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Call it."}],
        tools=[function("built_once_served", params)],
        tool_choice="required",
        max_tokens=4,
        n=2,
    )
    assert len(answer.choices) == 2 and [choice for choice, _ in grammar_builds] == ["required"]


def test_a_request_failed_by_the_server_is_an_error_and_a_cancelled_one_an_abort():
    """The outcome of each way a scheduled request fails, from the exceptions the scheduler delivers."""
    from concurrent.futures import CancelledError

    from asymspec_mm.base.errors import ContextOverflowError
    from asymspec_mm.core.handle import SchedulerStoppedError
    from asymspec_mm.serve.errors import RequestError
    from asymspec_mm.serve.metrics import finished_reason
    from asymspec_mm.serve.transport import error_of, outcome_of

    cases = {
        "cancelled": CancelledError(),
        "refused": ContextOverflowError("too long"),
        "error": SchedulerStoppedError("the worker stopped"),
    }
    for outcome, exc in cases.items():
        assert outcome_of(exc) == outcome
        assert (error_of(exc).status < 500) == (outcome == "refused")
    assert outcome_of(RuntimeError("a bug")) == "error" and outcome_of(RequestError(503, "busy")) == "error"
    from asymspec_mm.serve.drain import timeout_error

    assert outcome_of(timeout_error(1.0)) == "cancelled"  # cut off by a SIGTERM drain that ran out: not a failure
    assert [finished_reason(o) for o in ("cancelled", "refused", "error")] == ["abort", None, "error"]


# ---------------------------------------------------------------------------------------------- wording
def test_the_out_of_domain_warning_tells_an_http_client_what_it_can_send(client, shipped_tiny):
    """The tiny pair's warning names the request's text for an HTTP client, the flags for the command line and the
    Python calls for the Python API: each front end passes its own advice."""
    from asymspec_mm.cli.main import DOMAIN_ADVICE as CLI_ADVICE
    from asymspec_mm.request.domain import HOW_TO
    from asymspec_mm.serve.chat_request import DOMAIN_ADVICE as HTTP_ADVICE

    answer = chat(messages=user("Tell me a story.", chart_url()), asymspec={"caption": "", "ocr": False})(client)
    (served,) = answer.model_extra["asymspec"]["warnings"]
    assert served.endswith(HTTP_ADVICE) and "--choices" not in served and "message text" in served
    case = make_case(9)
    (python,) = shipped_tiny.generate(case["image"], "Tell me a story.", caption="", ocr=False, max_new_tokens=1).warnings
    assert python.endswith(HOW_TO) and "--" not in HOW_TO
    (cli,) = shipped_tiny.generate(
        case["image"], "Tell me a story.", caption="", ocr=False, max_new_tokens=1, domain_advice=CLI_ADVICE
    ).warnings
    assert cli.endswith("add --choices to a MiniVista question, or load a real pair (--preset qwen3)")
    assert served.removesuffix(HTTP_ADVICE) == python.removesuffix(HOW_TO) == cli.removesuffix(CLI_ADVICE)


def test_the_start_up_line_names_every_api_it_serves(server):
    from asymspec_mm.serve.cli import SERVED_APIS, announcement

    line = announcement("tiny", server.url)
    assert line.startswith(f"asymspec-mm serve: serving tiny on {server.url}/v1 (")
    for path, name in SERVED_APIS.items():
        assert f"{name} (POST /v1/{path})" in line
        r = httpx.post(f"{server.url}/v1/{path}", json={}, timeout=30)  # each one is served: a 400 naming a field
        assert r.status_code == 400 and r.json()["error"]["code"] != "not_found", (path, r.text)
    assert "chat completions" in line and "Responses" in line


# ---------------------------------------------------------------------------------------------- every front end
def test_every_front_end_gives_the_documented_limit_for_a_huge_png(tmp_path):
    """A 20000x20000 PNG (Pillow's own guard fires before ours sees the size) is refused by the 64 MP limit's
    message, each front end naming the option it has."""
    from asymspec_mm.base.errors import AsymSpecError
    from asymspec_mm.cli.main import read_image
    from ui import app as ui_app
    from vision_cache.errors import InvalidImageError
    from vision_cache.image import load_image

    path = tmp_path / "huge.png"
    path.write_bytes(png_header(20000, 20000))
    with pytest.raises(InvalidImageError) as python:
        load_image(path.read_bytes())
    assert f"is 400,000,000 pixels, {LIMIT}; downscale it before passing it in, or raise max_pixels_in" in str(python.value)
    with pytest.raises(AsymSpecError) as cli:
        read_image(str(path))
    assert LIMIT in str(cli.value) and "set ASYMSPEC_MAX_INPUT_PIXELS to a larger pixel count" in str(cli.value)
    with pytest.raises(InvalidImageError) as demo:
        ui_app.DemoApp(object())._load_image({"path": str(path), "orig_name": "huge.png"})
    assert LIMIT in str(demo.value) and "start the demo with ASYMSPEC_MAX_INPUT_PIXELS" in str(demo.value)
    for err in (python.value, cli.value, demo.value):
        assert "decompression bomb DOS" not in str(err) and "178956970" not in str(err)
    with pytest.raises(
        InvalidImageError, match="over the 178,956,970 pixels Pillow's decompression bomb guard allows"
    ):  # no limit of ours: Pillow's guard, named
        load_image(path.read_bytes(), max_pixels_in=None)
