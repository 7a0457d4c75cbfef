"""Whether a verifier can take tools: its chat template must render them, and ask for calls in the ``<tool_call>``
format that :func:`~asymspec_mm.request.tools.parse_tool_calls` reads.

Decided once per template by rendering a probe conversation with one probe tool (no model runs): a template that
raises (the cross-family preset's says it has no tools block), one that leaves the tool out of the prompt (a
template without a tools block silently drops them), and one that asks for another call format all get the same
one-line :class:`~asymspec_mm.request.tools.ToolError` naming ``tools``, before any caption, OCR or forward is
spent on the request. ``tool_choice="none"`` keeps tools out of the prompt, so such requests still run.
"""

from __future__ import annotations

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
