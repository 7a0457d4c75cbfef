"""What routers and orchestrators read from a server (issue #50, item 3): ``/ready``, ``/get_load``,
``/get_server_info`` and the load series of ``/metrics`` (vLLM's names), with real values under real load, and the
app's side of the drain (503 + ``Retry-After`` to new work, readiness down, the probes open). The server runs on a
thread with the tiny pair; the SIGTERM drain of a real ``serve`` process is in ``test_drain.py``."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from conftest import make_case
from test_serve import CHAT, body_of, metrics_of, wait_for

from asymspec_mm import __version__
from asymspec_mm.serve.app import create_app
from asymspec_mm.serve.server import ServerThread


@pytest.fixture()
def small_server(tiny_pipe):
    """A server of two rows (a third request waits) with a KV bound, so every load series has a value."""
    app = create_app(tiny_pipe, max_batch_size=2, max_queue=8, max_kv_bytes=64 * 2**20, max_stall=1.5)
    with ServerThread(app) as srv:
        srv.state = app.state.asymspec
        yield srv


def stream_in_thread(url: str, body: dict, out: dict, key: int) -> threading.Thread:
    """POST ``body`` as a stream on a thread; ``out[key]`` gets the lines (or the exception)."""

    def run() -> None:
        try:
            with httpx.stream("POST", url + CHAT, json={**body, "stream": True}, timeout=300) as r:
                out[key] = [line for line in r.iter_lines() if line]
        except Exception as exc:  # noqa: BLE001 - reported by the test
            out[key] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_get_load_and_metrics_follow_real_load(small_server, tiny_pipe):
    """Three requests on two rows: /get_load and /metrics say 2 running and 1 waiting while they run, 0 and 0
    after; the KV held grows while rows run."""
    url = small_server.url
    idle = httpx.get(url + "/get_load").json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "num_running_reqs": 0}]
    out: dict = {}
    long = {"ignore_eos": True}  # every answer runs its whole budget: the load lasts
    threads = [stream_in_thread(url, {**body_of(make_case(300 + i), max_tokens=300, method="floor"), **long}, out, i) for i in range(3)]
    name = f'model_name="{tiny_pipe.name}"'
    seen: dict = {}

    def loaded() -> bool:  # each read is one moment: the load and the metrics are read until each shows 2 + 1
        if "load" not in seen:
            load = httpx.get(url + "/get_load", timeout=30).json()[0]
            if (load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 1):
                seen["load"] = load
        if "metrics" not in seen:
            m = metrics_of(url)
            if (m[f"vllm:num_requests_running{{{name}}}"], m[f"vllm:num_requests_waiting{{{name}}}"]) == (2, 1):
                seen["metrics"] = m
        return len(seen) == 2

    wait_for(loaded, timeout=120, what="2 running and 1 waiting")
    assert seen["load"]["num_reqs"] == 3 and seen["load"]["num_tokens"] > 0
    m = seen["metrics"]
    assert m[f"asymspec_kv_bytes{{{name}}}"] > 0 and 0 < m[f"vllm:kv_cache_usage_perc{{{name}}}"] <= 1
    assert m[f"vllm:kv_cache_usage_perc{{{name}}}"] == pytest.approx(m[f"asymspec_kv_bytes{{{name}}}"] / (64 * 2**20))
    for t in threads:
        t.join(300)
    assert all(isinstance(out[i], list) and out[i][-1] == "data: [DONE]" for i in range(3)), out
    done = httpx.get(url + "/get_load").json()[0]
    assert (done["num_running_reqs"], done["num_waiting_reqs"], done["num_reqs"]) == (0, 0, 0)
    m = metrics_of(url)
    assert m[f"vllm:num_requests_running{{{name}}}"] == 0 and m[f"vllm:num_requests_waiting{{{name}}}"] == 0


def test_prefix_cache_series_grow_on_a_repeated_prompt(server_for_prefix, tiny_pipe):
    """vLLM's prefix-cache counters (tokens): the second time a prompt comes, its tokens are looked up and found."""
    url = server_for_prefix.url
    name = f'model_name="{tiny_pipe.name}"'
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a repeated question about nothing at all"}], "max_tokens": 2}
    before = metrics_of(url)
    assert httpx.post(url + CHAT, json=body, timeout=300).status_code == 200
    first = metrics_of(url)
    assert httpx.post(url + CHAT, json=body, timeout=300).status_code == 200
    second = metrics_of(url)
    queries, hits = f"vllm:prefix_cache_queries_total{{{name}}}", f"vllm:prefix_cache_hits_total{{{name}}}"
    assert first[queries] > before[queries]  # the first request looked its prompt up
    assert second[queries] - first[queries] == first[queries] - before[queries]  # the same prompt: the same lookups
    assert second[hits] - first[hits] > first[hits] - before[hits]  # ... and now they are found
    assert second[hits] - first[hits] <= second[queries] - first[queries]
    stats = tiny_pipe.prefix_kv.stats()
    assert (stats["queried_tokens"], stats["matched_tokens"]) == (second[queries], second[hits])
    assert second[f"asymspec_prefix_cache_bytes{{{name}}}"] == stats["bytes"] > 0


