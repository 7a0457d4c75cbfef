"""The two routers people put in front of OpenAI-compatible replicas, started on 127.0.0.1, and the requests sent
through them: vllm-router (PyPI ``vllm-router``) and SGLang's Model Gateway (PyPI ``sglang-router``, command ``smg``).

Used twice: by ``scripts/record_router_bodies.py``, which sends :data:`CASES` through each router to a stand-in
backend that records the bodies the router forwards (kept under ``tests/data/router_bodies/``), and by
``tests/test_router_e2e.py``, which sends the same cases through each router to a real server and compares the
answers with direct ones. Each case is a real ``openai``-client call returning what a user reads of the answer. The
routers' commands and processes are :mod:`asymspec_mm.bench.replicas`'s (re-exported here).
"""

from __future__ import annotations

import base64
import io
from typing import Any

from asymspec_mm.bench.replicas import (  # noqa: F401 - the routers' names and commands, for the tests and the recorder
    POLICY,
    ROUTER_BIN_ENV,
    ROUTERS,
    VERSIONS,
    router_executable,
    running_router,
    shown_command,
)

# ---------------------------------------------------------------------------------------------- the requests
QUESTION = "Which bar is the tallest?"
VIEW = {"caption": "a bar chart with two bars", "ocr": False}  # the compressed view given: no captioning, no OCR
BUDGET = 8


def image_url(seed: int = 71) -> str:
    """A small deterministic PNG as a data URL."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (24, 16), (200, 40, 40))
    ImageDraw.Draw(img).rectangle([2 + seed % 5, 3, 12, 14], fill=(20, 20, 220))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "pick_bar",
        "description": "Look up the value of one bar.",
        "parameters": {"type": "object", "properties": {"bar": {"type": "string", "enum": ["left", "right"]}}, "required": ["bar"]},
    },
}
RESPONSES_TOOL = {"type": "function", **CHAT_TOOL["function"], "strict": True}


def _chat_image() -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": image_url()}}]}]


def _chat_tool_history() -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "pick_bar", "arguments": '{"bar": "left"}'}}
    return [
        *_chat_image(),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "left: 7"},
    ]


def _responses_image() -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": image_url()}]}]


def _message(choice: Any) -> dict[str, Any]:
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return {"text": choice.message.content, "finish": choice.finish_reason, "calls": calls}


def _chat(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("stream"):
        r = client.chat.completions.create(model="tiny", **body)
        return {**_message(r.choices[0]), "usage": (r.usage.prompt_tokens, r.usage.completion_tokens)}
    text, finish, usage, calls = [], None, None, {}
    for chunk in client.chat.completions.create(model="tiny", **body):
        if chunk.usage is not None:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for c in chunk.choices:
            text.append(c.delta.content or "")
            for call in c.delta.tool_calls or []:
                name, args = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), args + (call.function.arguments or ""))
            finish = c.finish_reason or finish
    return {"text": "".join(text), "finish": finish, "calls": [calls[i] for i in sorted(calls)], "usage": usage}


def _completion(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("stream"):
        r = client.completions.create(model="tiny", **body)
        return {
            "text": r.choices[0].text,
            "finish": r.choices[0].finish_reason,
            "usage": (r.usage.prompt_tokens, r.usage.completion_tokens),
        }
    text, finish, usage = [], None, None
    for chunk in client.completions.create(model="tiny", **body):
        if chunk.usage is not None:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for c in chunk.choices:
            text.append(c.text)
            finish = c.finish_reason or finish
    return {"text": "".join(text), "finish": finish, "usage": usage}


def _response_of(r: Any) -> dict[str, Any]:
    calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
    usage = (r.usage.input_tokens, r.usage.output_tokens)
    return {"text": r.output_text, "status": r.status, "calls": calls, "usage": usage, "temperature": r.temperature}


def _response(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("stream"):
        return _response_of(client.responses.create(model="tiny", **body))
    final = None
    for event in client.responses.create(model="tiny", **body):
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    return _response_of(final)


CALLS = {"/v1/chat/completions": _chat, "/v1/completions": _completion, "/v1/responses": _response}


def send(client: Any, name: str, drop: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Case ``name`` sent with the ``openai`` client ``client`` (its ``extra_body`` without the fields ``drop``): what
    a user reads of the answer (text, finish reason or status, tool calls, token counts)."""
    endpoint, body = CASES[name]
    if "extra_body" in body:
        body = {**body, "extra_body": {k: v for k, v in body["extra_body"].items() if k not in drop}}
    return CALLS[endpoint](client, body)


_ASKED = [{"role": "user", "content": QUESTION}]
_PICK = {"type": "function", "function": {"name": "pick_bar"}}

