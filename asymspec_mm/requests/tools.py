"""Tool calls in Qwen's format: the tools a request offers, the calls an answer makes, and the same calls as they
stream.

Qwen3 and Qwen3-VL are trained (and their chat templates written) to call a function as a JSON object between
``<tool_call>`` and ``</tool_call>`` on lines of their own: ``<tool_call>\\n{"name": "add", "arguments": {"a": 2}}
\\n</tool_call>``, one block per call. :func:`parse_tool_calls` reads an answer's text into the text before the first
call (the message's content) and OpenAI-shaped calls; a block whose JSON does not parse leaves the whole answer as
content with no calls (OpenAI's ``finish_reason`` is then ``stop``), as a model that did not call a tool.
:class:`ToolCallStream` reads the same text as it grows and gives OpenAI's streamed deltas: content, then for each
call its id and name once the name is complete, then its arguments piece by piece as they are generated; the
deltas of a call join to exactly what :func:`parse_tool_calls` returns for it (arguments are the JSON text the
model wrote, checked to parse).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import UnknownOptionError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*', re.S)

#: ``tool_choice`` values that leave the output free (``required`` and a named function constrain it to calls).
FREE_CHOICES = ("none", "auto")


class ToolError(UnknownOptionError):
    """A ``tools`` / ``tool_choice`` / ``response_format`` argument the toolkit cannot use (one line naming the
    problem; ``param``: the request field it is about)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` as OpenAI function tools (``[{"type": "function", "function": {"name", "description"?,
    "parameters"?}}]``), checked; a :class:`ToolError` names the first bad entry."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError("tools must be a list of {'type': 'function', 'function': {...}} objects", "tools")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'", "tools")
        if name in names:
            raise ToolError(f"tools[{i}].function.name {name!r} is offered twice", "tools")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.add(name)
        out.append({"type": "function", "function": {**fn, "parameters": dict(params)}})
    return out


def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]]) -> Any:
    """``tool_choice`` checked: ``"none"``, ``"auto"`` (the default with tools; ``none`` without), ``"required"``
    or ``{"type": "function", "function": {"name": ...}}`` naming an offered tool (the last two force calls)."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice in FREE_CHOICES:
        return tool_choice
    if tool_choice == "required" or isinstance(tool_choice, Mapping):
        if not tools:
            raise ToolError(f"tool_choice={json.dumps(tool_choice)[:60]} forces a tool call, but no tools are offered", "tool_choice")
        if isinstance(tool_choice, Mapping):
            fn = tool_choice.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if tool_choice.get("type") != "function" or name not in {t["function"]["name"] for t in tools}:
                raise ToolError(f"tool_choice={json.dumps(tool_choice)[:80]} must name one of the offered tools", "tool_choice")
        return tool_choice
    raise ToolError(f"tool_choice={json.dumps(tool_choice)[:60]} is not one of none, auto, required or a named function", "tool_choice")


def prompt_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    """The tools the templates render: none under ``tool_choice="none"`` (OpenAI's meaning: the model does not call
    a tool). Out of the prompt rather than masked by a grammar: it works on every engine (vLLM's cannot follow a
    grammar here) and without the optional xgrammar, and a model that sees tools but may not open a call writes
    what follows a blocked call (the tiny pair: ``</tool_call>``)."""
    return [] if tool_choice == "none" else tools


def answer_stop_strings(stop_strings: tuple[str, ...], tools: list[dict[str, Any]], tool_choice: Any) -> tuple[str, ...]:
    """The stop strings an answer decodes with: with tools offered and ``tool_choice="none"``, also ``<tool_call>``,
    so that a model that opens a call anyway (copying the calls earlier in the conversation) ends its answer there:
    never call markup as content."""
    if tools and tool_choice == "none" and OPEN not in stop_strings:
        return (*stop_strings, OPEN)
    return stop_strings


def check_response_format(response_format: Any) -> None:
    """``None``, ``{"type": "text"}``, ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name":
    ..., "schema": {...}}}`` (whether the grammar engine takes the schema is known when it is compiled)."""
    if response_format is None or response_format in ({"type": "text"}, {"type": "json_object"}):
        return
    spec = response_format.get("json_schema") if isinstance(response_format, Mapping) else None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema" and isinstance(spec, Mapping):
        if isinstance(spec.get("schema"), Mapping):
            return
    raise ToolError(
        f"response_format={json.dumps(response_format)[:60]} is not text, json_object or "
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
        "response_format",
    )


def call_id(prefix: str, index: int) -> str:
    """The id of an answer's ``index``-th tool call: ``call_`` and a digest of ``prefix`` (what identifies the
    answer, e.g. the completion's id) and the index, the same streamed and not."""
    return "call_" + hashlib.sha256(f"{prefix}\x00{index}".encode()).hexdigest()[:24]


@dataclass
class ParsedAnswer:
    """An answer read for tool calls: ``content`` (the text before the first call; the whole text without calls),
    ``tool_calls`` (OpenAI's shape, ``arguments`` a JSON string) and why calls were not read (``problem``)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


def _args_end(text: str, start: int) -> int | None:
    """The end (exclusive) of the JSON object starting at ``text[start]``, or ``None`` while it is unfinished."""
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _read_call(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON text)`` of one call block's body, or ``None`` when it is not a call."""
    head = _HEAD.match(body)
    if head is None or not body[head.end() :].startswith("{"):
        return None
    end = _args_end(body, head.end())
    if end is None or body[end:].strip() != "}":
        return None
    args = body[head.end() : end]
    try:
        if not isinstance(json.loads(args), dict):
            return None
        return json.loads(head.group(1)), args
    except json.JSONDecodeError:
        return None


def parse_tool_calls(text: str, id_prefix: str = "") -> ParsedAnswer:
    """The content and tool calls of an answer's ``text`` (module docstring); call ids from :func:`call_id` of
    ``id_prefix`` (default: the text)."""
    first = text.find(OPEN)
    if first < 0:
        return ParsedAnswer(text)
    calls, pos = [], first
    while pos >= 0:
        end = text.find(CLOSE, pos)
        if end < 0:
            return ParsedAnswer(text, problem="a <tool_call> block is not closed")
        read = _read_call(text[pos + len(OPEN) : end])
        if read is None:
            return ParsedAnswer(text, problem="a <tool_call> block does not hold {'name': ..., 'arguments': {...}}")
        name, args = read
        ident = call_id(id_prefix or text, len(calls))
        calls.append({"id": ident, "type": "function", "function": {"name": name, "arguments": args}})
        pos = text.find(OPEN, end + len(CLOSE))
        if pos < 0 and text[end + len(CLOSE) :].strip():
            return ParsedAnswer(text, problem="text follows the last tool call")
        if pos >= 0 and text[end + len(CLOSE) : pos].strip():
            return ParsedAnswer(text, problem="text between two tool calls")
    return ParsedAnswer(text[:first].rstrip() or None, calls)


class ToolCallStream:
    """OpenAI's streamed deltas of an answer whose text grows (module docstring). :meth:`push` takes the whole text so
    far and returns the new deltas: ``{"content": ...}`` and ``{"tool_calls": [{"index", "id", "type", "function":
    {"name", "arguments": ""}}]}`` then ``{"tool_calls": [{"index", "function": {"arguments": piece}}]}``;
    :meth:`finish` takes the final text and returns what is left (content the stream held back, or a parse that
    failed: the answer is then content after all)."""

    def __init__(self, id_prefix: str) -> None:
        self.id_prefix = id_prefix  # the calls' ids: call_id(id_prefix, index), as parse_tool_calls(text, id_prefix)
        self.sent_content = ""
        self.calls: list[dict[str, Any]] = []  # per call: name, args text sent
        self.failed = False

    @staticmethod
    def _content_part(text: str) -> str:
        """The content that can be sent: the text before the first call, or with no call yet the text but a
        possible start of ``<tool_call>``; trailing spaces held back (content before a call is right-stripped)."""
        first = text.find(OPEN)
        if first < 0:
            hold = next((n for n in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:n])), 0)
            first = len(text) - hold
        return text[:first].rstrip()

    def push(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        content = self._content_part(text)
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            out.append({"content": content[len(self.sent_content) :]})
            self.sent_content = content
        first = text.find(OPEN)
        if first < 0 or self.failed:
            return out
        pos, index = first, 0
        while pos >= 0:
            body_start = pos + len(OPEN)
            end = text.find(CLOSE, body_start)
            body = text[body_start : end if end >= 0 else len(text)]
            head = _HEAD.match(body)
            if head is None:
                break
            if index == len(self.calls):
                self.calls.append({"args": ""})
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id(self.id_prefix, index),
                                "type": "function",
                                "function": {"name": json.loads(head.group(1)), "arguments": ""},
                            }
                        ]
                    }
                )
            stop = _args_end(body, head.end()) if body[head.end() :].startswith("{") else None
            args = body[head.end() : stop] if stop is not None else body[head.end() :]
            if stop is None:
                args = args.rstrip()  # the object's end is not known yet: trailing spaces may be the block's
            sent = self.calls[index]["args"]
            if args.startswith(sent) and len(args) > len(sent):
                out.append({"tool_calls": [{"index": index, "function": {"arguments": args[len(sent) :]}}]})
                self.calls[index]["args"] = args
            if end < 0:
                break
            index += 1
            pos = text.find(OPEN, end + len(CLOSE))
        return out

    def finish(self, text: str, parsed: ParsedAnswer) -> list[dict[str, Any]]:
        """The deltas that complete the stream for the final ``text`` and its :func:`parse_tool_calls` result."""
        out = self.push(text) if parsed.tool_calls else []
        if not parsed.tool_calls:
            self.failed = True
            rest = text[len(self.sent_content) :] if text.startswith(self.sent_content) else ""
            return [{"content": rest}] if rest else []
        for i, call in enumerate(parsed.tool_calls):
            sent = self.calls[i]["args"] if i < len(self.calls) else ""
            want = call["function"]["arguments"]
            if want.startswith(sent) and len(want) > len(sent):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": want[len(sent) :]}}]})
        return out
