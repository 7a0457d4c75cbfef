"""The text layout of the three prompts.

The verifier and the drafter's compressed stream read the same user message: the compressed
view (caption + OCR, see :class:`captioning.CompressedView`) followed by the question. The
drafter's full stream reads the image and, with ``drafter_view="image+text"`` (the paper's
released harness), the same text as well; with ``drafter_view="image"`` only the question.
Each prompt goes through its own model's chat template; the verifier's with thinking disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import DRAFTER_VIEWS  # noqa: F401 - re-exported


def compressed_user_text(view_text: str, question: str) -> str:
    """User message of the compressed view: ``view_text``, a blank line, the question."""
    view_text = view_text.strip()
    return f"{view_text}\n\n{question}" if view_text else question


def verifier_messages(view_text: str, question: str) -> list[dict[str, Any]]:
    """Chat messages of the verifier (and of the drafter's compressed stream)."""
    return [{"role": "user", "content": compressed_user_text(view_text, question)}]


def drafter_comp_messages(view_text: str, question: str) -> list[dict[str, Any]]:
    """Chat messages of the drafter on the compressed view (text only, VL content format)."""
    return [{"role": "user", "content": [{"type": "text", "text": compressed_user_text(view_text, question)}]}]


def drafter_full_messages(view_text: str, question: str, drafter_view: str = "image+text") -> list[dict[str, Any]]:
    """Chat messages of the drafter on the full view: the image first, then the text."""
    if drafter_view not in DRAFTER_VIEWS:
        from .errors import UnknownOptionError

        raise UnknownOptionError(f"drafter_view={drafter_view!r} is not one of {DRAFTER_VIEWS}")
    text = compressed_user_text(view_text, question) if drafter_view == "image+text" else question
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


@dataclass
class Prompts:
    """Token ids of the three prompts of one request (batch size 1).

    drafter_full_ids: ``[1, Lf]`` with the image pads expanded; pixel_values ``[P, C*T*p*p]``;
    image_grid_thw ``[n_images, 3]``; mm_token_type_ids ``[1, Lf]`` (1 at image pads).
    drafter_comp_ids ``[1, Lc]`` and verifier_ids ``[1, Lv]`` are text only.
    """

    drafter_full_ids: torch.Tensor
    drafter_comp_ids: torch.Tensor
    verifier_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    mm_token_type_ids: torch.Tensor | None


def build_prompts(processor, verifier_tokenizer, image, view_text: str, question: str, drafter_view: str = "image+text") -> Prompts:
    """Render the three chat prompts and tokenize them exactly as the models were trained to read them.

    ``processor`` is the drafter's Qwen3-VL processor (its tokenizer renders the drafter's
    template); ``verifier_tokenizer`` renders the verifier's template with thinking disabled.
    ``image`` is an RGB PIL image already validated by :func:`vision_cache.load_image`.
    """
    v_text = verifier_tokenizer.apply_chat_template(
        verifier_messages(view_text, question), tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    c_text = processor.apply_chat_template(drafter_comp_messages(view_text, question), tokenize=False, add_generation_prompt=True)
    f_text = processor.apply_chat_template(
        drafter_full_messages(view_text, question, drafter_view), tokenize=False, add_generation_prompt=True
    )
    enc = processor(text=[f_text], images=[image], return_tensors="pt")
    ids = lambda tok, text: torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], dtype=torch.long)  # noqa: E731
    return Prompts(
        drafter_full_ids=enc["input_ids"],
        drafter_comp_ids=ids(processor.tokenizer, c_text),
        verifier_ids=ids(verifier_tokenizer, v_text),
        pixel_values=enc["pixel_values"],
        image_grid_thw=enc["image_grid_thw"],
        mm_token_type_ids=enc["mm_token_type_ids"],
    )
