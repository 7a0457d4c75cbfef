"""Summaries written by a model the pipeline already holds (the ``summary`` compressor's ``summarizer="verifier"``
or ``"drafter"``): one greedy answer by the pipeline's own models, a row of the engine loop that sets the request
up (a child request of it, as a caption is), with no second copy of any model.

The paper's LongBench and MultiChallenge settings compress a context into a summary; here the verifier (by default)
or the drafter writes it from :data:`SUMMARY_PROMPT`. Each summary is cached by its text and settings like any
compressed message, so an older turn is summarized once and reads the same in every later request.
"""

from __future__ import annotations

import torch

from ..base.config import AsymSpecConfig
from ..base.errors import ContextOverflowError
from ..decode import greedy_steps
from ..engines import EngineFactory
from ..engines.loading import eos_ids
from ..engines.model_calls import greedy_request, loop_for, model_runner, stepped_tokens
from .models import ModelSet

#: What the model is asked; ``{text}`` is the message's text.
SUMMARY_PROMPT = (
    "Summarize the text below in a few sentences. Keep every name, number and fact that a later question may ask about.\n\n{text}"
)


def chat_prompt_ids(models: ModelSet, which: str, prompt: str) -> list[int]:
    """``prompt`` as one user turn through ``which`` model's chat template (generation prompt, thinking off), its ids."""
    if which == "verifier":
        tok = models.verifier_tokenizer
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
    else:
        tok = models.processor.tokenizer
        text = models.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": prompt}]}], tokenize=False, add_generation_prompt=True
        )
    return tok(text, add_special_tokens=False)["input_ids"]


def model_answer(models: ModelSet, engines: EngineFactory, which: str, prompt: str, max_new_tokens: int) -> str:
    """``which`` model's greedy answer to ``prompt`` (``verifier`` or ``drafter``). In a set-up an engine loop serves
    (a scheduler's, or the pipeline's direct loop on the direct path), or outside any (the pipeline's loop for such
    calls: ``models.home_loop``), it is a token request, a row of that loop's batch (and a child of the request being
    set up, as a caption is); a served model's is decoded on a fresh stream of the pipeline's engines, each model call
    in that loop."""
    model = models.verifier if which == "verifier" else models.drafter
    tok = models.verifier_tokenizer if which == "verifier" else models.processor.tokenizer
    ids = torch.tensor(chat_prompt_ids(models, which, prompt), dtype=torch.long)
    conf = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(conf, "max_position_embeddings", None)
    if limit and ids.numel() + max_new_tokens > limit:
        raise ContextOverflowError(f"the summary prompt has {ids.numel()} tokens; the {which}'s window is {limit}")
    eos = eos_ids([tok], [model])
    loop = loop_for(models.home_loop) if isinstance(model, torch.nn.Module) else None  # a loop batches transformers rows
    if loop is not None:
        method, stream = ("floor", "verifier") if which == "verifier" else ("drafter", "drafter_full")
        tokens = loop.decode_row(greedy_request(method, stream, ids, max_new_tokens, eos, kind="summary")).token_ids
        return tok.decode(tokens, skip_special_tokens=True).strip()

    def start():
        engine = models.verifier_engine(engines, "summary") if which == "verifier" else models.drafter_engine(engines, "summary")
        engine.prefill(ids[:-1])
        return engine

    run = model_runner(models.home_loop)
    engine = run(start)
    cfg = AsymSpecConfig(max_new_tokens=max_new_tokens, trace_top=0)
    tokens = stepped_tokens(greedy_steps(engine, ids[-1:].to(engine.device), cfg, eos, is_verifier=which == "verifier"), run)
    return tok.decode(tokens, skip_special_tokens=True).strip()


class ModelSummarizer:
    """``summarize(which, text)``: the summary of ``text`` by the pipeline's ``which`` model (see the module)."""

    def __init__(self, models: ModelSet, engines: EngineFactory):
        self.models, self.engines = models, engines

    @property
    def key(self) -> tuple:
        """What tells two pipelines' summaries apart in a cache key: their models' sources."""
        name = lambda m: str(getattr(m, "name_or_path", "") or id(m))  # noqa: E731
        return (name(self.models.verifier), name(self.models.drafter))

    def __call__(self, which: str, text: str, max_new_tokens: int) -> str:
        """``which`` model's summary of ``text``, at most ``max_new_tokens`` long."""
        return model_answer(self.models, self.engines, which, SUMMARY_PROMPT.format(text=text), max_new_tokens)
