"""Token lengths of dumped prompts: the verifier's prompt and the drafter's full view (text plus the image's tokens).

The verifier's count is its chat prompt through its own tokenizer. The drafter's full view is its user text
after the image through its chat template, with the image's ``<|image_pad|>`` tokens counted from the
problem's recorded size (``metadata.img_width`` / ``img_height``) by the drafter's preprocessor config, so
no image is needed (MathVista's text data records every testmini image's size).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vision_cache.qwen_sizing import image_token_count


class DrafterCounter:
    """Counts the drafter's full-view tokens from a drafter folder's processor files (no weights are read)."""

    def __init__(self, drafter_dir: str | Path):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(drafter_dir))
        self.preprocessor = json.loads((Path(drafter_dir) / "preprocessor_config.json").read_text(encoding="utf-8"))

    def image_tokens(self, problem: Mapping[str, Any]) -> int | None:
        """The image's token count from its recorded size, or ``None`` when the problem records none."""
        meta = problem.get("metadata") or {}
        w, h = meta.get("img_width"), meta.get("img_height")
        return image_token_count(int(h), int(w), self.preprocessor) if w and h else None

    def full_view_tokens(self, user_text: str, image_tokens: int) -> int:
        """The full view's length: the chat prompt with one image item, its single pad counted ``image_tokens`` times."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user_text}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]) - 1 + image_tokens


def verifier_tokens(tokenizer: Any, prompt: str) -> int:
    """Length of a rendered verifier prompt in its tokenizer's ids."""
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def add_lengths(
    rows: Sequence[dict[str, Any]], problems: Sequence[Mapping[str, Any]], verifier_tokenizer: Any, drafter: DrafterCounter | None = None
) -> None:
    """Add ``verifier_prompt_tokens`` to each dumped row (in place; ``rows[i]`` is ``problems[i]``'s), and with a
    ``drafter`` also ``image_tokens`` and ``drafter_full_tokens`` (``None`` where the problem records no image size)."""
    for row, problem in zip(rows, problems, strict=True):
        row["verifier_prompt_tokens"] = verifier_tokens(verifier_tokenizer, row["verifier_prompt"])
        if drafter is not None:
            image = drafter.image_tokens(problem)
            row["image_tokens"] = image
            row["drafter_full_tokens"] = None if image is None else drafter.full_view_tokens(row["drafter_full_user_text"], image)


def longest_and_median(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[int, str, float] | None:
    """``(longest, its pid, median)`` of ``rows[key]`` over the rows that have it, or ``None``."""
    have = [(int(r[key]), str(r["pid"])) for r in rows if r.get(key) is not None]
    if not have:
        return None
    n, pid = max(have, key=lambda x: (x[0], -len(x[1])))
    return n, pid, statistics.median(v for v, _ in have)


def length_summary(rows: Sequence[Mapping[str, Any]], window: int = 32704) -> str:
    """One line per counted field: ``verifier prompt: longest 1,028 tokens (pid 394), median 370, 0 over 32,704``."""
    lines = []
    for key, label in (("verifier_prompt_tokens", "verifier prompt"), ("drafter_full_tokens", "drafter full view")):
        stats = longest_and_median(rows, key)
        if stats is None:
            continue
        n, pid, median = stats
        over = sum(1 for r in rows if (r.get(key) or 0) > window)
        lines.append(f"{label}: longest {n:,} tokens (pid {pid}), median {median:,.0f}, {over} over {window:,}")
    return "\n".join(lines)
