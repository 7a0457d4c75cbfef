"""``POST /v1/responses`` (issue #43): OpenAI's Responses API on a live server (the tiny random pair, uvicorn on a free
loopback port), through real clients: the ``openai`` package (streamed and not), the openai-agents SDK in its default
mode (the Responses API) and langchain-openai with ``use_responses_api=True``. The tiny pair's words mean nothing: these
tests check the protocol (shapes validated by the ``openai`` package's types, event order, streamed = not streamed, the
conversation each item becomes, the refusals), and forced calls, being grammar-constrained, give valid calls."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Literal

import pytest
from conftest import make_image

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
import httpx
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from asymspec_mm import AsymSpecConfig

VIEW = {"caption": "a bar chart with two bars", "ocr": False}  # the compressed view given: no captioning, no OCR
EXTRA = {"asymspec": VIEW}
#: A tool whose grammar-constrained call ends in a few tokens (an enum argument).
PICK = {
    "type": "function",
    "name": "pick_bar",
    "description": "Look up the value of one bar.",
    "parameters": {
        "type": "object",
        "properties": {"bar": {"type": "string", "enum": ["left", "right"]}},
        "required": ["bar"],
        "additionalProperties": False,
    },
    "strict": True,
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user_input(text: str, seed: int | None = 71) -> list[dict]:
    content = [{"type": "input_text", "text": text}]
    if seed is not None:
        content.append({"type": "input_image", "image_url": data_url(make_image(seed))})
    return [{"role": "user", "content": content}]


def create(client, **body) -> Response:
    """``client.responses.create`` whose raw JSON is validated by the openai package's ``Response`` type."""
    raw = client.responses.with_raw_response.create(model="tiny", extra_body=EXTRA, **body)
    return Response.model_validate(json.loads(raw.text))


def streamed(client, **body) -> list:
    """Every event of a streamed ``client.responses.create``, each validated by the openai package's event types."""
    with client.responses.create(model="tiny", extra_body=EXTRA, stream=True, **body) as stream:
        return [EVENTS.validate_python(ev.model_dump(mode="json", exclude_unset=True)) for ev in stream]


# ---------------------------------------------------------------------------------------------- answers
def test_a_text_answer_with_an_image_is_pipe_chats(client, tiny_pipe):
    """A message with an input_text and a data-URL input_image, and instructions: the answer is ``pipe.chat`` of the
    same conversation; usage counts the verifier's prompt and the new tokens; cut by the budget it is incomplete."""
    img = make_image(71)
    resp = create(client, instructions="Answer briefly.", input=user_input("Which bar is the tallest?"), max_output_tokens=6)
    want = tiny_pipe.chat(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "image", "image": img}, "Which bar is the tallest?"]},
        ],
        config=AsymSpecConfig(max_new_tokens=6),
        **VIEW,
    )
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.instructions == "Answer briefly."
    assert [item.type for item in resp.output] == ["message"] and resp.output_text == want.text
    assert resp.usage.input_tokens == want.prompts.verifier_ids.shape[1] and resp.usage.output_tokens == len(want.token_ids)
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    if want.finish_reason == "length":
        assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    else:
        assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.model_extra["asymspec"]["view"]["caption"] == VIEW["caption"]


def test_a_forced_call_its_output_and_the_final_message(client, tiny_pipe):
    """A named tool_choice gives a function_call; the call and its function_call_output sent back make the chat
    conversation (an assistant message with the call, a tool message) whose answer equals chat completions'."""
    task = user_input("Which bar is taller?")
    first = create(client, input=task, tools=[PICK], tool_choice={"type": "function", "name": "pick_bar"}, max_output_tokens=120)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and calls[0].name == "pick_bar"
    assert json.loads(calls[0].arguments)["bar"] in ("left", "right") and calls[0].call_id.startswith("call_")
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "The left bar is 7."}
    follow = [*task, *[item.model_dump(exclude_none=True) for item in first.output], output]
    final = create(client, input=follow, tools=[PICK], tool_choice="none", max_output_tokens=8)
    assert [item.type for item in final.output] == ["message"] and final.output_text
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Which bar is taller?"},
                    {"type": "image_url", "image_url": {"url": task[0]["content"][1]["image_url"]}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": calls[0].call_id, "type": "function", "function": {"name": "pick_bar", "arguments": calls[0].arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": calls[0].call_id, "content": "The left bar is 7."},
        ],
        tools=[{"type": "function", "function": {k: v for k, v in PICK.items() if k != "type"}}],
        tool_choice="none",
        max_tokens=8,
        extra_body=EXTRA,
    )
    assert final.output_text == chat.choices[0].message.content
    assert final.usage.input_tokens == chat.usage.prompt_tokens


