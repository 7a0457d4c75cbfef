"""Every field of OpenAI's request schemas is classified (issue #43, item 3): for ``CreateChatCompletionRequest``,
``CreateCompletionRequest`` and ``CreateResponse`` of the pinned OpenAPI document, each property is declared by the
server's request model as read (``supported``), a ``hint`` (accepted, no effect on the answer) or ``unsupported``
(refused with code ``unsupported`` naming it unless it holds its neutral value), never left to "unknown request
field"; a field added upstream fails here until it is classified. docs/serving.md's tables list the same.

The fields routers add to the bodies they forward (issue #50: vLLM's and SGLang's extras, :mod:`.models_router`)
are classified the same way and listed in their own table; any other field stays a 400 ``unknown_field``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai_contract import request_properties

pytest.importorskip("fastapi")
from asymspec_mm.serve.chat_request import parse_chat_request, validated
from asymspec_mm.serve.completions import CompletionRequest, parse_completion_request
from asymspec_mm.serve.errors import RequestError
from asymspec_mm.serve.models_chat import ChatCompletionRequest
from asymspec_mm.serve.models_fields import field_support
from asymspec_mm.serve.models_responses import CreateResponseRequest
from asymspec_mm.serve.models_router import ROUTER_FIELDS, router_fields
from asymspec_mm.serve.responses_api import parse_responses_request

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "Which bar is the tallest?"}]


def parse_completion(body: dict):
    return parse_completion_request(validated(CompletionRequest, body))


#: endpoint -> (OpenAI's schema, the server's model, a minimal body, its parser, the server's own extension fields)
ENDPOINTS = {
    "chat": (
        "CreateChatCompletionRequest",
        ChatCompletionRequest,
        {"messages": MESSAGES},
        parse_chat_request,
        {
            "top_k",
            "chat_template_kwargs",
            "asymspec",
            "structured_outputs",
            "ignore_eos",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        },
    ),
    "completions": (
        "CreateCompletionRequest",
        CompletionRequest,
        {"prompt": "Which bar is the tallest?"},
        parse_completion,
        {"top_k", "asymspec", "structured_outputs", "ignore_eos", "guided_json", "guided_regex", "guided_choice", "guided_grammar"},
    ),
    "responses": (
        "CreateResponse",
        CreateResponseRequest,
        {"input": "Which bar is the tallest?"},
        parse_responses_request,
        {"top_k", "seed", "asymspec"},
    ),
}

#: A value each hint may take (accepted, the request unchanged) and one each unsupported field is refused for.
HINTS = {
    "parallel_tool_calls": False,
    "metadata": {"team": "charts"},
    "user": "user-1",
    "store": True,
    "service_tier": "flex",
    "safety_identifier": "hashed-user",
    "prompt_cache_key": "charts",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "auto"},
    "verbosity": "low",
    "max_tool_calls": 3,
    # fields routers add
    "priority": 5,
    "separate_reasoning": False,
    "stream_reasoning": False,
    "include_reasoning": False,
}
REFUSED = {
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logit_bias": {"50256": -100},
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "the answer"},
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "function_call": "auto",
    "echo": True,
    "best_of": 2,
    "suffix": " and so on",
    "background": True,
    "truncation": "auto",
    "reasoning": {"effort": "high"},
    "conversation": "conv_1",
    "prompt": {"id": "pmpt_1"},
    "context_management": [{"type": "compaction"}],
    "guided_json": {"type": "object"},
    "guided_regex": "[0-9]+",
    "guided_choice": ["yes", "no"],
    "guided_grammar": "root ::= 'yes'",
    # fields routers add, at a value that would change the answer
    "no_stop_trim": True,
    "skip_special_tokens": False,
    "return_hidden_states": True,
    "continue_final_message": True,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "min_tokens": 4,
    "stop_token_ids": [2],
    "include_stop_str_in_output": True,
}
#: The neutral value of each field routers add (what vllm-router 0.1.17 and sglang-router 0.3.2 send).
ROUTER_NEUTRAL = {
    "no_stop_trim": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "include_reasoning": True,
    "priority": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "stop_token_ids": [],
    "include_stop_str_in_output": False,
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_openai_field_is_classified(endpoint):
    schema, model, _, _, extensions = ENDPOINTS[endpoint]
    upstream = set(request_properties(schema))
    support = field_support(model)
    routed = router_fields(model)
    assert upstream - set(support) == set(), f"{schema}: fields the server does not classify (declare them in {model.__name__})"
    assert set(support) - upstream - routed == extensions, "the server's own fields beyond OpenAI's"
    assert routed <= set(ROUTER_FIELDS) and not routed & upstream
    assert set(support.values()) <= {"supported", "hint", "unsupported"}
    # every hint and refusal has an example below, so the next tests exercise each one
    assert {n for n, kind in support.items() if kind == "hint"} <= set(HINTS)
    assert {n for n, kind in support.items() if kind == "unsupported"} <= set(REFUSED)


def _cases(kind: str) -> list[tuple[str, str]]:
    return [(e, n) for e, (_, model, *_) in ENDPOINTS.items() for n, k in field_support(model).items() if k == kind]


@pytest.mark.parametrize("endpoint,name", _cases("hint"))
def test_a_hint_is_accepted_and_changes_nothing(endpoint, name):
    _, _, body, parse, _ = ENDPOINTS[endpoint]
    assert parse({**body, name: HINTS[name]}).request == parse(body).request


@pytest.mark.parametrize("endpoint,name", _cases("unsupported"))
def test_an_unsupported_field_is_refused_naming_it(endpoint, name):
    _, _, body, parse, _ = ENDPOINTS[endpoint]
    with pytest.raises(RequestError) as info:
        parse({**body, name: REFUSED[name]})
    err = info.value
    assert (err.status, err.param, err.code) == (400, name, "unsupported"), err.body()
    assert err.message.startswith(name) and "is not supported; it must be absent or" in err.message and "\n" not in err.message
    assert "unknown request field" not in err.message


@pytest.mark.parametrize(
    "endpoint,name,neutral",
    [
        ("chat", "frequency_penalty", 0),
        ("chat", "logit_bias", {}),
        ("chat", "modalities", ["text"]),
        ("completions", "echo", False),
        ("completions", "best_of", 1),
        ("responses", "background", False),
        ("responses", "truncation", "disabled"),
        ("responses", "reasoning", {"effort": "none"}),
    ],
)
def test_an_unsupported_field_at_its_neutral_value_is_accepted(endpoint, name, neutral):
    _, _, body, parse, _ = ENDPOINTS[endpoint]
    assert parse({**body, name: neutral}).request == parse(body).request


def _router_cases() -> list[tuple[str, str]]:
    return [(e, n) for e, (_, model, *_) in ENDPOINTS.items() for n in sorted(router_fields(model))]


def test_every_endpoint_takes_the_fields_its_routers_add():
    """Chat and text completions take every router field; Responses the three SGLang's gateway adds there."""
    assert router_fields(ChatCompletionRequest) == set(ROUTER_FIELDS) == set(ROUTER_NEUTRAL)
    assert router_fields(CompletionRequest) == set(ROUTER_FIELDS) - {
        "continue_final_message",
        "separate_reasoning",
        "stream_reasoning",
        "include_reasoning",
    }
    assert router_fields(CreateResponseRequest) == {"priority", "min_p", "repetition_penalty"}


