"""Issue #49, items 1, 3 and 10: tools on a verifier that cannot take them are refused up front (a ``ToolError`` in
Python, a 400 naming ``tools`` from the server, which the ``openai`` client does not retry), decided from the chat
template alone; and a tool's ``strict`` flag (or any key beyond name, description and parameters) never reaches the
prompt, so the same request reads and answers the same with ``strict`` true, false or absent; and on real forwards
through the server, a call the model ended without ``</tool_call>`` and a bare string argument are read as vLLM's
hermes parser reads them, streamed as whole (the parser's own cases: tests/test_tool_call_streams.py)."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import httpx
import pytest
from conftest import ADD_TOOL as ADD

from asymspec_mm import AsymSpecPipeline
from asymspec_mm.request.tool_support import template_tools_problem
from asymspec_mm.request.tools import ToolError

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "asymspec_mm" / "examples_data"
QUESTION = [{"role": "user", "content": "What is 4 plus 5?"}]


def with_function_keys(tool: dict, **keys) -> dict:
    """``tool`` with extra members in its ``function`` (``strict=True``, ...)."""
    return {**tool, "function": {**tool["function"], **keys}}


@pytest.fixture(scope="module")
def xfamily():
    return AsymSpecPipeline.from_preset("tiny-xfamily", ocr="none")


@pytest.fixture(scope="module")
def agent_example():
    """The demo's first agent example (its image, question, caption, OCR text and the add / subtract tools)."""
    from PIL import Image

    ex = json.loads((EXAMPLES / "agent_examples.json").read_text(encoding="utf-8"))[0]
    return ex, Image.open(EXAMPLES / ex["image"]).convert("RGB")


# ---------------------------------------------------------------------------------------------------------------
# item 1: a verifier that cannot take tools


def test_the_template_decides_whether_a_verifier_takes_tools(xfamily, tiny_pipe, two_vocab_pipe):
    """Qwen's template (the tiny pair's) takes tools; the cross-family preset's raises, another Llama-style template
    silently drops them, and one that asks for another call format is no good either: each one reason."""
    assert template_tools_problem(tiny_pipe.verifier_tokenizer) is None
    assert "cannot render tools (this chat template has no tools block" in template_tools_problem(xfamily.verifier_tokenizer)
    assert "has no tools block (it leaves the tools out" in template_tools_problem(two_vocab_pipe.verifier_tokenizer)
    other = copy.deepcopy(tiny_pipe.verifier_tokenizer)
    other.chat_template = "{{ bos_token }}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{{ messages[-1]['content'] }}"
    assert "a format other than the <tool_call> blocks" in template_tools_problem(other)


def test_pipe_chat_with_tools_on_the_cross_family_pair_is_one_tool_error_before_any_model_work(xfamily, agent_example):
    """``pipe.chat(tools=...)`` raised jinja2's TemplateError after captioning; now one line naming ``tools`` and the
    way out, before the image is captioned (no vision call); ``tool_choice="none"`` keeps the tools out and answers."""
    ex, image = agent_example
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": ex["query"]}]}]
    before = xfamily.models.encoder.thread_counts()
    for choice in (None, "auto", "required", {"type": "function", "function": {"name": "add"}}):
        with pytest.raises(ToolError) as err:
            xfamily.chat(messages, tools=ex["tools"], tool_choice=choice, max_new_tokens=4)
        assert err.value.param == "tools" and "\n" not in str(err.value)
        assert "verifier cannot take tools" in str(err.value) and 'tool_choice "none"' in str(err.value)
    assert xfamily.models.encoder.thread_counts() == before  # refused before the drafter captioned the image
    with xfamily.scheduler(max_batch_size=2) as sched:
        with pytest.raises(ToolError, match="verifier cannot take tools"):
            sched.submit_chat(QUESTION, tools=[ADD], max_new_tokens=4).result()
    res = xfamily.chat(QUESTION, tools=[ADD], tool_choice="none", max_new_tokens=6)
    assert res.token_ids and res.tool_calls is None


def serve_in_thread(pipe):
    """The server ``asymspec-mm serve`` builds (``create_app`` with its defaults) for ``pipe``, in a thread on a free
    loopback port: yields its base URL. The pipeline is this module's own, so no second process loads it again."""
    from asymspec_mm.serve import ServerThread, create_app

    with ServerThread(create_app(pipe)) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def served_xfamily(xfamily):
    """The server of ``--preset tiny-xfamily`` (OCR off): its base URL."""
    yield from serve_in_thread(xfamily)


