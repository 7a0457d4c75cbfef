"""The tool-call panel: each call an answer makes, with every argument's value drawn as the tokens that produced it,
coloured by their source (accepted draft, fused at a rejection, bonus, ...) as in the answer panel, and a short
count per argument. Pure functions of a trace and a tokenizer; no Gradio.

The answer's text is the one :class:`~asymspec_mm.request.session.MMResult` reads calls from (the tokenizer's decoding of
all its tokens, special tokens skipped), and each token's characters in it are found by decoding the growing
prefix, so that a token that ends inside a multi-byte character, or that the tokenizer merges with the next,
still gets the characters it produced.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asymspec_mm.request.tools import parse_tool_calls, tool_call_spans

from .render import SOURCES, _Decoder, _get, esc, plural, render_token

__all__ = [
    "ARGUMENTS_KEY",
    "NO_CALL_TEXT",
    "Argument",
    "answer_text",
    "argument_spans",
    "render_tool_calls_html",
    "token_offsets",
    "tool_call_arguments",
]

#: The panel's text when the answer calls no tool.
NO_CALL_TEXT = "No tool call in this answer."
PANEL_TITLE = "Tool calls"
PANEL_SUB = "each argument's value as the tokens that wrote it"
#: The row of arguments that are one value rather than an object's members (``[1, 2]``, ``3``, ``null``).
ARGUMENTS_KEY = "(arguments)"
#: A character range of the answer's text, end exclusive.
Span = tuple[int, int]


@dataclass(frozen=True)
class Argument:
    """One argument of a call: its ``key``, its ``value`` (parsed), where its JSON text lies in the answer's text,
    and the trace indices of the tokens that produced it (in order)."""

    key: str
    value: Any
    span: Span
    tokens: tuple[int, ...]


def answer_text(trace: Sequence[Any], tokenizer: Any = None) -> str:
    """The answer's text as the result reads calls from it (the events' texts joined without a tokenizer)."""
    if tokenizer is None:
        return "".join(_get(ev, "text") or "" for ev in trace)
    return tokenizer.decode([int(_get(ev, "token_id")) for ev in trace], skip_special_tokens=True)


def token_offsets(trace: Sequence[Any], tokenizer: Any = None) -> tuple[str, list[Span]]:
    """The answer's text and each token's characters in it, ``(start, end)``.

    With a tokenizer, the text is ``tokenizer.decode(ids, skip_special_tokens=True)`` (as the result's text) and a
    token ends where the decoded prefix up to it stops agreeing with the text: a token that leaves a character
    unfinished produces nothing yet (an empty span at the character's start), the one that finishes it produces it.
    Without one, the events' own texts are joined."""
    text = answer_text(trace, tokenizer)
    if tokenizer is None:
        spans, pos = [], 0
        for ev in trace:
            n = len(_get(ev, "text") or "")
            spans.append((pos, pos + n))
            pos += n
        return text, spans
    ids = [int(_get(ev, "token_id")) for ev in trace]
    spans, pos = [], 0
    for i in range(len(ids)):
        # quadratic in the answer's length; the panel reads it once, when the answer is done
        prefix = text if i == len(ids) - 1 else tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        end = max(pos, len(os.path.commonprefix([prefix, text])))
        spans.append((pos, end))
        pos = end
    return text, spans


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def argument_spans(args_text: str) -> list[tuple[str, Any, Span]]:
    """The top-level members of a JSON object's text, each as ``(key, value, (start, end))`` of its value's text
    (an empty list when it is not an object)."""
    decoder = json.JSONDecoder()
    out: list[tuple[str, Any, Span]] = []
    pos = _skip_ws(args_text, 0)
    if not args_text.startswith("{", pos):
        return out
    pos = _skip_ws(args_text, pos + 1)
    try:
        while pos < len(args_text) and args_text[pos] != "}":
            key, pos = decoder.raw_decode(args_text, pos)
            pos = _skip_ws(args_text, pos)
            if not args_text.startswith(":", pos):
                return out
            start = _skip_ws(args_text, pos + 1)
            value, end = decoder.raw_decode(args_text, start)
            out.append((str(key), value, (start, end)))
            pos = _skip_ws(args_text, end)
            if args_text.startswith(",", pos):
                pos = _skip_ws(args_text, pos + 1)
    except json.JSONDecodeError:
        pass
    return out


def _overlaps(token: Span, value: Span) -> bool:
    """Whether a token produced characters of a value (an empty token: whether it stands inside it)."""
    (s, e), (a, b) = token, value
    return s < b and e > a if s < e else a <= s < b


def tool_call_arguments(text: str, spans: Sequence[Span], calls: Sequence[dict[str, Any]], finished: bool = False) -> list[list[Argument]]:
    """Per call (OpenAI-shaped, as parsed from ``text``), its arguments with the tokens that produced each value; a
    token that straddles two values belongs to the first one it overlaps. Where each call's arguments are written is
    the parser's to say (:func:`~asymspec_mm.request.tools.tool_call_spans`: a close tag inside a string does not end
    a block); arguments written as a JSON string are produced, every value, by the tokens of that string; arguments
    that are one value (a list, a number, ...) are one row, :data:`ARGUMENTS_KEY`. ``finished``:
    as :func:`~asymspec_mm.request.tools.parse_tool_calls` read the calls."""
    shown: set[int] = set()
    out = []
    for call, (start, end) in zip(calls, tool_call_spans(text, finished=finished)):
        written, carried = text[start:end], call["function"]["arguments"]
        if written.startswith("{"):
            members = [(key, value, (start + a, start + b)) for key, value, (a, b) in argument_spans(written)]
        elif carried.startswith("{"):  # a string holding an object: every value by the string's tokens
            members = [(key, value, (start, end)) for key, value, _ in argument_spans(carried)]
        else:  # a list, a number, true / false, null or a plain string: the arguments are one value
            members = [(ARGUMENTS_KEY, json.loads(carried), (start, end))]
        args = []
        for key, value, span in members:
            tokens = tuple(i for i, t in enumerate(spans) if i not in shown and _overlaps(t, span))
            shown.update(tokens)
            args.append(Argument(key, value, span, tokens))
        out.append(args)
    return out


def _summary(events: Sequence[Any]) -> tuple[str, bool]:
    """``2 accepted, 1 fused`` for an argument's tokens, and whether any of them was steered."""
    counts: dict[str, int] = {}
    for ev in events:
        source = str(_get(ev, "source", "greedy"))
        counts[source] = counts.get(source, 0) + 1
    order = [s for s in SOURCES if s in counts] + sorted(s for s in counts if s not in SOURCES)
    steered = any(bool(_get(ev, "steered", False)) for ev in events)
    return ", ".join(f"{counts[s]} {s}" for s in order), steered


def _render_argument(arg: Argument, trace: Sequence[Any], text: str, spans: Sequence[Span], dec: _Decoder) -> str:
    a, b = arg.span
    toks = []
    for i in arg.tokens:
        s, e = spans[i]
        # the part of the token inside the value (its whole text is in the hover box)
        toks.append(render_token(trace[i], dec, shown=text[max(s, a) : min(e, b)]))
    events = [trace[i] for i in arg.tokens]
    summary, steered = _summary(events)
    mark = ' <span class="asym-tool-steered" title="a token differs from what the verifier alone would emit">steered</span>'
    sources = ",".join(str(_get(ev, "source", "greedy")) for ev in events)
    return (
        f'<div class="asym-tool-arg" data-arg="{esc(arg.key)}" data-value="{esc(json.dumps(arg.value))}" '
        f'data-sources="{esc(sources)}" data-steered="{1 if steered else 0}">'
        f'<span class="asym-tool-key">{esc(arg.key)}</span> <span class="asym-tool-eq">=</span> '
        f'<span class="asym-tool-value">{"".join(toks)}</span>'
        f'<span class="asym-tool-summary">{esc(summary)}{mark if steered else ""}</span></div>'
    )


def render_tool_calls_html(trace: Sequence[Any], tokenizer: Any = None, *, empty: str = NO_CALL_TEXT, finished: bool = False) -> str:
    """The tool-call panel of an answer's ``trace`` (:class:`~asymspec_mm.decode.TokenEvent` objects or their
    ``as_dict()``): per call (``div.asym-tool-call[data-name]``) its function's name and each argument
    (``div.asym-tool-arg[data-arg]``) as ``key = value``, the value drawn as its tokens (the answer panel's
    ``span.tok`` with their hover box; a token shows the characters it produced inside the value) with a count of
    their sources and a steered mark. ``empty`` when the answer calls no tool; why its calls could not be read when
    a ``<tool_call>`` block is malformed. ``finished``: the model ended the answer (not the token budget), so a last
    block it left without ``</tool_call>`` may be a call, as the result reads it (``not res.cut_by_budget``)."""
    parsed = parse_tool_calls(answer_text(trace, tokenizer) if trace else "", finished=finished)
    if not parsed.tool_calls:
        state, note = ("problem", f"The tool call could not be read: {parsed.problem}.") if parsed.problem else ("empty", empty)
        return _panel(state, 0, f'<p class="asym-empty">{esc(note)}</p>')
    text, spans = token_offsets(trace, tokenizer)  # only for an answer with calls: it decodes every prefix
    dec = _Decoder(tokenizer)
    parts = []
    for n, (call, args) in enumerate(zip(parsed.tool_calls, tool_call_arguments(text, spans, parsed.tool_calls, finished))):
        name = call["function"]["name"]
        rows = "".join(_render_argument(arg, trace, text, spans, dec) for arg in args)
        if not args:
            rows = '<div class="asym-empty">(no arguments)</div>'
        parts.append(
            f'<div class="asym-tool-call" data-call="{n}" data-name="{esc(name)}">'
            f'<div class="asym-tool-name"><span class="asym-tool-fn">{esc(name)}</span> '
            f'<span class="asym-tool-count">{plural(len(args), "argument")}</span></div>{rows}</div>'
        )
    return _panel("calls", len(parsed.tool_calls), "".join(parts))


def _panel(state: str, calls: int, body: str) -> str:
    # an .asym-panel, so that its tokens take the answer panel's colours and hover box (ui.page_js)
    return (
        f'<div class="asym-panel asym-tool-calls" data-tool-state="{state}" data-calls="{calls}">'
        f'<div class="asym-panel-title">{esc(PANEL_TITLE)} <span class="asym-panel-sub">{esc(PANEL_SUB)}</span></div>{body}</div>'
    )
