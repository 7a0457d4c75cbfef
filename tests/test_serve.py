"""``asymspec-mm serve``: the OpenAI-compatible server on the random tiny pair, driven by the real ``openai``
client and ``httpx`` on free loopback ports. Answers equal ``pipe.generate`` token for token; every refused
request is followed by one that still succeeds."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import make_case, start_serve, stop_serve

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.errors import AsymSpecError
from asymspec_mm.frontend.prometheus import parse_prometheus
from asymspec_mm.serve import ServerThread, bind_socket, create_app, is_loopback
from asymspec_mm.serve.chat_answers import TextDeltas
from asymspec_mm.serve.models_fields import field_value
from asymspec_mm.serve.server import warn_if_exposed

ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"


# ---------------------------------------------------------------------------------------------- helpers
def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def data_url(img) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()


def user_message(text: str, url: str | None) -> dict:
    """One user message: the image first, then the question (the layout in which it equals ``pipe.generate``)."""
    parts: list[dict] = [{"type": "text", "text": text}]
    if url is not None:
        parts.insert(0, {"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def body_of(case: dict, max_tokens: int = 8, url: str | None = None, **asymspec) -> dict:
    """A chat request for a conftest case (caption and OCR given, so no OCR engine runs)."""
    return {
        "model": "tiny",
        "messages": [user_message(case["question"], url or data_url(case["image"]))],
        "max_tokens": max_tokens,
        "asymspec": {"caption": case["caption"], "ocr": case["ocr"], **asymspec},
    }


def reference(pipe, case: dict, method: str = "asymspec", **cfg):
    return pipe.generate(
        case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method=method, config=AsymSpecConfig(**cfg)
    )


def good_request(url: str, headers: dict | None = None) -> None:
    """A cheap request that must succeed: the server goes on serving."""
    case = make_case(90)
    r = httpx.post(url + CHAT, json=body_of(case, max_tokens=2, method="floor"), headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == reference_cache(case)


_GOOD: dict[str, str] = {}


def reference_cache(case: dict) -> str:
    return _GOOD[case["question"]]


def metrics_of(url: str, headers: dict | None = None) -> dict[str, float]:
    r = httpx.get(url + "/metrics", headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse_prometheus(r.text)


def wait_for(cond, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def sse_events(lines) -> list:
    """The JSON payloads of server-sent ``data:`` lines, up to ``[DONE]`` (included as the string)."""
    out = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
        if payload == "[DONE]":
            break
    return out


# ---------------------------------------------------------------------------------------------- servers
@pytest.fixture(scope="module")
def pipe(tiny_pipe):
    case = make_case(90)
    _GOOD[case["question"]] = reference(tiny_pipe, case, "floor", max_new_tokens=2).text
    return tiny_pipe


@pytest.fixture(scope="module")
def server_pipe(pipe):
    return pipe


@pytest.fixture(scope="module")
def server_options():
    return {"max_batch_size": 16, "max_queue": 64}


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("allowed")
    (d / "sub").mkdir()
    make_case(5)["image"].save(d / "sub" / "chart.png")
    outside = tmp_path_factory.mktemp("outside")
    make_case(5)["image"].save(outside / "secret.png")
    os.symlink(outside / "secret.png", d / "escape.png")
    os.symlink(d / "sub" / "chart.png", d / "inside_link.png")
    return d, outside


@pytest.fixture(scope="module")
def strict(pipe, image_dir):
    """A server with a key, a 0.05 MB body limit, one row and a queue of one, and a folder of local images."""
    app = create_app(pipe, max_batch_size=1, max_queue=1, api_key="sekret", max_request_mb=0.05, allow_local_images=image_dir[0])
    with ServerThread(app) as srv:
        srv.state = app.state.asymspec
        srv.auth = {"Authorization": "Bearer sekret"}
        yield srv


# ---------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize(
    "method,options",
    [
        ("asymspec", {"k": 3, "beta": 0.5}),
        ("asymspec", {"gate": "fixed", "bonus": "gated", "gamma": 0.3}),
        ("floor", {}),
        ("sd", {"k": 2}),
        ("drafter", {}),
    ],
)
def test_completion_equals_generate(pipe, client, method, options):
    case = make_case(1)
    ref = reference(pipe, case, method, max_new_tokens=10, **options)
    resp = client.chat.completions.create(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_tokens=10,
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"], "method": method, "return_trace": True, **options}},
    )
    assert resp.object == "chat.completion" and resp.model == pipe.name
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    assert choice.finish_reason == ("length" if ref.stats["stopped_by"] == "max_new_tokens" else "stop")
    extra = resp.model_extra["asymspec"]
    assert [t["token_id"] for t in extra["trace"]] == ref.token_ids
    assert resp.usage.prompt_tokens == ref.prompts.verifier_ids.shape[1]
    assert resp.usage.completion_tokens == len(ref.token_ids) and resp.usage.total_tokens == resp.usage.prompt_tokens + len(ref.token_ids)
    assert extra["view"] == {"caption": ref.view.caption, "ocr_text": ref.view.ocr_text}
    assert extra["method"] == method and extra["config"]["k"] == ref.config.k
    for key in ("steps", "drafted", "accepted", "new_tokens", "stopped_by", "accepted_per_position"):
        assert extra["stats"][key] == ref.stats[key], key


def test_ignore_eos_decodes_to_the_budget(pipe, client):
    """vLLM's ``ignore_eos`` (what ``vllm bench serve --ignore-eos`` sends) reaches the request on both endpoints that
    take it, and the answer runs to ``max_tokens``, token for token the library's ``ignore_eos``."""
    from asymspec_mm.serve.chat_request import parse_chat_request, validated
    from asymspec_mm.serve.completions import CompletionRequest, parse_completion_request

    case = make_case(2)
    body = body_of(case, max_tokens=40, return_trace=True)
    for flag in (True, False, None):
        extra = {} if flag is None else {"ignore_eos": flag}
        assert parse_chat_request({**body, **extra}).request.ignore_eos is bool(flag)
        completion = validated(CompletionRequest, {"prompt": "Which bar?", **extra})
        assert parse_completion_request(completion).request.ignore_eos is bool(flag)
    ref = pipe.generate(
        case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=AsymSpecConfig(max_new_tokens=40), ignore_eos=True
    )
    resp = client.chat.completions.create(
        **{k: v for k, v in body.items() if k != "asymspec"}, extra_body={"asymspec": body["asymspec"], "ignore_eos": True}
    )
    assert [t["token_id"] for t in resp.model_extra["asymspec"]["trace"]] == ref.token_ids
    assert resp.usage.completion_tokens == 40 and resp.choices[0].finish_reason == "length"
    done = client.completions.create(model="tiny", prompt=case["question"], max_tokens=12, extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 12 and done.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        client.completions.create(model="tiny", prompt="x", extra_body={"ignore_eos": "yes"})


def test_return_trace_matches_res_trace(pipe, client):
    case = make_case(2)
    ref = reference(pipe, case, max_new_tokens=12, k=3)
    resp = client.chat.completions.create(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_completion_tokens=12,
        temperature=0,
        n=1,
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"], "k": 3, "return_trace": True}},
    )
    trace = resp.model_extra["asymspec"]["trace"]
    assert len(trace) == len(ref.trace)
    for got, ev in zip(trace, ref.trace):
        assert got["token_id"] == ev.token_id and got["text"] == ev.text and got["source"] == ev.source
        assert (got["step"], got["position"], got["index"], got["steered"]) == (ev.step, ev.position, ev.index, ev.steered)
        for key in ("p_verifier", "p_base", "jsd", "gamma_eff"):
            want = getattr(ev, key)
            assert (got[key] is None) if want is None else got[key] == pytest.approx(want, rel=1e-6, abs=1e-9), key
        assert got["verifier_argmax_id"] == ev.verifier_argmax
        assert got["verifier_argmax"] == (None if ev.verifier_argmax is None else pipe.tokenizer.decode([ev.verifier_argmax]))
    assert {t["source"] for t in trace} <= {"accepted", "fused", "bonus", "corrected", "greedy"}
    # without return_trace no trace is sent
    plain = client.chat.completions.create(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_tokens=12,
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"], "k": 3}},
    )
    assert "trace" not in plain.model_extra["asymspec"] and plain.choices[0].message.content == ref.text


def test_streaming_chunks_concatenate_to_the_answer(pipe, client):
    case = make_case(3)
    ref = reference(pipe, case, max_new_tokens=14)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_tokens=14,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"], "return_trace": True}},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    steps = [c for c in chunks if c.choices and (c.model_extra.get("asymspec") or {}).get("trace")]
    assert len(steps) == ref.stats["steps"] > 1  # a chunk per committed step
    assert [t["token_id"] for c in steps for t in c.model_extra["asymspec"]["trace"]] == ref.token_ids
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["asymspec"]["stats"]["new_tokens"] == len(ref.token_ids)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert chunks[-1].usage.prompt_tokens == ref.prompts.verifier_ids.shape[1]


def test_stop_strings_streamed_and_not(pipe, client, server):
    case = make_case(4)
    full = reference(pipe, case, max_new_tokens=16)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    assert stop.strip("\ufffd") == stop and stop, full.text
    ref = reference(pipe, case, max_new_tokens=16, stop_strings=(stop,))
    assert ref.stats["stopped_by"] == "stop_string" and len(ref.text) < len(full.text)
    kwargs = dict(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_tokens=16,
        stop=[stop],
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"]}},
    )
    resp = client.chat.completions.create(**kwargs)
    assert resp.choices[0].message.content == ref.text and resp.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_text_deltas_hold_back_partial_characters_and_stop_prefixes(pipe):
    tok = pipe.tokenizer
    ids = tok("héllo wörld, café € done", add_special_tokens=False)["input_ids"]
    deltas = TextDeltas(tok, ("done",))
    pieces = [deltas.push([i]) for i in ids]
    final = tok.decode(ids, skip_special_tokens=True)
    assert final == "héllo wörld, café € done"
    pieces.append(deltas.finish(final[: final.index("done")]))
    assert "".join(pieces) == "héllo wörld, café € " and not any("\ufffd" in p for p in pieces)
    assert pieces[-1] == ""  # nothing of the stop string's prefix ("d", "do", "don") was sent early


def test_system_message_is_a_system_turn(pipe, client):
    case = make_case(6)
    system = "Answer briefly."
    ref = pipe.chat(
        [{"role": "system", "content": system}, {"role": "user", "content": [{"type": "image", "image": case["image"]}, case["question"]]}],
        caption=case["caption"],
        ocr=case["ocr"],
        config=AsymSpecConfig(max_new_tokens=8),
    )
    resp = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": system}, user_message(case["question"], data_url(case["image"]))],
        max_tokens=8,
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"]}},
    )
    assert resp.choices[0].message.content == ref.text


