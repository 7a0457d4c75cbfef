"""Tool calls in Qwen's format: the tools a request offers, the calls an answer makes, and the same calls as they
stream.

Qwen3 and Qwen3-VL are trained (and their chat templates written) to call a function as a JSON object between
``<tool_call>`` and ``</tool_call>`` on lines of their own: ``<tool_call>\\n{"name": "add", "arguments": {"a": 2}}
\\n</tool_call>``, one block per call. :func:`parse_tool_calls` reads an answer's text:

- a block is ``<tool_call>``, a JSON object, ``</tool_call>`` (blanks between). The object's end is found by reading
  the JSON (a ``</tool_call>`` inside a string is part of the string), and it is a call when it has a non-empty
  string ``name`` and an ``arguments`` member, any JSON value, as vLLM's hermes parser takes them: its text as the
  model wrote it (an object, and also a list, a number, ``true`` / ``false`` or ``null``: a tool whose parameters
  schema is not an object gets those, and a forced call's grammar writes them); a string holding an object's JSON,
  that string's content; any other string (``"hello"``, ``"{hello world}"``), the string's own JSON literal as
  written, so that ``arguments`` is always valid JSON. Other members are ignored; a block without ``arguments`` is
  not a call.
- when the model ends its answer itself (its end-of-turn token or a stop string, ``finished=True``) with a block
  whose call object is complete but whose ``</tool_call>`` never came, that block is a call too (vLLM reads a block
  up to the end of the text the same way). A cut by the token budget is not: the model may have meant more.
- the content is the text before the first ``<tool_call>`` (blanks at its end dropped; ``None`` when nothing is
  left). The calls are the blocks read from there; text between or after them is left out (as vLLM does), and
  reading stops at the first block that is not a call (it and what follows are left out).
- when the first block is not a call (malformed, or not closed and not ended by the model: an answer cut by the token
  budget) the answer has no calls and all of its text is the content, as from a model that did not call a tool.

Those rules make a call final the moment its block closes and parses: nothing the model writes after it can take it
back (a block the model ended without its close tag is known to be a call only at the end: it goes out then). :class:`ToolCallStream` relies on that to stream without contradicting the answer: it sends a call whole once
its block is read, and content once no continuation can change it, so the deltas joined are exactly what
:func:`parse_tool_calls` reads from the final text (``arguments`` are the JSON text the model wrote).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from json.decoder import scanstring
from typing import Any

from ..base.errors import UnknownOptionError
from ..base.frozen import thawed

OPEN, CLOSE = "<tool_call>", "</tool_call>"

#: ``tool_choice`` values that leave the output free (``required`` and a named function constrain it to calls).
FREE_CHOICES = ("none", "auto")


class ToolError(UnknownOptionError):
    """A ``tools`` / ``tool_choice`` / ``response_format`` argument the toolkit cannot use (one line naming the
    problem; ``param``: the request field it is about, as a path such as ``tools[0].function.parameters``;
    ``code``: a short machine code where a server should send one, e.g. ``invalid_json_schema``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


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
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}", f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-'", f"tools[{i}].function.name")
        if name in names:
            raise ToolError(f"tools[{i}].function.name {name!r} is offered twice", f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object", f"tools[{i}].function.parameters")
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


#: The members of a function that describe it to the model; the rest (``strict``, keys of other APIs) stay out of
#: the prompt: they say how the server should treat the calls, and a model that reads them answers differently.
PROMPT_FUNCTION_KEYS = ("name", "description", "parameters")


def template_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A checked tool as the chat templates see it: ``{"type": "function", "function": {"name", "description"?,
    "parameters"}}`` (:data:`PROMPT_FUNCTION_KEYS`), whatever else the request's entry holds."""
    return {"type": "function", "function": {k: v for k, v in tool["function"].items() if k in PROMPT_FUNCTION_KEYS}}  # the caller's order


def prompt_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[dict[str, Any]]:
    """The tools the templates render (:func:`template_tool` of each): none under ``tool_choice="none"`` (OpenAI's
    meaning: the model does not call a tool). Out of the prompt rather than masked by a grammar: it works on every
    engine (vLLM's cannot follow a grammar here) and without the optional xgrammar, and a model that sees tools but
    may not open a call writes what follows a blocked call (the tiny pair: ``</tool_call>``). Plain ``dict`` and ``list``
    copies (:func:`~asymspec_mm.base.frozen.thawed`): a checked request's tools are read-only, a template gets its own."""
    return [] if tool_choice == "none" else [thawed(template_tool(t)) for t in tools]


def answer_stop_strings(stop_strings: tuple[str, ...], tools: list[dict[str, Any]], tool_choice: Any) -> tuple[str, ...]:
    """The stop strings an answer decodes with: with tools offered and ``tool_choice="none"``, also ``<tool_call>``,
    so that a model that opens a call anyway (copying the calls earlier in the conversation) ends its answer there:
    never call markup as content."""
    if tools and tool_choice == "none" and OPEN not in stop_strings:
        return (*stop_strings, OPEN)
    return stop_strings


#: The ``response_format`` kinds beyond OpenAI's (vLLM's ``structured_outputs`` as the server maps them): each one key
#: holding its value, checked here for shape; whether xgrammar compiles the value is known when it is compiled.
EXTRA_FORMATS = {"regex": str, "choice": list, "grammar": str}


def check_response_format(response_format: Any) -> None:
    """``None``, ``{"type": "text"}``, ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"name":
    ..., "schema": {...}}}``, or one of :data:`EXTRA_FORMATS`: ``{"type": "regex", "regex": "..."}``, ``{"type":
    "choice", "choice": ["...", ...]}`` (non-empty strings), ``{"type": "grammar", "grammar": "<EBNF>"}``."""
    if response_format is None or response_format in ({"type": "text"}, {"type": "json_object"}):
        return
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), Mapping):
        if isinstance(response_format["json_schema"].get("schema"), Mapping):
            return
    if kind in EXTRA_FORMATS:
        value = response_format.get(kind)
        if kind == "choice":
            if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) and c for c in value):
                return
            raise ToolError("response_format choice needs a non-empty list of non-empty strings", "response_format.choice")
        if isinstance(value, str) and value.strip():
            return
        raise ToolError(f"response_format {kind} needs a non-empty string in {kind!r}", f"response_format.{kind}")
    raise ToolError(
        f"response_format={json.dumps(response_format)[:60]} is not text, json_object, "
        '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}, regex, choice or grammar',
        "response_format",
    )


