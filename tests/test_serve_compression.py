"""Per-turn compression through the server (issue #52): ``serve --compression`` as the default, a request's
``asymspec.compression`` replacing it (``false``: none), the verifier's cached tokens per turn with and without
compression (the openai client over HTTP), and each bad setting a 400 naming its field."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import start_serve, stop_serve
from test_compression import agent_messages, common_prefix, message_start

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from asymspec_mm import AsymSpecPipeline  # noqa: E402
from asymspec_mm.request.compression import Compression  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = "truncate,limit=20,keep_last_turns=2"
ROWS = 12  # each tool output about 340 verifier tokens: five turns fit the tiny pair's window


@pytest.fixture(scope="module")
def live():
    """``serve --preset tiny --compression SPEC`` on a free port, and the same preset here for the prompts."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--ocr-engine", "none", "--port", "0"]
    cmd += ["--compression", SPEC, "--log-level", "warning"]
    proc, url = start_serve(cmd, ROOT, env)
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none"), AsymSpecPipeline.from_preset("tiny", ocr="none")
    finally:
        stop_serve(proc)


def wire(messages: list[dict]) -> list[dict]:
    """The messages as an OpenAI client sends them (tool call arguments as JSON strings)."""
    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def verifier_ids(pipe, messages, compression) -> list[int]:
    session = pipe.prepare_chat(messages, compression=compression, max_new_tokens=2, prefill=False)
    return session.prompts.verifier_ids[0].tolist()


def test_cached_tokens_per_turn_with_and_without_compression(live):
    client, pipe = live
    tok = pipe.verifier_tokenizer
    comp = Compression.of(SPEC)
    last_prompt = {}
    for name, asymspec, setting in (("none", {"compression": False}, None), ("truncate", {}, comp)):
        cached, prompt = [], []
        for steps in range(1, 6):
            r = client.chat.completions.create(
                model="tiny", messages=wire(agent_messages(steps, ROWS)), max_tokens=2, temperature=0, extra_body={"asymspec": asymspec}
            )
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            prompt.append(r.usage.prompt_tokens)
            view = r.model_extra["asymspec"]["view"]
            # each compressed message as the verifier read it: all but the last two, under the server's default only
            assert [m["index"] for m in view.get("messages", [])] == (list(range(2 * steps)) if setting else [])
        print(f"compression={name}: prompt_tokens per turn {prompt}, cached_tokens per turn {cached}")
        for i, steps in enumerate(range(1, 6)):
            v = verifier_ids(pipe, agent_messages(steps, ROWS), setting)
            assert prompt[i] == len(v)  # the server's verifier read exactly the prompt the library renders
            if i == 0:
                continue
            before = verifier_ids(pipe, agent_messages(steps - 1, ROWS), setting)
            if setting is None:  # each turn extends the last: all of it is reused but its generation prompt
                assert cached[i] >= message_start(before, tok, len(agent_messages(steps - 1)))
            else:  # reused up to the message that has just aged out, and not past where the prompts part
                assert message_start(before, tok, len(agent_messages(steps - 1)) - 2) <= cached[i] <= common_prefix(before, v)
        last_prompt[name] = prompt[-1]
    assert last_prompt["truncate"] < last_prompt["none"] / 2  # the compressed conversation is less than half as long


@pytest.mark.parametrize(
    ("compression", "param", "words"),
    [
        ({"method": "gzip"}, "asymspec.compression.method", "is not a compressor"),
        ({"method": "truncate", "rate": 1.5}, "asymspec.compression.rate", "(0, 1]"),
        ({"method": "truncate", "rate": 0}, "asymspec.compression.rate", "(0, 1]"),
        ({"method": "truncate", "keep_last_turns": -1}, "asymspec.compression.keep_last_turns", ">= 0"),
        ({"method": "llmlingua2", "rate": 0.3}, "asymspec.compression.model", "huggingface-cli download microsoft/llmlingua-2"),
        ("gzip", "asymspec.compression.method", "is not a compressor"),
        (3, "asymspec.compression", "a compressor's name"),
        ({"method": ["truncate"]}, "asymspec.compression.method", "is not a compressor"),
        ({"method": "summary", "summarizer": "abc"}, "asymspec.compression.summarizer", "or a callable text -> summary"),
    ],
)
def test_a_bad_setting_is_a_400_naming_its_field(live, compression, param, words):
    client, _ = live
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=wire(agent_messages(1, ROWS)), max_tokens=2, extra_body={"asymspec": {"compression": compression}}
        )
    body = err.value.body
    assert body["param"] == param and words in body["message"] and "\n" not in body["message"]
    # and the server keeps serving
    assert client.chat.completions.create(model="tiny", messages=wire(agent_messages(1, ROWS)), max_tokens=1).choices[0].message is not None


def test_a_bad_server_default_fails_before_the_models_load():
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0", "--compression", "truncate,rate=2"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--compression.rate=2 must be a number in (0, 1]" in out.stderr
    assert "loading the models" not in out.stderr