def test_neutral_openai_fields_are_accepted(pipe, server):
    """Fields that change nothing under greedy decoding (what agent frameworks send) pass; the answer is unchanged."""
    case = make_case(14)
    ref = reference(pipe, case, max_new_tokens=5)
    body = {**body_of(case, max_tokens=5), "temperature": 0.0, "top_p": 0.9, "seed": 3, "user": "u", "n": 1, "stream": False}
    body.update(tool_choice="auto", tools=[], response_format={"type": "text"}, logprobs=False, frequency_penalty=0, presence_penalty=0.0)
    body["asymspec"] = {**body["asymspec"], "k": None}  # null: the default
    r = httpx.post(server.url + CHAT, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == ref.text
    body["messages"][0]["content"] = [
        {"type": "image_url", "image_url": data_url(case["image"])},
        {"type": "text", "text": case["question"]},
    ]
    r = httpx.post(server.url + CHAT, json=body, timeout=120)  # image first, image_url as a bare string
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ref.text, r.text


def test_models_health_and_metrics(pipe, client, server):
    assert [m.id for m in client.models.list().data] == [pipe.name]
    assert client.models.retrieve(pipe.name).id == pipe.name
    # vLLM's ``root``: a benchmark client loads the tokenizer from it
    from transformers import AutoTokenizer

    root = client.models.list().data[0].model_extra["root"]
    assert AutoTokenizer.from_pretrained(root).get_vocab() == pipe.verifier_tokenizer.get_vocab()
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == pipe.name
    before = metrics_of(server.url)
    case = make_case(7)
    ref = reference(pipe, case, max_new_tokens=6)
    r = httpx.post(server.url + CHAT, json=body_of(case, max_tokens=6), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ref.text
    after = metrics_of(server.url)
    assert after['asymspec_requests_total{outcome="ok"}'] == before['asymspec_requests_total{outcome="ok"}'] + 1
    assert after["asymspec_completion_tokens_total"] == before["asymspec_completion_tokens_total"] + len(ref.token_ids)
    assert after["asymspec_prompt_tokens_total"] == before["asymspec_prompt_tokens_total"] + ref.prompts.verifier_ids.shape[1]
    assert after["asymspec_drafted_tokens_total"] - before["asymspec_drafted_tokens_total"] == ref.stats["drafted"]
    assert after["asymspec_accepted_tokens_total"] - before["asymspec_accepted_tokens_total"] == ref.stats["accepted"]
    assert (
        0 <= after["asymspec_acceptance_rate"] <= 1 and after["asymspec_scheduler_steps_total"] > before["asymspec_scheduler_steps_total"]
    )
    assert after["asymspec_live_rows"] == 0 and f'asymspec_model_info{{model="{pipe.name}"}}' in after
    # the same acceptance under vLLM's spec-decode counter names, and per request in vLLM's shape
    vllm = lambda name, extra="": (
        after.get(f'vllm:spec_decode_{name}_total{{model_name="{pipe.name}"{extra}}}', 0.0)
        - before.get(  # noqa: E731
            f'vllm:spec_decode_{name}_total{{model_name="{pipe.name}"{extra}}}', 0.0
        )
    )
    assert (vllm("num_draft_tokens"), vllm("num_accepted_tokens"), vllm("num_drafts")) == (
        ref.stats["drafted"],
        ref.stats["accepted"],
        ref.stats["steps"],
    )
    per_pos = [vllm("num_accepted_tokens_per_pos", f',position="{i}"') for i in range(len(ref.stats["accepted_per_position"]))]
    assert per_pos == ref.stats["accepted_per_position"] and sum(per_pos) == ref.stats["accepted"]
    spec = r.json()["asymspec"]["speculative_decoding"]
    assert spec["num_accepted_tokens_per_pos"] == ref.stats["accepted_per_position"] and spec["num_drafts"] == ref.stats["steps"]
    assert spec["mean_acceptance_length"] == 1 + ref.stats["accepted"] / ref.stats["steps"]
    assert spec["draft_acceptance_rate"] == ref.stats["accepted"] / ref.stats["drafted"]


def at_once(n: int, ask) -> dict[int, object]:
    """``ask(i)`` for i < n on n threads released together (a barrier); their answers by i."""
    barrier = threading.Barrier(n)
    got: dict[int, object] = {}

    def worker(i: int) -> None:
        barrier.wait(timeout=60)
        got[i] = ask(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(got) == n
    return got


def test_sixteen_concurrent_clients_with_mixed_settings_each_get_their_answer_alone(pipe):
    """Issue #42: 16 ``openai`` clients at once in four setting groups (K 2 / 6, gates, beta, methods AsymSpec / Floor /
    SD, a seeded sampled row): one batch steps them all (the rows shared steps across groups) and each answer equals
    its request run alone, token for token."""
    groups = [
        {"method": "asymspec", "k": 2, "gate": "cda", "beta": 0.5},
        {"method": "asymspec", "k": 6, "gate": "fixed", "beta": 1.0},
        {"method": "floor"},
        {"method": "sd", "k": 4},
    ]
    cases = [make_case(140 + i) for i in range(16)]
    settings = [dict(groups[i % 4]) for i in range(16)]
    settings[5] |= {"temperature": 0.9, "seed": 123}  # a sampled row in the mix
    refs = []
    for c, st in zip(cases, settings):
        cfg = {k: v for k, v in st.items() if k not in ("method", "temperature", "seed")}
        sample = {k: st[k] for k in ("temperature", "seed") if k in st}
        refs.append(reference(pipe, c, st["method"], max_new_tokens=8, **cfg, **sample))
    app = create_app(pipe, max_batch_size=16)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(i: int):
            c, st = cases[i], dict(settings[i])
            sample = {k: st.pop(k) for k in ("temperature", "seed") if k in st}
            return client.chat.completions.create(
                model="tiny",
                messages=[user_message(c["question"], data_url(c["image"]))],
                max_tokens=8,
                **sample,
                extra_body={"asymspec": {"caption": c["caption"], "ocr": c["ocr"], "return_trace": True, **st}},
            )

        got = at_once(16, ask)
        for i, ref in enumerate(refs):
            assert [t["token_id"] for t in got[i].model_extra["asymspec"]["trace"]] == ref.token_ids, (i, settings[i])
        assert max(got[i].model_extra["asymspec"]["stats"]["batch_size"] for i in range(16)) > 4  # groups stepped together


def test_sixteen_concurrent_clients_share_steps(pipe):
    cases = [make_case(100 + i) for i in range(16)]
    refs = [reference(pipe, c, max_new_tokens=8) for c in cases]
    app = create_app(pipe, max_batch_size=16)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(i: int):
            c = cases[i]
            return client.chat.completions.create(
                model="tiny",
                messages=[user_message(c["question"], data_url(c["image"]))],
                max_tokens=8,
                stream=i % 2 == 1,
                extra_body={"asymspec": {"caption": c["caption"], "ocr": c["ocr"], "return_trace": True}},
            )

        got = at_once(16, ask)
        for i, ref in enumerate(refs):
            if i % 2:
                chunks = list(got[i])
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text, i
            else:
                assert got[i].choices[0].message.content == ref.text, i
                assert [t["token_id"] for t in got[i].model_extra["asymspec"]["trace"]] == ref.token_ids, i
        m = metrics_of(srv.url)
        sched = app.state.asymspec.scheduler
        assert (
            m["asymspec_batch_occupancy"] == pytest.approx(sched.rows_stepped / sched.steps, rel=1e-5) and m["asymspec_batch_occupancy"] > 1
        )
        assert m['asymspec_requests_total{outcome="ok"}'] == 16 and m["asymspec_requests_in_flight"] == 0


# ---------------------------------------------------------------------------------------------- cancellation
def test_disconnecting_clients_cancel_their_rows(pipe, server, monkeypatch):
    """A streaming client that hangs up after the first piece of text, and a client that stops waiting for a
    plain answer, each cancel their row (no EOS, a 2,000-token budget: the rows could not have finished)."""
    monkeypatch.setattr(pipe, "eos_ids", set())
    sched = server.state.scheduler
    case = make_case(8)
    cancelled = lambda: metrics_of(server.url)['asymspec_requests_total{outcome="cancelled"}']  # noqa: E731
    before = cancelled()
    body = {**body_of(case, max_tokens=2000), "stream": True}
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()  # held: a dropped line iterator closes the connection at once (httpcore closes on GeneratorExit)
        for line in lines:
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # the first piece of text: hang up when the block ends
        assert sched.live_rows == 1
    wait_for(lambda: sched.live_rows == 0 and sched.waiting == 0, what="the streamed row to leave")
    wait_for(lambda: cancelled() == before + 1, what="the cancellation")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + CHAT, json=body_of(case, max_tokens=2000), timeout=httpx.Timeout(60, read=1.0))
    wait_for(lambda: cancelled() == before + 2, what="the second cancellation")
    wait_for(lambda: sched.live_rows == 0 and sched.waiting == 0, what="the second row to leave")
    wait_for(lambda: not server.state.handles, what="the server to forget the handles")
    m = metrics_of(server.url)
    assert m["asymspec_requests_in_flight"] == 0
    monkeypatch.undo()
    good_request(server.url)


# ---------------------------------------------------------------------------------------------- refusals
def _raw(body: str) -> tuple[str, dict]:
    return body, {"content-type": "application/json"}


def _case_body(**changes) -> dict:
    body = body_of(make_case(9), max_tokens=4)
    body.update(changes)
    return body


def _with_content(*parts) -> dict:
    return _case_body(messages=[{"role": "user", "content": list(parts)}])


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _text_part(text: str = "What is the largest value?") -> dict:
    return {"type": "text", "text": text}


_PNG = png_bytes(make_case(9)["image"])
_TOOL = {  # an ordinary agent's tool: its JSON is far longer than a message should echo
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
    },
}
_NAN_BODY = json.dumps(body_of(make_case(9), max_tokens=4, beta=123.0)).replace("123.0", "NaN")
_INF_BODY = json.dumps(body_of(make_case(9), max_tokens=4, gamma=123.0)).replace("123.0", "Infinity")

BAD_REQUESTS = {
    "remote_url": (
        _with_content(_text_part(), _image_part("https://example.com/chart.png")),
        "remote image URLs are not fetched",
        "image_url",
    ),
    "http_url": (_with_content(_text_part(), _image_part("http://127.0.0.1:9/x.png")), "remote image URLs are not fetched", "image_url"),
    "bad_base64": (_with_content(_text_part(), _image_part("data:image/png;base64,@@not base64!!")), "base64", "image_url"),
    "not_an_image": (
        _with_content(_text_part(), _image_part("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode())),
        "not a recognised image",
        "image_url",
    ),
    "truncated_png": (
        _with_content(_text_part(), _image_part("data:image/png;base64," + base64.b64encode(_PNG[: len(_PNG) // 2]).decode())),
        "bad image",
        "image_url",
    ),
    "text_data_url": (_with_content(_text_part(), _image_part("data:text/plain;base64,aGVsbG8=")), "not an image", "image_url"),
    "local_path_refused": (_with_content(_text_part(), _image_part("/etc/hostname")), "--allow-local-images", "image_url"),
    "empty_text": (_with_content(_text_part("   "), _image_part(data_url(make_case(9)["image"]))), "empty", "messages[0].content"),
    "no_text": (_with_content(_image_part(data_url(make_case(9)["image"]))), "empty", "messages[0].content"),
    "too_many_images": (
        _with_content(_text_part(), *[_image_part(data_url(make_case(9)["image"]))] * 9),
        "more than 8 images",
        "messages[0].content[9].image_url",
    ),
    "image_in_assistant": (
        _case_body(
            messages=[
                user_message("hi", data_url(make_case(9)["image"])),
                {"role": "assistant", "content": [_image_part(data_url(make_case(9)["image"]))]},
                user_message("and now?", None),
            ]
        ),
        "images go in user messages only",
        "messages[1].content[0]",
    ),
    "orphan_tool_message": (
        _case_body(messages=[user_message("hi", data_url(make_case(9)["image"])), {"role": "tool", "content": "42", "tool_call_id": "x"}]),
        "names no earlier assistant tool call",
        "messages[1].tool_call_id",
    ),
    "bad_template_kwargs": (
        _case_body(chat_template_kwargs={"add_vision_id": True}),
        "it takes enable_thinking, asymspec and structured_outputs",
        "chat_template_kwargs.add_vision_id",
    ),
    "audio_part": (_with_content(_text_part(), {"type": "input_audio", "input_audio": {}}), "'input_audio'", "messages[0].content[1].type"),
    "unknown_option": (_case_body(asymspec={"kk": 3}), "unknown AsymSpec option(s) kk", "asymspec.kk"),
    "unknown_field": (_case_body(frobnicate=True), "unknown request field(s) frobnicate", "frobnicate"),
    "temperature": (_case_body(temperature=3), "temperature=3 must be", "temperature"),
    "temperature_nan": (
        _raw(json.dumps(body_of(make_case(9), max_tokens=4)).replace('"max_tokens"', '"temperature": NaN, "max_tokens"')),
        "finite number",
        "temperature",
    ),
    "top_p_zero": (_case_body(top_p=0), "top_p=0 must be", "top_p"),
    "top_k_bad": (_case_body(top_k=-2), "top_k=-2 must be", "top_k"),
    "seed_negative": (_case_body(seed=-1), "seed=-1 must be", "seed"),
    "n_zero": (_case_body(n=0), "n=0 must be", "n"),
    "n_too_many": (_case_body(n=99), "n=99 must be", "n"),
    "nan_beta": (_raw(_NAN_BODY), "asymspec.beta=nan must be a finite number", "asymspec.beta"),
    "inf_gamma": (_raw(_INF_BODY), "asymspec.gamma=inf must be a finite number", "asymspec.gamma"),
    "bad_gate": (_case_body(asymspec={"gate": "sometimes"}), "choose one of cda, fixed, tuned", "asymspec.gate"),
    "bad_method": (_case_body(asymspec={"method": "beam"}), "choose one of", "asymspec.method"),
    "k_zero": (_case_body(asymspec={"k": 0}), "integer >= 1", "asymspec.k"),
    "bad_caption": (_case_body(asymspec={"caption": 3}), "must be a string", "asymspec.caption"),
    "max_tokens_zero": (_case_body(max_tokens=0), "integer >= 1", "max_tokens"),
    "empty_stop": (_case_body(stop=[""]), "must not be empty", "stop"),
    "top_logprobs_range": (_case_body(logprobs=True, top_logprobs=21), "top_logprobs=21 must be", "top_logprobs"),
    "top_logprobs_alone": (_case_body(top_logprobs=2), "needs logprobs=true", "top_logprobs"),
    "bad_tool": (_case_body(tools=[{"type": "function"}]), "tools[0].function is required", "tools[0].function"),
    "tool_choice_unknown_name": (
        _case_body(tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
        "must name one of the offered tools",
        "tool_choice",
    ),
    "tool_choice_without_tools": (_case_body(tool_choice="required"), "no tools are offered", "tool_choice"),
    "response_format_bad": (_case_body(response_format={"type": "yaml"}), "is not text, json_object", "response_format"),
    "assistant_last": (
        _case_body(messages=[user_message("hi", data_url(make_case(9)["image"])), {"role": "assistant", "content": "hello"}]),
        "neither the user's nor a tool's",
        "messages",
    ),
    "no_messages": (_case_body(messages=[]), "non-empty list", "messages"),
    "invalid_json": (_raw('{"messages": [}'), "not valid JSON", None),
    "not_an_object": (_raw("[1, 2]"), "must be a JSON object", None),
    "context_overflow": (_case_body(max_tokens=100000), "context window", "max_tokens"),
    "prompt_overflow": (
        _with_content(_text_part("red " * 6000), _image_part(data_url(make_case(9)["image"]))),
        "context window",
        "messages",
    ),
    "long_logit_bias": (
        _case_body(logit_bias={str(i): 1 for i in range(20)}),
        "logit_bias (an object with 20 keys) is not supported",
        "logit_bias",
    ),
}


_RAW = ("invalid_json", "not_an_object", "nan_beta", "inf_gamma", "temperature_nan", "n_streamed")  # bodies sent as text, not streamed


@pytest.mark.parametrize(
    "name,stream", [(n, False) for n in sorted(BAD_REQUESTS)] + [(n, True) for n in sorted(BAD_REQUESTS) if n not in _RAW]
)
def test_bad_requests_get_400_and_the_server_goes_on(server, name, stream):
    body, fragment, param = BAD_REQUESTS[name]
    if isinstance(body, tuple):
        r = httpx.post(server.url + CHAT, content=body[0].encode(), headers=body[1], timeout=60)
    else:
        r = httpx.post(server.url + CHAT, json={**body, "stream": stream}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert fragment in err["message"] and "\n" not in err["message"], err
    if param is not None:
        assert err["param"] is not None and err["param"].endswith(param) or err["param"] == param, err
    assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", err["code"]), err  # every code snake_case, as OpenAI's
    good_request(server.url)


@pytest.mark.parametrize("name,param", [("context_overflow", "max_tokens"), ("prompt_overflow", "messages")])
def test_a_context_overflow_is_openai_context_length_exceeded_naming_what_to_shorten(server, name, param):
    r = httpx.post(server.url + CHAT, json=BAD_REQUESTS[name][0], timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and (err["code"], err["param"]) == ("context_length_exceeded", param), err


def test_a_long_value_is_named_not_cut_mid_word():
    assert field_value("top_p", 2) == "top_p=2"
    assert field_value("tools", [_TOOL]) == "tools (a list of 1 item)"
    assert (
        field_value("response_format", {"type": "json_schema", "json_schema": {"name": "x" * 80}})
        == "response_format (an object with 2 keys)"
    )
    assert field_value("user", "u" * 100) == "user (a string of 100 characters)"


def test_openai_client_raises_on_refusals(client, server):
    case = make_case(9)
    with pytest.raises(openai.BadRequestError, match="temperature=3 must be"):
        client.chat.completions.create(
            model="tiny", messages=[user_message(case["question"], data_url(case["image"]))], temperature=3, max_tokens=4
        )
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    r = httpx.get(server.url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(server.url + CHAT)
    assert r.status_code == 405 and "error" in r.json()
    good_request(server.url)


def test_api_key(strict):
    case = make_case(10)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        r = httpx.post(strict.url + CHAT, json=body_of(case, max_tokens=2), headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        assert r.headers["www-authenticate"] == "Bearer"
        good_request(strict.url, strict.auth)
    assert httpx.get(strict.url + "/v1/models").status_code == 401
    assert httpx.get(strict.url + "/metrics").status_code == 401
    assert httpx.get(strict.url + "/health").status_code == 200  # liveness stays open
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="sekret", max_retries=0, timeout=300)
    assert client.models.list().data[0].id == strict.state.model
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_body_over_the_limit_gets_413(strict):
    big = body_of(make_case(10), max_tokens=2)
    big["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64," + base64.b64encode(os.urandom(80_000)).decode()
    r = httpx.post(strict.url + CHAT, json=big, headers=strict.auth, timeout=60)
    assert r.status_code == 413 and "--max-request-mb" in r.json()["error"]["message"], r.text
    good_request(strict.url, strict.auth)

    def chunked():  # no Content-Length: counted while read
        payload = json.dumps(big).encode()
        for i in range(0, len(payload), 8192):
            yield payload[i : i + 8192]

    r = httpx.post(strict.url + CHAT, content=chunked(), headers={**strict.auth, "content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    good_request(strict.url, strict.auth)


def test_full_queue_gets_429_with_retry_after(pipe, strict, monkeypatch):
    monkeypatch.setattr(pipe, "eos_ids", set())  # the held rows run to their budget: they cannot finish early
    sched = strict.state.scheduler
    case = make_case(11)
    body = {**body_of(case, max_tokens=2000), "stream": True}
    with httpx.Client(timeout=120, headers=strict.auth) as first, httpx.Client(timeout=120, headers=strict.auth) as second:
        with first.stream("POST", strict.url + CHAT, json=body) as r1:
            assert r1.status_code == 200
            wait_for(lambda: sched.live_rows == 1, what="the first row")
            started = threading.Event()

            def queued() -> None:
                started.set()
                with second.stream("POST", strict.url + CHAT, json=body) as r2:
                    for _ in r2.iter_lines():
                        break

            t = threading.Thread(target=queued, daemon=True)
            t.start()
            wait_for(lambda: sched.waiting == 1, what="the second request to queue")
            r = httpx.post(strict.url + CHAT, json=body_of(case, max_tokens=2), headers=strict.auth, timeout=60)
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
            assert "max_queue=1" in r.json()["error"]["message"]
        # the first client hung up: its row is cancelled and the queued one gets the row, then hangs up too
        t.join(timeout=120)
    wait_for(lambda: sched.live_rows == 0 and sched.waiting == 0, timeout=120, what="both rows to leave")
    monkeypatch.undo()
    good_request(strict.url, strict.auth)


# ---------------------------------------------------------------------------------------------- local images
def test_local_images_only_inside_the_allowed_folder(pipe, strict, image_dir):
    allowed, outside = image_dir
    case = make_case(12)
    case = {**case, "image": make_case(5)["image"]}
    ref = reference(pipe, case, max_new_tokens=4)
    for ref_path in ("sub/chart.png", str(allowed / "sub" / "chart.png"), (allowed / "sub" / "chart.png").as_uri(), "inside_link.png"):
        r = httpx.post(strict.url + CHAT, json=body_of(case, max_tokens=4, url=ref_path), headers=strict.auth, timeout=120)
        assert r.status_code == 200, (ref_path, r.text)
        assert r.json()["choices"][0]["message"]["content"] == ref.text
    refused = {
        "escape.png": "outside the folder",  # a symlink out of the folder
        "../" + outside.name + "/secret.png": "outside the folder",
        str(outside / "secret.png"): "outside the folder",
        "/etc/passwd": "outside the folder",
        "missing.png": "no image file",
        "sub": "no image file",
        "file://otherhost/etc/passwd": "with a host",
    }
    for ref_path, fragment in refused.items():
        r = httpx.post(strict.url + CHAT, json=body_of(case, max_tokens=4, url=ref_path), headers=strict.auth, timeout=60)
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], (ref_path, r.text)
        good_request(strict.url, strict.auth)


# ---------------------------------------------------------------------------------------------- network and CLI
def test_is_loopback_and_the_exposure_warning(capsys):
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.com"))
    warn_if_exposed("127.0.0.1", 8000, None)
    assert capsys.readouterr().err == ""
    warn_if_exposed("0.0.0.0", 8000, None)
    err = capsys.readouterr().err
    assert "WARNING" in err and "NO API key" in err and "--host 127.0.0.1" in err


def test_busy_port_is_a_one_line_error(capsys, tiny_dirs):
    from asymspec_mm.cli.main import main

    held = bind_socket("127.0.0.1", 0)
    port = held.getsockname()[1]
    try:
        with pytest.raises(AsymSpecError, match=f"port {port} .*already in use.*--port"):
            bind_socket("127.0.0.1", port)
        rc = main(["serve", "--drafter", str(tiny_dirs[0]), "--verifier", str(tiny_dirs[1]), "--port", str(port), "--ocr-engine", "none"])
    finally:
        held.close()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"port {port}" in err and "--port" in err, err


def test_cli_options_parse():
    from asymspec_mm.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "serve",
            "--preset",
            "tiny",
            "--port",
            "0",
            "--max-batch-size",
            "4",
            "--api-key",
            "k",
            "--max-queue",
            "3",
            "--max-request-mb",
            "1.5",
            "--max-images",
            "2",
            "--max-kv-bytes",
            "5000000",
            "--max-stall",
            "1.5",
        ]
    )
    assert args.max_images == 2 and args.max_kv_bytes == 5_000_000 and args.max_stall == 1.5
    assert build_parser().parse_args(["serve", "--preset", "tiny"]).max_kv_bytes is None
    assert build_parser().parse_args(["serve", "--preset", "tiny"]).max_stall is None
    assert (args.host, args.port, args.max_batch_size, args.api_key, args.max_queue, args.max_request_mb) == (
        "127.0.0.1",
        0,
        4,
        "k",
        3,
        1.5,
    )
    assert args.allow_local_images is None and args.func.__name__ == "cmd_serve"
    from asymspec_mm.serve import app as serve_app
    from asymspec_mm.serve.cli import DEFAULTS

    assert DEFAULTS == {
        "max_batch_size": serve_app.DEFAULT_MAX_BATCH_SIZE,
        "max_queue": serve_app.DEFAULT_MAX_QUEUE,
        "max_request_mb": serve_app.DEFAULT_MAX_REQUEST_MB,
        "max_images": serve_app.DEFAULT_MAX_IMAGES,
    }
    for bad in (
        ["--max-batch-size", "0"],
        ["--max-request-mb", "nan"],
        ["--max-queue", "x"],
        ["--max-images", "0"],
        ["--max-kv-bytes", "0"],
        ["--max-stall", "0.5"],
        ["--max-stall", "nan"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])


@pytest.mark.timeout(900)  # a bound on a hang (the server's start-up and stop take minutes on a loaded machine)
def test_serve_command_end_to_end(tiny_dirs, pipe):
    """``asymspec-mm serve`` as a subprocess on port 0: it prints its address, answers, and stops on SIGINT."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--drafter", str(tiny_dirs[0]), "--verifier", str(tiny_dirs[1])]
    cmd += ["--ocr-engine", "none", "--port", "0", "--max-batch-size", "4", "--max-stall", "2", "--log-level", "warning"]
    proc, url = start_serve(cmd, ROOT, env)
    try:
        assert url.startswith("http://127.0.0.1:")
        case = make_case(13)
        ref = reference(pipe, case, max_new_tokens=5)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        resp = client.chat.completions.create(
            model="x",
            messages=[user_message(case["question"], data_url(case["image"]))],
            max_tokens=5,
            extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"]}},
        )
        assert resp.choices[0].message.content == ref.text  # the stall bound changes when tokens come, not which
        assert httpx.get(url + "/get_server_info").json()["max_stall"] == 2.0
    finally:
        stop_serve(proc)
    assert proc.returncode in (0, 130)
