"""The calls the vLLM engines make to ``LLM.generate``: one call for many streams' requests, the logits rows the
worker extension captured, extending streams by their new tokens, drafting K greedy tokens per stream in one call.
Each function takes ``(engine, ...)`` items of :class:`CapturingStream` (a :class:`~asymspec_mm.engines.vllm.CapturingStream`)
on one LLM."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Protocol

import torch

from .vllm_worker import ARG


class CapturingStream(Protocol):
    """What these calls read and update of a vLLM stream: its tokens and limits, the prompt it submits, the cache
    salt that keeps its requests out of vLLM's prefix cache, the logits rows kept from its last call (``row_memory``:
    the tokens they were computed for and the rows by position), and its counters."""

    name: str
    device: torch.device
    max_model_len: int
    tokens: list[int]
    in_process: bool
    cache_salt: str | None
    last_output: Any
    row_memory: tuple[list[int], dict[int, torch.Tensor]]
    tokens_computed: int
    forward_calls: int
    tokens_forwarded: int
    cache_rerequests: int

    def request_prompt(self, tokens: list[int]) -> dict[str, Any]: ...

    def rows_from_memory(self, tokens: list[int], positions: list[int]) -> dict[int, torch.Tensor]: ...


log = logging.getLogger("asymspec_mm")


def run_requests(llm, requests: list[tuple[CapturingStream, list[int], int | None, int]]) -> list[tuple[Any, Any]]:
    """Submit requests of engines on one ``llm`` in ONE ``LLM.generate`` call and collect their captured rows in
    one RPC. Each request is ``(engine, context tokens, first wanted position or None, max_tokens)``; returns
    ``(vLLM's RequestOutput, captured (first, positions, logits) or None)`` per request, in order.

    Every request is checked against the context window before anything is submitted; each engine's
    ``tokens_computed`` and ``forward_calls`` (+1) are updated.
    """
    from vllm import SamplingParams

    prompts, params, keys = [], [], []
    for engine, tokens, wanted_from, max_tokens in requests:
        if len(tokens) + max_tokens > engine.max_model_len:
            from ..base.errors import ContextOverflowError

            raise ContextOverflowError(
                f"the {engine.name} stream needs {len(tokens) + max_tokens} positions but vLLM's max_model_len is "
                f"{engine.max_model_len}: raise max_model_len in vllm_kwargs or lower max_new_tokens"
            )
        key = extra = None
        if wanted_from is not None:
            key = uuid.uuid4().hex
            extra = {ARG: {"key": key, "from": wanted_from}}
        # ignore_eos: a request decoding several tokens (drafting) must not stop at an EOS
        params.append(SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False, ignore_eos=True, extra_args=extra))
        prompt = engine.request_prompt(tokens)
        if engine.cache_salt is not None:
            prompt["cache_salt"] = engine.cache_salt
        prompts.append(prompt)
        keys.append(key)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for (engine, tokens, _, _), out in zip(requests, outs):
        engine.last_output = out
        generated = len(out.outputs[0].token_ids) if out.outputs else 1
        engine.tokens_computed += len(tokens) - (out.num_cached_tokens or 0) + max(generated - 1, 0)
        engine.forward_calls += 1
    wanted = [k for k in keys if k is not None]
    got: dict[str, Any] = {}
    if wanted:
        inproc = all(engine.in_process for engine, *_ in requests)
        got = dict(zip(wanted, llm.collective_rpc("asymspec_take_many", args=(wanted, not inproc))[0]))
    return [(out, got.get(k) if k is not None else None) for out, k in zip(outs, keys)]


def captured_rows(engine: CapturingStream, got) -> dict[int, torch.Tensor]:
    """``{position: logits [V]}`` of one request's captured rows."""
    if got is None:
        raise RuntimeError(f"{engine.name}: vLLM returned no captured rows (is the worker extension installed?)")
    _, positions, logits = got
    if logits is None and positions:
        raise RuntimeError(f"{engine.name}: rank 0 holds no logits (pipeline parallelism is not supported)")
    return {p: logits[i] for i, p in enumerate(positions)} if positions else {}


def extend_many(llm, items: list[tuple[CapturingStream, list[int]]]) -> tuple[list[torch.Tensor], int]:
    """Append ``new`` tokens to each engine of ``items`` (``(engine, new)``; engines of one ``llm``, each at most
    once) with ONE ``LLM.generate`` call for all of them; returns (logits ``[n, V]`` per item, generate calls).

    Rows vLLM served from its prefix cache come from the engine's previous call when it computed them over the
    same tokens; the items still missing rows are re-requested together under fresh salts (a second call)."""
    tokens = [engine.tokens + new for engine, new in items]
    starts = [len(engine.tokens) for engine, _ in items]
    rows: list[dict[int, torch.Tensor]] = [{} for _ in items]
    todo, calls = list(range(len(items))), 0
    for _attempt in range(2):
        results = run_requests(llm, [(items[i][0], tokens[i], starts[i], 1) for i in todo])
        calls += 1
        again = []
        for i, (_, got) in zip(todo, results):
            engine = items[i][0]
            wanted = range(starts[i], len(tokens[i]))
            rows[i] = captured_rows(engine, got)
            missing = [p for p in wanted if p not in rows[i]]
            if missing:
                rows[i].update(engine.rows_from_memory(tokens[i], missing))
                missing = [p for p in wanted if p not in rows[i]]
            if missing:  # served from the prefix cache and not in our memory: recompute under a fresh namespace
                engine.cache_rerequests += 1
                log.debug("%s: positions %s came from vLLM's prefix cache; re-requesting under a new cache_salt", engine.name, missing)
                engine.cache_salt = f"asymspec-{engine.name}-{uuid.uuid4().hex}"
                again.append(i)
        todo = again
        if not todo:
            break
    else:
        names = sorted({items[i][0].name for i in todo})
        raise RuntimeError(f"{names}: vLLM did not recompute the requested positions even under a fresh cache_salt")
    out = []
    for i, (engine, new) in enumerate(items):
        wanted = range(starts[i], len(tokens[i]))
        engine.row_memory = (tokens[i], {p: rows[i][p] for p in wanted})
        engine.tokens = tokens[i]
        engine.tokens_forwarded += len(new)
        out.append(torch.stack([rows[i][p] for p in wanted]).to(engine.device))
    return out, calls


def draft_many(llm, items: list[tuple[CapturingStream, list[int]]], k: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Forward each item's ``new`` tokens (``(engine, new)``, engines of one ``llm``) and decode ``k`` greedy tokens
    per item, all in ONE ``LLM.generate`` call (``max_tokens=k``, temperature 0). Equivalent to ``k`` extends (the
    new tokens, then each draft but the last, taking the argmax of the last row): each engine ends with its new
    tokens and drafts ``1 .. k-1`` appended, and its counters move as those extends would move them. Returns the
    drafts ``[n, k]`` (vLLM's greedy samples: the tokens in its KV), their logits ``[n, k, V]`` float32 and how
    many drafts differ from the argmax of their rows."""
    if k < 1:
        raise ValueError(f"draft needs k >= 1, got {k}")
    contexts = [engine.tokens + new for engine, new in items]
    results = run_requests(llm, [(engine, ctx, len(ctx) - 1, k) for (engine, _), ctx in zip(items, contexts)])
    drafts, logits, mismatches = [], [], 0
    for (engine, new), ctx, (out, got) in zip(items, contexts, results):
        sampled = [int(t) for t in out.outputs[0].token_ids]
        if len(sampled) != k:
            raise RuntimeError(f"{engine.name}: vLLM decoded {len(sampled)} tokens, {k} were asked for")
        full = ctx + sampled[:-1]  # the tokens whose KV vLLM computed
        wanted = range(len(ctx) - 1, len(full))
        rows = captured_rows(engine, got)
        missing = [p for p in wanted if p not in rows]
        if missing:
            rows.update(engine.rows_from_memory(full, missing))
            missing = [p for p in wanted if p not in rows]
        if missing:  # the last prompt token and the decoded ones are always computed
            raise RuntimeError(f"{engine.name}: vLLM did not compute positions {missing} while drafting")
        row_logits = torch.stack([rows[p] for p in wanted]).float()
        mismatches += int((row_logits.argmax(-1) != torch.tensor(sampled, device=row_logits.device)).sum())
        engine.row_memory = (full, {p: rows[p] for p in wanted})
        engine.tokens = full
        engine.tokens_forwarded += len(new) + k - 1
        engine.forward_calls += k - 1  # run_requests counted one: as k extends would
        drafts.append(sampled)
        logits.append(row_logits.to(engine.device))
    return torch.tensor(drafts, dtype=torch.long), torch.stack(logits), mismatches
