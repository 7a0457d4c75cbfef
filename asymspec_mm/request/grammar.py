"""Grammar-constrained output with xgrammar: forced tool calls and JSON answers.

``tool_choice="required"`` (one or more calls to the offered tools), a named function (one call to it),
``response_format`` ``json_object`` / ``json_schema`` (JSON with fixed separators and no free whitespace, so a model
cannot fill its budget with spaces) and the kinds vLLM's ``structured_outputs`` adds (``regex``, ``choice``, an EBNF
``grammar``) each become a grammar over the pair's shared vocabulary, and
each constrained row of the decoder carries a :class:`GrammarConstraint`: a matcher that knows which tokens may come
next. Why xgrammar: it is what vLLM and SGLang use for these very options, so an output here is what a Qwen
deployment would give; its matcher rolls back, which speculative decoding needs (drafts are pushed tentatively and
the rejected ones taken back), and it compiles JSON schemas and EBNF into token masks in microseconds per token.

How the decoder uses a constraint (:mod:`asymspec_mm.decode.rows`): each draft is the drafter's argmax under the
mask of its position (drafts are always valid), the same mask applies to the gate's inputs ``a``, ``b`` and ``t``
at that position (a forbidden token's logit is :data:`~asymspec_mm.decode.constraints.FORBIDDEN` in all three, so
``delta = a - b`` is 0 there and the fused and bonus tokens are always allowed), and after the step the matcher
takes back the drafts and accepts the committed tokens.

Tool calls are written in Qwen's format, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, each
call's object a JSON schema with the name fixed and the tool's own parameters as ``arguments``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .tools import FREE_CHOICES, ToolError

#: Separators of the JSON the grammars allow (Qwen's, and ``json.dumps``'s), with no free whitespace.
SEPARATORS = (", ", ": ")


#: xgrammar writes the characters of a string with ``maxLength`` as ``[^"\\\r\n]``, which lets control characters
#: through (JSON forbids them unescaped); the grammars here use JSON's own class instead.
_LOOSE_CHARS, _JSON_CHARS = '[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\]'

#: The time and C++ source location xgrammar puts before its messages (``[02:42:39] /project/cpp/x.cc:94: ``).
_WHERE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def _json(schema: Mapping[str, Any], param: str):
    import xgrammar as xgr

    grammar = _checked(
        lambda: xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS),
        param,
        "JSON schema",
        "invalid_json_schema",
    )
    ebnf = str(grammar)
    return xgr.Grammar.from_ebnf(ebnf.replace(_LOOSE_CHARS, _JSON_CHARS)) if _LOOSE_CHARS in ebnf else grammar


def _checked(build, param: str, what: str, code: str = "invalid_grammar"):
    """``build()``'s grammar, or a one-line :class:`ToolError` naming ``param`` (the field's path, e.g.
    ``response_format.json_schema.schema``) with xgrammar's reason and ``code``."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - xgrammar raises several types; the message is what the user needs
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        reason = _WHERE.sub("", line)[:200]
        raise ToolError(f"{param}: the {what} cannot be compiled to a grammar: {reason}", param, code) from None


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal: quotes, backslashes and control characters escaped, the rest as is."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if ord(c) >= 0x20 else f"\\x{ord(c):02x}" for c in escaped) + '"'


def choice_grammar(choices: Sequence[str]):
    """Exactly one of ``choices`` (vLLM's ``choice``)."""
    import xgrammar as xgr

    build = lambda: xgr.Grammar.from_ebnf("root ::= " + " | ".join(_literal(c) for c in choices))  # noqa: E731
    return _checked(build, "response_format.choice", "choice")


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params}, "required": ["name", "arguments"]}


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], *, repeat: bool = True, indices: Sequence[int] | None = None):
    """One call (``repeat``: one or more, a blank line between) to one of ``tools`` in Qwen's format; ``indices``:
    each tool's place in the request's ``tools`` (default: their order), which a refusal of its parameters names."""
    import xgrammar as xgr

    if not tools:
        raise ToolError("a forced tool call needs tools: none are offered", "tool_choice")
    places = range(len(tools)) if indices is None else indices
    calls = [_json(_call_schema(t), f"tools[{i}].function.parameters") for i, t in zip(places, tools)]
    call = xgr.Grammar.union(*calls) if len(calls) > 1 else calls[0]
    block = xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), call, xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')
    )
    if not repeat:
        return block
    more = xgr.Grammar.concat(xgr.Grammar.from_ebnf('root ::= "\\n"'), block)
    rest = xgr.Grammar.from_ebnf('root ::= ""')
    for _ in range(3):  # up to four calls in one answer (parallel tool calls)
        rest = xgr.Grammar.union(xgr.Grammar.from_ebnf('root ::= ""'), xgr.Grammar.concat(more, rest))
    return xgr.Grammar.concat(block, rest)


