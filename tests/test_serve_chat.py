"""Conversations through the server (issue #29): a live ``asymspec-mm serve --preset tiny`` answers the official
``openai`` client's multi-turn conversation with two images exactly as ``pipe.chat`` does, reports the verifier's
reused tokens as ``usage.prompt_tokens_details.cached_tokens``, honours ``chat_template_kwargs``, and a smolagents
``CodeAgent`` (multi-turn, its task image repeated in every request) runs its steps with no HTTP error."""

from __future__ import annotations

import base64
import io
import os
import sys
from pathlib import Path

import pytest
from conftest import make_image, start_serve, stop_serve

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = ["a bar chart with three bars", "a bar chart with two bars"]


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def live():
    """``serve --preset tiny`` on a free port, and the same preset loaded here for reference answers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--ocr-engine", "none", "--port", "0"]
    cmd += ["--max-images", "6", "--log-level", "warning"]
    proc, url = start_serve(cmd, ROOT, env)
    try:
        yield url, AsymSpecPipeline.from_preset("tiny", ocr="none")
    finally:
        stop_serve(proc)


def _openai_messages(turns: list[tuple[str, list]]) -> list[dict]:
    out = []
    for role, parts in turns:
        content = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image_url", "image_url": {"url": data_url(p)}} for p in parts
        ]
        out.append({"role": role, "content": content})
    return out


def _pipe_messages(turns: list[tuple[str, list]]) -> list[dict]:
    return [{"role": role, "content": [p if isinstance(p, str) else {"type": "image", "image": p} for p in parts]} for role, parts in turns]


def test_three_turns_with_two_images_equal_pipe_chat(live):
    url, pipe = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    img1, img2 = make_image(61), make_image(62)
    turns: list[tuple[str, list]] = [("system", ["Answer with a number."]), ("user", ["What is the value of the tallest bar?", img1])]
    asked = [["How many bars are there?"], ["Here is another chart.", img2, "Which chart has more bars?"]]
    cached = []
    for turn in range(3):
        n_images = sum(not isinstance(p, str) for _, parts in turns for p in parts)
        options = {"caption": CAPTIONS[:n_images], "ocr": [False] * n_images}
        resp = client.chat.completions.create(
            model="tiny", messages=_openai_messages(turns), max_tokens=12, extra_body={"asymspec": options}
        )
        want = pipe.chat(_pipe_messages(turns), config=AsymSpecConfig(max_new_tokens=12), **options)
        assert resp.choices[0].message.content == want.text, turn
        assert resp.choices[0].finish_reason == want.finish_reason
        assert resp.usage.prompt_tokens == want.prompts.verifier_ids.shape[1]
        cached.append(resp.usage.prompt_tokens_details.cached_tokens)
        turns.append(("assistant", [resp.choices[0].message.content]))
        turns.append(("user", asked[turn] if turn < 2 else ["Thanks."]))
    # the server's own KV: the second and third turns start from the earlier turns' (the system prompt and the
    # first user message at least); the first turn has nothing of this conversation to reuse but the template's opening
    assert cached[1] > cached[0] and cached[2] > cached[0]


def test_enable_thinking_reaches_the_verifier_template(live):
    url, pipe = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    turns = [("user", [make_image(63), "What is shown?"])]
    options = {"caption": CAPTIONS[0], "ocr": False}
    for thinking in (False, True):
        resp = client.chat.completions.create(
            model="tiny",
            messages=_openai_messages(turns),
            max_tokens=6,
            extra_body={"asymspec": options, "chat_template_kwargs": {"enable_thinking": thinking}},
        )
        want = pipe.chat(_pipe_messages(turns), config=AsymSpecConfig(max_new_tokens=6), enable_thinking=thinking, **options)
        assert resp.choices[0].message.content == want.text
        think_block = "<think>\n\n</think>" in pipe.verifier_tokenizer.decode(want.prompts.verifier_ids[0])
        assert think_block == (not thinking)  # the empty think block is how Qwen3 switches thinking off


def test_too_many_images_is_refused_and_the_server_goes_on(live):
    url, _ = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    img = make_image(64)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=_openai_messages([("user", ["Compare", *[img] * 7])]), max_tokens=2)
    assert err.value.body["code"] == "too_many_images" and "more than 6 images" in err.value.body["message"]
    assert err.value.body["param"] == "messages[0].content[7].image_url"
    resp = client.chat.completions.create(
        model="tiny", messages=_openai_messages([("user", [img, "Count."])]), max_tokens=2, extra_body={"asymspec": {"ocr": False}}
    )
    assert resp.choices[0].message.content is not None


def test_smolagents_code_agent_runs_three_steps(live):
    """smolagents' CodeAgent against the server: every step is one chat request with the whole history and the task's
    image in its first message; none fails over HTTP (the tiny pair writes no valid code, so each step ends in a
    parsing error that the agent feeds back to the model, and the run ends at max_steps). The agent's own system
    prompt is some 5,700 tokens, past the tiny pair's 4,096-token window (the server refuses it with the counts), so
    it gets a short one here; everything else is smolagents' own."""
    smolagents = pytest.importorskip("smolagents")
    import importlib.resources

    import yaml
    from smolagents import CodeAgent, OpenAIServerModel
    from smolagents.memory import ActionStep
    from smolagents.utils import AgentGenerationError

    url, _ = live
    requests = []

    class Counting(OpenAIServerModel):
        def generate(self, messages, *args, **kwargs):
            requests.append(len(messages))
            return super().generate(messages, *args, **kwargs)

    model = Counting(model_id="tiny", api_base=url + "/v1", api_key="unused", extra_body={"asymspec": {"ocr": False}}, max_tokens=16)
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("code_agent.yaml").read_text())
    templates["system_prompt"] = "Solve the task with Python code between <code> and </code>; end with final_answer(answer)."
    agent = CodeAgent(tools=[], model=model, max_steps=3, verbosity_level=0, prompt_templates=templates)
    agent.run("What is the value of the tallest bar?", images=[make_image(65)])
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    assert len(steps) >= 3  # three steps, then (at max_steps) the request for a final answer from the memory
    assert not any(isinstance(s.error, AgentGenerationError) for s in steps), [s.error for s in steps]
    assert all(s.model_output is not None for s in steps[:3])
    assert requests[:3] == sorted(requests[:3]) and requests[2] > requests[0]  # the history grows turn by turn
    assert smolagents.__version__


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"],
        },
    },
}


