"""The bodies vllm-router 0.1.17 and SGLang's gateway (sglang-router 0.3.2) really forward (issue #50, item 1),
recorded once by ``scripts/record_router_bodies.py`` in front of a stand-in backend (tests/data/router_bodies/): the
server accepts each and reads it exactly as the client's own body, the parsed request compared whole (the engine's
request with its images, streaming, choices, log-probabilities, what the Responses API echoes).

Where a router changes a body's meaning the difference is pinned here, so that a new router version that stops (or
starts) doing it fails: SGLang's gateway strips ``asymspec`` and ``structured_outputs`` from chat bodies and
``asymspec`` and ``seed`` from Responses bodies, sends a Responses body without ``temperature`` / ``top_p`` with
OpenAI's defaults (1.0, 1.0: sampled, where the client's own body decodes greedily), replaces a Responses
``input_image`` part with ``{"type": "unknown"}`` (refused: the image is gone) and refuses a Responses
``tool_choice`` naming a function itself. The same extensions inside ``chat_template_kwargs`` (chat) and ``metadata``
(Responses), which the gateway forwards as sent, are read as at the top level, refused by the path as sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from router_cases import ROUTERS, shown_command

pytest.importorskip("fastapi")
from asymspec_mm.serve.chat_request import parse_chat_request, validated
from asymspec_mm.serve.completions import CompletionRequest, parse_completion_request
from asymspec_mm.serve.errors import RequestError
from asymspec_mm.serve.models_router import ROUTER_FIELDS
from asymspec_mm.serve.responses_api import parse_responses_request

DATA = Path(__file__).parent / "data" / "router_bodies"
RECORDED = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DATA.glob("*.json"))}
PARSE = {
    "/v1/chat/completions": parse_chat_request,
    "/v1/completions": lambda body: parse_completion_request(validated(CompletionRequest, body)),
    "/v1/responses": parse_responses_request,
}
#: (router, endpoint) -> the client's fields the router drops.
STRIPPED = {
    ("sglang-router", "/v1/chat/completions"): {"asymspec", "structured_outputs"},
    ("sglang-router", "/v1/responses"): {"asymspec", "seed"},
}
#: (router, case) -> what the server answers the forwarded body: a 400 naming this param (the router lost a part).
REFUSED_AFTER_ROUTER = {("sglang-router", "responses_image_asymspec"): "input[0].content[1].type"}
#: (router, case) the router itself refuses (the client's body never reaches a replica).
REFUSED_BY_ROUTER = {("sglang-router", "responses_tools")}
#: OpenAI's sampling defaults, which SGLang's gateway writes into a Responses body that has none.
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


def _cases() -> list[tuple[str, str]]:
    return [(router, name) for router, doc in RECORDED.items() for name in doc["cases"]]


def test_both_routers_were_recorded_with_every_case():
    assert set(RECORDED) == {"vllm-router", "sglang-router"}
    assert RECORDED["vllm-router"]["cases"].keys() == RECORDED["sglang-router"]["cases"].keys()
    assert {(r, n) for r, n in _cases() if "router_refused" in RECORDED[r]["cases"][n]} == REFUSED_BY_ROUTER


def _expected_client_body(router: str, case: dict) -> dict:
    """The client's body as the router's rewrite means it: the fields it strips dropped, OpenAI's sampling defaults
    where SGLang's gateway writes them."""
    body = {k: v for k, v in case["client_body"].items() if k not in STRIPPED.get((router, case["path"]), set())}
    if router == "sglang-router" and case["path"] == "/v1/responses":
        body = {**OPENAI_DEFAULTS, **body}
    return body


@pytest.mark.parametrize("router,name", _cases())
def test_a_recorded_body_is_read_as_the_clients_own(router, name):
    case = RECORDED[router]["cases"][name]
    if (router, name) in REFUSED_BY_ROUTER:
        assert case["router_refused"].startswith("400 ")
        return
    parse = PARSE[case["path"]]
    if (router, name) in REFUSED_AFTER_ROUTER:
        with pytest.raises(RequestError) as info:
            parse(case["router_body"])
        assert (info.value.status, info.value.param) == (400, REFUSED_AFTER_ROUTER[(router, name)]), info.value.body()
        return
    assert parse(case["router_body"]) == parse(_expected_client_body(router, case))