def call_id(prefix: str, index: int) -> str:
    """The id of an answer's ``index``-th tool call: ``call_`` and a digest of ``prefix`` (what identifies the
    answer, e.g. the completion's id) and the index, the same streamed and not."""
    return "call_" + hashlib.sha256(f"{prefix}\x00{index}".encode()).hexdigest()[:24]


@dataclass
class ParsedAnswer:
    """An answer read for tool calls: ``content`` (the text before the first call, ``None`` when blank; the whole
    text when there is no call), ``tool_calls`` (OpenAI's shape, ``arguments`` the JSON text the model wrote) and what was
    not read (``problem``: why there are no calls, or what the calls leave out)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


NOT_A_CALL = "a <tool_call> block does not hold {'name': ..., 'arguments': ...}"
NOT_CLOSED = "a <tool_call> block is not closed"
_WS = " \t\n\r"  # JSON's whitespace, the only blanks a block may hold around its object
#: the next character that matters outside a JSON string: a brace, a quote, or one no JSON text has there (a letter
#: outside true/false/null, '<', ...): what may follow it can no longer make the block a call
_NEXT = re.compile(r"[^ \t\n\r\[\]:,\-+.0-9eEtrufalsn]")
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # the rest of a JSON string, through its closing quote


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


#: Python's decoder takes NaN and Infinity, which JSON (and the clients that read the arguments) do not
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _object_end(text: str, start: int) -> int | None:
    """The end (exclusive) of the JSON object opening at ``text[start]``, found string-aware (a ``}`` or a
    ``</tool_call>`` inside a string does not end it); ``None`` while the text may still close it, ``-1`` when no
    continuation can make it JSON."""
    depth, i = 0, start
    while (m := _NEXT.search(text, i)) is not None:
        ch, i = m.group(), m.end()
        if ch == '"':
            rest = _STRING_REST.match(text, i)
            if rest is None:
                return None  # the string is still open
            i = rest.end()
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        else:
            return -1
    return None


def _member_span(obj: str, key: str) -> tuple[int, int]:
    """Where the value of ``obj``'s (last) top-level member ``key`` is written; ``obj`` is a valid JSON object."""
    found, i = (0, 0), _skip_ws(obj, 1)
    while obj[i] != "}":
        name, i = scanstring(obj, i + 1)
        i = _skip_ws(obj, _skip_ws(obj, i) + 1)  # past the ':'
        end = _DECODER.raw_decode(obj, i)[1]
        if name == key:
            found = (i, end)
        i = _skip_ws(obj, end)
        if obj[i] == ",":
            i = _skip_ws(obj, i + 1)
    return found


