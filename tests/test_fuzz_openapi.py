"""Fuzzing (issue #43, item 4): schemathesis generates requests from the live server's own ``/openapi.json`` (the
request models of ``POST /v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``, valid and invalid ones)
against a real uvicorn server on 127.0.0.1 running the tiny random pair, and every answer must be no server error
(no 5xx), a documented status and content type, and conform to the documented answer schema. The token budgets of
generated bodies are capped, so a request the server accepts decodes a couple of tokens. Then hand-made hostile
bodies: a lone surrogate, a body that is not UTF-8, huge numbers, 10,000 nested arrays, 100,000 messages and a
50 MB body; each is a 400 (the 50 MB body a 413) naming the problem, and the server goes on serving."""

from __future__ import annotations

import json
import time

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance, status_code_conformance

from asymspec_mm.serve.app import create_app
from asymspec_mm.serve.body import MAX_JSON_DEPTH
from asymspec_mm.serve.models_fields import MAX_MESSAGES
from asymspec_mm.serve.server import ServerThread

#: Generated requests, all three endpoints and both modes together (a CI-sized run on a 2-core box).
EXAMPLES = 240
#: The budget fields a generated body's value is capped to (an answer of at most this many tokens).
BUDGETS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_GENERATED_TOKENS = 2
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server(tiny_pipe):
    app = create_app(tiny_pipe, max_batch_size=8, max_queue=256)
    with ServerThread(app) as srv:
        yield srv


def capped(body: object, path: str) -> object:
    """``body`` with its token budgets at most :data:`MAX_GENERATED_TOKENS` (set where it has none: the endpoints'
    defaults are 16 to 512 tokens) and ``n`` at most 2; an invalid value is kept as it is: the server must refuse it."""
    if isinstance(body, dict):
        own = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
        if not any(name in body for name in BUDGETS):
            body[own] = MAX_GENERATED_TOKENS
        for name in BUDGETS:
            v = body.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > MAX_GENERATED_TOKENS:
                body[name] = MAX_GENERATED_TOKENS
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > 2:
            body["n"] = 2
    return body


def good(url: str) -> None:
    """A request that must succeed: the server goes on serving."""
    r = httpx.post(url + "/v1/completions", json={"prompt": "Which bar is the tallest?", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_generated_requests_get_no_server_error_and_conform(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    posts = [op for op in (r.ok() for r in schema.get_all_operations()) if op.method.upper() == "POST"]
    assert sorted(op.path for op in posts) == ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    strategy = st.one_of([op.as_strategy(generation_mode=mode) for op in posts for mode in modes])
    seen: dict[tuple[str, int], int] = {}

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        case.body = capped(case.body, case.operation.path)
        response = case.call(base_url=server.url, timeout=120)
        key = (case.operation.path, response.status_code)
        seen[key] = seen.get(key, 0) + 1
        case.validate_response(response, checks=CHECKS)

    start = time.monotonic()
    for op in posts:  # the example body each endpoint documents is answered
        example = op.definition.raw["requestBody"]["content"]["application/json"]["schema"]
        example = schema.raw_schema["components"]["schemas"][example["$ref"].rsplit("/", 1)[1]]["examples"][0]
        case = op.Case(body=capped(dict(example), op.path), media_type="application/json")
        response = case.call(base_url=server.url, timeout=120)
        assert response.status_code == 200, response.text
        case.validate_response(response, checks=CHECKS)
    run()
    took = time.monotonic() - start
    assert sum(seen.values()) == EXAMPLES
    assert not [key for key in seen if key[1] >= 500], seen
    # the run reached past validation on every endpoint: some answers, and refusals
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        assert seen.get((path, 400)), (path, seen)
    assert sum(count for (_, status), count in seen.items() if status == 200) >= 10, seen
    print(f"{EXAMPLES} generated requests in {took:.1f} s: {sorted(seen.items())}")
    good(server.url)


# ---------------------------------------------------------------------------------------------- hostile bodies
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Which bar is the tallest?"}]


def _post(url: str, content: bytes, path: str = CHAT) -> httpx.Response:
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=300)


_LATIN1 = '{"messages": [{"role": "user", "content": "Which café?"}]}'.encode("latin-1")
HOSTILE = {
    "lone_surrogate": (
        json.dumps({"messages": [{"role": "user", "content": "BAD what is this?"}]}).replace("BAD", "\\ud800").encode(),
        400,
        "messages[0].content",
        "lone surrogate U+D800",
    ),
    "not_utf8": (_LATIN1, 400, None, f"not UTF-8 (byte 0xe9 at offset {_LATIN1.index(0xE9)})"),
    "float_overflow": (
        json.dumps({"messages": MESSAGES, "temperature": 1}).replace(": 1}", ": 1e400}").encode(),
        400,
        "temperature",
        "finite",
    ),
    "huge_max_tokens": (json.dumps({"messages": MESSAGES, "max_tokens": 10**100}).encode(), 400, "max_tokens", "context window"),
    "huge_seed": (json.dumps({"messages": MESSAGES, "seed": 10**100}).encode(), 400, "seed", "< 2**63"),
    "huge_top_logprobs": (
        json.dumps({"messages": MESSAGES, "logprobs": True, "top_logprobs": 10**30}).encode(),
        400,
        "top_logprobs",
        "<= 20",
    ),
    "deep_nesting": (b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 400, None, f"more than {MAX_JSON_DEPTH} levels deep"),
    "deep_schema": (
        json.dumps({"messages": MESSAGES, "metadata": json.loads("[" * 100 + "]" * 100)}).encode(),
        400,
        None,
        f"more than {MAX_JSON_DEPTH} levels deep",
    ),
    "many_messages": (json.dumps({"messages": MESSAGES * 100_000}).encode(), 400, "messages", f"at most {MAX_MESSAGES} are taken"),
    "many_input_items": (
        json.dumps({"input": [{"role": "user", "content": "q?"}] * 100_000}).encode(),
        400,
        "input",
        f"at most {MAX_MESSAGES} are taken",
        "/v1/responses",
    ),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_body_is_a_400_naming_the_problem(server, name):
    body, status, param, fragment, *path = HOSTILE[name]
    r = _post(server.url, body, *path)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == param and fragment in err["message"] and "\n" not in err["message"], err
    good(server.url)


def test_a_body_over_the_limit_is_a_413_before_it_is_read(server):
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * (50 * 2**20) + b'"}]}'
    r = _post(server.url, body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text[:300]
    assert "--max-request-mb" in r.json()["error"]["message"]
    good(server.url)


def test_a_lone_surrogate_on_every_endpoint(server):
    for path, body in (
        ("/v1/completions", {"prompt": "BAD"}),
        ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "BAD"}]}]}),
    ):
        r = _post(server.url, json.dumps(body).replace("BAD", "\\udfff").encode(), path)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text", r.text
    good(server.url)
