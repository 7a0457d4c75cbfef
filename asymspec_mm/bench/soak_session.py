"""The agent-like sessions of the soak benchmark (``asymspec_mm.bench.soak``): one client's loop of conversations.

A session is a MiniVista agent task (a bar chart and a question that needs ``add`` or ``subtract``) played as an
agent plays it, with the ``openai`` client, every request streamed: turn 1 sends the image, the question and the
tools; a tool call the model makes is executed (:func:`~asymspec_mm.eval.minivista_agent.run_tool`) and its result
appended (the next turn answers it); a turn answered without a tool call is followed by a user's follow-up question,
so the history grows turn after turn. Each request records its
timings (time to the first streamed token, the gaps between chunks), its usage (prompt and cached tokens) and its
outcome; a failed request ends its session (an agent would retry from scratch). Every loop is bounded in count and
in time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..eval.minivista_agent import AgentToolError, make_agent_problem, run_tool

#: Turns per session: the image and question, the answer after the tool's result, two follow-ups.
TURNS = 4
FOLLOWUPS = ("Which of the two bars is taller?", "Say the final number once more.", "Thank you. Is that all?")
#: Tokens each turn may generate: a tool call of the tiny pair is some 30 tokens.
MAX_TOKENS = 48
#: Seconds one request may take before it counts as failed.
REQUEST_TIMEOUT_S = 120.0
#: The most sessions one client starts in a phase (the phase's deadline usually comes first).
MAX_SESSIONS = 100_000
#: The seed of the soak's MiniVista agent tasks (any; fixed so that runs send the same conversations).
SEED = 11


@dataclass
class RequestRecord:
    """One request: when it started and ended (``time.monotonic()`` seconds), its turn (1-based), its outcome
    (``"ok"``, ``"http_NNN"`` or the exception's name; ``detail``: a failure's message, cut to one line), and for a
    success its timings and token counts."""

    phase: str
    session: str
    turn: int
    start: float
    end: float
    outcome: str
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def status(self) -> int | None:
        """The HTTP status of a failed request the server or router answered; None otherwise."""
        return int(self.outcome[5:]) if self.outcome.startswith("http_") else None


def view_of(problem: dict[str, Any], session: str) -> dict[str, Any]:
    """The ``asymspec`` extension giving the task's compressed view, so that no replica runs OCR or captioning. The
    caption opens with the session's name: the verifier's prompt is then the session's own from the image
    description on (the system prompt and the tools before it are what every session shares, as agents share
    theirs), so that a turn on another replica finds no more than that shared start in its cache."""
    return {"caption": f"Chart {session}: {problem['caption']}", "ocr": problem["ocr"]}


def stream_turn(
    client: Any, messages: list[dict[str, Any]], problem: dict[str, Any], headers: dict[str, str], session: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One streamed chat request: (``{"ttft_s", "itl_s", "prompt_tokens", "cached_tokens", "completion_tokens"}``,
    the assistant message to append to the history, its tool calls executed by the caller)."""
    start = time.monotonic()
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=problem["tools"],
        tool_choice="auto",
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
        extra_body={"asymspec": view_of(problem, session)},
    )
    arrivals, text, calls, usage = [], [], {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content or delta.tool_calls:
                arrivals.append(time.monotonic())
            text.append(delta.content or "")
            for call in delta.tool_calls or []:
                got = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                got["id"] = call.id or got["id"]
                got["name"] += (call.function.name or "") if call.function else ""
                got["arguments"] += (call.function.arguments or "") if call.function else ""
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    stats = {
        "ttft_s": arrivals[0] - start if arrivals else None,
        "itl_s": [b - a for a, b in zip(arrivals, arrivals[1:])],
        "prompt_tokens": usage.prompt_tokens if usage is not None else 0,
        "cached_tokens": int(getattr(details, "cached_tokens", 0) or 0),
        "completion_tokens": usage.completion_tokens if usage is not None else 0,
    }
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"] or f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in sorted(calls.items())
        ]
    return stats, message


def tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool messages answering ``message``'s calls: the tool's result, or its one-line error (an agent shows the
    model what went wrong)."""
    out = []
    for call in message.get("tool_calls", []):
        try:
            result = run_tool(call["function"]["name"], call["function"]["arguments"])
        except (AgentToolError, json.JSONDecodeError) as exc:
            result = f"error: {exc}"
        out.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return out


def failure_name(exc: BaseException) -> str:
    """``http_NNN`` for an error the server or router answered, else the exception's class name."""
    status = getattr(exc, "status_code", None)
    return f"http_{status}" if isinstance(status, int) else type(exc).__name__


def run_session(client: Any, phase: str, name: str, index: int, deadline: float, headers: dict[str, str]) -> list[RequestRecord]:
    """Session ``name``: MiniVista agent task ``index``, up to :data:`TURNS` streamed turns, none started after
    ``deadline``; ends at its first failed request."""
    problem = make_agent_problem(SEED, index)
    messages = [dict(m) for m in problem["messages"]]
    records: list[RequestRecord] = []
    asked = 0
    for turn in range(1, TURNS + 1):
        if time.monotonic() >= deadline:
            break
        if messages[-1]["role"] == "assistant":  # answered (no tool call to answer first): the user asks on
            messages.append({"role": "user", "content": FOLLOWUPS[min(asked, len(FOLLOWUPS) - 1)]})
            asked += 1
        start = time.monotonic()
        try:
            stats, message = stream_turn(client, messages, problem, headers, name)
        except Exception as exc:  # noqa: BLE001 - every failure is a result of the soak, recorded by its name
            detail = " ".join(str(exc).split())[:200]
            records.append(RequestRecord(phase, name, turn, start, time.monotonic(), failure_name(exc), detail=detail))
            break
        records.append(
            RequestRecord(phase, name, turn, start, time.monotonic(), "ok", tool_calls=len(message.get("tool_calls", [])), **stats)
        )
        messages.append(message)
        messages.extend(tool_results(message))
    return records


def client_loop(url: str, phase: str, client_id: int, deadline: float, header: str | None) -> list[RequestRecord]:
    """One client: sessions one after another until ``deadline`` (at most :data:`MAX_SESSIONS`), each under its own
    session key in ``header`` (no key when ``header`` is None)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    records: list[RequestRecord] = []
    for n in range(MAX_SESSIONS):
        if time.monotonic() >= deadline:
            break
        name = f"{phase}-c{client_id}-s{n}"
        headers = {header: name} if header else {}
        records += run_session(client, phase, name, client_id * 1000 + n, deadline, headers)
    return records