def _holds_object(text: str) -> bool:
    """Whether ``text`` is exactly one JSON object's text (blanks around it allowed)."""
    try:
        return isinstance(_DECODER.decode(text), dict)
    except (ValueError, RecursionError):
        return False


def _read_call(obj: str) -> tuple[str, str, tuple[int, int]] | None:
    """``(name, arguments JSON text, where the arguments are written in obj)`` of a block's JSON object, or ``None``
    when it is not a call. ``arguments`` is any JSON value, its text kept as the model wrote it (``{"a": 1}``,
    ``[1, 2]``, ``3``, ``null``), or a string, as vLLM's hermes parser takes it: one holding an object's JSON gives
    that content, any other gives its own JSON literal as written (``"hello"``), so the arguments are JSON whatever
    the model wrote."""
    try:
        value = _DECODER.decode(obj)
    except (ValueError, RecursionError):
        return None
    name, args = value.get("name"), value.get("arguments")
    if not isinstance(name, str) or not name or "arguments" not in value:
        return None
    span = _member_span(obj, "arguments")
    if isinstance(args, str) and _holds_object(args):
        return name, args.strip(), span
    return name, obj[span[0] : span[1]], span


def _block(text: str, at: int) -> tuple[str, Any]:
    """The ``<tool_call>`` block at ``text[at]``: ``("call", (name, arguments, arguments' span, end of block))``,
    ``("open", None)`` while what follows may still make it a call, or ``("bad", why)`` once nothing can."""
    i = _skip_ws(text, at + len(OPEN))
    if i == len(text):
        return "open", None
    end = _object_end(text, i) if text[i] == "{" else -1
    if end is None:
        return "open", None
    call = _read_call(text[i:end]) if end > 0 else None
    if call is None:
        return "bad", NOT_A_CALL
    j = _skip_ws(text, end)
    tail = text[j : j + len(CLOSE)]
    if tail != CLOSE:
        return ("open", None) if CLOSE.startswith(tail) else ("bad", "text follows the JSON of a <tool_call> block inside it")
    name, args, (a, b) = call
    return "call", (name, args, (i + a, i + b), j + len(CLOSE))


@dataclass
class _Reading:
    """How far an answer's text reads as calls. Everything recorded is final for any longer text the answer may
    become, so a longer text's reading resumes from here (:func:`_read`)."""

    first: int = -1  # where the first <tool_call> starts (-1: none yet)
    calls: list[tuple[str, str, tuple[int, int]]] = field(default_factory=list)  # name, arguments, their span
    state: str = "text"  # text: no <tool_call> yet; open: a block undecided; bad: a block that is no call; after
    why: str | None = None  # state bad: why
    resume: int = 0  # where reading goes on: the end of the last call's block, else the first <tool_call>
    left_out: bool = False  # text stood between two calls


def _read(text: str, done: _Reading | None = None) -> _Reading:
    """The reading of ``text``, resumed from ``done`` (the reading of a prefix of it). Blocks are read from the first
    ``<tool_call>``; after a call, text up to the next ``<tool_call>`` is skipped, and reading stops at the first
    block that is not a call."""
    r = _Reading() if done is None else replace(done, calls=list(done.calls))
    if r.state == "bad":
        return r
    if r.first < 0:
        r.first = r.resume = text.find(OPEN)
        if r.first < 0:
            return r
    pos = r.resume
    while True:
        at = text.find(OPEN, pos) if r.calls else pos
        if at < 0:
            r.state = "after"
            return r
        kind, got = _block(text, at)
        if kind != "call":
            r.state, r.why = kind, got
            return r
        *call, end = got
        r.left_out = r.left_out or bool(text[pos:at].strip())
        r.calls.append(tuple(call))
        r.state, r.resume = "after", end
        pos = end


def _unclosed_call(text: str, at: int) -> tuple[str, str, tuple[int, int]] | None:
    """The call of the ``<tool_call>`` block at ``text[at]`` when its call object is complete and only blanks follow
    it to the end of ``text`` (the model ended the answer there instead of writing ``</tool_call>``), else ``None``."""
    i = _skip_ws(text, at + len(OPEN))
    end = _object_end(text, i) if text.startswith("{", i) else -1
    if end is None or end < 0 or _skip_ws(text, end) != len(text):
        return None
    call = _read_call(text[i:end])
    if call is None:
        return None
    name, args, (a, b) = call
    return name, args, (i + a, i + b)


