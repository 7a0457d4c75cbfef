"""OpenAI's OpenAPI document is the server's contract (issue #43, item 3): every answer, stream chunk, stream event
and error body of ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` validates with ``jsonschema``
against the pinned component schemas (``tests/data/openai_openapi``), on a live server (the tiny random pair,
uvicorn on a free loopback port) driven by ``httpx``: plain and tool-calling answers, logprobs, ``n`` choices,
streamed chunks with the usage chunk and tool-call deltas, the Responses API's events, and the errors (400, 401,
404, 405, 413, 429, a failure mid-stream)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from openai_contract import assert_conforms, pinned, violations

pytest.importorskip("fastapi")
from asymspec_mm.serve.app import create_app
from asymspec_mm.serve.server import ServerThread

VIEW: dict = {}  # text-only questions: no image, no caption, no OCR
ADD = {
    "type": "function",
    "function": {
        "name": "pick_bar",
        "description": "Look up one bar.",
        "parameters": {"type": "object", "properties": {"bar": {"type": "string", "enum": ["left", "right"]}}, "required": ["bar"]},
    },
}


@pytest.fixture(scope="module")
def server(tiny_pipe):
    app = create_app(tiny_pipe, max_batch_size=4, max_queue=64)
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def strict(tiny_pipe):
    """A server with a key, a small body limit, one row and no queue."""
    app = create_app(tiny_pipe, max_batch_size=1, max_queue=1, api_key="sekret", max_request_mb=0.01)
    with ServerThread(app) as srv:
        yield srv


def chat_body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Which bar is the tallest?"}], "asymspec": VIEW, **fields}


def sse(text: str) -> list[dict | str]:
    """The JSON payloads of an event stream's ``data:`` lines (``[DONE]`` as the string)."""
    out: list[dict | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def post(srv, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=300, **kw)


def test_the_pinned_document_records_its_source():
    source = pinned()["source"]
    assert source["repository"] == "https://github.com/openai/openai-openapi" and len(source["commit"]) == 40
    schemas = pinned()["components"]["schemas"]
    assert set(pinned()["roots"]) <= set(schemas) and "ChatCompletionResponseMessage" in schemas
    # the validators are not vacuous: a known violation is reported, naming where
    assert (
        violations("CreateChatCompletionResponse", {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": []})
        == []
    )
    bad = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [], "system_fingerprint": None}
    assert violations("CreateChatCompletionResponse", bad) and "system_fingerprint" in violations("CreateChatCompletionResponse", bad)[0]


# ---------------------------------------------------------------------------------------------- chat completions
@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 4},
        {"max_tokens": 3, "n": 2, "logprobs": True, "top_logprobs": 2, "temperature": 0.7, "seed": 3},
        {"max_tokens": 3, "asymspec": {**VIEW, "return_trace": True}, "stop": ["zz"]},
    ],
    ids=["plain", "n2_logprobs", "trace"],
)
def test_chat_answers_conform(server, fields):
    r = post(server, "/v1/chat/completions", chat_body(**fields))
    assert r.status_code == 200, r.text
    body = r.json()
    assert "metrics" in body  # vLLM's per-request acceptance: an extra root field, valid beside OpenAI's
    assert_conforms("CreateChatCompletionResponse", body)
    assert "system_fingerprint" not in body or isinstance(body["system_fingerprint"], str)
    assert all(c["message"]["refusal"] is None for c in body["choices"])


def test_a_tool_call_answer_conforms(server):
    pytest.importorskip("xgrammar")
    r = post(server, "/v1/chat/completions", chat_body(max_tokens=96, tools=[ADD], tool_choice="required"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert_conforms("CreateChatCompletionResponse", body)
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["choices"][0]["message"]["tool_calls"]


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 4, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 1},
        {"max_tokens": 3, "n": 2, "stream_options": {"include_usage": True}},
    ],
    ids=["usage_logprobs", "n2"],
)
def test_chat_chunks_conform(server, fields):
    r = post(server, "/v1/chat/completions", chat_body(stream=True, **fields))
    assert r.status_code == 200, r.text
    events = sse(r.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"] is not None and events[-2]["choices"] == []
    assert [i for i, c in enumerate(events[:-1]) if "metrics" in c] == [len(events) - 2]  # on the usage chunk only
    for chunk in events[:-1]:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)