@pytest.mark.parametrize("router,name", _cases())
def test_a_router_adds_only_listed_fields_and_strips_only_the_pinned_ones(router, name):
    case = RECORDED[router]["cases"][name]
    if "router_body" not in case:
        return
    sent, forwarded = case["client_body"], case["router_body"]
    added = set(forwarded) - set(sent)
    # OpenAI's own fields at their defaults (stream, logprobs, echo, store, temperature, top_p, top_k) and the budget
    # renamed (max_tokens -> max_completion_tokens) are read already; the rest must be router fields
    known = {"stream", "logprobs", "echo", "store", "temperature", "top_p", "top_k", "ignore_eos", "max_completion_tokens"}
    assert added - known <= set(ROUTER_FIELDS), added - known - set(ROUTER_FIELDS)
    stripped = set(sent) - set(forwarded) - ({"max_tokens"} if "max_completion_tokens" in added else set())
    assert stripped == STRIPPED.get((router, case["path"]), set()) & set(sent)


def test_vllm_router_forwards_the_asymspec_extension_and_structured_outputs():
    cases = RECORDED["vllm-router"]["cases"]
    for name, case in cases.items():
        for field in ("asymspec", "structured_outputs", "seed", "top_k"):
            if field in case["client_body"]:
                assert case["router_body"][field] == case["client_body"][field], (name, field)


def test_through_sglang_an_omitted_responses_temperature_samples():
    """The client's greedy body and the forwarded one differ only in OpenAI's sampling defaults: the server cannot
    tell a client's explicit ``temperature: 1.0`` from the gateway's (the two forwarded bodies are equal), so the
    forwarded body samples. A client that
    sends ``temperature`` itself (0: greedy) gets its own value through: the same engine request (only the echoed
    ``top_p`` reads 1.0, the gateway's, for null)."""
    cases = RECORDED["sglang-router"]["cases"]
    omitted = cases["responses_text"]
    assert "temperature" not in omitted["client_body"] and omitted["router_body"]["temperature"] == 1.0
    assert parse_responses_request(omitted["client_body"]).config.temperature == 0.0
    assert parse_responses_request(omitted["router_body"]).config.temperature == 1.0
    # a client's own temperature 1.0 and top_p 1.0 (and a seed, which the gateway drops) arrive as the same bytes
    assert cases["responses_openai_defaults"]["router_body"] == omitted["router_body"]
    greedy = cases["responses_greedy"]
    assert greedy["client_body"]["temperature"] == greedy["router_body"]["temperature"] == 0
    assert parse_responses_request(greedy["router_body"]).request == parse_responses_request(greedy["client_body"]).request


def test_the_bodies_as_the_server_refused_them_before():
    """Every forwarded chat and completions body carries a field that used to be an unknown field."""
    for router, doc in RECORDED.items():
        for name, case in doc["cases"].items():
            if case["path"] != "/v1/responses" and "router_body" in case:
                assert set(case["router_body"]) & set(ROUTER_FIELDS), (router, name)


def test_the_deployment_page_shows_the_commands_the_tests_run():
    page = (Path(__file__).parents[1] / "docs" / "deployment.md").read_text(encoding="utf-8")
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for router in ROUTERS:
        assert shown_command(router) in page.splitlines() and f"`{shown_command(router)}`" in readme
        assert RECORDED[router]["command"] == shown_command(router)


def test_the_registry_names_exactly_the_routers_that_add_each_field():
    """:data:`ROUTER_FIELDS` says which router adds a field: each recorded router adds exactly the fields naming it."""
    for router, doc in RECORDED.items():
        added = set()
        for case in doc["cases"].values():
            if "router_body" in case:
                added |= (set(case["router_body"]) - set(case["client_body"])) & set(ROUTER_FIELDS)
        assert added == {name for name, by in ROUTER_FIELDS.items() if router in by}, router


