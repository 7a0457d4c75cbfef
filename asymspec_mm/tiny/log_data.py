"""The tiny pair's ``agent-log`` examples: the requests of :mod:`~asymspec_mm.eval.minivista_log`'s tasks, each rendered
exactly as ``pipe.chat(messages, tools=..., compression=...)`` renders it: the full view reads the whole history, the
compressed views (the verifier's, the drafter's second stream) read it with every message before the last two
compressed, by one of the family's compressors in turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..eval import minivista as mv
from ..eval.minivista_log import ROWS, log_requests, make_log_problem
from .agent_data import number_positions
from .data import answer_ids, prompt_fields

_VALUE = re.compile(r"^(bar \d+:) \d+$")


def drop_values(text: str) -> str:
    """A table's lines without their values (``bar 17:``): what the shipped classifier's LLMLingua-2 keeps of a log
    (its header and keys); the training stand-in for it, so that training needs no classifier run."""
    return "\n".join(_VALUE.sub(r"\1", line) for line in text.split("\n"))


#: The compressed views training rotates through (the family's three compressors; LLMLingua-2 as its stand-in).
TRAIN_COMPRESSIONS: tuple[dict[str, Any], ...] = (
    {"method": "truncate", "limit": 40, "keep": "head", "keep_last_turns": 2},
    {"method": drop_values, "keep_last_turns": 2},
    {"method": "question-only", "keep_last_turns": 2},
)


def encode_log_request(
    messages: list[dict[str, Any]], target: str, name: str, tools: list[dict[str, Any]], proc, tok, compression: Any
) -> dict[str, Any]:
    """One request as the pipeline renders it, with ``compression`` (a :class:`Compression` or its settings) for
    the compressed views, and its answer; the keys of :func:`.data.encode` (``dec_idx``: the value in
    ``log-answer``, weighted for the drafter; ``final_idx``: the answer's last number)."""
    from ..request.compression import Compression, compress_turns
    from ..request.conversation import parse_messages, view_messages, view_texts
    from ..request.prompts import tokenize_prompts

    turns = parse_messages(messages)
    squeezed = compress_turns(turns, Compression.of(compression), tok)
    vm = view_messages(turns, {}, verifier_turns=squeezed.turns)
    pr = tokenize_prompts(proc, tok, [], view_texts(proc, tok, vm, tools=tools or None))
    ans = answer_ids(target, tok)
    numbers = number_positions(ans, tok)
    value = numbers[-1] if name == "log-answer" and numbers else None
    return {
        **prompt_fields(pr),
        "ans": ans,
        "dec_idx": value,
        "final_idx": value if value is not None else len(ans) - 1,
        "read_idx": [],
        "copy_idx": [],
        "family": name,
    }


def log_examples(problem: dict[str, Any], proc, tok, compression: Any, answers_only: bool = False) -> list[dict[str, Any]]:
    """The task's requests encoded (:func:`encode_log_request`); ``answers_only``: the ``log-answer`` request alone."""
    return [
        encode_log_request(messages, target, name, tools, proc, tok, compression)
        for messages, target, name, tools in log_requests(problem)
        if not answers_only or name == "log-answer"
    ]


class LogStream:
    """Encoded ``agent-log`` requests from fresh tasks (seed ``mv.TRAIN_SEED``, indices ``start, start + stride,
    ...``): each task's ``log-answer`` request, and every ``calls_every``-th task's call and ``Done.`` too (they are
    fixed texts, soon learned); the compressed views rotate through :data:`TRAIN_COMPRESSIONS`; ``rows``: the
    tables' length range."""

    def __init__(self, proc, tok, start: int = 0, stride: int = 1, calls_every: int = 4, rows: tuple[int, int] = ROWS):
        self.proc, self.tok, self.i, self.stride, self.calls_every, self.rows = proc, tok, start, stride, calls_every, rows
        self.k = 0
        self._pending: Iterator[dict[str, Any]] = iter(())

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` requests."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            nxt = next(self._pending, None)
            if nxt is None:
                problem = make_log_problem(mv.TRAIN_SEED, self.i, self.rows)
                compression = TRAIN_COMPRESSIONS[self.k % len(TRAIN_COMPRESSIONS)]
                only = self.k % self.calls_every != 0
                self._pending = iter(log_examples(problem, self.proc, self.tok, compression, answers_only=only))
                self.i += self.stride
                self.k += 1
                continue
            out.append(nxt)
        return out
