"""Sampling through the server, with the official ``openai`` client: temperature / top_p / top_k / seed reproduce
``pipe.chat`` with the same settings, ``n`` gives independent choices with derived seeds, and
``--generation-config model`` applies the verifier's own sampling defaults to requests without temperature."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import make_case
from test_serve import CHAT, data_url, metrics_of, user_message, wait_for

from asymspec_mm.serve import ServerThread, create_app
from asymspec_mm.serve.sampling_fields import choice_seed, model_sampling_defaults

SAMPLED = dict(temperature=0.7, top_p=0.8, seed=1)


@pytest.fixture(scope="module")
def server_options():
    return {"max_batch_size": 8}


def chat_args(case):
    return dict(
        model="tiny",
        messages=[user_message(case["question"], data_url(case["image"]))],
        max_tokens=12,
        extra_body={"asymspec": {"caption": case["caption"], "ocr": case["ocr"]}},
    )


def reference(pipe, case, method="asymspec", **settings):
    messages = [{"role": "user", "content": [{"type": "image", "image": case["image"]}, {"type": "text", "text": case["question"]}]}]
    return pipe.chat(messages, caption=case["caption"], ocr=case["ocr"], max_new_tokens=12, method=method, **settings)


def test_a_seeded_request_repeats_and_equals_pipe_chat(tiny_pipe, client):
    case = make_case(31)
    first = client.chat.completions.create(**chat_args(case), **SAMPLED)
    again = client.chat.completions.create(**chat_args(case), **SAMPLED)
    assert first.choices[0].message.content == again.choices[0].message.content
    ref = reference(tiny_pipe, case, **SAMPLED)
    assert first.choices[0].message.content == ref.text
    info = first.model_extra["asymspec"]
    assert info["config"]["temperature"] == 0.7 and info["config"]["top_p"] == 0.8 and info["stats"]["seed"] == 1


def test_top_k_is_an_extension_field(tiny_pipe, client):
    case = make_case(32)
    args = chat_args(case)
    args["extra_body"]["top_k"] = 3
    resp = client.chat.completions.create(**args, temperature=1.2, seed=8)
    assert resp.choices[0].message.content == reference(tiny_pipe, case, temperature=1.2, seed=8, top_k=3).text
    assert resp.model_extra["asymspec"]["config"]["top_k"] == 3


def test_n_choices_have_derived_seeds(tiny_pipe, client):
    case = make_case(33)
    resp = client.chat.completions.create(**chat_args(case), n=3, temperature=1.3, seed=5)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    texts = [c.message.content for c in resp.choices]
    for i, text in enumerate(texts):
        assert text == reference(tiny_pipe, case, temperature=1.3, seed=choice_seed(5, i)).text
    assert (
        resp.choices[0].message.content
        == client.chat.completions.create(**chat_args(case), temperature=1.3, seed=5).choices[0].message.content
    )
    seeds = [c["stats"]["seed"] for c in resp.model_extra["asymspec"]["choices"]]
    assert seeds == [choice_seed(5, i) for i in range(3)] and len(set(seeds)) == 3
    assert resp.usage.completion_tokens == sum(c["stats"]["new_tokens"] for c in resp.model_extra["asymspec"]["choices"])


def test_streamed_choices_equal_the_answered_ones(client):
    """stream=true with n=3: each chunk names its choice; each choice's pieces join into the non-streamed answer's
    choice (same seed), with its finish reason and stats, and usage counts every choice's tokens once at the end."""
    case = make_case(36)
    whole = client.chat.completions.create(**chat_args(case), n=3, temperature=1.3, seed=7)
    stream = client.chat.completions.create(
        **chat_args(case), n=3, temperature=1.3, seed=7, stream=True, stream_options={"include_usage": True}
    )
    texts, roles, finish, seeds, usage = ["", "", ""], [None] * 3, [None] * 3, [None] * 3, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        (c,) = chunk.choices
        assert finish[c.index] is None  # nothing of a choice after its finish chunk
        roles[c.index] = roles[c.index] or c.delta.role
        texts[c.index] += c.delta.content or ""
        if c.finish_reason is not None:
            finish[c.index] = c.finish_reason
            seeds[c.index] = chunk.model_extra["asymspec"]["stats"]["seed"]
    assert roles == ["assistant"] * 3
    assert texts == [c.message.content for c in whole.choices] and len(set(texts)) > 1
    assert finish == [c.finish_reason for c in whole.choices]
    assert seeds == [choice_seed(7, i) for i in range(3)]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_a_streamed_request_that_hangs_up_cancels_every_choice(tiny_pipe, server, monkeypatch):
    """n=2, streamed, no EOS and a 2,000-token budget: once both choices have sent text the client hangs up, and
    both rows leave as cancelled."""
    monkeypatch.setattr(tiny_pipe, "eos_ids", set())
    sched, case = server.state.scheduler, make_case(37)
    cancelled = lambda: metrics_of(server.url)['asymspec_requests_total{outcome="cancelled"}']  # noqa: E731
    before = cancelled()
    body = {**chat_args(case), "max_tokens": 2000, "n": 2, "temperature": 1.0, "stream": True}
    body["asymspec"] = body.pop("extra_body")["asymspec"]
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=120) as r:
        assert r.status_code == 200
        lines, talking = r.iter_lines(), set()  # the iterator held: dropping it would hang up at once
        for line in lines:
            choices = json.loads(line[6:])["choices"] if line.startswith("data: {") else []
            talking |= {c["index"] for c in choices if c["delta"].get("content")}
            if talking == {0, 1}:
                break
        assert sched.live_rows == 2
    wait_for(lambda: sched.live_rows == 0 and sched.waiting == 0, what="both rows to leave")
    wait_for(lambda: cancelled() == before + 2, what="both cancellations")


