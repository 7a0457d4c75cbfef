"""Sessions through the routers (issue #50, item 2): two replicas of the tiny random pair (each its own pipeline, so
each its own prefix KV; both on one ``--responses-store`` SQLite file) behind vllm-router and behind SGLang's
gateway, started on 127.0.0.1 with the session policies docs/deployment.md names.

With the session key in its header (``X-Session-Id`` for vllm-router's ``consistent_hash``, ``X-SMG-Routing-Key``
for the gateway's ``manual``), a 4-turn conversation sent with the ``openai`` client (chat with the growing history
and an image; the Responses API by ``previous_response_id``) lands every turn on one replica (each replica's own
``asymspec_requests_total`` tells) and ``usage.prompt_tokens_details.cached_tokens`` grows turn after turn. Without
a key, under ``round_robin``, the turns alternate replicas and the Responses turns still continue, from the shared
store. A router whose console script is not installed is skipped with the reason (see test_router_e2e.py)."""

from __future__ import annotations

import uuid

import pytest
from replicas import router_or_skip
from router_cases import ROUTERS, image_url, running_router, shown_command

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
import httpx

from asymspec_mm.frontend.prometheus import parse_prometheus
from asymspec_mm.serve.app import create_app
from asymspec_mm.serve.responses_store import SQLiteResponseStore
from asymspec_mm.serve.server import ServerThread

pytestmark = pytest.mark.slow
TIMEOUT = 120  # seconds per request: a hung client fails instead of stalling the suite
TURNS = 4
BUDGET = 6
#: Each router's session policy and the header it reads the session key from (docs/deployment.md, "Sessions").
SESSION_POLICY = {"vllm-router": "consistent_hash", "sglang-router": "manual"}
SESSION_HEADER = {"vllm-router": "X-Session-Id", "sglang-router": "X-SMG-Routing-Key"}
#: Tokens of the opening question that only its own conversation shares (the tag and the words after it).
OPENING = 16
QUESTIONS = ("Which bar is the tallest?", "And the shortest?", "How many bars are there?", "What colour is the tallest?")