#: Tools whose arguments are not an object (a list, a number, null); each forced call ends in a few tokens.
NOT_OBJECTS = {
    "pick_bars": {"type": "array", "items": {"enum": ["left", "right"]}, "minItems": 1, "maxItems": 2},
    "scale": {"enum": [2, 0.5]},
    "reset": {"type": "null"},
}


def test_arguments_that_are_a_list_a_number_or_null_are_the_json_the_model_wrote(client, tiny_pipe):
    """A forced call to a tool whose parameters are not an object: chat completions and the Responses API carry its
    arguments as the JSON text the model wrote (``pipe.chat``'s answer holds ``"arguments": <it>``; they read as
    no call before), and the call sent back (chat messages; a stored response named by previous_response_id)
    is taken."""
    jsonschema = pytest.importorskip("jsonschema")
    task = user_input("Which bars?")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Which bars?"},
                {"type": "image_url", "image_url": {"url": task[0]["content"][1]["image_url"]}},
            ],
        }
    ]
    image = [{"role": "user", "content": ["Which bars?", {"type": "image", "image": make_image(71)}]}]
    for name, schema in NOT_OBJECTS.items():
        tool = {"type": "function", "function": {"name": name, "parameters": schema}}
        named = {"type": "function", "function": {"name": name}}
        want = tiny_pipe.chat(image, tools=[tool], tool_choice=named, config=AsymSpecConfig(max_new_tokens=120), **VIEW)
        chat = client.chat.completions.create(
            model="tiny", messages=messages, tools=[tool], tool_choice=named, max_tokens=120, extra_body=EXTRA
        )
        (call,) = chat.choices[0].message.tool_calls
        args = call.function.arguments
        assert (call.function.name, chat.choices[0].finish_reason) == (name, "tool_calls") and f'"arguments": {args}}}' in want.text
        jsonschema.validate(json.loads(args), schema)
        again = [
            *messages,
            chat.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "7"},
        ]
        assert client.chat.completions.create(model="tiny", messages=again, max_tokens=2, extra_body=EXTRA).usage.completion_tokens >= 1
        first = create(
            client,
            input=task,
            tools=[{"type": "function", "name": name, "parameters": schema}],
            tool_choice={"type": "function", "name": name},
            max_output_tokens=120,
        )
        (item,) = [it for it in first.output if it.type == "function_call"]
        assert item.arguments == args
        output = [{"type": "function_call_output", "call_id": item.call_id, "output": "7"}]
        assert create(client, previous_response_id=first.id, input=output, max_output_tokens=2).status in ("completed", "incomplete")


def test_text_format_json_schema_constrains_the_answer(client):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {"tallest": {"enum": ["red", "blue"]}},
        "required": ["tallest"],
        "additionalProperties": False,
    }
    resp = create(
        client,
        input=user_input("Which bar is the tallest? Answer in JSON."),
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        max_output_tokens=40,
    )
    assert resp.status == "completed" and resp.text.format.type == "json_schema"
    jsonschema.validate(json.loads(resp.output_text), schema)