def _final_reading(text: str, finished: bool) -> _Reading:
    """The reading of a whole answer: :func:`_read`'s, with a last block the model left unclosed read as a call when
    it ``finished`` the answer itself (module docstring)."""
    r = _read(text)
    if finished and r.state == "open":
        last = _unclosed_call(text, text.find(OPEN, r.resume))
        if last is not None:
            r.calls.append(last)
            r.state, r.resume = "after", len(text)
    return r


def parse_tool_calls(text: str, id_prefix: str = "", *, finished: bool = False) -> ParsedAnswer:
    """The content and tool calls of an answer's ``text`` (module docstring); call ids from :func:`call_id` of
    ``id_prefix`` (default: the text). ``finished``: the model ended the answer (its end-of-turn token or a stop
    string; not the token budget), so a last block it left without ``</tool_call>`` may still be a call."""
    r = _final_reading(text, finished)
    if r.first < 0:
        return ParsedAnswer(text)
    if not r.calls:
        return ParsedAnswer(text, problem=NOT_CLOSED if r.state == "open" else r.why)
    problem = None
    if r.state == "open":
        problem = f"{NOT_CLOSED} (the answer was cut short): it is left out"
    elif r.state == "bad":
        problem = f"{r.why}: it and the text after it are left out"
    elif r.left_out or text[r.resume :].strip():
        problem = "text between or after the tool calls is left out"
    ident = id_prefix or text
    calls = [{"id": call_id(ident, i), "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a, _) in enumerate(r.calls)]
    return ParsedAnswer(text[: r.first].rstrip() or None, calls, problem)


def tool_call_spans(text: str, *, finished: bool = False) -> list[tuple[int, int]]:
    """Per call :func:`parse_tool_calls` reads in ``text`` (``finished`` as there), where its arguments are written
    (``text[a:b]``: the object, or the string that holds it), e.g. to show which tokens wrote them."""
    r = _final_reading(text, finished)
    return [span for _, _, span in r.calls] if r.first >= 0 else []


def _partial_open(text: str) -> int:
    """How many characters at the end of ``text`` may be the start of a ``<tool_call>``."""
    return next((n for n in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:n])), 0)


class ToolCallStream:
    """OpenAI's streamed deltas of an answer whose text grows: :meth:`push` takes the whole text so far and returns
    what is certain and not yet sent, :meth:`finish` takes the final text and its :func:`parse_tool_calls` result
    and returns the rest. Nothing sent is ever taken back: joined, the deltas are the parsed answer (content
    ``parsed.content or ""``; the calls with their ids, names and arguments).

    Content goes out as soon as no continuation can change it: the text before the first ``<tool_call>`` (blanks
    and a possible start of the tag held back), or all of it once the first block can no longer be a call. A call
    goes out whole once its block has closed and parsed: ``{"tool_calls": [{"index", "id", "type": "function",
    "function": {"name", "arguments": ""}}]}`` then ``{"tool_calls": [{"index", "function": {"arguments"}}]}``.
    Give it the ``id_prefix`` given to :func:`parse_tool_calls` (not empty: the ids are drawn from it)."""

    def __init__(self, id_prefix: str) -> None:
        self.id_prefix = id_prefix
        self.sent_content = ""
        self.sent_calls = 0
        self._reading: _Reading | None = None

    def push(self, text: str) -> list[dict[str, Any]]:
        """The new deltas of the answer's text so far, ``text`` (the text of the previous push and more)."""
        r = self._reading = _read(text, self._reading)
        if r.first < 0:
            content = text[: len(text) - _partial_open(text)].rstrip()
        elif r.state == "bad" and not r.calls:
            content = text  # the answer calls nothing: all of it is content
        else:
            content = text[: r.first].rstrip()  # the content if calls follow, and the start of the whole text if not
        return self._send(content, [(n, a) for n, a, _ in r.calls])

    def finish(self, text: str, parsed: ParsedAnswer) -> list[dict[str, Any]]:
        """The deltas that complete the stream for the final ``text`` and its :func:`parse_tool_calls` result."""
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls]
        return self._send(parsed.content or "", calls)

    def _send(self, content: str, calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            out.append({"content": content[len(self.sent_content) :]})
            self.sent_content = content
        for index in range(self.sent_calls, len(calls)):
            name, args = calls[index]
            head = {"index": index, "id": call_id(self.id_prefix, index), "type": "function", "function": {"name": name, "arguments": ""}}
            out += [{"tool_calls": [head]}, {"tool_calls": [{"index": index, "function": {"arguments": args}}]}]
        self.sent_calls = max(self.sent_calls, len(calls))
        return out
