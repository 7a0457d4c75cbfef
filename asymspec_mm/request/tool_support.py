"""Whether a verifier can take tools: its chat template must render them, and ask for calls in the ``<tool_call>``
format that :func:`~asymspec_mm.request.tools.parse_tool_calls` reads.

Decided once per template by rendering a probe conversation with one probe tool (no model runs): a template that
raises (the cross-family preset's says it has no tools block), one that leaves the tool out of the prompt (a
template without a tools block silently drops them), and one that asks for another call format all get the same
one-line :class:`~asymspec_mm.request.tools.ToolError` naming ``tools``, before any caption, OCR or forward is
spent on the request. ``tool_choice="none"`` keeps tools out of the prompt, so such requests still run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .tools import OPEN, ToolError

#: A tool no real request offers: its name in the rendered prompt shows that the template wrote the tools block.
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "asymspec_probe_tool",
        "description": "Probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}
PROBE_MESSAGES = [{"role": "user", "content": "Which tool?"}]


def template_tools_problem(tokenizer: Any) -> str | None:
    """Why ``tokenizer``'s chat template cannot take tools (a short clause), or ``None`` when it renders them and asks
    for ``<tool_call>`` blocks."""
    try:
        text = tokenizer.apply_chat_template(PROBE_MESSAGES, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - jinja2's errors, a missing template, ...: the reason is what matters
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return f"its chat template cannot render tools ({reason})"
    if not isinstance(text, str) or PROBE_TOOL["function"]["name"] not in text:
        return "its chat template has no tools block (it leaves the tools out of the prompt)"
    if OPEN not in text:
        return f"its chat template asks for tool calls in a format other than the {OPEN} blocks this toolkit reads"
    return None


def check_verifier_tools(problem: str | None, prompt_tools: list[dict[str, Any]]) -> None:
    """Refuse a request whose prompt would carry ``prompt_tools`` when the verifier cannot take tools (``problem``:
    :func:`template_tools_problem` of its tokenizer): a one-line :class:`ToolError` naming ``tools``."""
    if prompt_tools and problem is not None:
        raise ToolError(
            f"tools: this pair's verifier cannot take tools: {problem}; send the request without tools or with "
            'tool_choice "none", or load a verifier whose chat template renders tools in <tool_call> blocks (as Qwen3\'s does)',
            "tools",
        )


#: An earlier call's arguments as a client sends them back: JSON text that parsing and writing it again would change
#: (``-2.5e3`` becomes ``-2500.0``), so the rendered probe shows whether a template writes the text as it is.
PROBE_ARGUMENTS = '{"x": -2.5e3, "y": "\\u00e9"}'
PROBE_CALL_MESSAGES = [
    {"role": "user", "content": "Call it."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "asymspec_probe_tool", "arguments": PROBE_ARGUMENTS}}],
    },
]
_VERBATIM: dict[str, bool] = {}  # writes_argument_text by chat template text
_VERBATIM_LOCK = threading.Lock()


def writes_argument_text(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes a tool call's arguments given as JSON text as they are (Qwen3's
    templates do: ``arguments is string`` is written verbatim, only an object goes through ``tojson``). Decided once
    per template by rendering :data:`PROBE_CALL_MESSAGES`; a template that raises on it, or re-writes the text (one
    that always applies ``tojson``, say), takes the parsed arguments instead."""
    template = getattr(tokenizer, "chat_template", None)
    key = template if isinstance(template, str) else None
    if key is not None and key in _VERBATIM:
        return _VERBATIM[key]
    try:
        text = tokenizer.apply_chat_template(PROBE_CALL_MESSAGES, tokenize=False)
        verbatim = isinstance(text, str) and PROBE_ARGUMENTS in text
    except Exception:  # noqa: BLE001 - jinja2's errors, a template that wants an object: use the parsed arguments
        verbatim = False
    if key is not None:
        with _VERBATIM_LOCK:
            _VERBATIM[key] = verbatim
    return verbatim


def _parsed_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """``call`` with its JSON-text arguments parsed (a JSON string value keeps its text, which templates write as it
    is)."""
    args = call["function"]["arguments"]
    if not isinstance(args, str):
        return dict(call)
    value = json.loads(args)
    return {**call, "function": {**call["function"], "arguments": args if isinstance(value, str) else value}}


def template_messages(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` as ``tokenizer``'s chat template takes them: earlier tool calls' arguments stay the JSON text the
    client sent where the template writes that text as it is (:func:`writes_argument_text`), so the prompt holds the
    call as the model wrote it (``-2.5e3``, not ``-2500.0``); other templates get the arguments parsed."""
    if not any(m.get("tool_calls") for m in messages) or writes_argument_text(tokenizer):
        return list(messages)
    return [{**m, "tool_calls": [_parsed_arguments(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]
