"""Real SDK clients against a live server (issue #43; the tiny random pair, uvicorn on a free loopback port):
langchain-openai's ``ChatOpenAI`` in chat-completions mode (``use_responses_api=False``) and litellm on the three
endpoints. The ``openai`` client, openai-agents and langchain-openai's Responses mode are in test_responses_api.py.

Each answer is checked against an independent one: ``pipe.chat`` of the same conversation for langchain-openai, the
``openai`` client's answer to the same request for litellm (greedy, so equal). litellm stays offline: its bundled
cost map, its offline mode, and an audit hook that records every name looked up or address connected to while it
runs, which must all be loopback."""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import socket
import sys
from typing import Literal

import pytest
from conftest import make_image

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
from pydantic import BaseModel

from asymspec_mm import AsymSpecConfig

TIMEOUT = 60  # seconds per request: a tiny answer takes a few; a client that hangs fails instead of stalling the suite
QUESTION = "Which bar is the tallest?"
VIEW = {"caption": "a bar chart with two bars", "ocr": False}  # the compressed view given: no captioning, no OCR
EXTRA = {"asymspec": VIEW}
#: A tool whose grammar-constrained call ends in a few tokens (an enum argument), in the chat completions shape.
PICK = {
    "type": "function",
    "function": {
        "name": "pick_bar",
        "description": "Look up the value of one bar.",
        "parameters": {
            "type": "object",
            "properties": {"bar": {"type": "string", "enum": ["left", "right"]}},
            "required": ["bar"],
            "additionalProperties": False,
        },
    },
}
FORCED = {"type": "function", "function": {"name": "pick_bar"}}
CALL_BUDGET = 120  # the call's JSON, a few dozen tokens of the tiny tokenizer, fits


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def with_image(text: str, seed: int = 71) -> tuple[list[dict], list[dict]]:
    """``(openai_messages, pipe_messages)``: one user message holding ``text`` and image ``seed``, in the chat
    completions shape (a data URL) and in ``pipe.chat``'s (the PIL image)."""
    img = make_image(seed)
    wire = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(img)}}]}]
    local = [{"role": "user", "content": [text, {"type": "image", "image": img}]}]
    return wire, local


@pytest.fixture(scope="module")
def client_timeout():
    return TIMEOUT


# ---------------------------------------------------------------------------------------------- langchain-openai
@pytest.fixture(scope="module")
def chat_model(server):
    """A factory of langchain-openai ``ChatOpenAI`` in chat-completions mode on the server (greedy, no retries)."""
    lco = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed: pip install -e '.[dev]'")

    def make(**fields):
        return lco.ChatOpenAI(
            model="tiny",
            base_url=server.url + "/v1",
            api_key="unused",
            use_responses_api=False,
            temperature=0,
            max_retries=0,
            timeout=TIMEOUT,
            **fields,
        )

    return make


def test_langchain_chat_completions_text_answer_and_stream_are_pipe_chats(chat_model, tiny_pipe):
    """A text-only question: ``invoke`` answers as ``pipe.chat`` (text, finish reason, token counts) and the
    ``stream`` chunks join to that answer."""
    from langchain_core.messages import HumanMessage

    llm = chat_model(max_tokens=8)
    want = tiny_pipe.chat([{"role": "user", "content": QUESTION}], config=AsymSpecConfig(max_new_tokens=8))
    got = llm.invoke([HumanMessage(QUESTION)])
    assert got.text == want.text and got.response_metadata["finish_reason"] == want.finish_reason
    assert got.usage_metadata["input_tokens"] == want.prompts.verifier_ids.shape[1]
    assert got.usage_metadata["output_tokens"] == len(want.token_ids)
    chunks = list(llm.stream([HumanMessage(QUESTION)]))
    assert len(chunks) > 2 and "".join(c.text for c in chunks) == want.text


