"""End to end through the routers people deploy (issue #50, item 1): the server (the tiny random pair, uvicorn on a
free loopback port) behind vllm-router and behind SGLang's gateway, each started on 127.0.0.1; every case of
``router_cases.py`` (chat, completions, Responses; streamed and not; tools, images, the ``asymspec`` extension) sent
with the ``openai`` client through the router equals the same call sent straight to the server.

Where a router changes the request's meaning (SGLang's gateway, pinned by test_router_bodies.py too), the routed answer
is compared with the direct answer of the request as the gateway forwards it (its extensions dropped), or its
documented outcome is checked (an omitted Responses temperature samples at 1.0; a lost image is a 400 naming the part;
a Responses ``tool_choice`` naming a function is the gateway's own 400). The same extensions sent inside the objects
the gateway forwards verbatim (``chat_template_kwargs`` on chat, ``metadata`` on Responses) answer through either
router exactly as at the top level straight to the server.

A router whose console script is not installed is skipped with the reason (``pip install vllm-router==0.1.17
sglang-router==0.3.2``, or ``ASYMSPEC_ROUTER_BIN`` naming the ``bin`` folder of a venv holding them)."""

from __future__ import annotations

import pytest
from router_cases import CASES, ROUTERS, VERSIONS, router_executable, running_router, send

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
from asymspec_mm.serve.app import create_app
from asymspec_mm.serve.server import ServerThread

pytestmark = pytest.mark.slow
TIMEOUT = 120  # seconds per request; a client that hangs fails instead of stalling the suite
#: (router, endpoint) -> the ``extra_body`` fields the router drops.
DROPPED = {
    ("sglang-router", "/v1/chat/completions"): frozenset({"asymspec", "structured_outputs"}),
    ("sglang-router", "/v1/responses"): frozenset({"asymspec", "seed"}),
}
#: (router, case) -> the temperature a Responses body is answered with where the client's own answer is not the routed
#: one: sampled without the client's seed (dropped) or at OpenAI's default 1.0 (the client sent none).
SAMPLED = {
    ("sglang-router", "responses_text"): 1.0,
    ("sglang-router", "responses_openai_defaults"): 1.0,
    ("sglang-router", "responses_sampled"): 0.7,
}
#: (router, case) -> (status, param) of the error the client gets.
FAILS = {
    ("sglang-router", "responses_image_asymspec"): (400, "input[0].content[1].type"),  # the image became {"type": "unknown"}
    ("sglang-router", "responses_tools"): (400, None),  # the gateway cannot parse tool_choice {"type": "function", "name"}
}


@pytest.fixture(scope="module")
def server(tiny_pipe):
    with ServerThread(create_app(tiny_pipe, max_batch_size=4)) as srv:
        yield srv


@pytest.fixture(scope="module")
def direct(server):
    """Case name -> the answer sent straight to the server (computed once per case and dropped set)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    cache: dict[tuple[str, frozenset[str]], dict] = {}

    def answer(name: str, drop: frozenset[str] = frozenset()) -> dict:
        if (name, drop) not in cache:
            cache[(name, drop)] = send(client, name, drop)
        return cache[(name, drop)]

    return answer


@pytest.fixture(scope="module", params=list(ROUTERS))
def routed(request, tmp_path_factory):
    """(router name, an ``openai`` client on the router in front of the server); skipped before the server starts
    when the router is not installed."""
    name = request.param
    if router_executable(name) is None:
        pytest.skip(
            f"{name} is not installed: pip install {name}=={VERSIONS[name]} (or set ASYMSPEC_ROUTER_BIN to the bin folder holding it)"
        )
    server = request.getfixturevalue("server")
    log = tmp_path_factory.mktemp("router") / f"{name}.log"
    with running_router(name, server.url, log=log) as url:
        yield name, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.parametrize("case", list(CASES))
def test_an_answer_through_the_router_equals_the_direct_one(routed, direct, case):
    router, client = routed
    endpoint = CASES[case][0]
    if (router, case) in FAILS:
        status, param = FAILS[(router, case)]
        with pytest.raises(openai.APIStatusError) as info:
            send(client, case)
        assert info.value.status_code == status
        if param is not None:
            assert info.value.body["param"] == param, info.value.body
        return
    got = send(client, case)
    if (router, case) in SAMPLED:
        assert got["temperature"] == SAMPLED[(router, case)] and got["status"] in ("completed", "incomplete")
        assert got["usage"][0] == direct(case)["usage"][0]  # the same prompt
        return
    assert got == direct(case, DROPPED.get((router, endpoint), frozenset()))


def test_sglang_drops_the_extension_so_the_answer_is_the_drafters_own_view(routed, direct):
    """Through SGLang's gateway the chat body's ``asymspec`` (here: the caption given, no OCR) never arrives: the
    answer is the server's default view's, which for this image and pair differs from the client's in the prompt the
    verifier reads (the caption's tokens)."""
    router, client = routed
    if router != "sglang-router":
        pytest.skip("vllm-router forwards asymspec")
    with_view, without = direct("chat_image_asymspec"), direct("chat_image_asymspec", DROPPED[(router, "/v1/chat/completions")])
    assert send(client, "chat_image_asymspec") == without
    assert with_view["usage"][0] != without["usage"][0]


#: Carried case -> (the same call with the extension at the top level: the ``openai`` call's ``extra_body``).
TOP_LEVEL = {
    "chat_image_carried": {"asymspec": {"caption": "a bar chart with two bars", "ocr": False, "k": 4}},
    "chat_method_carried": {"asymspec": {"method": "drafter"}},
    "chat_structured_outputs_carried": {"structured_outputs": {"choice": ["left", "right"]}},
    "responses_carried": {"asymspec": {"method": "drafter", "k": 3}, "seed": 3, "metadata": {"team": "charts"}},
}


@pytest.mark.parametrize("case", list(TOP_LEVEL))
def test_through_either_router_a_carried_extension_answers_as_the_top_level_one(routed, server, case):
    """The extension in ``chat_template_kwargs`` (chat) or ``metadata`` (Responses), which SGLang's gateway forwards
    verbatim, answers through the router exactly as the same extension at the top level sent straight to the server
    (the method, the caption and OCR given, structured_outputs, a seeded sampled Responses answer)."""
    from router_cases import CALLS

    router, client = routed
    endpoint, body = CASES[case]
    direct = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    top = CALLS[endpoint](direct, {**body, "extra_body": TOP_LEVEL[case]})
    assert send(client, case) == top
    without = CALLS[endpoint](direct, {k: v for k, v in body.items() if k != "extra_body"})
    assert without != top, "the extension changes this answer, so the test can tell it arrived"


def test_the_routers_list_the_served_model_id(routed, server):
    """The model id: both routers answer ``GET /v1/models`` with the replica's own id, and SGLang's gateway lists it
    for the worker (read from ``GET /get_server_info``). vllm-router 0.1.17's worker listing (``GET /workers``) reads
    the id from a worker label that its registration never sets and never asks the replica (its src/core/worker.rs:
    ``model_id`` falls back to "unknown"), so it shows ``unknown`` whatever the server answers; pinned here so that a
    version that reads it shows up."""
    import httpx

    router, client = routed
    served = [m.id for m in openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0).models.list().data]
    assert [m.id for m in client.models.list().data] == served and len(served) == 1
    workers = httpx.get(str(client.base_url).removesuffix("/v1/") + "/workers", timeout=10).json()["workers"]
    assert [w["model_id"] for w in workers] == (["unknown"] if router == "vllm-router" else served)