def output_grammar(tools: Sequence[Mapping[str, Any]], tool_choice: Any, response_format: Any):
    """The grammar a request's options ask for, or ``None`` (free output): ``tool_choice`` ``required`` or
    ``{"type": "function", "function": {"name": ...}}``, ``response_format`` ``json_object``, ``json_schema``,
    ``regex``, ``choice`` or ``grammar`` (:data:`~asymspec_mm.request.tools.EXTRA_FORMATS`)."""
    if tool_choice == "required":
        return tool_call_grammar(tools)
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name") if tool_choice.get("type") == "function" else None
        chosen = [i for i, t in enumerate(tools) if t["function"]["name"] == name]
        if not chosen:
            raise ToolError(f"tool_choice names {name!r}, which is not among the offered tools", "tool_choice")
        return tool_call_grammar([tools[i] for i in chosen], repeat=False, indices=chosen)
    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "json_object":  # any object, with json_schema's separators and no free whitespace
        return _json({"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ToolError(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}', "response_format.json_schema"
            )
        return _json(schema, "response_format.json_schema.schema")
    import xgrammar as xgr

    if kind == "regex":
        return _checked(lambda: xgr.Grammar.from_regex(response_format["regex"]), "response_format.regex", "regex")
    if kind == "choice":
        return choice_grammar(response_format["choice"])
    if kind == "grammar":
        return _checked(lambda: xgr.Grammar.from_ebnf(response_format["grammar"]), "response_format.grammar", "EBNF grammar")
    raise ToolError(
        f"response_format type {kind!r} is not one of text, json_object, json_schema, regex, choice, grammar", "response_format"
    )


def _xgrammar() -> Any:
    """The xgrammar module, or a one-line :class:`ToolError` saying how to install it."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ToolError("forced tool calls and JSON answers need xgrammar: pip install 'asymspec-mm[grammar]'") from None
    return xgr


def check_output_grammar(tools: Sequence[Mapping[str, Any]], tool_choice: Any, response_format: Any) -> Any:
    """The grammar these options ask for (``None``: free output), built before the request queues; options whose
    grammar cannot be built (a JSON schema, regex or EBNF xgrammar rejects, or no xgrammar) raise the
    :class:`ToolError` that :meth:`GrammarCompiler.compile` would raise at set-up. Building the grammar is what fails
    on bad options; compiling it against the vocabulary (the slow part) is left to the set-up, which is handed this
    grammar (:meth:`GrammarCompiler.compile`'s ``grammar``) rather than building it again."""
    if (tool_choice is None or tool_choice in FREE_CHOICES) and response_format in (None, {"type": "text"}):
        return None  # free output: no grammar
    _xgrammar()
    return output_grammar(tools, tool_choice, response_format)


class GrammarCompiler:
    """Compiles grammars for one tokenizer and vocabulary width (the models' logits), caching by request options."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]):
        xgr = _xgrammar()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(self.info)
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def compile(self, tools: Sequence[Mapping[str, Any]], tool_choice: Any, response_format: Any, *, grammar: Any = None) -> Any:
        """The compiled grammar of these options, or ``None`` for free output. ``grammar``: these options' grammar
        as the submission's check built it (:func:`check_output_grammar`), compiled on a cache miss instead of
        building it again."""
        key = json.dumps([tools, tool_choice, response_format], sort_keys=True, default=str)
        with self._lock:
            if key not in self._cache:
                if grammar is None:
                    grammar = output_grammar(tools, tool_choice, response_format)
                self._cache[key] = None if grammar is None else self._compiler.compile_grammar(grammar)
            return self._cache[key]


class GrammarConstraint:
    """One row's matcher (see the module docstring): :meth:`mask` the tokens allowed next, :meth:`push` a token
    tentatively (a draft), :meth:`settle` the step (take the drafts back, accept what was committed)."""

    def __init__(self, compiled: Any, vocab_size: int):
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)  # its rollback is unbounded: a step takes back up to K + 1 drafts
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._bits = torch.arange(32, dtype=torch.int32)
        self.vocab_size = vocab_size
        self.tentative = 0  # tokens pushed since the last settle
        self.stop_ids = list(compiled.tokenizer_info.stop_token_ids)

    def mask(self) -> torch.Tensor:
        """``[V]`` bool: the tokens the grammar allows next (after a finished output: only the stop tokens)."""
        if self._matcher.is_terminated():
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            allowed[self.stop_ids] = True
            return allowed
        self._matcher.fill_next_token_bitmask(self._bitmask)
        return ((self._bitmask[0].unsqueeze(-1) >> self._bits) & 1).bool().flatten()[: self.vocab_size]

    def push(self, token: int) -> None:
        """Advance on a draft (taken back at :meth:`settle`); nothing after the output is finished."""
        if not self._matcher.is_terminated():
            if not self._matcher.accept_token(int(token)):
                raise RuntimeError(f"the grammar refused draft token {token}, which its own mask allowed")
            self.tentative += 1

    def settle(self, committed: Sequence[int]) -> None:
        """The step is over: take back its drafts and accept the ``committed`` tokens."""
        if self.tentative:
            self._matcher.rollback(self.tentative)
            self.tentative = 0
        for token in committed:
            if self._matcher.is_terminated():
                break
            if not self._matcher.accept_token(int(token)):
                raise RuntimeError(f"the grammar refused committed token {token}")

    @property
    def finished(self) -> bool:
        return self._matcher.is_terminated()
