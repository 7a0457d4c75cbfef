"""The conversation's two views side by side, turn by turn: what the drafter read (every message whole) beside what
the verifier read (older messages compressed by the page's per-turn compression, the last ones verbatim), with each
message's token ratio.

The page's "Per-turn compression" field (:func:`check_compression_input`) sets ``compression=`` on every row of a run
(empty: off); after a run, :class:`SideViews` keeps the session's last conversation (the messages the main row was
sent and its result, whose ``stats["compressed_view"]`` holds each compressed message as the verifier read it) and
:func:`render_views_html` draws the two columns. Gradio is imported only to build the panel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .conversation import user_message
from .render import esc

__all__ = [
    "COMPRESSION_PLACEHOLDER",
    "SideViews",
    "ViewRow",
    "build_compression_input",
    "build_views_panel",
    "check_compression_input",
    "render_views_html",
    "view_rows",
]

COMPRESSION_PLACEHOLDER = "off; e.g. truncate,limit=40,keep_last_turns=2 or llmlingua2,rate=0.3,keep_last_turns=2"
_EMPTY = "No run yet. After a run, each message of the conversation shows here as the drafter read it and as the verifier read it."
_STYLE = (
    "<style>.asym-views table{width:100%;border-collapse:collapse;table-layout:fixed}"
    ".asym-views td,.asym-views th{border:1px solid var(--border-color-primary,#ddd);padding:4px 6px;vertical-align:top;"
    "text-align:left}.asym-views pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.85em;max-height:14em;"
    "overflow:auto}.asym-views .asym-squeezed{background:rgba(255,170,0,.12)}</style>"
)


def check_compression_input(text: Any) -> dict[str, Any]:
    """The field as ``submit`` options: ``{}`` when empty, else ``{"compression": Compression}`` (a bad setting
    raises its one-line error naming the field, e.g. ``compression.rate=2 must be a number in (0, 1]``)."""
    from asymspec_mm.request.compression import Compression

    spec = str(text or "").strip()
    return {"compression": Compression.of(spec)} if spec else {}


@dataclass(frozen=True)
class ViewRow:
    """One message as the two models read it: ``drafter`` (its text whole), ``verifier`` (compressed, or the same
    text), the lengths of its text parts in verifier tokens, whole and as the verifier read them (images left out),
    and ``ratio`` (the first over the second)."""

    index: int
    role: str
    drafter: str
    verifier: str
    compressed: bool
    drafter_tokens: int
    verifier_tokens: int

    @property
    def ratio(self) -> float:
        return self.drafter_tokens / max(1, self.verifier_tokens)


def _text_of(content: Any, image_text: str | None) -> str:
    """A message's content as text: its text parts, each image as ``image_text`` (None: left out)."""
    if isinstance(content, str) or content is None:
        return content or ""
    parts = []
    for p in content:
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, dict) and p.get("type") == "text":
            parts.append(str(p.get("text", "")))
        elif isinstance(p, dict) and p.get("type") in ("image", "image_url") and image_text is not None:
            parts.append(image_text)
    return "\n\n".join(parts)


def _has_image(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in ("image", "image_url") for p in content)


def view_rows(messages: list[dict[str, Any]], result: Any, tokenizer: Any) -> list[ViewRow]:
    """Each of ``messages`` (what the main row was sent) as the drafter read it and as the verifier read it
    (``result.stats["compressed_view"]``; an image is pixels for the drafter, its caption for the verifier)."""
    squeezed = {int(m["index"]): m["text"] for m in result.stats.get("compressed_view") or ()}
    caption = getattr(getattr(result, "view", None), "caption", None) or ""
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0  # noqa: E731
    rows = []
    for i, m in enumerate(messages):
        content = m.get("content")
        drafter = _text_of(content, "[image: the drafter reads its pixels]")
        # the compressed view holds the message's text parts; an image stays the image (its caption, for the verifier)
        image = f"[image: the verifier reads its caption] {caption}".strip()
        verifier = squeezed[i] if i in squeezed else _text_of(content, image)
        if i in squeezed and _has_image(content):
            verifier = f"{image}\n\n{verifier}"
        text = _text_of(content, None)  # the ratio counts text only: an image is not text compression's
        tokens = (count(text), count(squeezed.get(i, text)))
        rows.append(ViewRow(i, str(m.get("role")), drafter, verifier, i in squeezed, *tokens))
    return rows


