"""The tiny pair's agent examples: MiniVista ``agent`` tasks as the requests an agent loop makes, each rendered exactly
as ``pipe.chat`` renders it (the conversation layout, the real templates with their tools block) with the answer it
expects; and the tokens added to the tiny tokenizer for tool calls.

Two request formats: the OpenAI tools loop of :func:`~asymspec_mm.eval.agent_loop.run_agent_task` (the call, the
final answer after the tool's result, a follow-up) and smolagents' ``ToolCallingAgent`` (the call, then
``final_answer`` after an ``Observation:`` message), :func:`~asymspec_mm.eval.minivista_agent.smolagents_requests`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..eval import minivista as mv
from ..eval.minivista_agent import make_agent_problem, openai_requests, smolagents_requests
from .data import answer_ids, prompt_fields

#: Added to the tiny tokenizer (plain added tokens, as Qwen's own ``<tool_call>``): the tool tags, the fixed sentences
#: of the templates' tools block and the JSON of a function schema and a call. The corpus-built BPE splits them into
#: single characters (the two tools' block was 788 tokens, a call 59); with them the block is about a fifth of that.
TOOL_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "# Tools",
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "<tools>",
    "</tools>",
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:",
    '{"name": <function-name>, "arguments": <args-json-object>}',
    '{"type": "function", "function": {"name": "',
    '", "description": "',
    '", "parameters": {"type": "object", "properties": {',
    '{"type": "integer"',
    '{"type": "string"',
    '"description": "',
    '"minimum": ',
    '"maximum": ',
    '"required": [',
    '{"name": "',
    '", "arguments": {',
    "Calling tools:",
    "Observation:",
    "New task:",
    "'type': 'function', 'function': {'name': '",
    "', 'arguments': {",
)


def add_tool_tokens(tokenizer) -> int:
    """Add :data:`TOOL_TOKENS` to ``tokenizer`` (not special: they decode as text); returns how many were new."""
    from tokenizers import AddedToken

    return tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TOKENS])


def encode_request(
    messages: list[dict[str, Any]], target: str, problem: dict[str, Any], tools: list[dict[str, Any]], proc, tok, family: str
) -> dict[str, Any]:
    """One request as the pipeline renders it (``pipe.chat`` with the problem's caption and OCR for every image) and
    its answer; the keys of :func:`.data.encode` (``dec_idx`` / ``final_idx``: the first and last number of the
    answer, the call's two values or the final answer; ``read_idx``: the call's values, weighted for the drafter;
    ``copy_idx``: a final answer's copy of the tool's result)."""
    from ..request.conversation import parse_messages, view_messages, view_texts
    from ..request.prompts import tokenize_prompts

    turns = parse_messages(messages)
    images = [problem["image"] for turn in turns for _ in turn.images]
    view = mv.view_text(problem)
    vm = view_messages(turns, {k + 1: view for k in range(len(images))})
    pr = tokenize_prompts(proc, tok, images, view_texts(proc, tok, vm, tools=tools))
    ans = answer_ids(target, tok)
    numbers = number_positions(ans, tok)
    is_call = target.startswith("<tool_call>") and "final_answer" not in target
    copied = last_number(ans, numbers, tok)
    return {
        **prompt_fields(pr),
        "ans": ans,
        "dec_idx": numbers[0] if numbers else None,
        "final_idx": numbers[-1] if numbers else len(ans) - 1,
        "read_idx": numbers[:2] if is_call else [],
        # a final answer's copy of the tool's result: its last number (the call turns and the follow-up copy nothing)
        "copy_idx": copied if not is_call and tok.decode(ans[copied]).strip() == str(problem["tool_result"]) else [],
        "family": family,
    }


def number_positions(ans: torch.Tensor, tok) -> list[int]:
    """Positions in ``ans`` of the tokens that are numbers (`` 7``, ``10``)."""
    return [i for i, t in enumerate(ans.tolist()) if tok.decode([t]).strip().isdigit()]


def last_number(ans: torch.Tensor, numbers: list[int], tok) -> list[int]:
    """The positions of the last number in ``ans`` (``numbers``: :func:`number_positions`): one token (`` 12``), or
    one a digit after a quote or a newline (``"``, ``1``, ``2``)."""
    if not numbers:
        return []
    run = [numbers[-1]]
    while run[0] - 1 in numbers and not tok.decode(ans[run[0]]).startswith(" "):
        run.insert(0, run[0] - 1)
    return run


def agent_requests(problem: dict[str, Any], proc, tok) -> list[dict[str, Any]]:
    """Every request of one task in both formats, encoded (:func:`encode_request`): families ``agent-call``,
    ``agent-final``, ``agent-followup``, ``smol-call`` and ``smol-final``."""
    out = []
    names = ["agent-call", "agent-final", "agent-followup"]
    for (messages, target), name in zip(openai_requests(problem), names):
        out.append(encode_request(messages, target, problem, problem["tools"], proc, tok, name))
    return out + [smolagents_request(problem, proc, tok, k) for k in range(2)]


def smolagents_request(problem: dict[str, Any], proc, tok, k: int) -> dict[str, Any]:
    """smolagents' ``k``-th request of one task, encoded: 0 the call (``smol-call``), 1 ``final_answer`` after the
    ``Observation:`` message (``smol-final``)."""
    from ..eval.minivista_agent import SMOLAGENTS_TOOLS

    messages, target = smolagents_requests(problem)[k]
    return encode_request(messages, target, problem, SMOLAGENTS_TOOLS, proc, tok, ("smol-call", "smol-final")[k])


class AgentStream:
    """Encoded agent requests from fresh tasks (seed ``mv.TRAIN_SEED``, indices ``start, start + stride, ...``), in
    order: all the requests of one task, then the next task's."""

    def __init__(self, proc, tok, start: int = 0, stride: int = 1):
        self.proc, self.tok, self.i, self.stride = proc, tok, start, stride
        self._pending: Iterator[dict[str, Any]] = iter(())

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` requests."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            nxt = next(self._pending, None)
            if nxt is None:
                self._pending = iter(agent_requests(make_agent_problem(mv.TRAIN_SEED, self.i), self.proc, self.tok))
                self.i += self.stride
                continue
            out.append(nxt)
        return out


class FinalStream:
    """smolagents' ``final_answer`` requests (``smol-final``) of fresh tasks (seed ``mv.TRAIN_SEED``, indices ``start,
    start + stride, ...``), every other one of a task whose result has two digits: there the answer copies two tokens
    from the ``Observation:`` message (``"``, ``1``, ``3``), which the mixture alone (about one such request in 20)
    taught too slowly."""

    def __init__(self, proc, tok, start: int = 0, stride: int = 1):
        self.proc, self.tok, self.i, self.stride = proc, tok, start, stride
        self.two_digits = False

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` requests."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            problem = make_agent_problem(mv.TRAIN_SEED, self.i)
            self.i += self.stride
            if (len(str(problem["tool_result"])) == 2) == self.two_digits:
                out.append(smolagents_request(problem, self.proc, self.tok, 1))
                self.two_digits = not self.two_digits
        return out
