"""A page session's conversation about its current image: the turns asked so far (each question with the main
panel's answer, its trace, and what the KV reuse cache gave its prompts), the OpenAI-format messages that a
follow-up question continues, and the conversation's HTML.

A run with Follow-up on, about the same image (by content hash) as the session's earlier turns, is asked as the
next message of that conversation; any other run starts a new conversation, as do a new image and Clear. Every
finished run records its turn. Gradio is not needed here.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .render import esc, method_title, plural, render_panel

__all__ = [
    "CONVERSATION_NOTE",
    "STREAM_LABELS",
    "ConversationStart",
    "Conversations",
    "Turn",
    "cached_line",
    "render_conversation_html",
    "user_message",
]

#: The prompt streams a method may prefill, in the order the cached-token line names them, with their words.
STREAM_LABELS: dict[str, str] = {
    "verifier": "verifier",
    "drafter_full": "drafter full view",
    "drafter_comp": "drafter compressed view",
}
#: Each stream's prompt ids in :class:`~asymspec_mm.request.prompts.Prompts`.
_PROMPT_IDS = {"verifier": "verifier_ids", "drafter_full": "drafter_full_ids", "drafter_comp": "drafter_comp_ids"}
#: The line under the conversation: what ends it.
CONVERSATION_NOTE = "A new image or Clear conversation starts a new conversation."
_EMPTY_TEXT = (
    "No conversation yet. Every finished run is a turn; with Follow-up on, the next question about the same image "
    "is asked with the earlier turns as context."
)


@dataclass(frozen=True)
class Turn:
    """One finished run of a conversation: the question, the main panel's answer (text and trace), its method, and
    per prompt stream the tokens reused from earlier requests (``cached_tokens``) out of its prompt's length
    (``prompt_tokens``)."""

    question: str
    answer: str
    trace: tuple[Any, ...]
    method: str
    cached_tokens: dict[str, int] = field(default_factory=dict)
    prompt_tokens: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, question: str, result: Any) -> Turn:
        """The turn of a finished result (:class:`~asymspec_mm.request.session.MMResult`) that answered ``question``."""
        cached = {str(k): int(v) for k, v in (result.stats.get("cached_tokens") or {}).items()}
        prompts = getattr(result, "prompts", None)
        lengths = {}
        for name in cached:
            ids = getattr(prompts, _PROMPT_IDS.get(name, ""), None)
            if ids is not None:
                lengths[name] = int(ids.shape[-1])
        return cls(question, result.text, tuple(result.trace), result.method, cached, lengths)


def user_message(question: str, image: Any = None) -> dict[str, Any]:
    """An OpenAI-format user message: ``image`` (a PIL image) first when given, then the question."""
    parts: list[dict[str, Any]] = [{"type": "image", "image": image}] if image is not None else []
    return {"role": "user", "content": [*parts, {"type": "text", "text": question}]}


@dataclass(frozen=True)
class ConversationStart:
    """Where a run stands in its session's conversation as it starts: the earlier ``turns`` it follows (none: it
    is the first turn of a new conversation), about the image whose content hash is ``image_hash``. ``epoch``
    names the conversation, so that a turn finishing after Clear or a new image is not recorded into the next one."""

    session: str | None
    epoch: int
    image_hash: str
    turns: tuple[Turn, ...] = ()

    def messages(self, image: Any, question: str) -> list[dict[str, Any]] | None:
        """The conversation so far with ``question`` last (the image in the first user message), or None for a first
        turn, which is asked as a single request."""
        if not self.turns:
            return None
        messages: list[dict[str, Any]] = []
        for i, turn in enumerate(self.turns):
            messages.append(user_message(turn.question, image if i == 0 else None))
            messages.append({"role": "assistant", "content": turn.answer})
        messages.append(user_message(question))
        return messages


@dataclass
class _Conversation:
    epoch: int
    image_hash: str
    turns: list[Turn] = field(default_factory=list)


class Conversations:
    """Per page session, the conversation about its current image (thread-safe: runs, Clear and a new image
    come from Gradio's worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, _Conversation] = {}
        self._epochs = itertools.count(1)

    def begin(self, session: str | None, image: Any, followup: bool) -> ConversationStart:
        """A run of ``session`` about ``image`` (a PIL image) starts: it continues the session's conversation when
        ``followup`` is on and the conversation has turns about this image; else it starts a new one at once (the
        earlier turns are gone). A run without a session has no conversation to continue."""
        from vision_cache.image import image_content_hash

        image_hash = image_content_hash(image) if image is not None else ""  # a text pair's conversation has no image
        if not session:
            return ConversationStart(None, 0, image_hash)
        with self._lock:
            conv = self._by_session.get(session)
            if followup and conv is not None and conv.turns and conv.image_hash == image_hash:
                return ConversationStart(session, conv.epoch, image_hash, tuple(conv.turns))
            conv = self._by_session[session] = _Conversation(next(self._epochs), image_hash)
            return ConversationStart(session, conv.epoch, image_hash)

    def record(self, start: ConversationStart, turn: Turn) -> bool:
        """A run that began at ``start`` finished with ``turn``: appended to its conversation when that is still
        the session's and still ends where the run began (not after Clear, a new image, or another run's turn that
        this answer did not see). Returns whether it was recorded."""
        if not start.session:
            return False
        with self._lock:
            conv = self._by_session.get(start.session)
            if conv is None or conv.epoch != start.epoch or len(conv.turns) != len(start.turns):
                return False
            conv.turns.append(turn)
            return True

    def about(self, session: str | None, image: Any) -> bool:
        """Whether the session's conversation (begun by a run, with or without turns yet) is about ``image`` (a PIL
        image, compared by content)."""
        from vision_cache.image import image_content_hash

        if not session or image is None:
            return False
        image_hash = image_content_hash(image)
        with self._lock:
            conv = self._by_session.get(session)
            return conv is not None and conv.image_hash == image_hash

    def turns(self, session: str | None) -> tuple[Turn, ...]:
        """The session's turns, oldest first (none without a session)."""
        with self._lock:
            conv = self._by_session.get(session or "")
            return tuple(conv.turns) if conv is not None else ()

    def clear(self, session: str | None) -> None:
        """Forget the session's conversation (Clear, a new image, the page went away)."""
        with self._lock:
            self._by_session.pop(session or "", None)


def cached_line(turn: Turn) -> str:
    """What the KV reuse cache gave the turn's prompts, e.g. ``reused 84 of 97 verifier prompt tokens; drafter full
    view 60 of 110`` (the streams its method prefills, the verifier first)."""
    parts: list[str] = []
    for name, label in STREAM_LABELS.items():
        if name not in turn.cached_tokens:
            continue
        total = turn.prompt_tokens.get(name)
        numbers = f"{turn.cached_tokens[name]} of {total}" if total is not None else str(turn.cached_tokens[name])
        # the first stream is spelled out, the others follow in short
        parts.append(f"{label} {numbers}" if parts else f"reused {numbers} {label} prompt tokens")
    return "; ".join(parts)


def _render_turn(n: int, turn: Turn, tokenizer: Any) -> str:
    cached = json.dumps(turn.cached_tokens, sort_keys=True)
    panel = render_panel(f"Answer {n}: {method_title(turn.method)}", turn.trace, tokenizer, empty="(no tokens)")
    line = cached_line(turn)
    cache = f'<div class="asym-turn-cache">{esc(line)}</div>' if line else ""
    return (
        f'<div class="asym-turn" data-turn="{n}" data-method="{esc(turn.method)}" data-cached-tokens="{esc(cached)}">'
        f'<div class="asym-turn-question"><span class="asym-turn-label">Question {n}</span> {esc(turn.question)}</div>'
        f"{panel}{cache}</div>"
    )


def render_conversation_html(turns: Sequence[Turn], tokenizer: Any = None) -> str:
    """The conversation: each turn's question, its answer with every token's provenance (:func:`render_panel` of
    its trace) and its cached-token line, oldest first; then what starts a new conversation. An empty state when
    there are no turns."""
    head = f"Conversation about this image: {plural(len(turns), 'turn')}" if turns else "Conversation"
    body = "".join(_render_turn(i, t, tokenizer) for i, t in enumerate(turns, start=1))
    if not turns:
        body = f'<p class="asym-empty">{esc(_EMPTY_TEXT)}</p>'
    return (
        f'<div class="asym-conversation" data-turns="{len(turns)}"><div class="asym-conversation-title">{esc(head)}</div>'
        f'{body}<p class="asym-conversation-note">{esc(CONVERSATION_NOTE)}</p></div>'
    )