def render_views_html(rows: list[ViewRow], compression_ratio: float | None = None) -> str:
    """The two columns, one table row per message, each with its token ratio; ``compression_ratio``: the request's
    (|x_full| / |x_comp| over the whole prompt)."""
    if not rows:
        return f'<div class="asym-views">{_STYLE}<p>{esc(_EMPTY)}</p></div>'
    squeezed = sum(r.compressed for r in rows)
    head = (
        f"<p><b>Full and compressed views, turn by turn</b>: {squeezed} of {len(rows)} messages compressed for the verifier"
        + (f"; the whole prompt's compression ratio {compression_ratio:.2f}x" if compression_ratio else "; no compression")
        + ".</p>"
    )
    lines = [
        '<table><thead><tr><th style="width:4.5em">turn</th><th>what the drafter read</th><th>what the verifier read</th>'
        '<th style="width:6em">ratio</th></tr></thead><tbody>'
    ]
    for r in rows:
        cls = ' class="asym-squeezed"' if r.compressed else ""
        lines.append(
            f'<tr data-turn="{r.index}"{cls}><td>{r.index + 1}. {esc(r.role)}</td><td><pre class="asym-view-full">{esc(r.drafter)}</pre></td>'
            f'<td><pre class="asym-view-comp">{esc(r.verifier)}</pre></td>'
            f'<td class="asym-view-ratio">{r.ratio:.2f}x<br><small>{r.drafter_tokens} / {r.verifier_tokens} tokens</small></td></tr>'
        )
    lines.append("</tbody></table>")
    return f'<div class="asym-views">{_STYLE}{head}{"".join(lines)}</div>'


class SideViews:
    """Per page session, the last finished run's conversation (the messages its main row read) and result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str | None, tuple[list[dict[str, Any]], Any]] = {}

    def record(self, job: Any) -> None:
        """A run finished: keep its main row's messages (a first turn: its one user message) and result."""
        main = job.snapshot().results.get("main")
        if main is None:
            return
        messages = getattr(job, "messages", None) or [user_message(job.req.question, job.req.image)]
        with self._lock:
            self._by_session[job.session] = (messages, main)

    def forget(self, session: str | None) -> None:
        with self._lock:
            self._by_session.pop(session, None)

    def html(self, session: str | None, tokenizer: Any) -> str:
        """The panel for ``session``'s last run."""
        with self._lock:
            last = self._by_session.get(session)
        if last is None:
            return render_views_html([])
        messages, result = last
        return render_views_html(view_rows(messages, result, tokenizer), result.stats.get("compression_ratio"))


def build_compression_input() -> Any:
    """The "Per-turn compression" field (a Gradio component, inside the current Blocks: the inputs' column)."""
    import gradio as gr

    with gr.Accordion("Per-turn compression", open=False, elem_id="asym-compression-box"):
        return gr.Textbox(
            value="",  # a default, so that API callers that leave it out get no compression
            label="The verifier's view of earlier turns (empty: off); the views show under the conversation",
            placeholder=COMPRESSION_PLACEHOLDER,
            lines=1,
            elem_id="asym-compression",
        )


def build_views_panel() -> Any:
    """The side-by-side panel (a Gradio component, inside the current Blocks: the outputs' column)."""
    import gradio as gr

    with gr.Accordion("Full and compressed views, turn by turn", open=True, elem_id="asym-views-box"):
        return gr.HTML(render_views_html([]), js_on_load=None, elem_id="asym-views", label="views_html")


def views_handler(state: Any, request_type: type) -> Any:
    """The panel's update after a run, with Gradio's request (for the session) put in."""

    def views(request=None) -> str:
        return state.side_views.html(getattr(request, "session_hash", None), state.pipe.verifier_tokenizer)

    views.__annotations__["request"] = request_type
    return views
