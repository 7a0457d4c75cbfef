"""The tiny pair's tokenizer, processor and models: their sizes, and building them from scratch or
loading a run's saved tokenizer and processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..eval import minivista as mv
from . import IMAGE_SIZE

# text and vision sizes (checkpoints.drafter_config / verifier_config); the verifier has about 3x the
# drafter's text parameters
DRAFTER_KW = dict(
    hidden_size=96, num_layers=4, num_heads=3, head_dim=32, intermediate_size=256, vision_depth=3, vision_hidden=128, deepstack=(0,)
)
VERIFIER_KW = dict(hidden_size=160, num_layers=4, num_heads=5, head_dim=32, intermediate_size=448)


def build_tokenizer_and_processor(vocab_size: int = 768) -> tuple[Any, Any]:
    """A byte-level BPE tokenizer trained on the MiniVista training corpus (plus the chat roles and the
    captioner's prompt) and a processor that resizes every image to about ``IMAGE_SIZE`` squared pixels.
    Raises RuntimeError when a word the answers need is not a single token (:func:`check_single_tokens`)."""
    from captioning.captioner import CAPTION_PROMPT

    from ..checkpoints.build import build_processor, build_tokenizer

    texts = mv.corpus(3000, mv.TRAIN_SEED) + ["user\nassistant\n"] * 200 + [CAPTION_PROMPT] * 100
    tok = build_tokenizer(texts, vocab_size=vocab_size)
    proc = build_processor(tok, min_pixels=IMAGE_SIZE * IMAGE_SIZE, max_pixels=IMAGE_SIZE * IMAGE_SIZE)
    check_single_tokens(tok)
    return tok, proc


def check_single_tokens(tok) -> None:
    """Raise RuntimeError unless every colour (also capitalised), shape, number 0..180 and option letter
    is one token: the decisive-token weights and the flat target address single positions."""
    words = (
        [" " + c for c in mv.COLORS]
        + [c.capitalize() for c in mv.COLORS]
        + [" " + s for s in mv.SHAPES]
        + [f" {i}" for i in range(181)]
        + list("ABCD")
    )
    bad = [w for w in words if len(tok(w, add_special_tokens=False)["input_ids"]) != 1]
    if bad:
        raise RuntimeError(f"not single tokens: {bad}")


def build_models(tok, seed: int = 0) -> tuple[Any, Any]:
    """A freshly initialised (drafter, verifier): Qwen3-VL seeded ``seed``, Qwen3 seeded ``seed + 1``."""
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from ..checkpoints.build import drafter_config, verifier_config

    torch.manual_seed(seed)
    drafter = Qwen3VLForConditionalGeneration(drafter_config(tok, **DRAFTER_KW))
    torch.manual_seed(seed + 1)
    verifier = Qwen3ForCausalLM(verifier_config(tok, **VERIFIER_KW))
    return drafter, verifier


def n_params(model) -> dict[str, int]:
    """Parameter counts: total, vision tower, and the rest (text)."""
    total = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n or n.startswith("visual.") or "model.visual" in n)
    return {"total": total, "vision": vis, "text": total - vis}


def load_tokenizer_and_processor(work: Path) -> tuple[Any, Any]:
    """The tokenizer and processor a run saved in ``work`` (``work/tokenizer``, ``work/processor``)."""
    from transformers import AutoTokenizer, Qwen3VLProcessor

    return AutoTokenizer.from_pretrained(work / "tokenizer"), Qwen3VLProcessor.from_pretrained(work / "processor")