@pytest.fixture(scope="module")
def replicas(tiny_dirs, tmp_path_factory):
    """Two live replicas, each its own pipeline and scheduler, sharing one SQLite Responses store (each its own
    connection, as two processes)."""
    from asymspec_mm import AsymSpecPipeline

    path = tmp_path_factory.mktemp("store") / "responses.sqlite"
    stores = [SQLiteResponseStore(path) for _ in range(2)]
    pipes = [AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none") for _ in range(2)]
    servers = [ServerThread(create_app(pipe, max_batch_size=2, responses_store=store)).start() for pipe, store in zip(pipes, stores)]
    yield servers
    for server, store, pipe in zip(servers, stores, pipes):
        server.stop()
        store.close()
        pipe.close()


def served(servers) -> list[int]:
    """Each replica's count of requests it took (``asymspec_requests_total``, all outcomes), from its own /metrics."""
    counts = []
    for server in servers:
        values = parse_prometheus(httpx.get(server.url + "/metrics", timeout=10).text)
        counts.append(int(sum(v for k, v in values.items() if k.startswith("asymspec_requests_total{"))))
    return counts


def opening(tag: str) -> str:
    """The first question, made unique by ``tag`` so that no earlier conversation's KV serves this one's turns."""
    return f"[{tag}] {QUESTIONS[0]}"


def chat_session(client: openai.OpenAI, headers: dict[str, str], tag: str) -> list[tuple[int, int]]:
    """A 4-turn chat (an image in the first turn, the history growing); each turn's (prompt, cached) tokens."""
    text = {"type": "text", "text": opening(tag)}
    messages: list[dict] = [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": image_url()}}]}]
    usage = []
    for turn in range(TURNS):
        if turn:
            messages.append({"role": "user", "content": QUESTIONS[turn]})
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=BUDGET, temperature=0, extra_headers=headers)
        usage.append((out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens))
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
    return usage


def responses_session(client: openai.OpenAI, headers: dict[str, str], tag: str, image: bool) -> list[tuple[int, int]]:
    """A 4-turn Responses conversation by ``previous_response_id`` (an image in the first turn when ``image``);
    each turn's (prompt, cached) tokens. ``temperature=0`` is sent: SGLang's gateway adds 1.0 where none is sent."""
    first = [{"type": "input_text", "text": opening(tag)}]
    first += [{"type": "input_image", "image_url": image_url()}] if image else []
    previous, usage = None, []
    for turn in range(TURNS):
        content = first if turn == 0 else QUESTIONS[turn]
        out = client.responses.create(
            model="tiny",
            input=[{"role": "user", "content": content}],
            previous_response_id=previous,
            max_output_tokens=BUDGET,
            temperature=0,
            extra_headers=headers,
        )
        assert out.status in ("completed", "incomplete") and (turn == 0 or out.previous_response_id == previous)
        previous = out.id
        usage.append((out.usage.input_tokens, out.usage.input_tokens_details.cached_tokens))
    return usage


def routed_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_session_key_keeps_a_conversation_on_one_replica(router, replicas, tmp_path):
    """Chat and Responses, each 4 turns under its own session key: every turn on one replica (4 and 0 by the
    replicas' own counters), and ``cached_tokens`` grows turn after turn: each turn finds the turn before in its
    replica's cache (the conversation is new, its opening unique, so only its own turns can serve it). Through SGLang's gateway the Responses turns
    carry no image: it turns an ``input_image`` into ``{"type": "unknown"}`` (docs/deployment.md)."""
    router_or_skip(router)
    header = SESSION_HEADER[router]
    urls = [s.url for s in replicas]
    with running_router(router, urls, log=tmp_path / f"{router}.log", policy=SESSION_POLICY[router]) as url:
        client = routed_client(url)
        for name, session in (
            ("chat", lambda h, tag: chat_session(client, h, tag)),
            ("responses", lambda h, tag: responses_session(client, h, tag, image=router == "vllm-router")),
        ):
            before = served(replicas)
            tag = uuid.uuid4().hex[:8]
            usage = session({header: f"{name}-{tag}"}, tag)
            taken = [after - b for after, b in zip(served(replicas), before)]
            assert sorted(taken) == [0, TURNS], (name, taken)
            assert all(later > earlier for (_, earlier), (_, later) in zip(usage, usage[1:])), (name, usage)


@pytest.mark.parametrize("router", list(ROUTERS))
def test_without_a_session_key_responses_continue_on_the_other_replica(router, replicas, tmp_path):
    """Under ``round_robin`` and no key the turns alternate replicas (2 and 2 by their counters), and each
    ``previous_response_id`` is found in the shared store: before it, turn 2 was a 400 ``previous_response_not_found``.
    The KV stays behind: turn 2, on the other replica, misses turn 1's unique opening (more than :data:`OPENING`
    tokens of turn 1's prompt are not in its cache; the replica of turn 1 would miss only the few tokens its chat
    template writes differently once the answer is history: 6 for the tiny pair)."""
    router_or_skip(router)
    with running_router(router, [s.url for s in replicas], log=tmp_path / f"{router}.log", policy="round_robin") as url:
        before = served(replicas)
        usage = responses_session(routed_client(url), {}, uuid.uuid4().hex[:8], image=router == "vllm-router")
        assert [after - b for after, b in zip(served(replicas), before)] == [TURNS // 2, TURNS // 2]
        assert usage[1][1] < usage[0][0] - OPENING, usage


def test_the_documented_commands_are_the_tested_ones():
    """docs/deployment.md's Sessions commands are :func:`router_cases.shown_command` of the policies tested here."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "deployment.md").read_text()
    workers = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    for router, policy in SESSION_POLICY.items():
        assert shown_command(router, workers, policy=policy) in page.splitlines(), router
