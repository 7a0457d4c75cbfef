"""``POST /v1/completions`` (issue #43) and vLLM's ``structured_outputs`` on a live server (the tiny random pair,
uvicorn on a free loopback port), through the ``openai`` client: a text prompt is answered exactly as ``pipe.chat``
answers one user message with that text and no image (greedy and seeded sampling, ``n`` choices, stop strings),
streamed chunks join to the same text, ``logprobs`` equal chat completions' for the same question, and every body
validates against the pinned ``CreateCompletionResponse``; ``structured_outputs`` constrains the answer on both
endpoints (a choice, a regex, a JSON schema), and vLLM's older ``guided_*`` fields are refused pointing at it."""

from __future__ import annotations

import json
import re

import pytest
from openai_contract import assert_conforms

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from asymspec_mm import AsymSpecConfig
from asymspec_mm.serve.completions import DEFAULT_COMPLETION_TOKENS
from asymspec_mm.serve.sampling_fields import choice_seed

PROMPT = "Which bar is the tallest?"


def as_chat(pipe, prompt: str = PROMPT, **cfg):
    """The reference: ``pipe.chat`` of one user message holding the prompt."""
    return pipe.chat([{"role": "user", "content": prompt}], config=AsymSpecConfig(**cfg))


@pytest.mark.parametrize(
    "fields,cfg",
    [
        ({"max_tokens": 6}, {"max_new_tokens": 6}),
        ({}, {"max_new_tokens": DEFAULT_COMPLETION_TOKENS}),  # OpenAI's default budget
        (
            {"max_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 11},
            {"max_new_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 11},
        ),
    ],
    ids=["greedy", "default_budget", "sampled"],
)
def test_a_completion_is_pipe_chat_of_the_prompt(client, tiny_pipe, fields, cfg):
    want = as_chat(tiny_pipe, **cfg)
    raw = client.completions.with_raw_response.create(model="tiny", prompt=PROMPT, **fields)
    body = json.loads(raw.text)
    assert_conforms("CreateCompletionResponse", body)
    resp = raw.parse()
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].text == want.text and resp.choices[0].finish_reason == ("length" if want.finish_reason == "length" else "stop")
    assert resp.usage.prompt_tokens == want.prompts.verifier_ids.shape[1] and resp.usage.completion_tokens == len(want.token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_a_list_of_one_prompt_and_n_choices(client, tiny_pipe):
    resp = client.completions.create(model="tiny", prompt=[PROMPT], max_tokens=5, n=2, temperature=0.8, seed=5)
    want = [as_chat(tiny_pipe, max_new_tokens=5, temperature=0.8, seed=choice_seed(5, i)) for i in range(2)]
    assert [c.index for c in resp.choices] == [0, 1] and [c.text for c in resp.choices] == [w.text for w in want]
    assert resp.usage.completion_tokens == sum(len(w.token_ids) for w in want)


def test_streamed_chunks_join_to_the_answer(client, tiny_pipe):
    want = as_chat(tiny_pipe, max_new_tokens=7, stop_strings=("zz",))
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=7, stop="zz", stream=True, stream_options={"include_usage": True})
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == want.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_logprobs_are_chat_completions_logprobs(client):
    """``logprobs: 2`` gives each token's log-probability and its two most likely alternatives, the same numbers chat
    completions reports for the same question; ``text_offset`` points at each token in the text."""
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, logprobs=2)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=6, logprobs=True, top_logprobs=2
    )
    lp, ref = resp.choices[0].logprobs, chat.choices[0].logprobs.content
    assert lp.tokens == [e.token for e in ref] and lp.token_logprobs == pytest.approx([e.logprob for e in ref])
    assert [sorted(d) for d in lp.top_logprobs] == [sorted(t.token for t in e.top_logprobs) for e in ref]
    text = resp.choices[0].text
    assert all(text[off:].startswith(tok) for off, tok in zip(lp.text_offset, lp.tokens) if tok in text)
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, logprobs=2, stream=True))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in streamed if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"echo": True}, "echo"),
        ({"suffix": "!"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "  "}, "prompt"),
        ({"logprobs": 6}, "logprobs"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"prompt": "red " * 6000}, "prompt"),
    ],
    ids=["echo", "suffix", "best_of", "token_ids", "two_prompts", "empty", "logprobs", "budget_over_window", "prompt_over_window"],
)
def test_a_bad_field_is_a_400_naming_it(client, fields, param):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**body)
    assert info.value.body["param"] == param and "\n" not in info.value.body["message"], info.value.body
    assert client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices[0].text is not None


# ---------------------------------------------------------------------------------------------- structured_outputs
SCHEMA = {
    "type": "object",
    "properties": {"bar": {"type": "string", "enum": ["left", "right"]}},
    "required": ["bar"],
    "additionalProperties": False,
}
KINDS = {
    "choice": ({"choice": ["left", "right", "middle"]}, lambda text: text in ("left", "right", "middle")),
    "regex": ({"regex": "[0-9]{2,3}"}, lambda text: re.fullmatch("[0-9]{2,3}", text) is not None),
    "json": ({"json": SCHEMA}, lambda text: json.loads(text)["bar"] in ("left", "right")),
    "json_text": ({"json": json.dumps(SCHEMA)}, lambda text: json.loads(text)["bar"] in ("left", "right")),
}


@pytest.mark.parametrize("kind", KINDS)
def test_structured_outputs_constrain_both_endpoints(client, tiny_pipe, kind):
    pytest.importorskip("xgrammar")
    so, ok = KINDS[kind]
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=40, extra_body={"structured_outputs": so}
    )
    text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, extra_body={"structured_outputs": so}).choices[0].text
    assert ok(chat.choices[0].message.content) and ok(text), (chat.choices[0].message.content, text)
    assert text == chat.choices[0].message.content  # the same question, the same constrained answer
    engine_kind = "json_schema" if kind.startswith("json") else kind
    fmt = (
        {"type": engine_kind, kind: so[kind]}
        if engine_kind != "json_schema"
        else {"type": "json_schema", "json_schema": {"name": "structured_outputs", "schema": SCHEMA}}
    )
    assert text == tiny_pipe.chat([{"role": "user", "content": PROMPT}], response_format=fmt, config=AsymSpecConfig(max_new_tokens=40)).text


@pytest.mark.parametrize(
    "extra,param,fragment",
    [
        (
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "structured_outputs",
            "exactly one of json, regex, choice or grammar, not 2",
        ),
        ({"structured_outputs": {}}, "structured_outputs", "not 0"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "not valid JSON"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least 1"),
        ({"structured_outputs": {"grammar": "root ::= nothing_defined"}}, "structured_outputs.grammar", "grammar"),
        ({"guided_json": SCHEMA}, "guided_json", 'send structured_outputs={"json": ...}'),
        ({"guided_choice": ["a"]}, "guided_choice", 'send structured_outputs={"choice": [...]}'),
        ({"guided_regex": "a+"}, "guided_regex", "structured_outputs"),
        ({"guided_grammar": "root ::= 'a'"}, "guided_grammar", "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs", "not both"),
    ],
)
def test_structured_outputs_refusals_name_the_field(client, extra, param, fragment):
    pytest.importorskip("xgrammar")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=2, extra_body=extra)
    assert info.value.body["param"] == param and fragment in info.value.body["message"], info.value.body