def test_unseeded_choices_report_their_seeds(tiny_pipe, client):
    case = make_case(34)
    resp = client.chat.completions.create(**chat_args(case), n=2, temperature=1.0)
    seeds = [c["stats"]["seed"] for c in resp.model_extra["asymspec"]["choices"]]
    assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    again = reference(tiny_pipe, case, temperature=1.0, seed=seeds[1])
    assert again.text == resp.choices[1].message.content


def test_bad_sampling_fields_get_400_and_the_server_keeps_serving(server):
    case = make_case(35)
    body = {
        "model": "tiny",
        "messages": [user_message(case["question"], data_url(case["image"]))],
        "max_tokens": 3,
        "asymspec": {"caption": case["caption"], "ocr": case["ocr"]},
    }
    for field, value in (("temperature", 3), ("top_p", 1.5), ("seed", "x"), ("n", 9)):
        r = httpx.post(server.url + CHAT, json={**body, field: value}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = httpx.post(server.url + CHAT, json={**body, "temperature": 0.7, "top_p": 0.8, "seed": 1}, timeout=60)
    assert r.status_code == 200, r.text


def test_model_sampling_defaults_of_the_real_qwen_files():
    from transformers import GenerationConfig

    from asymspec_mm.checkpoints.qwen_files import DATA_DIR as QWEN_DATA

    qwen3 = model_sampling_defaults(GenerationConfig.from_pretrained(QWEN_DATA / "qwen3"))
    assert qwen3 == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    vl = model_sampling_defaults(GenerationConfig.from_pretrained(QWEN_DATA / "qwen3-vl-2b"))
    assert vl == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    assert model_sampling_defaults(GenerationConfig(do_sample=False, temperature=0.3)) == {}


def test_generation_config_model_samples_requests_without_temperature(standin_pipe):
    """The stand-in verifier carries Qwen3-32B's real generation_config.json: a request without temperature is
    sampled with its defaults; one that sends temperature 0 stays greedy."""
    case = make_case(36)
    app = create_app(standin_pipe, max_batch_size=2, generation_config="model")
    body = {
        "model": "x",
        "messages": [user_message(case["question"], data_url(case["image"]))],
        "max_tokens": 3,
        "asymspec": {"caption": case["caption"], "ocr": False},
    }
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + CHAT, json=body, timeout=120)
        assert r.status_code == 200, r.text
        cfg = r.json()["asymspec"]["config"]
        assert (cfg["temperature"], cfg["top_p"], cfg["top_k"]) == (0.6, 0.95, 20)
        assert isinstance(r.json()["asymspec"]["stats"]["seed"], int)
        r = httpx.post(srv.url + CHAT, json={**body, "temperature": 0}, timeout=120)
        assert r.json()["asymspec"]["config"]["temperature"] == 0 and r.json()["asymspec"]["stats"]["seed"] is None
    with pytest.raises(Exception, match="generation_config='auto' is not valid"):
        create_app(standin_pipe, generation_config="auto")


def test_logprobs_are_the_fused_targets_streamed_and_not(tiny_pipe, client):
    """``logprobs``: each emitted token's log-probability under softmax(t + beta * delta) (TokenEvent.p_fused) and its
    top alternatives there; the streamed chunks carry the same entries; the tokens' bytes join to the answer."""
    import math

    case = make_case(37)
    for settings in ({}, SAMPLED, {"extra_body": {"asymspec": {"caption": case["caption"], "ocr": case["ocr"], "method": "floor"}}}):
        args = {**chat_args(case), **settings}
        resp = client.chat.completions.create(**args, logprobs=True, top_logprobs=4)
        method = args["extra_body"]["asymspec"].get("method", "asymspec")
        ref = reference(tiny_pipe, case, method=method, **{k: v for k, v in settings.items() if k != "extra_body"})
        special = set(tiny_pipe.tokenizer.all_special_ids)
        events = [ev for ev in ref.trace if ev.token_id not in special]
        content = resp.choices[0].logprobs.content
        assert [c.token for c in content] == [ev.text for ev in events]
        assert b"".join(bytes(c.bytes) for c in content).decode() == resp.choices[0].message.content
        for c, ev in zip(content, events):
            assert c.logprob == pytest.approx(math.log(ev.p_fused), abs=1e-6)
            assert len(c.top_logprobs) == 4 and [t.logprob for t in c.top_logprobs] == sorted(
                (t.logprob for t in c.top_logprobs), reverse=True
            )
            assert c.top_logprobs[0].logprob >= c.logprob - 1e-6  # the most likely token is listed first
            if method == "floor" and "temperature" not in settings:  # greedy Floor emits the top token itself
                assert c.top_logprobs[0].token == c.token
        stream = client.chat.completions.create(**args, logprobs=True, top_logprobs=4, stream=True)
        streamed = [e for ch in stream if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
        assert [(e.token, round(e.logprob, 6)) for e in streamed] == [(c.token, round(c.logprob, 6)) for c in content]
    plain = client.chat.completions.create(**chat_args(case))
    assert plain.choices[0].logprobs is None