# ---------------------------------------------------------------------------------------------- carriers
#: The recorded cases sending an extension in the object SGLang's gateway forwards verbatim -> the client's body with
#: the carried fields at the top level instead (the request it must read as).
CARRIED = {
    "chat_image_carried": ("chat_template_kwargs", {"asymspec"}),
    "chat_method_carried": ("chat_template_kwargs", {"asymspec"}),
    "chat_structured_outputs_carried": ("chat_template_kwargs", {"structured_outputs"}),
    "responses_carried": ("metadata", {"asymspec", "seed"}),
}


def _lifted(body: dict, carrier: str, names: set[str]) -> tuple[dict, dict]:
    """(``body`` with ``names`` moved from its ``carrier`` to the top level, ``body`` without them at all)."""
    kept = {k: v for k, v in body[carrier].items() if k not in names}
    rest = {k: v for k, v in body.items() if k != carrier} | ({carrier: kept} if kept else {})
    return rest | {n: body[carrier][n] for n in names}, rest


@pytest.mark.parametrize("name", list(CARRIED))
def test_through_sglang_a_carrier_brings_the_extension(name):
    """The gateway forwards ``chat_template_kwargs`` (chat) and ``metadata`` (Responses) as sent, and the server reads
    the extension there as at the top level (which the gateway drops): the same engine request, unlike the body
    without it."""
    carrier, names = CARRIED[name]
    case = RECORDED["sglang-router"]["cases"][name]
    assert case["router_body"][carrier] == case["client_body"][carrier]
    parse = PARSE[case["path"]]
    top, without = _lifted(case["client_body"], carrier, names)
    assert parse(case["router_body"]).request == parse(top).request
    assert parse(case["router_body"]).request != parse(without).request


def test_the_gateway_drops_the_top_level_fields_the_carriers_stand_for():
    """What the carriers are for: the same fields at the top level never arrive (a new gateway version that forwards
    them fails here, and the docs' advice can change)."""
    from asymspec_mm.serve.models_router import CARRIERS

    cases = RECORDED["sglang-router"]["cases"]
    for path, carried in CARRIERS.items():
        sent = [c for c in cases.values() if c["path"] == path and "router_body" in c]
        for field in carried:
            with_it = [c for c in sent if field in c["client_body"]]
            assert with_it and all(field not in c["router_body"] for c in with_it), (path, field)


MESSAGES = [{"role": "user", "content": "Which bar is the tallest?"}]