#: name -> (endpoint path, the ``openai`` call's arguments). Greedy unless a case samples; every extension travels
#: in ``extra_body``, as a client sends it.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat_text": ("/v1/chat/completions", {"messages": _ASKED, "max_tokens": BUDGET}),
    "chat_stream": (
        "/v1/chat/completions",
        {"messages": _ASKED, "max_tokens": BUDGET, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "chat_image_asymspec": (
        "/v1/chat/completions",
        {"messages": _chat_image(), "max_completion_tokens": BUDGET, "extra_body": {"asymspec": {**VIEW, "k": 4}}},
    ),
    "chat_tools": (
        "/v1/chat/completions",
        {
            "messages": _chat_tool_history(),
            "tools": [CHAT_TOOL],
            "tool_choice": "auto",
            "max_tokens": BUDGET,
            "extra_body": {"asymspec": VIEW},
        },
    ),
    "chat_forced_tool_stream": (
        "/v1/chat/completions",
        {
            "messages": _chat_image(),
            "tools": [CHAT_TOOL],
            "tool_choice": _PICK,
            "max_tokens": 120,
            "stream": True,
            "extra_body": {"asymspec": VIEW},
        },
    ),
    "chat_structured_outputs": (
        "/v1/chat/completions",
        {"messages": _ASKED, "max_tokens": BUDGET, "extra_body": {"structured_outputs": {"choice": ["left", "right"]}}},
    ),
    "chat_sampled": (
        "/v1/chat/completions",
        {"messages": _ASKED, "max_tokens": BUDGET, "temperature": 0.7, "top_p": 0.9, "seed": 3, "extra_body": {"top_k": 20}},
    ),
    "completion_text": ("/v1/completions", {"prompt": QUESTION, "max_tokens": BUDGET}),
    "completion_stream": (
        "/v1/completions",
        {"prompt": QUESTION, "max_tokens": BUDGET, "stream": True, "stream_options": {"include_usage": True}},
    ),
    "completion_asymspec": (
        "/v1/completions",
        {"prompt": QUESTION, "max_tokens": BUDGET, "stop": ["\n\n"], "extra_body": {"asymspec": {"method": "asymspec", "k": 3}}},
    ),
    "responses_text": ("/v1/responses", {"input": QUESTION, "max_output_tokens": BUDGET}),
    "responses_openai_defaults": (
        "/v1/responses",
        {"input": QUESTION, "max_output_tokens": BUDGET, "temperature": 1.0, "top_p": 1.0, "extra_body": {"seed": 5}},
    ),
    "responses_greedy": ("/v1/responses", {"input": QUESTION, "max_output_tokens": BUDGET, "temperature": 0}),
    "responses_stream": ("/v1/responses", {"input": QUESTION, "max_output_tokens": BUDGET, "temperature": 0, "stream": True}),
    "responses_image_asymspec": (
        "/v1/responses",
        {"input": _responses_image(), "max_output_tokens": BUDGET, "temperature": 0, "extra_body": {"asymspec": VIEW}},
    ),
    "responses_tools": (
        "/v1/responses",
        {
            "input": _responses_image(),
            "instructions": "Answer briefly.",
            "tools": [RESPONSES_TOOL],
            "tool_choice": {"type": "function", "name": "pick_bar"},
            "max_output_tokens": 120,
            "temperature": 0,
            "extra_body": {"asymspec": VIEW},
        },
    ),
    "responses_sampled": (
        "/v1/responses",
        {"input": QUESTION, "max_output_tokens": BUDGET, "temperature": 0.7, "top_p": 0.9, "extra_body": {"seed": 3, "top_k": 20}},
    ),
    # the extensions in the objects SGLang's gateway forwards verbatim (asymspec_mm.serve.models_router.CARRIERS)
    "chat_image_carried": (
        "/v1/chat/completions",
        {
            "messages": _chat_image(),
            "max_completion_tokens": BUDGET,
            "extra_body": {"chat_template_kwargs": {"asymspec": {**VIEW, "k": 4}}},
        },
    ),
    "chat_method_carried": (
        "/v1/chat/completions",
        {"messages": _ASKED, "max_tokens": BUDGET, "extra_body": {"chat_template_kwargs": {"asymspec": {"method": "drafter"}}}},
    ),
    "chat_structured_outputs_carried": (
        "/v1/chat/completions",
        {
            "messages": _ASKED,
            "max_tokens": BUDGET,
            "extra_body": {"chat_template_kwargs": {"structured_outputs": {"choice": ["left", "right"]}, "enable_thinking": False}},
        },
    ),
    "responses_carried": (
        "/v1/responses",
        {
            "input": QUESTION,
            "max_output_tokens": BUDGET,
            "temperature": 0.7,
            "extra_body": {"metadata": {"asymspec": {"method": "drafter", "k": 3}, "seed": 3, "team": "charts"}},
        },
    ),
}
