"""``pipe.complete``: the verifier's greedy completion of a one-turn chat (MathVista's answer extraction), decoded
as a row of the pipeline's running engine loop when one runs, else as the same row on an engine core stepped on
the calling thread (a served verifier: one model call of the loop that runs the models)."""

from __future__ import annotations

from typing import Any

import torch

from ..base.config import AsymSpecConfig
from ..base.errors import ContextOverflowError, EmptyQuestionError
from ..base.unicode_check import check_text_fields
from ..core.direct import decode_alone
from ..core.loop_calls import LoopClosedError
from ..core.loop_client import completion_request, completion_tokens, model_call, serving_loop
from ..decode import greedy_steps


def prompt_ids(pipe: Any, prompt: str, max_new_tokens: int) -> torch.Tensor:
    """The verifier's ids ``[L]`` of ``prompt`` as a one-turn chat, thinking off; refused when empty or when it and
    ``max_new_tokens`` overflow the verifier's window."""
    check_text_fields({"prompt": prompt})
    if not prompt.strip():
        raise EmptyQuestionError("the completion prompt is empty")
    tok = pipe.verifier_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    limit = getattr(pipe.verifier.config, "max_position_embeddings", None)
    if limit and ids.numel() + max_new_tokens > limit:
        raise ContextOverflowError(f"the extraction prompt has {ids.numel()} tokens; the verifier's window is {limit}")
    return ids


def complete(pipe: Any, prompt: str, max_new_tokens: int = 64) -> str:
    """The completion's text (see :meth:`AsymSpecPipeline.complete`). A transformers verifier decodes it as a
    ``floor`` row of the running loop's batch (the same greedy tokens), or with no loop running the same row on an
    engine core of its own, stepped here; a served verifier's whole completion is one model call (of the loop when
    one runs)."""
    ids = prompt_ids(pipe, prompt, max_new_tokens)
    tokens = None
    loop = serving_loop(pipe)
    on_core = isinstance(pipe.verifier, torch.nn.Module)
    if loop is not None and on_core:
        try:
            tokens = completion_tokens(loop, ids, max_new_tokens, pipe.eos_ids)
        except LoopClosedError:  # it closed meanwhile: decoded here
            tokens = None
    if tokens is None and on_core:  # no loop: the same row on an engine core, stepped here
        tokens = decode_alone(pipe, completion_request(ids, max_new_tokens, pipe.eos_ids)).token_ids
    if tokens is None:
        tokens = model_call(pipe, lambda: _greedy_here(pipe, ids, max_new_tokens))
    return pipe.verifier_tokenizer.decode(tokens, skip_special_tokens=True).strip()


def _greedy_here(pipe: Any, ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The greedy tokens after ``ids`` on a fresh single-row verifier stream (one model call: prefill and steps)."""
    engine = pipe.models.verifier_engine(pipe.engines)
    engine.prefill(ids[:-1])
    cfg = AsymSpecConfig(max_new_tokens=max_new_tokens, trace_top=0)
    return [ev.token_id for events in greedy_steps(engine, ids[-1:], cfg, pipe.eos_ids) for ev in events]