@pytest.mark.parametrize("kind", ["text", "call"])
def test_the_stream_is_the_responses_event_sequence_and_joins_to_the_response(client, kind):
    """Greedy, the same request streamed and not: the events come in the Responses order with increasing
    sequence numbers, their text deltas and arguments join to the non-streamed output, and the last event carries
    the same response with its usage."""
    body = {"input": user_input("Which bar is the tallest?"), "max_output_tokens": 12}
    if kind == "call":
        body.update(tools=[PICK], tool_choice="required", max_output_tokens=120)
    whole = create(client, **body)
    events = streamed(client, **body)
    types = [ev.type for ev in events]
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"] and events[0].response.status == "in_progress"
    last = events[-1]
    assert last.type == ("response.incomplete" if whole.status == "incomplete" else "response.completed") and types.count(last.type) == 1
    usage = (last.response.usage.input_tokens, last.response.usage.output_tokens, last.response.usage.total_tokens)
    assert usage == (whole.usage.input_tokens, whole.usage.output_tokens, whole.usage.total_tokens) and [
        i.type for i in last.response.output
    ] == [i.type for i in whole.output]
    expected = []  # the events each output item gets, in order
    for item in whole.output:
        if item.type == "message":
            deltas = types.count("response.output_text.delta")
            expected += ["response.output_item.added", "response.content_part.added", *["response.output_text.delta"] * deltas]
            expected += ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
        else:
            expected += ["response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done"]
            expected += ["response.output_item.done"]
    assert types[2:-1] == expected
    text = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    assert text == whole.output_text == last.response.output_text
    done = [ev for ev in events if ev.type == "response.output_item.done"]
    for item, ev in zip(whole.output, done):
        assert ev.item.type == item.type and ev.output_index == whole.output.index(item)
        if item.type == "function_call":
            args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.item_id == ev.item.id)
            assert args == ev.item.arguments == item.arguments and ev.item.name == item.name
    if kind == "call":
        assert any(item.type == "function_call" for item in whole.output)


def test_output_text_logprobs_are_chat_completions_logprobs(client):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the output text's logprobs are the numbers
    chat completions reports for the same question; streamed, the deltas' logprobs join to the done event's, which
    equal the non-streamed response's."""
    ask = {"input": user_input("Which bar is the tallest?"), "max_output_tokens": 6}
    lp = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    resp = create(client, **ask, **lp)
    got = resp.output[0].content[0].logprobs
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Which bar is the tallest?"},
                    {"type": "image_url", "image_url": {"url": data_url(make_image(71))}},
                ],
            }
        ],
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        extra_body=EXTRA,
    )
    want = chat.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in got] == [(e.token, pytest.approx(e.logprob)) for e in want] and got
    assert [[t.token for t in e.top_logprobs] for e in got] == [[t.token for t in e.top_logprobs] for e in want]
    assert create(client, **ask).output[0].content[0].logprobs == []  # none asked, none sent
    events = streamed(client, **ask, **lp)
    deltas = [t.token for ev in events if ev.type == "response.output_text.delta" for t in ev.logprobs]
    done = next(ev for ev in events if ev.type == "response.output_text.done").logprobs
    assert [t.token for t in done] == [e.token for e in got]
    assert deltas and deltas == [t.token for t in done][: len(deltas)]  # the deltas carry them, in order


def test_input_items_become_the_chat_conversation():
    """Each kind of item as the chat message the toolkit reads: instructions first (a system message), a message
    and the calls after it as one assistant turn, each output as a tool message (an image in it loaded), a reasoning
    item skipped; the tools and the choice in their chat shapes."""
    from asymspec_mm.serve.responses_api import parse_responses_request

    img = data_url(make_image(3))
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use the tools."},
            *user_input("Which bar is taller?", 4),
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "pick_bar", "arguments": '{"bar": "left"}'},
            {"type": "function_call", "call_id": "c2", "name": "pick_bar", "arguments": '{"bar": "right"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "7"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "9"}, {"type": "input_image", "image_url": img}],
            },
        ],
        "tools": [PICK],
        "tool_choice": {"type": "function", "name": "pick_bar"},
    }
    req = parse_responses_request(body).request
    roles = [(m["role"], [p["type"] for p in m["content"]]) for m in req.messages]
    assert roles == [
        ("system", ["text"]),
        ("developer", ["text"]),  # rendered as a system turn, as in chat completions
        ("user", ["text", "image"]),
        ("assistant", ["text"]),
        ("tool", ["text"]),
        ("tool", ["text", "image"]),
    ]
    assert [c["id"] for c in req.messages[3]["tool_calls"]] == ["c1", "c2"] and req.messages[3]["tool_calls"][1]["function"][
        "arguments"
    ] == '{"bar": "right"}'  # the text as the client sent it (what Qwen3's template writes)
    assert [m.get("tool_call_id") for m in req.messages[4:]] == ["c1", "c2"] and req.images[
        req.messages[5]["content"][1]["image"]
    ].size == (make_image(3).size)
    assert req.tools[0]["function"]["name"] == "pick_bar" and req.tool_choice == {"type": "function", "function": {"name": "pick_bar"}}