@pytest.mark.parametrize(
    "endpoint,body,param,code",
    [
        ("chat", {"chat_template_kwargs": {"asymspec": {"method": "fast"}}}, "chat_template_kwargs.asymspec.method", "invalid_value"),
        ("chat", {"chat_template_kwargs": {"asymspec": {"k": 0}}}, "chat_template_kwargs.asymspec.k", "invalid_value"),
        ("chat", {"chat_template_kwargs": {"asymspec": {"beta": "x"}}}, "chat_template_kwargs.asymspec.beta", "invalid_value"),
        ("chat", {"chat_template_kwargs": {"asymspec": {"kk": 3}}}, "chat_template_kwargs.asymspec.kk", "unknown_option"),
        ("chat", {"chat_template_kwargs": {"asymspec": {"caption": ["a", "b"]}}}, "chat_template_kwargs.asymspec.caption", "invalid_value"),
        ("chat", {"chat_template_kwargs": {"structured_outputs": {}}}, "chat_template_kwargs.structured_outputs", "invalid_value"),
        (
            "chat",
            {"chat_template_kwargs": {"structured_outputs": {"json": "{"}}},
            "chat_template_kwargs.structured_outputs.json",
            "invalid_value",
        ),
        (
            "chat",
            {"chat_template_kwargs": {"structured_outputs": {"choice": ["a"]}}, "response_format": {"type": "json_object"}},
            "chat_template_kwargs.structured_outputs",
            "invalid_value",
        ),
        ("chat", {"chat_template_kwargs": {"other": 1}}, "chat_template_kwargs.other", "unsupported"),
        ("responses", {"metadata": {"asymspec": {"k": 0}}}, "metadata.asymspec.k", "invalid_value"),
        ("responses", {"metadata": {"asymspec": {"ocr": 3}}}, "metadata.asymspec.ocr", "invalid_value"),
        ("responses", {"metadata": {"seed": "3"}}, "metadata.seed", "invalid_value"),
        ("responses", {"metadata": {"seed": -1}}, "metadata.seed", "invalid_value"),
        ("responses", {"metadata": {"team": 3}}, "metadata.team", "invalid_value"),
    ],
)
def test_a_carried_field_is_refused_by_the_path_the_client_sent(endpoint, body, param, code):
    """The carriers validate exactly as the top-level fields, and the refusal names the field as the client spelled it
    (in ``param`` and at the start of the message)."""
    base, parse = (
        ({"messages": MESSAGES}, parse_chat_request) if endpoint == "chat" else ({"input": MESSAGES[0]["content"]}, parse_responses_request)
    )
    with pytest.raises(RequestError) as info:
        parse({**base, **body})
    err = info.value
    assert (err.status, err.param, err.code) == (400, param, code), err.body()
    named = param.rsplit(".", 1)[0] if code == "unknown_option" else param  # an unknown option: the object it is in
    assert named in err.message and "\n" not in err.message, err.message
    # the same value at the top level is refused the same way, named there
    carrier, field = param.split(".")[:2]
    if (
        carrier in ("chat_template_kwargs", "metadata")
        and field in ("asymspec", "structured_outputs", "seed")
        and "response_format" not in body
    ):
        top = {field: body[carrier][field]}
        with pytest.raises(RequestError) as plain:
            parse({**base, **top})
        tail = param.split(".", 1)[1]
        assert (plain.value.param, plain.value.code) == (tail, code)
        if code != "unknown_option":
            assert plain.value.message == err.message.replace(param, tail)


@pytest.mark.parametrize(
    "endpoint,field,carrier,one,other",
    [
        ("chat", "asymspec", "chat_template_kwargs", {"k": 3}, {"k": 4}),
        ("chat", "structured_outputs", "chat_template_kwargs", {"choice": ["a"]}, {"choice": ["b"]}),
        ("responses", "asymspec", "metadata", {"method": "drafter"}, {"method": "floor"}),
        ("responses", "seed", "metadata", 3, 4),
    ],
)
def test_a_field_sent_both_ways(endpoint, field, carrier, one, other):
    """Both at once: the same value is read once; different values are a 400 naming both."""
    base, parse = (
        ({"messages": MESSAGES}, parse_chat_request) if endpoint == "chat" else ({"input": MESSAGES[0]["content"]}, parse_responses_request)
    )
    both = parse({**base, field: one, carrier: {field: one}}).request
    assert both == parse({**base, field: one}).request == parse({**base, carrier: {field: one}}).request
    with pytest.raises(RequestError) as info:
        parse({**base, field: one, carrier: {field: other}})
    err = info.value
    assert (err.status, err.param) == (400, f"{carrier}.{field}") and f"{field} and {carrier}.{field} differ" in err.message


def test_chat_template_kwargs_keeps_its_own_key_beside_the_carried_ones():
    thinking = {"chat_template_kwargs": {"enable_thinking": True, "asymspec": {"method": "drafter"}}}
    req = parse_chat_request({"messages": MESSAGES, **thinking}).request
    assert (req.enable_thinking, req.method) == (True, "drafter")


def test_responses_metadata_is_echoed_as_sent_and_its_other_keys_stay_hints():
    meta = {"team": "charts", "asymspec": {"method": "drafter"}, "seed": 3}
    got = parse_responses_request({"input": "Which bar?", "metadata": meta})
    assert got.echo["metadata"] == meta
    assert (
        parse_responses_request({"input": "Which bar?", "metadata": {"team": "charts"}}).request
        == parse_responses_request({"input": "Which bar?"}).request
    )