def test_streamed_tool_call_deltas_conform(server):
    pytest.importorskip("xgrammar")
    body = chat_body(max_tokens=96, tools=[ADD], tool_choice="required", stream=True, stream_options={"include_usage": True})
    events = sse(post(server, "/v1/chat/completions", body).text)
    calls = [c for c in events[:-1] if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert calls and events[-1] == "[DONE]"
    for chunk in events[:-1]:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)


# ---------------------------------------------------------------------------------------------- completions
@pytest.mark.parametrize(
    "fields", [{"max_tokens": 4}, {"max_tokens": 3, "temperature": 0.8, "seed": 1, "stop": "zz"}], ids=["greedy", "sampled"]
)
def test_completions_conform(server, fields):
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": "Which bar is the tallest?", **fields})
    assert r.status_code == 200, r.text
    assert r.json()["metrics"]["speculative_decoding"]["num_spec_tokens"] > 0
    assert_conforms("CreateCompletionResponse", r.json())


def test_completion_chunks_conform(server):
    body = {
        "model": "tiny",
        "prompt": ["Which bar is the tallest?"],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse(post(server, "/v1/completions", body).text)
    assert events[-1] == "[DONE]" and events[-2]["usage"] is not None and "metrics" in events[-2]
    assert events[-3]["choices"][0]["finish_reason"] == "length" and events[0]["choices"][0]["finish_reason"] is None
    for chunk in events[:-1]:
        assert_conforms("CreateCompletionChunk", chunk)
    assert_conforms("CreateCompletionResponse", events[-3])  # the choice's last chunk is a whole answer's shape


# ---------------------------------------------------------------------------------------------- responses
def responses_body(**fields) -> dict:
    return {"model": "tiny", "input": "Which bar is the tallest?", "asymspec": VIEW, **fields}


LOGPROBS = {"max_output_tokens": 4, "include": ["message.output_text.logprobs"], "top_logprobs": 2}
PICK = {"type": "function", "name": "pick_bar", "parameters": ADD["function"]["parameters"], "strict": True}


@pytest.mark.parametrize(
    "fields",
    [{"max_output_tokens": 4}, {"max_output_tokens": 96, "tools": [PICK], "tool_choice": "required"}, LOGPROBS],
    ids=["text", "call", "logprobs"],
)
def test_responses_conform(server, fields):
    if "tools" in fields:
        pytest.importorskip("xgrammar")
    r = post(server, "/v1/responses", responses_body(**fields))
    assert r.status_code == 200, r.text
    assert r.json()["metrics"]["speculative_decoding"]["num_spec_tokens"] > 0
    assert_conforms("Response", r.json())


@pytest.mark.parametrize(
    "fields",
    [{"max_output_tokens": 4}, {"max_output_tokens": 96, "tools": [PICK], "tool_choice": "required"}, LOGPROBS],
    ids=["text", "call", "logprobs"],
)
def test_response_events_conform(server, fields):
    if "tools" in fields:
        pytest.importorskip("xgrammar")
    r = post(server, "/v1/responses", responses_body(stream=True, **fields))
    events = sse(r.text)
    assert events and events[-1]["type"] in ("response.completed", "response.incomplete")
    assert [e["type"] for e in events if "metrics" in e.get("response", {})] == [events[-1]["type"]]  # the final one only
    for event in events:
        assert_conforms("ResponseStreamEvent", event)


# ---------------------------------------------------------------------------------------------- errors
ERRORS = [
    ("post", "/v1/chat/completions", chat_body(temperature=3), 400),
    ("post", "/v1/chat/completions", chat_body(frobnicate=1), 400),
    ("post", "/v1/chat/completions", chat_body(max_tokens=100000), 400),
    ("post", "/v1/completions", {"prompt": 3}, 400),
    ("post", "/v1/completions", {"prompt": "q", "echo": True}, 400),
    ("post", "/v1/responses", responses_body(background=True), 400),
    ("post", "/v1/responses", {"input": []}, 400),
    ("get", "/v1/nothing", None, 404),
    ("get", "/v1/models/other", None, 404),
    ("get", "/v1/chat/completions", None, 405),
]


@pytest.mark.parametrize("method,path,body,status", ERRORS, ids=[f"{m}{p}-{s}-{i}" for i, (m, p, _, s) in enumerate(ERRORS)])
def test_error_bodies_conform(server, method, path, body, status):
    r = httpx.request(method.upper(), server.url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    assert_conforms("ErrorResponse", r.json())


def test_key_size_and_queue_errors_conform(strict):
    auth = {"Authorization": "Bearer sekret"}
    r = post(strict, "/v1/chat/completions", chat_body(max_tokens=2))
    assert r.status_code == 401 and violations("ErrorResponse", r.json()) == []
    r = post(strict, "/v1/chat/completions", chat_body(max_tokens=2, messages=[{"role": "user", "content": "x" * 20000}]), headers=auth)
    assert r.status_code == 413 and violations("ErrorResponse", r.json()) == []
    # one row decoding, one waiting: a third is a 429
    long = chat_body(max_tokens=200, asymspec={**VIEW, "method": "floor"})
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(post(strict, "/v1/chat/completions", long, headers=auth))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [r for r in results if r.status_code == 429]
    assert refused, [r.status_code for r in results]
    for r in refused:
        assert_conforms("ErrorResponse", r.json())


def test_a_streamed_request_refused_by_the_set_up_gets_a_conforming_error(server):
    """A prompt over the context window is found by the set-up before the first chunk: an HTTP error, not a stream."""
    r = post(server, "/v1/chat/completions", chat_body(stream=True, max_tokens=100000))
    assert r.status_code == 400 and violations("ErrorResponse", r.json()) == []
    r = post(server, "/v1/responses", responses_body(stream=True, max_output_tokens=100000))
    assert r.status_code == 400 and violations("ErrorResponse", r.json()) == []


@pytest.fixture(scope="module")
def failing(tiny_pipe):
    """A server whose verifier's forward fails from its fourth call on: a streamed answer has started by then."""
    from test_scheduler_faults import BatchEngine, FailingForward

    boom = RuntimeError("boom in the verifier forward")
    factory = lambda model, name: FailingForward(model, name, boom, fail_on=4) if name == "verifier" else BatchEngine(model, name)  # noqa: E731
    sched = tiny_pipe.scheduler(max_batch_size=2, batch_engines=factory)
    with ServerThread(create_app(tiny_pipe, scheduler=sched)) as srv:
        yield srv
    sched.close(timeout=30)


def test_an_error_mid_stream_conforms(failing):
    """A row that fails after its stream started: chat completions send OpenAI's error object as a data line, the
    Responses API its ``error`` and ``response.failed`` events; each validates."""
    r = post(failing, "/v1/chat/completions", chat_body(stream=True, max_tokens=64, asymspec={"method": "floor"}))
    assert r.status_code == 200, r.text
    events = sse(r.text)
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
    assert_conforms("ErrorResponse", events[-2])
    for chunk in events[:-2]:
        assert_conforms("CreateChatCompletionStreamResponse", chunk)


def test_an_error_mid_response_stream_conforms(tiny_pipe):
    """The Responses API's stream ends with ``error`` and ``response.failed``, both valid events."""
    from test_scheduler_faults import BatchEngine, FailingForward

    boom = RuntimeError("boom in the verifier forward")
    factory = lambda model, name: FailingForward(model, name, boom, fail_on=4) if name == "verifier" else BatchEngine(model, name)  # noqa: E731
    sched = tiny_pipe.scheduler(max_batch_size=2, batch_engines=factory)
    with ServerThread(create_app(tiny_pipe, scheduler=sched)) as srv:
        r = post(srv, "/v1/responses", responses_body(stream=True, max_output_tokens=64, asymspec={"method": "floor"}))
    sched.close(timeout=30)
    assert r.status_code == 200, r.text
    events = sse(r.text)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"], [e["type"] for e in events]
    for event in events:
        assert_conforms("ResponseStreamEvent", event)


def test_the_servers_own_openapi_describes_the_request_bodies(server):
    """``GET /openapi.json``: each POST endpoint's body is its request model (every OpenAI field it classifies marked
    with ``x-asymspec-support``), its answers are 200 (JSON or server-sent events) and OpenAI's error object for each
    error status; FastAPI's 422 is not there (a refused body is a 400)."""
    doc = httpx.get(server.url + "/openapi.json", timeout=60).json()
    schemas = doc["components"]["schemas"]
    for path, model in (
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
        ("/v1/responses", "CreateResponseRequest"),
    ):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert set(op["responses"]) == {"200", "400", "401", "413", "429", "500", "503"}
        assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        props = schemas[model]["properties"]
        assert {p.get("x-asymspec-support") for p in props.values()} >= {"hint", "unsupported"}
    assert schemas["ChatCompletionRequest"]["properties"]["logit_bias"]["x-asymspec-support"] == "unsupported"
    assert "HTTPValidationError" not in schemas
