"""Length limits for the compressed view.

The verifier only sees caption + OCR text, so both must fit its context window next to the
question. These helpers cut long texts on a word boundary and mark the cut, so the verifier can
tell that text is missing instead of reading a half word as if it were data.
"""

from __future__ import annotations

from typing import Any, Protocol

from captioning.view import DEFAULT_CAPTION_CHARS, DEFAULT_OCR_CHARS

ELLIPSIS = "..."

__all__ = [
    "ELLIPSIS",
    "truncate_text",
    "truncate_caption",
    "truncate_ocr_text",
    "truncate_tokens",
]


class _Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that :func:`truncate_tokens` uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def _cut_on_word_boundary(text: str, limit: int) -> str:
    """The longest prefix of ``text`` of at most ``limit`` characters that ends between words.

    Falls back to a hard cut when the prefix has no whitespace in its second half: one very long
    "word" (a URL, an OCR run without spaces) would otherwise throw away almost everything.
    """
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    prefix = text[:limit]
    if text[limit].isspace():
        # The cut already falls between two words.
        return prefix.rstrip()
    space = max(prefix.rfind(" "), prefix.rfind("\n"), prefix.rfind("\t"))
    if space >= limit // 2:
        return prefix[:space].rstrip()
    return prefix.rstrip()


def truncate_text(text: str, max_chars: int, marker: str = ELLIPSIS) -> str:
    """Shorten ``text`` to at most ``max_chars`` characters, marker included.

    Text that already fits is returned unchanged. Otherwise the text is cut on a word boundary
    (see :func:`_cut_on_word_boundary`) and ``marker`` is appended directly after the last kept
    word. A ``max_chars`` not larger than the marker yields a hard cut without marker.

    Raises:
        ValueError: ``max_chars`` is negative.
    """
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    if len(text) <= max_chars:
        return text
    if max_chars <= len(marker):
        return text[:max_chars]
    kept = _cut_on_word_boundary(text, max_chars - len(marker))
    return kept + marker


def truncate_caption(text: str, max_chars: int = DEFAULT_CAPTION_CHARS) -> str:
    """:func:`truncate_text` with the default caption budget (``DEFAULT_CAPTION_CHARS``)."""
    return truncate_text(text, max_chars)


def truncate_ocr_text(text: str, max_chars: int = DEFAULT_OCR_CHARS) -> str:
    """:func:`truncate_text` with the default OCR budget (``DEFAULT_OCR_CHARS``)."""
    return truncate_text(text, max_chars)


def truncate_tokens(text: str, max_tokens: int, tokenizer: Any, marker: str = ELLIPSIS) -> str:
    """Shorten ``text`` so that the result, marker included, encodes to at most ``max_tokens``.

    Token counts are what a context window limits; characters are only a proxy. The cut still
    lands on a word boundary. ``tokenizer`` needs ``encode(text, add_special_tokens=False)`` and
    ``decode(ids)`` (any Hugging Face tokenizer has both).

    Raises:
        ValueError: ``max_tokens`` is negative.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")

    def n_tokens(s: str) -> int:
        return len(tokenizer.encode(s, add_special_tokens=False))

    if n_tokens(text) <= max_tokens:
        return text
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Start from the decoded prefix of max_tokens tokens, then shrink on word boundaries until
    # the result with its marker fits: decoding/re-encoding is not always length-preserving.
    candidate = tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)
    limit = len(candidate)
    while limit > 0:
        kept = _cut_on_word_boundary(text, limit)
        result = kept + marker if kept else ""
        if result and n_tokens(result) <= max_tokens:
            return result
        # Drop at least one character, and about a word per step, to keep the loop short.
        limit = min(limit - 1, len(kept) - 1) if kept else 0
    return ""
