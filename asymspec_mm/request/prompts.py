"""The text layout of the three prompts.

The verifier and the drafter's compressed stream read the same user message: the compressed
view (caption + OCR, see :class:`captioning.CompressedView`) followed by the question. The
drafter's full stream reads the image and, with ``drafter_view="image+text"`` (the paper's
released harness), the same text as well; with ``drafter_view="image"`` only the question.
Each prompt goes through its own model's chat template; the verifier's with thinking disabled.

That layout is :class:`PromptStyle`; another layout (the paper harness' MathVista prompts, see
:mod:`asymspec_mm.eval.mathvista.paper_prompts`) is a subclass handed to the pipeline
(``AsymSpecPipeline(..., prompt_style=...)`` or per request, ``prepare(..., prompt_style=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base.config import DRAFTER_VIEWS  # noqa: F401 - re-exported

if TYPE_CHECKING:  # torch loads only to tokenize, so the prompt texts (eval's --dump-prompts) stay torch-free
    import torch


def compressed_user_text(view_text: str, question: str) -> str:
    """User message of the compressed view: ``view_text``, a blank line, the question."""
    view_text = view_text.strip()
    return f"{view_text}\n\n{question}" if view_text else question


def drafter_full_messages(view_text: str, question: str, drafter_view: str = "image+text") -> list[dict[str, Any]]:
    """Chat messages of the drafter on the full view: the image first, then the text."""
    if drafter_view not in DRAFTER_VIEWS:
        from ..base.errors import UnknownOptionError

        raise UnknownOptionError(f"drafter_view={drafter_view!r} is not one of {DRAFTER_VIEWS}")
    text = compressed_user_text(view_text, question) if drafter_view == "image+text" else question
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


@dataclass(frozen=True)
class UserTexts:
    """The user-message texts of one request's three prompts, before any chat template."""

    verifier: str
    drafter_comp: str
    drafter_full: str


class PromptStyle:
    """How a request's compressed view and question become the three user texts (the default layout).

    ``view`` is a :class:`captioning.CompressedView`; ``method`` lets a style give the drafter-alone
    method its own text. The verifier's chat template always gets ``enable_thinking=False``; the
    drafter's gets it too when ``drafter_thinking_off`` is set (templates without the switch ignore it).
    """

    name = "default"
    drafter_thinking_off = False

    def user_texts(self, view: Any, question: str, drafter_view: str = "image+text", method: str = "asymspec") -> UserTexts:
        """The three texts: verifier and compressed stream read view + question; the full stream per ``drafter_view``."""
        return default_user_texts(view.render(), question, drafter_view)


def default_user_texts(view_text: str, question: str, drafter_view: str = "image+text") -> UserTexts:
    """The default layout's texts for a rendered view (``Image description: ...``) and the question."""
    full = drafter_full_messages(view_text, question, drafter_view)[0]["content"][1]["text"]
    return UserTexts(compressed_user_text(view_text, question), compressed_user_text(view_text, question), full)


DEFAULT_STYLE = PromptStyle()


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
    """:func:`render_prompts` of the default layout: ``view_text`` (a rendered compressed view) and the question."""
    return render_prompts(processor, verifier_tokenizer, image, default_user_texts(view_text, question, drafter_view))


def verifier_chat_text(verifier_tokenizer, user_text: str) -> str:
    """The verifier's prompt string: one user turn through its chat template, generation prompt, thinking off."""
    return verifier_tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


def chat_texts(processor, verifier_tokenizer, texts: UserTexts, drafter_thinking_off: bool = False) -> tuple[str, str, str]:
    """``(verifier, drafter_comp, drafter_full)`` prompt strings: each user text through its model's chat template
    (the verifier's with thinking disabled, the drafter's too with ``drafter_thinking_off``; the full view's with
    the image first)."""
    # only to a template that reads the switch: transformers hands other keywords to the processor (and warns)
    reads_switch = "enable_thinking" in str(getattr(processor, "chat_template", None) or "")
    extra = {"enable_thinking": False} if drafter_thinking_off and reads_switch else {}
    v_text = verifier_chat_text(verifier_tokenizer, texts.verifier)
    comp = [{"role": "user", "content": [{"type": "text", "text": texts.drafter_comp}]}]
    full = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": texts.drafter_full}]}]
    c_text = processor.apply_chat_template(comp, tokenize=False, add_generation_prompt=True, **extra)
    f_text = processor.apply_chat_template(full, tokenize=False, add_generation_prompt=True, **extra)
    return v_text, c_text, f_text


def render_prompts(processor, verifier_tokenizer, image, texts: UserTexts, drafter_thinking_off: bool = False) -> Prompts:
    """Render the three chat prompts and tokenize them exactly as the models were trained to read them.

    ``processor`` is the drafter's Qwen3-VL processor (its tokenizer renders the drafter's
    template); ``verifier_tokenizer`` renders the verifier's template with thinking disabled.
    ``image`` is an RGB PIL image already validated by :func:`vision_cache.load_image`.
    """
    return tokenize_prompts(processor, verifier_tokenizer, [image], chat_texts(processor, verifier_tokenizer, texts, drafter_thinking_off))


def tokenize_prompts(processor, verifier_tokenizer, images: list, texts: tuple[str, str, str]) -> Prompts:
    """:class:`Prompts` of the rendered ``(verifier, drafter_comp, drafter_full)`` prompt strings; the full view's
    image pads expanded for ``images`` (RGB PIL images, in the order of their placeholders; none: text only)."""
    import torch

    v_text, c_text, f_text = texts
    enc = processor(text=[f_text], images=list(images) or None, return_tensors="pt")
    ids = lambda tok, text: torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], dtype=torch.long)  # noqa: E731
    types = enc.get("mm_token_type_ids")
    return Prompts(
        drafter_full_ids=enc["input_ids"],
        drafter_comp_ids=ids(processor.tokenizer, c_text),
        verifier_ids=ids(verifier_tokenizer, v_text),
        pixel_values=enc.get("pixel_values"),
        image_grid_thw=enc.get("image_grid_thw"),
        mm_token_type_ids=types if types is not None else torch.zeros_like(enc["input_ids"]),
    )