# ---------------------------------------------------------------------------------------------- state
def test_previous_response_id_continues_the_stored_conversation(client):
    """A response is stored (in memory, bounded) unless store=false; previous_response_id puts its conversation and
    answer before the new input, as if sent whole; a response not stored cannot be named."""
    task = user_input("Which bar is the tallest?")
    first = create(client, input=task, max_output_tokens=6)
    second = create(client, previous_response_id=first.id, input="And the shortest?", max_output_tokens=6)
    assert second.previous_response_id == first.id
    whole = [
        *task,
        {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        *user_input("And the shortest?", None),
    ]
    assert create(client, input=whole, max_output_tokens=6).output_text == second.output_text
    called = create(client, input=task, tools=[PICK], tool_choice="required", max_output_tokens=120)  # then only the call's output
    output = [{"type": "function_call_output", "call_id": called.output[-1].call_id, "output": "The left bar is 7."}]
    answer = create(client, previous_response_id=called.id, input=output, tools=[PICK], tool_choice="none", max_output_tokens=6)
    whole = [*task, *[item.model_dump(exclude_none=True) for item in called.output], *output]
    assert answer.output_text == create(client, input=whole, tools=[PICK], tool_choice="none", max_output_tokens=6).output_text
    unstored = create(client, input=task, max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as err:
        create(client, previous_response_id=unstored.id, input="And the shortest?")
    assert err.value.body["param"] == "previous_response_id" and "store=false" in err.value.body["message"]


# ---------------------------------------------------------------------------------------------- refusals
IMG = {"type": "input_image", "image_url": "https://example.com/chart.png"}
BAD = {
    "unknown_field": ({"frobnicate": 1}, "frobnicate"),
    "hosted_tool": ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    "unoffered_tool": ({"tools": [PICK], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    "forced_without_tools": ({"tool_choice": "required"}, "tool_choice"),
    "bad_format": ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    "unknown_format": ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    "remote_image": (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "q?"}, IMG]}]},
        "input[0].content[1].image_url",
    ),
    "file_part": ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    "zero_budget": ({"max_output_tokens": 0}, "max_output_tokens"),
    "temperature": ({"temperature": 3}, "temperature"),
    "background": ({"background": True}, "background"),
    "conversation": ({"conversation": "conv_1"}, "conversation"),
    "include": ({"include": ["file_search_call.results"]}, "include"),
    "top_logprobs_alone": ({"top_logprobs": 2}, "top_logprobs"),
    "unknown_previous": ({"previous_response_id": "resp_nothing"}, "previous_response_id"),
    "unanswered_output": ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
    "ends_with_assistant": ({"input": [{"role": "assistant", "content": "hi"}]}, "input"),
    # found by the fuzzer: the conversation skips reasoning items, which left nothing to answer (a 500 before)
    "only_reasoning": ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    "asymspec_option": ({"asymspec": {"k": 0}}, "asymspec.k"),
    # refused by the engine's set-up, named by the Responses fields
    "uncompilable_schema": (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"properties": {"a": {"type": "frobnicate"}}}}}},
        "text.format.schema",
    ),
    "budget_over_the_window": ({"max_output_tokens": 100000}, "max_output_tokens"),
    "prompt_over_the_window": ({"input": "red " * 6000}, "input"),
}


@pytest.mark.parametrize("name", BAD)
def test_a_bad_field_is_a_400_naming_it(server, name):
    changes, param = BAD[name]
    body = {"model": "tiny", "input": "Which bar is the tallest?", "max_output_tokens": 2, **changes}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and "\n" not in err["message"], err


