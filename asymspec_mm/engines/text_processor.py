"""A text-only drafter's processor: what the prompts need of the VL processor, over a text tokenizer.

The paper's text settings pair a text drafter (Qwen3-4B, Qwen3-1.7B) with the text verifier: the drafter's full view
is the whole conversation's text and its compressed view the verifier's. The prompt code renders the drafter's views
through ``processor.apply_chat_template`` (messages whose contents are lists of parts, the VL templates' shape) and
tokenizes them with ``processor(text=[...], images=...)``; :class:`TextProcessor` gives a causal LM's tokenizer that
surface, so one code path renders both kinds of drafter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base.errors import TextDrafterImageError

#: What a refusal of an image tells the user to load instead.
VL_DRAFTER_EXAMPLE = "Qwen/Qwen3-VL-2B-Instruct"


def image_refusal(drafter_name: str) -> str:
    """The one-line refusal of an image sent to a pair whose drafter reads text only."""
    return (
        f"this pair's drafter ({drafter_name}) is a text-only model and cannot read images: load a vision-language "
        f"drafter (e.g. {VL_DRAFTER_EXAMPLE}) to send images, or leave the image out"
    )


def flat_content(content: Any, drafter_name: str = "the drafter") -> Any:
    """A message's content as a text template reads it: a list of parts becomes its text parts joined (as the VL
    templates concatenate them); an image part is refused (:class:`TextDrafterImageError`)."""
    if isinstance(content, str) or not isinstance(content, Sequence):
        return content
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("image", "image_url", "input_image", "video"):
            raise TextDrafterImageError(image_refusal(drafter_name))
        texts.append(str(part.get("text", "")) if isinstance(part, Mapping) else str(part))
    return "".join(texts)


class TextProcessor:
    """The processor of a text-only drafter: ``tokenizer`` (a transformers tokenizer with a chat template) behind the
    calls the prompt code makes of a Qwen3-VL processor. ``name`` is what an image's refusal calls the drafter."""

    def __init__(self, tokenizer: Any, name: str = ""):
        self.tokenizer = tokenizer
        self.name = name or str(getattr(tokenizer, "name_or_path", "") or "the drafter")

    @property
    def chat_template(self) -> Any:
        """The tokenizer's chat template (read to see which switches it takes)."""
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> Any:
        """The tokenizer's template over ``messages`` with part lists flattened to text. Thinking is off unless asked
        (``enable_thinking=True``), as the verifier's prompt has it: a drafter whose template thinks by default would
        otherwise open its answer with a ``<think>`` block the verifier's prompt has closed."""
        flat = [{**m, "content": flat_content(m.get("content"), self.name)} for m in messages]
        kwargs.setdefault("enable_thinking", False)
        return self.tokenizer.apply_chat_template(flat, **kwargs)

    def __call__(self, text: Sequence[str], images: Any = None, return_tensors: str = "pt", **kwargs: Any) -> Any:
        """``text`` tokenized as the VL processor does (no special tokens added: the template wrote them), as a
        ``BatchEncoding`` with ``input_ids`` ``[B, L]``; ``images`` must be empty."""
        if images:
            raise TextDrafterImageError(image_refusal(self.name))
        return self.tokenizer(list(text), add_special_tokens=False, return_tensors=return_tensors)


def reads_images(model: Any) -> bool:
    """Whether a drafter reads images: a vision-language model's config has a ``vision_config``."""
    return hasattr(getattr(model, "config", None), "vision_config")
