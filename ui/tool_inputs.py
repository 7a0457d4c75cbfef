"""The page's agent tools: the tools a run offers (a JSON list of OpenAI function tools, typed into a field) and its
``tool_choice``, checked into what :meth:`~asymspec_mm.core.Scheduler.submit_chat` takes, and the "Agent tools"
inputs that hold them. Gradio is imported only to build the inputs.
"""

from __future__ import annotations

import json
from typing import Any

from asymspec_mm.request.tools import ToolError, check_tool_choice, check_tools

from .errors import DemoInputError

__all__ = [
    "EXAMPLE_TOOLS",
    "MAX_TOOLS_CHARS",
    "TOOL_CHOICES",
    "TOOL_CHOICE_INFO",
    "build_tool_inputs",
    "check_tool_inputs",
    "example_tools_text",
    "tool_choice_info",
]

#: Longest tools text the page accepts (a few dozen tools with their schemas).
MAX_TOOLS_CHARS = 20000
#: The choices the page offers; a caller may also send a tool's name (or ``{"type": "function", ...}``) to force it.
TOOL_CHOICES = ("auto", "required", "none")
#: What each of :data:`TOOL_CHOICES` does, as the line under the tool choice says it.
TOOL_CHOICE_INFO = {
    "auto": "auto: the model decides whether to call a tool or to answer in words.",
    "required": "required: the answer must call a tool.",
    "none": "none: the answer is words only; no tool is called.",
}
#: The example the page's "Insert example tool" button writes: a calculator's ``add`` (of bounded integers, so that a
#: forced call ends even where a small model would write digits on and on).
EXAMPLE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two whole numbers and return their sum.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -1000, "maximum": 1000, "description": "the first number"},
                    "b": {"type": "integer", "minimum": -1000, "maximum": 1000, "description": "the second number"},
                },
                "required": ["a", "b"],
            },
        },
    }
]


def example_tools_text() -> str:
    """:data:`EXAMPLE_TOOLS` as the tools field shows it (pretty-printed JSON)."""
    return json.dumps(EXAMPLE_TOOLS, indent=2)


def _choice_value(tool_choice: Any) -> Any:
    """The page's tool choice as the API reads it: a JSON object stays one, any other word than none, auto and
    required names a function (an empty choice is auto)."""
    if tool_choice is None or (isinstance(tool_choice, str) and not tool_choice.strip()):
        return "auto"
    if not isinstance(tool_choice, str):
        return tool_choice
    text = tool_choice.strip()
    if text in TOOL_CHOICES:
        return text
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise DemoInputError(f"the tool choice is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    return {"type": "function", "function": {"name": text}}


def tool_choice_info(tool_choice: Any) -> str:
    """The line under the tool choice: what the chosen value does (a tool's name forces a call of that tool)."""
    text = "" if tool_choice is None else str(tool_choice).strip()
    if not text or text in TOOL_CHOICE_INFO:
        return TOOL_CHOICE_INFO[text or "auto"]
    if text.startswith("{"):
        return "a tool choice object: the answer must call the function it names."
    return f"{text}: the answer must call the tool {text}."


def _tool_choice_update(tool_choice: Any) -> Any:
    """The tool choice's update when its value changes: the line under it says what the new value does."""
    import gradio as gr

    return gr.update(info=tool_choice_info(tool_choice))


def check_tool_inputs(tools: Any, tool_choice: Any) -> tuple[list[dict[str, Any]] | None, Any]:
    """The page's tools field and tool choice as ``(tools, tool_choice)`` for ``submit_chat``: ``(None, None)`` when
    the run offers no tools (an empty field, or ``[]``, with a choice that does not force a call), so that it runs as
    a run without tools. A :class:`DemoInputError` (one line naming the field and the fix) for bad input."""
    text = "" if tools is None else tools if isinstance(tools, str) else json.dumps(tools)
    if len(text) > MAX_TOOLS_CHARS:
        raise DemoInputError(f"the tools field is {len(text)} characters; the limit is {MAX_TOOLS_CHARS}")
    offered: Any = None
    if text.strip():
        try:
            offered = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DemoInputError(
                f"the tools field is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}; "
                "write a list such as the example tool's"
            ) from None
    try:
        checked = check_tools(offered)
    except ToolError as exc:
        raise DemoInputError(f"the tools field: {exc} (see Insert example tool)") from None
    choice = _choice_value(tool_choice)
    try:
        choice = check_tool_choice(choice, checked)
    except ToolError as exc:
        names = ", ".join(t["function"]["name"] for t in checked)
        fix = f"choose auto, required, none or one of: {names}" if names else "add a tool to the tools field first"
        raise DemoInputError(f"the tool choice: {exc}; {fix}") from None
    if not checked:
        return None, None
    return checked, choice


def build_tool_inputs() -> tuple[Any, Any]:
    """The "Agent tools" accordion (inside a Blocks being built): the tools field, the tool choice and a button that
    writes the example tool into the field. Returns ``(tools, tool_choice)``."""
    import gradio as gr

    with gr.Accordion("Agent tools", open=False, elem_id="asym-tools-accordion"):
        tools = gr.Textbox(
            "",
            label="Tools (a JSON list of OpenAI function tools; empty: no tools)",
            lines=3,
            max_lines=16,
            max_length=MAX_TOOLS_CHARS,
            placeholder='[{"type": "function", "function": {"name": "add", "parameters": {...}}}]',
            elem_id="asym-tools",
        )
        with gr.Row():
            # The line under the choice follows its value (the label used to say "required: ..." whatever was chosen).
            tool_choice = gr.Dropdown(
                list(TOOL_CHOICES),
                value="auto",
                label="Tool choice (auto, required, none or a tool's name)",
                info=tool_choice_info("auto"),
                allow_custom_value=True,
                elem_id="asym-tool-choice",
            )
            example = gr.Button("Insert example tool", size="sm", elem_id="asym-tools-example", min_width=100)
    quiet = dict(queue=False, api_visibility="private", show_progress="hidden")
    example.click(example_tools_text, None, [tools], **quiet)
    tool_choice.change(_tool_choice_update, [tool_choice], [tool_choice], **quiet)
    return tools, tool_choice