@pytest.mark.parametrize("endpoint,name", _router_cases())
def test_a_router_field_at_its_neutral_value_changes_nothing(endpoint, name):
    _, _, body, parse, _ = ENDPOINTS[endpoint]
    assert parse({**body, name: ROUTER_NEUTRAL[name]}).request == parse(body).request


def test_every_router_field_at_once_changes_nothing():
    for endpoint, (_, model, body, parse, _) in ENDPOINTS.items():
        extras = {n: ROUTER_NEUTRAL[n] for n in router_fields(model)}
        assert parse({**body, **extras}).request == parse(body).request, endpoint


@pytest.mark.parametrize(
    "endpoint,name,value",
    [
        ("chat", "sampling_seed", 3),
        ("chat", "lora_path", None),
        ("chat", "regex", "[0-9]+"),
        ("completions", "return_logprob", False),
        ("responses", "no_stop_trim", False),
        ("responses", "skip_special_tokens", True),
        ("responses", "request_id", "r-1"),
    ],
)
def test_a_field_outside_the_lists_stays_unknown(endpoint, name, value):
    """A field the server does not know and that no router adds (or that no router adds on that endpoint) is a 400
    ``unknown_field`` naming it, whatever its value."""
    _, _, body, parse, _ = ENDPOINTS[endpoint]
    with pytest.raises(RequestError) as info:
        parse({**body, name: value})
    assert (info.value.status, info.value.code) == (400, "unknown_field") and name in info.value.message


def test_reasoning_effort_turns_thinking_on_or_off():
    assert parse_chat_request({"messages": MESSAGES, "reasoning_effort": "low"}).request.enable_thinking is True
    assert parse_chat_request({"messages": MESSAGES, "reasoning_effort": "none"}).request.enable_thinking is False
    assert parse_chat_request({"messages": MESSAGES}).request.enable_thinking is False
    with pytest.raises(RequestError, match="contradicts chat_template_kwargs.enable_thinking=false") as info:
        parse_chat_request({"messages": MESSAGES, "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}})
    assert info.value.param == "reasoning_effort"


def _documented(section: str) -> dict[str, str]:
    """The field -> kind rows of a table in docs/serving.md whose heading line names ``section``."""
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    start = text.index(f"<!-- fields: {section} -->")
    table = text[start : text.index("<!-- /fields -->", start)]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1] in ("supported", "hint", "unsupported", "extension"):
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_docs_table_lists_every_field_as_the_model_treats_it(endpoint):
    _, model, _, _, extensions = ENDPOINTS[endpoint]
    routed = router_fields(model)
    want = {n: ("extension" if n in extensions and k == "supported" else k) for n, k in field_support(model).items() if n not in routed}
    assert _documented(endpoint) == want


def test_the_docs_table_of_router_fields_lists_each_as_the_models_treat_it():
    want = {n: k for _, (_, model, *_) in ENDPOINTS.items() for n, k in field_support(model).items() if n in router_fields(model)}
    assert _documented("routers") == want