def test_langchain_chat_completions_image_in_the_input(chat_model, tiny_pipe):
    """A HumanMessage with a text block and a data-URL image block (the view given through ``extra_body``): the
    answer is ``pipe.chat`` of the same message with the image."""
    from langchain_core.messages import HumanMessage

    wire, local = with_image(QUESTION)
    want = tiny_pipe.chat(local, config=AsymSpecConfig(max_new_tokens=8), **VIEW)
    got = chat_model(max_tokens=8, extra_body=EXTRA).invoke([HumanMessage(content=wire[0]["content"])])
    assert got.text == want.text and got.usage_metadata["input_tokens"] == want.prompts.verifier_ids.shape[1]
    assert want.stats["images"] == 1


def test_langchain_chat_completions_forced_tool_call_then_tool_message(chat_model, tiny_pipe):
    """``bind_tools(..., tool_choice=name)`` gives the call ``pipe.chat`` makes under the same forced choice; its
    result sent back as a ToolMessage, the final answer (tool choice none) is ``pipe.chat``'s of that conversation."""
    from langchain_core.messages import HumanMessage, ToolMessage

    wire, local = with_image("Which bar is taller?")
    question = HumanMessage(content=wire[0]["content"])
    llm = chat_model(max_tokens=CALL_BUDGET, extra_body=EXTRA)
    called = llm.bind_tools([PICK], tool_choice="pick_bar").invoke([question])
    want = tiny_pipe.chat(local, tools=[PICK], tool_choice=FORCED, config=AsymSpecConfig(max_new_tokens=CALL_BUDGET), **VIEW)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in want.tool_calls
    ]
    assert called.tool_calls[0]["args"]["bar"] in ("left", "right") and called.response_metadata["finish_reason"] == "tool_calls"
    call = called.tool_calls[0]
    result = ToolMessage("The left bar is 7.", tool_call_id=call["id"])
    answer = chat_model(max_tokens=8, extra_body=EXTRA).bind_tools([PICK], tool_choice="none").invoke([question, called, result])
    wire_call = {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["args"])}}
    follow = [
        *local,
        {"role": "assistant", "content": None, "tool_calls": [wire_call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "The left bar is 7."},
    ]
    final = tiny_pipe.chat(follow, tools=[PICK], tool_choice="none", config=AsymSpecConfig(max_new_tokens=8), **VIEW)
    assert not answer.tool_calls and answer.text == final.text and answer.text


def test_langchain_structured_output_pydantic_v1_by_function_calling(chat_model, tiny_pipe):
    """LangChain's standard ``test_structured_output_pydantic_2_v1``: a ``pydantic.v1`` model (bounded strings, so
    the tiny pair's constrained call ends within the budget) through ``with_structured_output``: ``invoke`` gives an
    instance holding ``pipe.chat``'s forced call of the model's tool, every ``stream`` chunk is an instance, the last
    the invoked one; the model's JSON schema gives a dict."""
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic.v1 import BaseModel as BaseModelV1
    from pydantic.v1 import Field as FieldV1

    class Joke(BaseModelV1):
        """Joke to tell user."""

        setup: str = FieldV1(description="question to set up a joke", max_length=12)
        punchline: str = FieldV1(description="answer to resolve the joke", max_length=12)

    ask = "Tell me a joke about cats."
    llm = chat_model(max_tokens=CALL_BUDGET)
    chat = llm.with_structured_output(Joke, method="function_calling")
    joke = chat.invoke(ask)
    tool = convert_to_openai_tool(Joke)  # what langchain sends: the class's schema without its titles
    forced = {"type": "function", "function": {"name": "Joke"}}
    want = tiny_pipe.chat(
        [{"role": "user", "content": ask}], tools=[tool], tool_choice=forced, config=AsymSpecConfig(max_new_tokens=CALL_BUDGET)
    )
    assert isinstance(joke, Joke) and joke.dict() == json.loads(want.tool_calls[0]["function"]["arguments"])
    chunks = list(chat.stream(ask))
    assert chunks and all(isinstance(c, Joke) for c in chunks) and chunks[-1] == joke
    as_dict = llm.with_structured_output(Joke.schema(), method="function_calling").invoke(ask)
    assert isinstance(as_dict, dict) and Joke.parse_obj(as_dict).dict() == as_dict  # (its titles kept: another prompt)


def test_langchain_structured_output_json_schema_is_pipe_chats(chat_model, tiny_pipe):
    """``with_structured_output(model, method="json_schema")``: OpenAI's ``response_format`` json_schema; the raw
    answer is ``pipe.chat``'s under the same schema and parses to a validated instance."""

    class Answer(BaseModel):
        taller: Literal["left", "right"]

    out = chat_model(max_tokens=40).with_structured_output(Answer, method="json_schema", include_raw=True).invoke(QUESTION)
    fmt = {"type": "json_schema", "json_schema": {"name": "Answer", "schema": Answer.model_json_schema()}}
    want = tiny_pipe.chat([{"role": "user", "content": QUESTION}], response_format=fmt, config=AsymSpecConfig(max_new_tokens=40))
    assert out["parsing_error"] is None and isinstance(out["parsed"], Answer)
    assert out["raw"].text == want.text and Answer.model_validate_json(want.text) == out["parsed"]


# ---------------------------------------------------------------------------------------------- litellm
#: litellm's switches for no network: the cost map bundled with the package instead of GitHub's, and its offline
#: mode (no catalog, beta-header list or tokenizer fetched on its own).
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true"}
REMOTE: list[tuple[str, object]] = []  # (event, host) of each look-up or connection off loopback while watched
_watch = [False]
_hooked: list[bool] = []


def _is_loopback(host: str | bytes) -> bool:
    host = host.decode() if isinstance(host, bytes) else host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _note_remote(event: str, args: tuple) -> None:
    """Audit hook (process-wide, cheap when not watching): records look-ups and connections off loopback."""
    if not _watch[0] or event not in ("socket.getaddrinfo", "socket.connect"):
        return
    if event == "socket.connect" and args[0].family == socket.AF_UNIX:
        return  # a local socket file, not the network
    host = args[0] if event == "socket.getaddrinfo" else args[1][0]  # connect's address: (host, port[, flow, scope])
    if isinstance(host, str | bytes) and not _is_loopback(host):
        REMOTE.append((event, host))


@pytest.fixture(scope="module")
def litellm():
    """litellm imported offline (see OFFLINE_ENV) with no logging callbacks, watched for network use."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in OFFLINE_ENV.items():
            mp.setenv(name, value)
        if not _hooked:  # once per process (an audit hook cannot be removed); idle while _watch is off
            sys.addaudithook(_note_remote)
            _hooked.append(True)
        _watch[0] = True
        try:
            lib = pytest.importorskip("litellm", reason="litellm is not installed: pip install -e '.[dev]'")
            lib.suppress_debug_info = True  # no "give feedback" banner on errors
            lib.disable_hf_tokenizer_download = True
            # an unknown model's responses(stream=True) is faked by litellm (one non-streamed request replayed as
            # events, always ending in response.completed); registered as streaming, it streams for real
            lib.register_model({"openai/tiny": {"litellm_provider": "openai", "mode": "chat", "supports_native_streaming": True}})
            for name in ("callbacks", "success_callback", "failure_callback", "_async_success_callback", "_async_failure_callback"):
                setattr(lib, name, [])
            yield lib
        finally:
            _watch[0] = False


@pytest.fixture
def offline(litellm):
    """litellm for one test, which fails if litellm looked up or connected to anything but loopback so far (its
    import included)."""
    yield litellm
    assert REMOTE == [], f"litellm tried the network: {REMOTE}"


def lite(server) -> dict:
    """litellm's arguments for this server: its OpenAI-compatible provider, no retries, a short timeout."""
    return {"model": "openai/tiny", "api_base": server.url + "/v1", "api_key": "unused", "timeout": TIMEOUT, "num_retries": 0}


def test_litellm_completion_streamed_and_not_is_the_openai_clients(offline, server, client):
    """``litellm.completion`` on a message with an image: content, finish reason and usage equal the ``openai``
    client's; streamed (usage included), the chunks rebuild (``stream_chunk_builder``) the same message."""
    wire, _ = with_image(QUESTION)
    want = client.chat.completions.create(model="tiny", messages=wire, max_tokens=8, extra_body=EXTRA)
    got = offline.completion(messages=wire, max_tokens=8, extra_body=EXTRA, **lite(server))
    usage = (want.usage.prompt_tokens, want.usage.completion_tokens)
    assert got.choices[0].message.content == want.choices[0].message.content and want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason and (got.usage.prompt_tokens, got.usage.completion_tokens) == usage
    chunks = list(
        offline.completion(
            messages=wire, max_tokens=8, extra_body=EXTRA, stream=True, stream_options={"include_usage": True}, **lite(server)
        )
    )
    assert len(chunks) > 2
    rebuilt = offline.stream_chunk_builder(chunks, messages=wire)
    assert rebuilt.choices[0].message.content == want.choices[0].message.content
    assert rebuilt.choices[0].finish_reason == want.choices[0].finish_reason
    assert (rebuilt.usage.prompt_tokens, rebuilt.usage.completion_tokens) == usage


def test_litellm_forced_tool_call_streamed_and_not_is_the_openai_clients(offline, server, client):
    """A named tool_choice through ``litellm.completion``: the same call (name, arguments) as the ``openai``
    client's, finish reason tool_calls; streamed, the deltas rebuild the same call."""
    wire, _ = with_image("Which bar is taller?")
    ask = {"messages": wire, "tools": [PICK], "tool_choice": FORCED, "max_tokens": CALL_BUDGET, "extra_body": EXTRA}
    want = client.chat.completions.create(model="tiny", **ask).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in want.message.tool_calls]
    assert want.finish_reason == "tool_calls" and calls[0][0] == "pick_bar"
    got = offline.completion(**ask, **lite(server)).choices[0]
    assert got.finish_reason == "tool_calls" and [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == calls
    rebuilt = offline.stream_chunk_builder(list(offline.completion(**ask, stream=True, **lite(server))), messages=wire).choices[0]
    assert [(c.function.name, c.function.arguments) for c in rebuilt.message.tool_calls] == calls
    assert all(c.id for c in rebuilt.message.tool_calls)


def test_litellm_responses_is_the_openai_clients(offline, server, client):
    """``litellm.responses`` (its Responses API client, here posting to the given api_base's /responses): the
    output text, status and usage equal ``client.responses.create``'s; streamed, the text deltas join to it.
    litellm raises a budget under 16 to 16 (OpenAI's minimum), so 16 is asked of both."""
    ask = {"input": QUESTION, "max_output_tokens": 16}
    want = client.responses.create(model="tiny", **ask)
    got = offline.responses(**ask, **lite(server))
    assert got.output_text == want.output_text and want.output_text and got.status == want.status
    assert (got.usage.input_tokens, got.usage.output_tokens) == (want.usage.input_tokens, want.usage.output_tokens)
    events = list(offline.responses(**ask, stream=True, **lite(server)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.output_text
    assert events[-1].type == f"response.{want.status}" and events[-1].response.usage.output_tokens == want.usage.output_tokens


def test_litellm_text_completion_is_the_openai_clients(offline, server, client):
    """``litellm.text_completion`` against /v1/completions: text, finish reason and usage equal the ``openai``
    client's ``completions.create``."""
    want = client.completions.create(model="tiny", prompt=QUESTION, max_tokens=8)
    got = offline.text_completion(prompt=QUESTION, max_tokens=8, **lite(server))
    assert got.choices[0].text == want.choices[0].text and want.choices[0].text
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens, want.usage.completion_tokens)