def test_tools_and_a_tool_result_with_an_image_equal_pipe_chat(live):
    """tools with tool_choice auto, an assistant tool call and the tool's result (text and an image): the answer and
    its finish reason equal pipe.chat's, streamed and not; what the server cannot honour is a 400 naming the field."""
    url, pipe = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    img1, img2 = make_image(66), make_image(67)
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}
    turns = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": data_url(img1)}}, {"type": "text", "text": "Add the bars."}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "text", "text": "7"}, {"type": "image_url", "image_url": {"url": data_url(img2)}}],
        },
    ]
    local = [
        {"role": "user", "content": [{"type": "image", "image": img1}, "Add the bars."]},
        turns[1],
        {"role": "tool", "tool_call_id": "call_1", "content": ["7", {"type": "image", "image": img2}]},
    ]
    options = {"caption": CAPTIONS, "ocr": [False, False]}
    want = pipe.chat(local, tools=[ADD], config=AsymSpecConfig(max_new_tokens=10), **options)
    resp = client.chat.completions.create(model="tiny", messages=turns, tools=[ADD], max_tokens=10, extra_body={"asymspec": options})
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == want.finish_reason
    assert (msg.content, [c.function.name for c in msg.tool_calls or []]) == (
        want.content,
        [c["function"]["name"] for c in want.tool_calls],
    )
    stream = client.chat.completions.create(
        model="tiny", messages=turns, tools=[ADD], tool_choice="auto", max_tokens=10, stream=True, extra_body={"asymspec": options}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (want.content or "")
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=turns, max_tokens=2, response_format=bad)
    assert err.value.body["param"] == "response_format.json_schema.schema" and "cannot be compiled" in err.value.body["message"]
    orphan = [turns[0], {"role": "tool", "tool_call_id": "call_9", "content": "7"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=orphan, tools=[ADD], max_tokens=2)
    assert err.value.body["code"] == "unknown_tool_call_id" and err.value.body["param"] == "messages[1].tool_call_id"
    again = client.chat.completions.create(model="tiny", messages=turns, tools=[ADD], max_tokens=10, extra_body={"asymspec": options})
    assert again.choices[0].message.content == msg.content  # the server goes on serving


def test_forced_tool_calls_and_json_answers_through_the_server(live):
    """tool_choice required / named and response_format json_schema against the live server: the calls and the
    JSON validate, equal pipe.chat's, and the streamed deltas join to the same calls."""
    import json

    jsonschema = pytest.importorskip("jsonschema")
    url, pipe = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    img = make_image(68)
    turns = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(img)}}, {"type": "text", "text": "Add the bars."}]}
    ]
    local = [{"role": "user", "content": [{"type": "image", "image": img}, "Add the bars."]}]
    options = {"caption": CAPTIONS[0], "ocr": False}
    cfg = AsymSpecConfig(max_new_tokens=96)
    params = ADD["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        want = pipe.chat(local, tools=[ADD], tool_choice=choice, config=cfg, **options)
        resp = client.chat.completions.create(
            model="tiny", messages=turns, tools=[ADD], tool_choice=choice, max_tokens=96, extra_body={"asymspec": options}
        )
        calls = resp.choices[0].message.tool_calls
        assert resp.choices[0].finish_reason == "tool_calls" == want.finish_reason
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in want.tool_calls
        ]
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), params)
        stream = client.chat.completions.create(
            model="tiny", messages=turns, tools=[ADD], tool_choice=choice, max_tokens=96, stream=True, extra_body={"asymspec": options}
        )
        joined: dict[int, list] = {}
        for chunk in stream:
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = joined.setdefault(d.index, [d.id, d.function.name, ""])
                entry[2] += d.function.arguments or ""
        assert [(name, args) for _, name, args in joined.values()] == [(c.function.name, c.function.arguments) for c in calls]
        assert all(ident for ident, _, _ in joined.values())
    schema = {"type": "object", "properties": {"sum": {"type": "integer", "minimum": 0, "maximum": 200}}, "required": ["sum"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    resp = client.chat.completions.create(
        model="tiny", messages=turns, max_tokens=96, response_format=fmt, extra_body={"asymspec": options}
    )
    want = pipe.chat(local, response_format=fmt, config=cfg, **options)
    assert resp.choices[0].message.content == want.text
    jsonschema.validate(json.loads(want.text), schema)


def test_a_tool_call_answer_as_openai_shapes_it():
    """The response of an answer that calls tools (hand-written text: the random and tiny pairs make no calls without
    a grammar): content before the call, the call with its arguments, finish_reason tool_calls; streamed deltas join
    to the same call with the same id."""
    from types import SimpleNamespace

    from asymspec_mm.request.tools import ToolCallStream, parse_tool_calls
    from asymspec_mm.serve.chat_answers import message_of

    text = 'I will add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    res = SimpleNamespace(text=text, tool_calls=parse_tool_calls(text).tool_calls, cut_by_budget=False)
    msg = message_of(res, "chatcmpl-1")
    assert msg["content"] == "I will add them." and msg["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 3, "b": 4}'}
    stream = ToolCallStream("chatcmpl-1")
    deltas = [d for i in range(1, len(text) + 1) for d in stream.push(text[:i])] + stream.finish(text, parse_tool_calls(text, "chatcmpl-1"))
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert first["id"] == msg["tool_calls"][0]["id"] and first["function"]["name"] == "add"
    args = "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", []))
    assert args == msg["tool_calls"][0]["function"]["arguments"]


def test_openai_agents_sdk_runs_an_agent_with_a_function_tool(live):
    """The openai-agents SDK in chat-completions mode: the first turn forces a call (tool_choice="required"), the
    SDK runs the function and sends its result as a tool message, the next turn (tool choice reset to auto) answers."""
    pytest.importorskip("agents")
    import asyncio

    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    url, _ = live
    set_tracing_disabled(True)
    calls = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        agent = Agent(
            name="calculator",
            instructions="Use the add tool, then answer.",
            tools=[add],
            model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
            model_settings=ModelSettings(tool_choice="required", max_tokens=200, extra_body={"asymspec": {"ocr": False}}),
        )
        task = [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Add the two bars."},
                    {"type": "input_image", "image_url": data_url(make_image(70))},
                ],
            }
        ]
        return await Runner.run(agent, task, max_turns=4)

    result = asyncio.run(main())
    assert calls and all(isinstance(a, int) and isinstance(b, int) for a, b in calls)
    assert isinstance(result.final_output, str)


def test_a_conversation_without_images_is_answered_as_pipe_chat(live):
    """A text-only conversation (an agent's tool output in it): answered; the drafter reads the long output whole
    while the verifier's view may shorten it, so it equals pipe.chat of the same messages."""
    url, pipe = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour of the bars."}]
    resp = client.chat.completions.create(model="tiny", messages=turns, max_tokens=8)
    assert resp.choices[0].message.content == pipe.chat(turns, config=AsymSpecConfig(max_new_tokens=8)).text