@pytest.fixture()
def server_for_prefix(tiny_pipe):
    tiny_pipe.prefix_kv.clear()
    app = create_app(tiny_pipe, max_batch_size=2)
    with ServerThread(app) as srv:
        yield srv


def test_server_info_ready_and_health(small_server, tiny_pipe):
    """The fields the routers' worker registration reads, and the probes while serving."""
    url = small_server.url
    info = httpx.get(url + "/get_server_info").json()
    assert info["model_id"] == info["served_model_name"] == tiny_pipe.name
    assert info["tokenizer_path"] == info["model_path"] == tiny_pipe.verifier_tokenizer.name_or_path
    assert (info["dp_size"], info["version"], info["max_running_requests"], info["max_batch_size"]) == (1, __version__, 2, 2)
    assert info["max_kv_bytes"] == 64 * 2**20 and info["max_stall"] == 1.5 and info["draining"] is False
    assert info["context_length"] == tiny_pipe.verifier.config.max_position_embeddings
    assert info["internal_states"] == [{"num_running_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    assert httpx.get(url + "/ready").json() == {"status": "ready", "model": tiny_pipe.name}
    assert httpx.get(url + "/health").json() == {"status": "ok", "model": tiny_pipe.name}


def test_probes_need_no_key_and_router_endpoints_do(tiny_pipe):
    app = create_app(tiny_pipe, api_key="k")
    with ServerThread(app) as srv:
        assert httpx.get(srv.url + "/ready").status_code == 200 and httpx.get(srv.url + "/health").status_code == 200
        for path in ("/get_load", "/get_server_info"):
            assert httpx.get(srv.url + path).status_code == 401
            assert httpx.get(srv.url + path, headers={"Authorization": "Bearer k"}).status_code == 200


def test_get_load_in_vllm_routers_shape(tiny_pipe):
    """vllm-router 0.1.17 reads ``{"load": n}`` (its /get_loads shows -1 for SGLang's list, and SGLang's gateway -1
    for the object: measured with both): ``load_format="vllm-router"`` answers that shape; anything else is refused."""
    from asymspec_mm.base.errors import AsymSpecError
    from asymspec_mm.cli.main import build_parser

    with ServerThread(create_app(tiny_pipe, load_format="vllm-router")) as srv:
        assert httpx.get(srv.url + "/get_load").json() == {"load": 0}
    with pytest.raises(AsymSpecError, match="load_format='vllm' is not valid; choose one of sglang, vllm-router"):
        create_app(tiny_pipe, load_format="vllm")
    assert build_parser().parse_args(["serve"]).load_format == "sglang"
    assert build_parser().parse_args(["serve", "--load-format", "vllm-router"]).load_format == "vllm-router"


def test_a_bad_drain_timeout_is_refused(tiny_pipe):
    from asymspec_mm.base.errors import AsymSpecError

    for bad in (0, -1.0, float("inf"), True, "20"):
        with pytest.raises(AsymSpecError, match="drain_timeout=.* must be a positive number of seconds"):
            create_app(tiny_pipe, drain_timeout=bad)


def test_a_draining_app_refuses_new_work_and_keeps_its_probes(tiny_pipe):
    """What SIGTERM switches on (the drain itself, begun here as the server's signal handler does): new work gets
    503 with Retry-After and OpenAI's error object (the ``openai`` client sees an APIStatusError), /ready says
    draining, /health stays 200 (liveness), the router endpoints and /metrics still answer."""
    app = create_app(tiny_pipe, max_batch_size=2)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1).choices
        app.state.asymspec.drain.begin()
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "1"
        assert err.value.body["code"] == "server_draining" and "shutting down" in err.value.body["message"]
        assert httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 503
        ready = httpx.get(srv.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "draining"
        assert httpx.get(srv.url + "/get_load").status_code == 200 and httpx.get(srv.url + "/get_server_info").json()["draining"]
        assert metrics_of(srv.url)['asymspec_refused_requests_total{status="503"}'] == 2