@pytest.fixture(scope="module")
def served_tiny(shipped_tiny):
    """The server of ``--preset tiny`` (OCR off; the shipped pair :func:`test_strict_and_other_keys_never_reach_the_prompt`
    runs in Python): its base URL."""
    yield from serve_in_thread(shipped_tiny)


def refused(metrics_text: str) -> dict[str, float]:
    """``asymspec_refused_requests_total`` by status from the server's ``/metrics``."""
    return {m[1]: float(m[2]) for m in re.finditer(r'^asymspec_refused_requests_total\{status="(\d+)"\} (\S+)$', metrics_text, re.M)}


def test_the_server_answers_tools_on_the_cross_family_pair_with_one_400(served_xfamily):
    """Chat (streamed and not, every tool_choice that puts tools in the prompt) and Responses (streamed and not):
    each a 400 naming ``tools`` in OpenAI's error shape, sent once by the ``openai`` client (a 500 it retried twice:
    6 calls made 18 failed requests); the server counts exactly 6 refusals, no 500, and goes on answering."""
    client = openai.OpenAI(base_url=served_xfamily + "/v1", api_key="unused", timeout=120)  # the client's default retries
    base = refused(httpx.get(served_xfamily + "/metrics").text)
    calls = [
        lambda: client.chat.completions.create(model="m", messages=QUESTION, tools=[ADD], max_tokens=4),
        lambda: client.chat.completions.create(model="m", messages=QUESTION, tools=[ADD], max_tokens=4, stream=True),
        lambda: client.chat.completions.create(model="m", messages=QUESTION, tools=[ADD], tool_choice="required", max_tokens=4),
        lambda: client.chat.completions.create(
            model="m", messages=QUESTION, tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=4
        ),
        lambda: client.responses.create(model="m", input="What is 4 plus 5?", tools=[{"type": "function", **ADD["function"]}]),
        lambda: client.responses.create(model="m", input="What is 4 plus 5?", tools=[{"type": "function", **ADD["function"]}], stream=True),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        body = err.value.body
        assert err.value.status_code == 400 and body["param"] == "tools" and body["code"] == "unsupported", body
        assert body["type"] == "invalid_request_error" and "verifier cannot take tools" in body["message"] and "\n" not in body["message"]
    now = refused(httpx.get(served_xfamily + "/metrics").text)
    assert now.get("400", 0) - base.get("400", 0) == len(calls) and "500" not in now
    ok = client.chat.completions.create(model="m", messages=QUESTION, tools=[ADD], tool_choice="none", max_tokens=4)
    assert ok.choices[0].message.tool_calls is None and ok.usage.completion_tokens >= 1


# ---------------------------------------------------------------------------------------------------------------
# item 3: strict stays out of the prompt


def test_strict_and_other_keys_never_reach_the_prompt(shipped_tiny, agent_example):
    """The agent example with its tools' ``strict`` true, false or absent, or an unknown key: the same prompt token
    ids on all three streams and the same answer (before, ``strict`` was rendered into the tools block)."""
    ex, image = agent_example
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": ex["query"]}]}]
    variants = {
        "absent": ex["tools"],
        "true": [with_function_keys(t, strict=True) for t in ex["tools"]],
        "false": [with_function_keys(t, strict=False) for t in ex["tools"]],
        "other": [with_function_keys(t, **{"x-note": "internal"}) for t in ex["tools"]],
    }
    results = {
        k: shipped_tiny.chat(messages, tools=tools, caption=ex["caption"], ocr=ex["ocr"], max_new_tokens=40)
        for k, tools in variants.items()
    }
    want = results["absent"]
    prompt = shipped_tiny.verifier_tokenizer.decode(want.prompts.verifier_ids[0])
    assert '"name": "subtract"' in prompt and "strict" not in prompt
    for name, res in results.items():
        for ids in ("verifier_ids", "drafter_comp_ids", "drafter_full_ids"):
            assert getattr(res.prompts, ids).tolist() == getattr(want.prompts, ids).tolist(), (name, ids)
        assert (res.text, res.tool_calls) == (want.text, want.tool_calls), name
    assert [c["function"]["name"] for c in want.tool_calls] == ["subtract"]  # the agent example's call, strict or not


def test_strict_does_not_change_what_the_server_answers(served_tiny, agent_example):
    """Through the server of ``--preset tiny`` with the ``openai`` client (as pydantic-ai sends ``strict: true`` and inspect-ai
    ``strict: false``): the same prompt token count and the same answer as without ``strict`` (before: 367 prompt
    tokens instead of 343, and the text ``</tool_call>`` instead of the call ``subtract {"a": 5, "b": 2}``)."""
    import io

    ex, image = agent_example
    buf = io.BytesIO()
    image.save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": ex["query"]}]}]
    client = openai.OpenAI(base_url=served_tiny + "/v1", api_key="unused", max_retries=0, timeout=300)
    answers = {}
    for name, strict in (("absent", None), ("true", True), ("false", False)):
        tools = ex["tools"] if strict is None else [with_function_keys(t, strict=strict) for t in ex["tools"]]
        resp = client.chat.completions.create(
            model="m", messages=messages, tools=tools, max_tokens=40, extra_body={"asymspec": {"caption": ex["caption"], "ocr": ex["ocr"]}}
        )
        msg = resp.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
        answers[name] = (resp.usage.prompt_tokens, msg.content, calls, resp.choices[0].finish_reason)
    assert answers["true"] == answers["absent"] == answers["false"], answers
    assert answers["absent"][2] and answers["absent"][3] == "tool_calls"


# ---------------------------------------------------------------------------------------------------------------
# item 10 on real forwards: what the model writes, forced by a pattern, read as vLLM's hermes parser reads it

UNCLOSED = '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}'
BARE = '<tool_call>\n{"name": "add", "arguments": "hello"}\n</tool_call>'


def streamed(client, **kwargs) -> tuple[str, list[tuple[str, str]], str]:
    """A streamed chat answer joined: its content, its calls ``(name, arguments)`` (each with an id) and its finish
    reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for c in choice.delta.tool_calls or []:
            got = calls.setdefault(c.index, [c.id, c.function.name, ""])
            got[2] += c.function.arguments or ""
        finish = choice.finish_reason or finish
    assert all(c[0].startswith("call_") for c in calls.values())
    return content, [(name, args) for _, name, args in calls.values()], finish


def test_a_call_the_model_ends_without_its_close_tag_and_a_bare_string_argument(served_tiny):
    """The tiny pair made to write (by a pattern) a whole call object and then its end-of-turn token: a call with
    finish_reason tool_calls, streamed and not (before: content, finish_reason stop); the same text cut by
    ``max_tokens`` right after the object: content, finish_reason length. ``"arguments": "hello"``: a call whose
    arguments are ``"hello"`` (before: no call)."""
    client = openai.OpenAI(base_url=served_tiny + "/v1", api_key="unused", max_retries=0, timeout=300)

    def ask(pattern: str, max_tokens: int = 64) -> dict:
        return dict(
            model="m",
            messages=QUESTION,
            tools=[ADD],
            max_tokens=max_tokens,
            extra_body={"structured_outputs": {"regex": re.escape(pattern)}},
        )

    whole = client.chat.completions.create(**ask(UNCLOSED))
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [("add", '{"a": 4, "b": 5}')]
    assert streamed(client, **ask(UNCLOSED)) == ("", [("add", '{"a": 4, "b": 5}')], "tool_calls")
    budget = whole.usage.completion_tokens - 1  # every token but the end-of-turn one
    cut = client.chat.completions.create(**ask(UNCLOSED, budget))
    assert (cut.choices[0].finish_reason, cut.choices[0].message.content, cut.choices[0].message.tool_calls) == ("length", UNCLOSED, None)
    assert streamed(client, **ask(UNCLOSED, budget)) == (UNCLOSED, [], "length")
    bare = client.chat.completions.create(**ask(BARE))
    calls = [(c.function.name, c.function.arguments) for c in bare.choices[0].message.tool_calls]
    assert calls == [("add", '"hello"')] and bare.choices[0].finish_reason == "tool_calls"
    assert streamed(client, **ask(BARE)) == ("", calls, "tool_calls")