def test_the_openai_client_raises_and_the_server_goes_on(client, server):
    with pytest.raises(openai.BadRequestError, match="tools\\[0\\] has type 'web_search'|tools\\[0\\] has type \"web_search\""):
        client.responses.create(model="tiny", input="q?", tools=[{"type": "web_search"}])
    assert client.responses.create(model="tiny", input="Which bar is the tallest?", max_output_tokens=2).output_text is not None


def test_an_unknown_path_names_the_endpoints(server):
    r = httpx.get(server.url + "/v1/foo")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["message"] == (
        "no endpoint /v1/foo; this server serves POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /v1/models, "
        "GET /health, GET /ready, GET /get_load, GET /get_server_info, GET /metrics, GET /openapi.json"
    )
    assert httpx.get(server.url + "/v1/responses/resp_1").status_code == 404  # stored responses are not fetched
    assert httpx.get(server.url + "/v1/responses").status_code == 405


# ---------------------------------------------------------------------------------------------- clients
def test_openai_agents_sdk_in_its_default_mode(server, monkeypatch):
    """The openai-agents SDK with its default model provider (the Responses API): a forced call of a function tool,
    the SDK runs it and sends its output back as a function_call_output, the next turn (tool choice reset to auto)
    answers in the agent's output type (text.format json_schema); streamed as well, and chained by
    previous_response_id (the SDK then sends only the function_call_output)."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool, set_tracing_disabled
    from pydantic import BaseModel

    class Answer(BaseModel):
        taller: Literal["left", "right"]

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def pick_bar(bar: Literal["left", "right"]) -> str:
        """Look up the value of one bar."""
        calls.append(bar)
        return f"The {bar} bar is 7."

    async def main(stream: bool, chained: bool):
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        agent = Agent(
            name="charts",
            instructions="Use the tool, then answer.",
            tools=[pick_bar],
            model="tiny",
            output_type=Answer,
            model_settings=ModelSettings(tool_choice="pick_bar", max_tokens=120, extra_body=EXTRA),
        )
        task = user_input("Which bar is taller?")
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))  # default: the Responses API
        if not stream:
            return await Runner.run(agent, task, max_turns=3, run_config=config, auto_previous_response_id=chained)
        result = Runner.run_streamed(agent, task, max_turns=3, run_config=config)
        async for _ in result.stream_events():
            pass
        return result

    looked_up = []
    get = server.store.get
    monkeypatch.setattr(server.store, "get", lambda rid: looked_up.append(get(rid)) or looked_up[-1])
    for stream, chained in ((False, False), (True, False), (False, True)):
        calls.clear()
        result = asyncio.run(main(stream, chained))
        assert bool(looked_up) == chained and all(looked_up)  # chained: the second turn names the first
        kinds = [item.type for item in result.new_items]
        assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item", kinds
        assert calls and calls[0] in ("left", "right") and isinstance(result.final_output, Answer)


def test_langchain_openai_with_the_responses_api(server):
    """langchain-openai's ChatOpenAI with use_responses_api=True: a forced tool call, its result sent back as a
    ToolMessage, the final answer; and a streamed answer that joins to the non-streamed one."""
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="tiny", base_url=server.url + "/v1", api_key="unused", use_responses_api=True, max_tokens=120, temperature=0, extra_body=EXTRA
    )
    tool = {k: v for k, v in PICK.items() if k != "strict"}
    question = HumanMessage(
        content=[{"type": "text", "text": "Which bar is taller?"}, {"type": "image_url", "image_url": {"url": data_url(make_image(71))}}]
    )
    called = llm.bind_tools([tool], tool_choice="pick_bar").invoke([question])
    assert called.tool_calls and called.tool_calls[0]["name"] == "pick_bar" and called.tool_calls[0]["args"]["bar"] in ("left", "right")
    answer = llm.bind_tools([tool], tool_choice="none").invoke(
        [question, called, ToolMessage("The left bar is 7.", tool_call_id=called.tool_calls[0]["id"])]
    )
    assert not answer.tool_calls and isinstance(answer.text, str)
    plain = ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused", use_responses_api=True, max_tokens=12, temperature=0)
    chunks = list(plain.stream([HumanMessage("Which bar is the tallest?")]))
    assert "".join(c.text for c in chunks) == plain.invoke([HumanMessage("Which bar is the tallest?")]).text
