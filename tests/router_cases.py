"""The two routers people put in front of OpenAI-compatible replicas, started on 127.0.0.1, and the requests sent
through them: vllm-router (PyPI ``vllm-router``) and SGLang's Model Gateway (PyPI ``sglang-router``, command ``smg``).

Used twice: by ``scripts/record_router_bodies.py``, which sends :data:`CASES` through each router to a stand-in
backend that records the bodies the router forwards (kept under ``tests/data/router_bodies/``), and by
``tests/test_router_e2e.py``, which sends the same cases through each router to a real server and compares the
answers with direct ones. Each case is a real ``openai``-client call returning what a user reads of the answer.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The routers, their console scripts, and the versions the recorded bodies come from.
ROUTERS = {"vllm-router": "vllm-router", "sglang-router": "smg"}
VERSIONS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
#: The routing policy of every run (both routers' default; one replica makes it moot, but it is what users get).
POLICY = "cache_aware"
#: Environment variable naming a folder holding the routers' console scripts (a venv's ``bin``) when they are not on PATH.
ROUTER_BIN_ENV = "ASYMSPEC_ROUTER_BIN"
STARTUP_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def router_executable(name: str) -> str | None:
    """The path of router ``name``'s console script: in ``$ASYMSPEC_ROUTER_BIN``, next to this Python, or on PATH."""
    exe = ROUTERS[name]
    for folder in (os.environ.get(ROUTER_BIN_ENV), str(Path(sys.executable).parent)):
        if folder and (Path(folder) / exe).is_file():
            return str(Path(folder) / exe)
    return shutil.which(exe)


def router_command(
    name: str, exe: str, port: int, worker: str | list[str], policy: str = POLICY, extra: list[str] | None = None
) -> list[str]:
    """The command line starting router ``name`` on 127.0.0.1:``port`` in front of the replica ``worker`` (or each of
    a list) with ``policy`` and the ``extra`` flags at its end (its metrics exporter on a free loopback port too, so
    that two routers never share one)."""
    workers = [worker] if isinstance(worker, str) else list(worker)
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy]
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    if name == "vllm-router":
        return [exe, *common, *metrics, "--worker-startup-timeout-secs", "30", "--log-level", "warning", *(extra or [])]
    return [exe, "launch", *common, *metrics, "--worker-startup-timeout-secs", "30", "--log-level", "warn", *(extra or [])]


def shown_command(
    name: str, worker: str | list[str] = "http://127.0.0.1:8000", port: int = 30000, policy: str = POLICY, extra: list[str] | None = None
) -> str:
    """The command line of :func:`router_command` as the docs show it (fixed ports)."""
    cmd = router_command(name, ROUTERS[name], port, worker, policy, extra)
    at = cmd.index("--prometheus-port")
    cmd[at + 1] = "29000"
    return " ".join(cmd)


@contextlib.contextmanager
def running_router(
    name: str, worker: str | list[str], log: Path | None = None, policy: str = POLICY, extra: list[str] | None = None
) -> Iterator[str]:
    """Router ``name`` in front of ``worker`` (a base URL without ``/v1``, or a list of them) with ``policy`` and the
    ``extra`` flags: its base URL once it routes a request
    (``GET /v1/models`` answered), stopped (SIGTERM, then SIGKILL) on exit. Raises RuntimeError naming the log tail
    when it does not start within :data:`STARTUP_S`."""
    import httpx

    exe = router_executable(name)
    if exe is None:
        raise RuntimeError(f"{name} is not installed: pip install {name}=={VERSIONS[name]}")
    port = free_port()
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(router_command(name, exe, port, worker, policy, extra), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}" + (f"; see {log}" if log else ""))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not route within {STARTUP_S:.0f} s" + (f"; see {log}" if log else ""))
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if log is not None:
            out.close()


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
