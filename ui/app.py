"""The AsymSpec steering inspector: a Gradio demo that shows, token by token, how the image steers the verifier.

A small Qwen3-VL drafter reads the image; a text-only verifier reads only the compressed view
(caption + OCR). This page shows the compressed view (editable, so you can degrade or fix what the
verifier sees), streams the AsymSpec answer with every token coloured by its source, and puts the
verifier alone (Floor) and the drafter alone beside it.

Public API:

- :func:`render_trace_html` - a trace (``TokenEvent`` list) as HTML spans with a class per source
  and the hover data in ``data-*`` attributes and a tooltip; pure, no Gradio needed.
- :func:`build_app` - the :class:`gradio.Blocks` for one loaded pipeline.
- :func:`launch` - load (once) and serve, bound to 127.0.0.1 unless told otherwise.
- :func:`add_demo_parser` - the ``asymspec-mm demo`` sub-command.

This module imports neither Gradio nor torch at import time, so ``asymspec-mm --help`` stays fast.
"""

from __future__ import annotations

import html
import ipaddress
import json
import logging
import math
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

if TYPE_CHECKING:  # pragma: no cover
    import gradio as gr

    from asymspec_mm.pipeline import AsymSpecPipeline

log = logging.getLogger("asymspec_mm.ui")

__all__ = [
    "SOURCES",
    "add_demo_parser",
    "build_app",
    "jsd_gamma_chart",
    "launch",
    "load_examples",
    "render_panel",
    "render_stats_html",
    "render_trace_html",
    "serve",
]

#: Token sources, in legend order, with what each means.
SOURCES: dict[str, str] = {
    "accepted": "drafter token accepted by the gate",
    "fused": "emitted at a rejection: argmax of verifier + \u03b2\u00b7\u03b4 (the image's steer)",
    "bonus": "the verifier's own token after K acceptances",
    "greedy": "plain greedy decoding (Floor / drafter alone)",
}
STEERED_HELP = "differs from the token the verifier alone would emit here"

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "asymspec_mm" / "examples_data"

MAX_QUESTION_CHARS = 4000
MAX_VIEW_CHARS = 8000
DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 1024

#: Output order of the ``/run`` endpoint (also the keys of :func:`outputs_as_dict`).
RUN_OUTPUTS = ("status", "answer_html", "answer_text", "floor_html", "drafter_html", "stats_html", "chart",
               "caption", "ocr", "result_json")

CSS = """
.asym-panel { font-family: var(--font, sans-serif); }
.asym-panel .asym-panel-title { font-weight: 600; margin: 0 0 .35rem 0; font-size: 1.02rem; }
.asym-panel .asym-panel-sub { font-weight: 400; color: var(--body-text-color-subdued, #6b7280); font-size: .85rem; }
.asym-panel .asym-panel-foot { color: var(--body-text-color-subdued, #6b7280); font-size: .82rem; margin-top: .4rem; }
.asym-panel .asym-trace { white-space: pre-wrap; word-break: break-word; line-height: 1.9; font-family: var(--font-mono, monospace);
  font-size: .92rem; padding: .55rem .6rem; border: 1px solid var(--border-color-primary, #e5e7eb);
  border-radius: 8px; min-height: 3.2rem; overflow: visible; background: var(--background-fill-primary, #fff); }
.asym-panel .asym-empty, .asym-stats .asym-empty { color: var(--body-text-color-subdued, #9ca3af); font-style: italic;
  font-family: var(--font, sans-serif); }
.asym-panel .tok { position: relative; border-radius: 3px; padding: 1px 0; color: #111827 !important; cursor: help;
  outline: none; }
.asym-panel .tok-accepted { background: #bbf7d0; }
.asym-panel .tok-fused { background: #fed7aa; }
.asym-panel .tok-bonus { background: #bfdbfe; }
.asym-panel .tok-greedy { background: #e5e7eb; }
.asym-panel .tok-steered { text-decoration: underline wavy #dc2626; text-decoration-thickness: 1.5px;
  text-underline-offset: 3px; }
.asym-panel .asym-trace .tok:hover, .asym-panel .asym-trace .tok:focus { outline: 2px solid #1f2937; z-index: 1000; }
.asym-panel .tok .tok-tip { display: none; position: absolute; left: 0; top: 1.75em; z-index: 1001; min-width: 18rem;
  max-width: 34rem; width: max-content; white-space: pre; font-family: var(--font-mono, monospace); font-size: .78rem;
  line-height: 1.4; background: #111827; color: #f9fafb !important; padding: .5rem .65rem; border-radius: 6px;
  box-shadow: 0 4px 14px rgba(0,0,0,.35); pointer-events: none; text-align: left; }
.asym-panel .tok:hover > .tok-tip, .asym-panel .tok:focus > .tok-tip { display: block; }
.asym-panel .tok-cursor { display: inline-block; width: .55em; background: #6b7280; animation: asym-blink 1s steps(1) infinite; }
@keyframes asym-blink { 50% { opacity: 0; } }
.asym-panel .asym-legend { display: flex; flex-wrap: wrap; gap: .25rem .9rem; font-size: .8rem; margin: .2rem 0 .5rem 0;
  line-height: 1.6; }
.asym-panel .asym-legend .tok { cursor: default; padding: 0 .35rem; }
.asym-status { font-size: .9rem; padding: .4rem .6rem; border-radius: 6px; }
.asym-status.asym-status-error { background: #fee2e2; color: #991b1b !important; border: 1px solid #fca5a5; }
.asym-status.asym-status-idle { background: var(--background-fill-secondary, #f9fafb); }
.asym-status.asym-status-ok { background: #ecfdf5; color: #065f46 !important; }
.asym-status.asym-status-run { background: #eff6ff; color: #1e40af !important; }
.asym-stats .asym-stats-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(8.5rem, 1fr)); gap: .4rem; }
.asym-stats .asym-stat { border: 1px solid var(--border-color-primary, #e5e7eb); border-radius: 6px; padding: .25rem .45rem; }
.asym-stats .asym-stat-k { font-size: .72rem; color: var(--body-text-color-subdued, #6b7280); }
.asym-stats .asym-stat-v { font-size: .92rem; font-weight: 600; font-family: var(--font-mono, monospace); }
"""


# ---------------------------------------------------------------------------------------------
# rendering (pure functions)
# ---------------------------------------------------------------------------------------------

def _esc(text: str) -> str:
    """HTML-escape, plus the characters Gradio's HTML templating could interpret (``{ } $ ```)."""
    return (html.escape(str(text), quote=True)
            .replace("{", "&#123;").replace("}", "&#125;").replace("$", "&#36;").replace("`", "&#96;"))


def visible_text(text: str) -> str:
    """Token text as shown: control characters become Unicode control pictures (newline and tab stay)."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in "\n\t":
            out.append(ch)
        elif o < 0x20:
            out.append(chr(0x2400 + o))
        elif o == 0x7F:
            out.append("\u2421")
        else:
            out.append(ch)
    return "".join(out)


def _get(ev: Any, name: str, default: Any = None) -> Any:
    if isinstance(ev, dict):
        return ev.get(name, default)
    return getattr(ev, name, default)


class _Decoder:
    """Token id -> text, cached per render (``tokenizer`` may be None: ids are shown instead)."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        token_id = int(token_id)
        if token_id not in self.cache:
            text = f"<{token_id}>"
            if self.tok is not None:
                try:
                    text = self.tok.decode([token_id])
                except Exception:  # a bad id must not break the page
                    pass
            self.cache[token_id] = text
        return self.cache[token_id]


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "\u2014"
    x = float(x)
    if math.isnan(x):
        return "nan"
    return f"{x:.{digits}g}"


def _num_attr(x: float | None) -> str | None:
    return None if x is None else repr(float(x))


def _tops_attr(tops: Iterable, dec: _Decoder) -> str:
    return json.dumps([[int(i), float(p), dec(i)] for i, p in tops], ensure_ascii=False)


def _tops_text(tops: Iterable, dec: _Decoder) -> str:
    parts = [f"{visible_text(dec(i))!r} {float(p):.3f}" for i, p in tops]
    return ", ".join(parts) if parts else "\u2014"


def _tooltip(ev: Any, dec: _Decoder) -> str:
    source = _get(ev, "source", "greedy")
    token = int(_get(ev, "token_id"))
    text = _get(ev, "text") or dec(token)
    vmax = _get(ev, "verifier_argmax")
    draft = _get(ev, "draft_token")
    steered = bool(_get(ev, "steered", False))
    lines = [
        f"#{_get(ev, 'index', 0)}  {source}  (step {_get(ev, 'step', 0)}, position {_get(ev, 'position', 0)})",
        f"token     {visible_text(text)!r} (id {token})",
    ]
    if vmax is not None:
        mark = "  <- STEERED: differs" if steered else "  (same)"
        lines.append(f"verifier  {visible_text(dec(vmax))!r} (id {int(vmax)}){mark}")
    if draft is not None:
        lines.append(f"draft     {visible_text(dec(draft))!r} (id {int(draft)}) rejected")
    lines.append(f"p_verifier {_fmt(_get(ev, 'p_verifier'))}   p_base {_fmt(_get(ev, 'p_base'))}")
    lines.append(f"JSD        {_fmt(_get(ev, 'jsd'))}   gamma_eff {_fmt(_get(ev, 'gamma_eff'))}")
    top_v = _get(ev, "top_verifier") or []
    top_f = _get(ev, "top_fused") or []
    if top_v:
        lines.append(f"top before fusion: {_tops_text(top_v, dec)}")
    if top_f:
        lines.append(f"top after fusion:  {_tops_text(top_f, dec)}")
    return "\n".join(lines)


def render_token(ev: Any, dec: _Decoder) -> str:
    """One token as ``<span class="tok tok-SOURCE [tok-steered]" data-...>text<span class="tok-tip">...</span></span>``."""
    source = str(_get(ev, "source", "greedy"))
    if source not in SOURCES:
        source = "greedy"
    token = int(_get(ev, "token_id"))
    text = _get(ev, "text")
    if not text:
        text = dec(token)
    steered = bool(_get(ev, "steered", False))
    classes = f"tok tok-{source}" + (" tok-steered" if steered else "")
    attrs: list[tuple[str, str | None]] = [
        ("class", classes),
        ("tabindex", "0"),
        ("data-index", str(_get(ev, "index", 0))),
        ("data-token-id", str(token)),
        ("data-source", source),
        ("data-step", str(_get(ev, "step", 0))),
        ("data-position", str(_get(ev, "position", 0))),
        ("data-steered", "1" if steered else "0"),
        ("data-p-verifier", _num_attr(_get(ev, "p_verifier"))),
        ("data-p-base", _num_attr(_get(ev, "p_base"))),
        ("data-jsd", _num_attr(_get(ev, "jsd"))),
        ("data-gamma-eff", _num_attr(_get(ev, "gamma_eff"))),
    ]
    vmax = _get(ev, "verifier_argmax")
    if vmax is not None:
        attrs += [("data-verifier-argmax", str(int(vmax))), ("data-verifier-argmax-text", dec(vmax))]
    draft = _get(ev, "draft_token")
    if draft is not None:
        attrs += [("data-draft-token", str(int(draft))), ("data-draft-text", dec(draft))]
    top_v = _get(ev, "top_verifier") or []
    top_f = _get(ev, "top_fused") or []
    if top_v:
        attrs.append(("data-top-verifier", _tops_attr(top_v, dec)))
    if top_f:
        attrs.append(("data-top-fused", _tops_attr(top_f, dec)))
    attr_html = " ".join(f'{k}="{_esc(v)}"' for k, v in attrs if v is not None)
    tip = _esc(_tooltip(ev, dec))
    return (f'<span {attr_html}><span class="tok-text">{_esc(visible_text(text))}</span>'
            f'<span class="tok-tip" role="tooltip">{tip}</span></span>')


def render_trace_html(trace: Sequence[Any], tokenizer: Any = None, *, done: bool = True,
                      empty: str = "No tokens yet.") -> str:
    """The answer as HTML: one ``span.tok.tok-<source>`` per emitted token (``tok-steered`` added where the
    token differs from the verifier's own argmax), with the hover data as ``data-*`` attributes and a
    CSS tooltip (shown on hover, focus or tap). Token text is HTML-escaped.

    ``trace``: :class:`~asymspec_mm.decode.TokenEvent` objects or their ``as_dict()``. ``tokenizer``
    (optional) decodes the verifier's argmax, the rejected draft and the top alternatives.
    ``done=False`` adds a blinking cursor (streaming).
    """
    dec = _Decoder(tokenizer)
    spans = [render_token(ev, dec) for ev in trace]
    body = "".join(spans)
    if not spans:
        body = f'<span class="asym-empty">{_esc(empty)}</span>' if done else ""
    cursor = "" if done else '<span class="tok-cursor">&nbsp;</span>'
    return (f'<div class="asym-trace" data-tokens="{len(spans)}" data-done="{1 if done else 0}">'
            f"{body}{cursor}</div>")


def source_counts(trace: Sequence[Any]) -> dict[str, int]:
    counts = {s: 0 for s in SOURCES}
    for ev in trace:
        s = _get(ev, "source", "greedy")
        counts[s] = counts.get(s, 0) + 1
    counts["steered"] = sum(bool(_get(ev, "steered", False)) for ev in trace)
    return counts


def render_legend() -> str:
    items = [f'<span class="tok tok-{s}" title="{_esc(h)}">{s}</span> <span>{_esc(h)}</span>' for s, h in SOURCES.items()]
    items.append(f'<span class="tok tok-greedy tok-steered" title="{_esc(STEERED_HELP)}">steered</span> '
                 f"<span>{_esc(STEERED_HELP)}</span>")
    return '<div class="asym-legend">' + "".join(f"<span>{i}</span>" for i in items) + "</div>"


def render_panel(title: str, trace: Sequence[Any], tokenizer: Any = None, *, subtitle: str = "", done: bool = True,
                 stats: dict | None = None, empty: str = "No tokens yet.", legend: bool = False) -> str:
    """A titled panel around :func:`render_trace_html` with a one-line summary under it."""
    foot = ""
    if trace:
        c = source_counts(trace)
        parts = [f"{len(trace)} tokens"]
        parts += [f"{c[s]} {s}" for s in ("accepted", "fused", "bonus") if c.get(s)]
        if any(_get(ev, "verifier_argmax") is not None for ev in trace) and _get(trace[0], "source") != "greedy":
            parts.append(f"{c['steered']} steered")
        if stats and done:
            parts.append(f"{stats.get('tokens_per_s', 0.0):.1f} tok/s")
        sep = " \u00b7 "
        foot = f'<div class="asym-panel-foot">{_esc(sep.join(parts))}</div>'
    sub = f' <span class="asym-panel-sub">{_esc(subtitle)}</span>' if subtitle else ""
    return (f'<div class="asym-panel"><div class="asym-panel-title">{_esc(title)}{sub}</div>'
            f'{render_legend() if legend else ""}'
            f"{render_trace_html(trace, tokenizer, done=done, empty=empty)}{foot}</div>")


def render_stats_html(stats: dict | None, method: str = "asymspec") -> str:
    """The stats panel: a grid of labelled values (each value carries ``data-stat``)."""
    if not stats:
        return '<div class="asym-stats"><span class="asym-empty">Statistics appear here after a run.</span></div>'

    def f(x):
        return "\u2014" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)

    def sec(x):
        return "\u2014" if x is None else "< 0.01" if 0 <= x < 0.005 else f"{x:.2f}"

    rows = [
        ("method", method),
        ("new tokens", stats.get("new_tokens")),
        ("steps", stats.get("steps")),
        ("acceptance rate", f(stats.get("acceptance_rate"))),
        ("mean accepted length", f(stats.get("mean_accepted_length"))),
        ("accepted per position", stats.get("accepted_per_position")),
        ("tokens/s (decode)", f(stats.get("tokens_per_s"))),
        ("wall time (s)", sec(stats.get("wall_s"))),
        ("vision tower calls", stats.get("vision_calls")),
        ("vision cache hits", stats.get("vision_cache_hits")),
        ("prefix KV cache hit", None if "prefix_cache_hit" not in stats
         else "yes" if stats["prefix_cache_hit"] else "no"),
        ("caption time (s)", sec(stats.get("caption_s"))),
        ("OCR time (s)", sec(stats.get("ocr_s"))),
        ("steered tokens", stats.get("steered")),
        ("fused tokens", stats.get("fused")),
        ("stopped by", stats.get("stopped_by")),
    ]
    rows = [(k, v) for k, v in rows if not (k == "prefix KV cache hit" and v is None)]
    cells = "".join(f'<div class="asym-stat"><div class="asym-stat-k">{_esc(k)}</div>'
                    f'<div class="asym-stat-v" data-stat="{_esc(k)}">{_esc("" if v is None else v)}</div></div>'
                    for k, v in rows)
    return f'<div class="asym-stats"><div class="asym-stats-grid">{cells}</div></div>'


def jsd_gamma_chart(trace: Sequence[Any]):
    """A small PNG-ready chart (PIL image) of JSD and gamma_eff per emitted position; None without data."""
    xs = [int(_get(ev, "index", i)) for i, ev in enumerate(trace)]
    jsd = [float("nan") if _get(ev, "jsd") is None else float(_get(ev, "jsd")) for ev in trace]
    gam = [float("nan") if _get(ev, "gamma_eff") is None else float(_get(ev, "gamma_eff")) for ev in trace]
    if not trace or all(math.isnan(v) for v in jsd + gam):
        return None
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(7.2, 2.7), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    ax.plot(xs, jsd, marker="o", ms=3, lw=1.2, color="#7c3aed", label="JSD(drafter full view, compressed view)")
    ax.plot(xs, gam, marker="s", ms=3, lw=1.2, color="#0891b2", label="gamma_eff (gate threshold)")
    fused = [x for x, ev in zip(xs, trace) if _get(ev, "source") == "fused"]
    for x in fused:
        ax.axvline(x, color="#fb923c", alpha=0.25, lw=3)
    ax.set_title("JSD and gamma_eff per emitted token", fontsize=9)
    ax.set_xlabel("emitted token #  (orange: fused at a rejection)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.85)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    return Image.open(buf).convert("RGB")


def _status(kind: str, text: str) -> str:
    return f'<div class="asym-status asym-status-{kind}" data-status="{kind}">{_esc(text)}</div>'


# ---------------------------------------------------------------------------------------------
# examples
# ---------------------------------------------------------------------------------------------

def load_examples(path: str | Path | None = None) -> list[dict]:
    """Bundled examples from ``examples.json`` (a list of {image, question, caption, ocr}; ``image`` relative
    to the JSON's folder). Entries whose image is missing are skipped; no file (or a bad one) gives []."""
    index = Path(path) if path is not None else EXAMPLES_DIR / "examples.json"
    if index.is_dir():
        index = index / "examples.json"
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for ex in raw if isinstance(raw, list) else []:
        if not isinstance(ex, dict) or not ex.get("image") or not ex.get("question"):
            continue
        img = (index.parent / str(ex["image"])).resolve()
        if not img.is_file():
            continue
        out.append({"image": str(img), "question": str(ex["question"]), "caption": str(ex.get("caption") or ""),
                    "ocr": str(ex.get("ocr") or ""), "label": _example_label(ex)})
    return out


def _example_label(ex: dict) -> str:
    q = str(ex.get("question", ""))
    for line in q.splitlines():
        if line.lower().startswith("question:"):
            q = line.split(":", 1)[1].strip()
            break
    fam = ex.get("family")
    label = f"{fam}: {q}" if fam else q
    return label if len(label) <= 70 else label[:67] + "..."


# ---------------------------------------------------------------------------------------------
# request handling
# ---------------------------------------------------------------------------------------------

class DemoInputError(Exception):
    """A request the page refuses before it reaches the models (message is shown to the user)."""


@dataclass
class _Request:
    image: Any
    question: str
    caption: str | None
    ocr: str | bool | None
    method: str
    overrides: dict
    compare: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def _file_path(payload: Any) -> str | None:
    """The server-side path of an uploaded file payload (Gradio FileData dict) or None."""
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    if isinstance(payload, (str, os.PathLike)):
        return str(payload)
    path = getattr(payload, "path", None)
    if path:
        return str(path)
    raise DemoInputError("the image input is not a file upload")


class _Job:
    """Runs the requested decodes in one worker thread (the pipeline's lock must be taken and released by the
    same thread, and Gradio may resume a generator on any thread) and hands events over a queue."""

    #: Stop decoding when the page has not collected committed tokens for this long (the client went away
    #: without Gradio closing the handler), so an abandoned request does not hold the models.
    abandon_after_s = 30.0

    def __init__(self, pipe: "AsymSpecPipeline", req: _Request):
        self.pipe = pipe
        self.req = req
        self.q: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.last_read = time.monotonic()
        self.reader_waiting = False
        self.thread = threading.Thread(target=self._run, name="asymspec-ui-job", daemon=True)

    def start(self) -> "_Job":
        self.thread.start()
        return self

    def _decode(self, key: str, method: str, caption, ocr) -> Any:
        r = self.req
        gen = self.pipe.stream(r.image, r.question, caption=caption, ocr=ocr, method=method, **r.overrides)
        try:
            while True:
                if self.cancel.is_set() or self._abandoned():
                    return None
                try:
                    events = next(gen)
                except StopIteration as stop:
                    self.q.put((key, "done", stop.value))
                    return stop.value
                self.q.put((key, "events", events))
        finally:
            gen.close()

    def _abandoned(self) -> bool:
        idle = time.monotonic() - self.last_read
        if not self.reader_waiting and not self.q.empty() and idle > self.abandon_after_s:
            log.warning("the client stopped reading; abandoning the request")
            self.cancel.set()
        return self.cancel.is_set()

    def get(self):
        """The next (key, kind, payload) item, for the handler (the reader)."""
        self.reader_waiting = True
        try:
            return self.q.get()
        finally:
            self.reader_waiting = False
            self.last_read = time.monotonic()

    def _run(self) -> None:
        try:
            r = self.req
            main = self._decode("main", r.method, r.caption, r.ocr)
            if main is not None:
                caption, ocr = main.view.caption, (main.view.ocr_text or False)
                for m in r.compare:
                    if self.cancel.is_set() or self._decode(m, m, caption, ocr) is None:
                        break
        except BaseException as exc:  # reported to the page; the server keeps serving
            self.q.put((None, "error", exc))
        finally:
            self.q.put((None, "end", None))


class DemoApp:
    """State and handlers behind the Blocks (one loaded pipeline, shared by all sessions)."""

    def __init__(self, pipe: "AsymSpecPipeline", *, max_upload_mb: float = 10, max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
                 stream_interval: float = 0.1):
        self.pipe = pipe
        self.max_upload_bytes = int(max_upload_mb * 2**20)
        self.max_upload_mb = max_upload_mb
        self.max_new_tokens_limit = max_new_tokens_limit
        self.stream_interval = stream_interval

    # ---------------------------------------------------------------- inputs
    def _load_image(self, payload: Any):
        from vision_cache.image import InvalidImageError, load_image

        path = _file_path(payload)
        if not path:
            raise DemoInputError("upload an image first (PNG, JPEG, WebP, ...)")
        try:
            size = os.path.getsize(path)
        except OSError:
            raise DemoInputError("the uploaded image could not be read; upload it again") from None
        if size > self.max_upload_bytes:
            raise DemoInputError(f"the upload is {size / 2**20:.1f} MB; the limit is {self.max_upload_mb:g} MB")
        try:
            return load_image(path)
        except InvalidImageError as exc:  # name the user's file, not the server's temp copy
            shown = (payload.get("orig_name") if isinstance(payload, dict) else None) or Path(path).name
            raise InvalidImageError(str(exc).replace(path, shown)) from None

    def _ocr_arg(self, ocr: str, autofill: bool, notes: list[str]):
        if ocr and ocr.strip():
            return ocr
        if not autofill:
            return False
        try:
            engine = self.pipe.ocr_engine
        except Exception as exc:  # OCR is optional: skip it and say so
            notes.append(f"OCR skipped ({exc})")
            return False
        if engine is None:
            notes.append("no OCR engine configured: OCR skipped")
            return False
        return None

    def prepare(self, image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus,
                max_new_tokens, drafter_view, compare) -> _Request:
        from asymspec_mm.decode import METHODS

        question = "" if question is None else str(question)
        caption = "" if caption is None else str(caption)
        ocr = "" if ocr is None else str(ocr)
        if len(question) > MAX_QUESTION_CHARS:
            raise DemoInputError(f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}")
        for name, text in (("caption", caption), ("OCR text", ocr)):
            if len(text) > MAX_VIEW_CHARS:
                raise DemoInputError(f"the {name} is {len(text)} characters; the limit is {MAX_VIEW_CHARS}")
        if not question.strip():
            raise DemoInputError("the question is empty: ask something about the image, e.g. 'Which bar is the tallest?'")
        method = str(method or "asymspec")
        if method not in METHODS:
            raise DemoInputError(f"method={method!r} is not valid; choose one of {', '.join(METHODS)}")
        try:
            max_new = int(max_new_tokens)
            k_int = int(k)
            overrides = dict(k=k_int, beta=float(beta), gamma=float(gamma), gate=str(gate), delta=str(delta),
                             bonus=str(bonus), max_new_tokens=max_new, drafter_view=str(drafter_view))
        except (TypeError, ValueError) as exc:
            raise DemoInputError(f"bad setting: {exc}") from None
        if not 1 <= max_new <= self.max_new_tokens_limit:
            raise DemoInputError(f"max new tokens must be between 1 and {self.max_new_tokens_limit}")
        if not 1 <= k_int <= 16:
            raise DemoInputError("K must be between 1 and 16")
        img = self._load_image(image)
        notes: list[str] = []
        cap_arg = caption if caption.strip() else (None if autofill else "")
        ocr_arg = self._ocr_arg(ocr, bool(autofill), notes)
        others = tuple(m for m in ("floor", "drafter") if m != method) if compare else ()
        return _Request(img, question, cap_arg, ocr_arg, method, overrides, others, notes)

    # ---------------------------------------------------------------- handlers
    def describe(self, image, caption, ocr):
        """Fill the compressed view from the image (drafter caption; OCR when an engine is available)."""
        try:
            img = self._load_image(image)
            notes: list[str] = []
            ocr_arg = self._ocr_arg("", True, notes)
            view = self.pipe.compressed_view(img, caption=None, ocr=ocr_arg)
        except Exception as exc:
            raise _gr_error(exc, "Cannot describe this image") from None
        return view.caption, view.ocr_text

    def run(self, image, question, caption, ocr, autofill=False, method="asymspec", k=4, beta=1.0, gamma=0.5,
            gate="cda", delta="contrast", bonus="verifier", max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
            drafter_view="image+text", compare=True) -> Iterator[tuple]:
        """The ``/run`` endpoint: a generator of :data:`RUN_OUTPUTS` tuples (streams as tokens commit)."""
        import gradio as gr

        skip = gr.skip()
        t0 = time.perf_counter()
        try:
            req = self.prepare(image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus,
                               max_new_tokens, drafter_view, compare)
        except Exception as exc:
            yield (_status("error", f"Error: {_error_text(exc)}"),) + (skip,) * (len(RUN_OUTPUTS) - 1)
            raise _gr_error(exc, "Cannot run this request") from None

        tok = self.pipe.tokenizer
        traces: dict[str, list] = {"main": [], "floor": [], "drafter": []}
        results: dict[str, Any] = {}
        titles = {"main": _method_title(req.method), "floor": _method_title("floor"), "drafter": _method_title("drafter")}
        subtitles = {"main": _method_subtitle(req.method), "floor": _method_subtitle("floor"),
                     "drafter": _method_subtitle("drafter")}

        def panel(key: str) -> str:
            if key != "main" and key not in req.compare:
                if key == req.method and "main" in results:
                    return render_panel(titles[key], traces["main"], tok, subtitle=subtitles[key],
                                        stats=results["main"].stats)
                return render_panel(titles[key], [], tok, subtitle=subtitles[key], empty="(comparison off)")
            done = key in results
            running = current[0] == key
            return render_panel(titles[key], traces[key], tok, subtitle=subtitles[key], done=not running,
                                stats=results[key].stats if done else None, legend=(key == "main"),
                                empty="waiting for the models..." if not done else "(no tokens)")

        current = ["main"]
        job = _Job(self.pipe, req).start()
        last_yield = time.perf_counter()
        try:
            yield (_status("run", f"Running {titles['main']}..."), panel("main"), "", panel("floor"), panel("drafter"),
                   render_stats_html(None), None) + (skip,) * 3
            while True:
                key, kind, payload = job.get()
                if kind == "events":
                    traces[key].extend(payload)
                elif kind == "done":
                    results[key] = payload
                    if key == "main":
                        current[0] = req.compare[0] if req.compare else ""
                    else:
                        i = req.compare.index(key)
                        current[0] = req.compare[i + 1] if i + 1 < len(req.compare) else ""
                elif kind == "error":
                    msg = _error_text(payload)
                    if not isinstance(payload, Exception) or not _is_user_error(payload):
                        log.error("request failed", exc_info=payload)
                    yield (_status("error", f"Error: {msg}"),) + (skip,) * (len(RUN_OUTPUTS) - 1)
                    raise _gr_error(payload, "The request failed")
                elif kind == "end":
                    break
                now = time.perf_counter()
                n_main = len(traces["main"])
                interval = self.stream_interval + n_main / 2000.0
                if kind == "done" or now - last_yield >= interval:
                    last_yield = now
                    cur = current[0]
                    where = {"main": titles["main"], "floor": "Floor", "drafter": "the drafter alone"}.get(cur, "")
                    text = "".join(ev.text for ev in traces["main"])
                    status = _status("run", f"Running {where}... {len(traces[cur])} tokens so far" if where
                                     else "Finishing...")
                    yield (status, panel("main"), text, panel("floor"), panel("drafter")) + (skip,) * 5
        finally:
            job.cancel.set()

        if "main" not in results:
            yield (_status("error", "Stopped."),) + (skip,) * (len(RUN_OUTPUTS) - 1)
            raise _gr_error("the request was stopped before it finished", "Stopped")
        main = results["main"]
        counts = source_counts(main.trace)
        summary = (f"Done in {time.perf_counter() - t0:.1f} s: {len(main.trace)} tokens"
                   + ("".join(f", {counts[s]} {s}" for s in ("accepted", "fused", "bonus") if counts.get(s)))
                   + (f"; {counts['steered']} differ from the verifier alone" if req.method == "asymspec" else ""))
        if req.notes:
            summary += " (" + "; ".join(req.notes) + ")"
        payload = {"main": main.as_dict()}
        for m in ("floor", "drafter"):
            if m in results:
                payload[m] = results[m].as_dict()
        current[0] = ""
        chart = jsd_gamma_chart(main.trace)
        yield (_status("ok", summary), panel("main"), main.text, panel("floor"), panel("drafter"),
               render_stats_html(main.stats, req.method), chart, main.view.caption, main.view.ocr_text, payload)


def _method_title(method: str) -> str:
    return {"asymspec": "AsymSpec", "floor": "Floor: verifier alone", "drafter": "Drafter alone",
            "sd": "Symmetric speculative decoding"}.get(method, method)


def _method_subtitle(method: str) -> str:
    return {"asymspec": "drafter sees the image and steers the text-only verifier",
            "floor": "reads only the compressed view (caption + OCR)",
            "drafter": "the small VLM reads the image, no verifier",
            "sd": "drafter on the compressed view, lossless w.r.t. Floor"}.get(method, "")


def _is_user_error(exc: BaseException) -> bool:
    from asymspec_mm.errors import AsymSpecError

    return isinstance(exc, (AsymSpecError, DemoInputError))


def _gr_error(exc_or_msg: BaseException | str, title: str):
    """A ``gr.Error`` for the page (its message is rendered as HTML, so it is escaped)."""
    import gradio as gr

    msg = exc_or_msg if isinstance(exc_or_msg, str) else _error_text(exc_or_msg)
    user = isinstance(exc_or_msg, str) or _is_user_error(exc_or_msg)
    return gr.Error(html.escape(msg, quote=False), title=title, print_exception=not user)


def _error_text(exc: BaseException) -> str:
    if _is_user_error(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------

def build_app(pipe: "AsymSpecPipeline", *, examples: Sequence[dict] | None = None, max_upload_mb: float = 10,
              concurrency_limit: int = 2, max_queue: int = 64, default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
              max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT, stream_interval: float = 0.1) -> "gr.Blocks":
    """The steering inspector for one loaded pipeline.

    ``examples``: dicts with image (path), question, caption, ocr; None loads the bundled
    ``examples.json`` when present, [] shows none. ``max_upload_mb`` is enforced by :func:`launch`
    (Gradio's ``max_file_size``) and again by the handlers. ``concurrency_limit``: model requests run at
    once (the pipeline serialises decoding; the rest wait in a queue of at most ``max_queue``).
    Endpoints: ``/run`` (see :data:`RUN_OUTPUTS`) and ``/describe``.
    """
    import gradio as gr

    from asymspec_mm.decode import METHODS, AsymSpecConfig
    from asymspec_mm.gate import DELTAS, GATES
    from asymspec_mm.prompts import DRAFTER_VIEWS

    if examples is None:
        examples = load_examples()
    state = DemoApp(pipe, max_upload_mb=max_upload_mb, max_new_tokens_limit=max_new_tokens_limit,
                    stream_interval=stream_interval)
    defaults = AsymSpecConfig()
    tok = pipe.tokenizer

    with gr.Blocks(title="AsymSpec steering inspector", analytics_enabled=False) as demo:
        gr.HTML(
            f"<style>{CSS}</style>"
            '<div class="asym-header"><h1 style="margin:.2rem 0">AsymSpec steering inspector</h1>'
            f'<p style="margin:.2rem 0 .6rem 0">A small vision-language drafter reads the image; a text-only verifier '
            f"reads only the compressed view (caption + OCR). Watch, token by token, how the drafter steers the "
            f"verifier. Models: <code>{_esc(_model_label(pipe))}</code>. Hover or tap a token for "
            f"its provenance.</p></div>",
            js_on_load=None,
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=320):
                image = gr.Image(label="Image", type="filepath", image_mode=None, sources=["upload", "clipboard"],
                                 height=260, elem_id="asym-image")
                question = gr.Textbox(label="Question", lines=3, max_lines=10, max_length=MAX_QUESTION_CHARS,
                                      placeholder="e.g. Which bar is the tallest?", elem_id="asym-question")
                with gr.Accordion("Compressed view: what the verifier reads (edit it)", open=True):
                    caption = gr.Textbox(label="Caption", lines=3, max_lines=8, max_length=MAX_VIEW_CHARS,
                                         placeholder="empty: the drafter writes one (if auto-fill is on)",
                                         elem_id="asym-caption")
                    ocr = gr.Textbox(label="OCR text", lines=2, max_lines=6, max_length=MAX_VIEW_CHARS,
                                     placeholder="empty: OCR engine (if auto-fill is on and one is installed)",
                                     elem_id="asym-ocr")
                    with gr.Row():
                        autofill = gr.Checkbox(value=True, label="Auto-fill empty fields from the image",
                                               elem_id="asym-autofill")
                        describe_btn = gr.Button("Describe image", size="sm", elem_id="asym-describe")
                with gr.Accordion("Advanced settings", open=False):
                    method = gr.Dropdown(list(METHODS), value="asymspec", label="Method (main panel)",
                                         elem_id="asym-method")
                    k = gr.Slider(1, 16, value=defaults.k, step=1, label="K (draft length)", elem_id="asym-k")
                    beta = gr.Slider(0.0, 4.0, value=defaults.beta, step=0.05, label="beta (fusion strength)",
                                     elem_id="asym-beta")
                    gamma = gr.Slider(0.0, 1.0, value=defaults.gamma, step=0.01, label="gamma (acceptance threshold)",
                                      elem_id="asym-gamma")
                    gate = gr.Dropdown(list(GATES), value=defaults.gate, label="Gate", elem_id="asym-gate")
                    delta = gr.Dropdown(list(DELTAS), value=defaults.delta, label="Delta source", elem_id="asym-delta")
                    bonus = gr.Dropdown(["verifier", "gated"], value=defaults.bonus, label="Bonus token",
                                        elem_id="asym-bonus")
                    max_new = gr.Slider(1, max_new_tokens_limit, value=min(default_max_new_tokens, max_new_tokens_limit),
                                        step=1, label="Max new tokens", elem_id="asym-max-new")
                    drafter_view = gr.Dropdown(list(DRAFTER_VIEWS), value=defaults.drafter_view, label="Drafter view",
                                               elem_id="asym-drafter-view")
                    compare = gr.Checkbox(value=True, label="Also run Floor (verifier alone) and the drafter alone",
                                          elem_id="asym-compare")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="asym-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="asym-stop")
                if examples:
                    gr.Examples(
                        examples=[[e["image"], e["question"], e.get("caption", ""), e.get("ocr", "")] for e in examples],
                        inputs=[image, question, caption, ocr],
                        example_labels=[e.get("label") or _example_label(e) for e in examples],
                        label="Bundled examples (MiniVista; they work with the shipped tiny pair)",
                        cache_examples=False,
                        examples_per_page=8,
                    )
            with gr.Column(scale=3, min_width=420):
                status = gr.HTML(_status("idle", "Upload an image, ask a question, press Run."), js_on_load=None,
                                 elem_id="asym-status")
                answer_html = gr.HTML(render_panel("AsymSpec", [], tok, subtitle=_method_subtitle("asymspec"), legend=True,
                                                   empty="The answer appears here, token by token."),
                                      js_on_load=None, elem_id="asym-answer")
                answer_text = gr.Textbox(label="Answer (plain text)", lines=2, interactive=False,
                                         elem_id="asym-answer-text")
                with gr.Row(equal_height=False):
                    floor_html = gr.HTML(render_panel(_method_title("floor"), [], tok, subtitle=_method_subtitle("floor")),
                                         js_on_load=None, elem_id="asym-floor")
                    drafter_html = gr.HTML(render_panel(_method_title("drafter"), [], tok,
                                                        subtitle=_method_subtitle("drafter")),
                                           js_on_load=None, elem_id="asym-drafter")
                stats_html = gr.HTML(render_stats_html(None), js_on_load=None, elem_id="asym-stats")
                chart = gr.Image(label="JSD and gamma_eff per emitted token", show_label=False, type="pil",
                                 interactive=False, format="png", elem_id="asym-chart", height=280,
                                 buttons=["download"])
                with gr.Accordion("Raw result (JSON: trace, stats, view)", open=False):
                    result_json = gr.JSON(label="result", elem_id="asym-json")

        inputs = [image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new,
                  drafter_view, compare]
        outputs = [status, answer_html, answer_text, floor_html, drafter_html, stats_html, chart, caption, ocr,
                   result_json]
        # show_progress="hidden": the status line reports progress and errors, so a refused request does not
        # cover the inputs (caption/OCR are outputs too) with error badges; gr.Error still raises a toast.
        run_event = run_btn.click(state.run, inputs, outputs, api_name="run", preprocess=False,
                                  concurrency_limit=concurrency_limit, concurrency_id="models", show_progress="hidden")
        stop_btn.click(lambda: _status("idle", "Stopped."), None, [status], cancels=[run_event], queue=False,
                       api_visibility="private")
        describe_btn.click(state.describe, [image, caption, ocr], [caption, ocr], api_name="describe",
                           preprocess=False, concurrency_limit=concurrency_limit, concurrency_id="models")

    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_queue)
    demo.asymspec = state  # type: ignore[attr-defined]
    demo.asymspec_max_upload_mb = max_upload_mb  # type: ignore[attr-defined]
    demo.asymspec_allowed_paths = sorted({str(Path(e["image"]).resolve().parent) for e in examples})  # type: ignore[attr-defined]
    return demo


def _model_label(pipe: Any) -> str:
    """The pipeline's name with local paths shortened to their last two parts."""
    parts = []
    for part in str(getattr(pipe, "name", "custom")).split(" + "):
        p = Path(part)
        parts.append(str(Path(*p.parts[-2:])) if p.is_absolute() and len(p.parts) > 2 else part)
    return " + ".join(parts)


def outputs_as_dict(outputs: Sequence[Any]) -> dict[str, Any]:
    """Name the ``/run`` endpoint's outputs (e.g. a gradio_client result tuple)."""
    return dict(zip(RUN_OUTPUTS, outputs))


# ---------------------------------------------------------------------------------------------
# serving
# ---------------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_pipeline(preset: str | None = None, drafter: str | None = None, verifier: str | None = None, *,
                  device: str | None = None, dtype: str | None = None, ocr_engine: str = "auto") -> "AsymSpecPipeline":
    """Load the pair once: ``drafter`` + ``verifier`` when given, else the named preset (default ``auto``)."""
    from asymspec_mm.errors import AsymSpecError
    from asymspec_mm.pipeline import AsymSpecPipeline

    if drafter or verifier:
        if not (drafter and verifier):
            raise AsymSpecError("give both --drafter and --verifier (or a --preset)")
        return AsymSpecPipeline.from_pretrained(drafter, verifier, device=device, dtype=dtype, ocr=ocr_engine)
    extra = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    return AsymSpecPipeline.from_preset(preset or "auto", ocr=ocr_engine, **extra)


def launch(pipe_or_preset: "AsymSpecPipeline | str" = "auto", host: str = "127.0.0.1", port: int | None = 7860,
           share: bool = False, *, drafter: str | None = None, verifier: str | None = None, device: str | None = None,
           dtype: str | None = None, ocr_engine: str = "auto", examples: Sequence[dict] | None = None,
           max_upload_mb: float = 10, concurrency_limit: int = 2, max_queue: int = 64,
           default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, prevent_thread_lock: bool = False,
           quiet: bool = False, **launch_kwargs) -> "gr.Blocks":
    """Load the models once (unless a pipeline is given), build the app and serve it.

    Binds ``127.0.0.1`` by default; any other host prints a warning (the demo has no authentication).
    No share link unless ``share=True``. Analytics are off. Returns the running Blocks (call
    ``.close()`` to stop; with ``prevent_thread_lock=False`` this blocks until interrupted).
    """
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    if isinstance(pipe_or_preset, str) or pipe_or_preset is None:
        pipe = load_pipeline(pipe_or_preset, drafter, verifier, device=device, dtype=dtype, ocr_engine=ocr_engine)
    else:
        pipe = pipe_or_preset
    demo = build_app(pipe, examples=examples, max_upload_mb=max_upload_mb, concurrency_limit=concurrency_limit,
                     max_queue=max_queue, default_max_new_tokens=default_max_new_tokens)
    return serve(demo, host=host, port=port, share=share, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
                 **launch_kwargs)


def serve(demo: "gr.Blocks", host: str = "127.0.0.1", port: int | None = 7860, share: bool = False, *,
          prevent_thread_lock: bool = False, quiet: bool = False, **launch_kwargs) -> "gr.Blocks":
    """Serve a Blocks made by :func:`build_app` with the demo's safe defaults: no share link unless asked,
    Gradio's upload limit set to the app's ``max_upload_mb``, no SSR/monitoring/MCP/PWA extras, the bundled
    examples' folder allowed. Extra keyword arguments go to ``Blocks.launch``."""
    if not is_loopback(host):
        msg = (f"serving the demo on {host}: anyone who can reach this machine on port {port} can use it "
               "(there is no authentication). Use the default --host 127.0.0.1 to keep it local.")
        warnings.warn(msg, stacklevel=2)
        print(f"asymspec-mm demo: WARNING: {msg}", file=sys.stderr)
    if share:
        print("asymspec-mm demo: WARNING: --share creates a public link through Gradio's tunnel service.", file=sys.stderr)
    max_mb = getattr(demo, "asymspec_max_upload_mb", 10)
    allowed = list(launch_kwargs.pop("allowed_paths", None) or []) + list(getattr(demo, "asymspec_allowed_paths", []))
    opts = dict(server_name=host, server_port=port, share=bool(share), max_file_size=f"{max_mb}mb",
                show_error=True, prevent_thread_lock=prevent_thread_lock, quiet=quiet, allowed_paths=allowed,
                inbrowser=False, ssr_mode=False, enable_monitoring=False, mcp_server=False, pwa=False,
                footer_links=["api", "settings"])
    opts.update(launch_kwargs)
    demo.launch(**opts)
    return demo


def _cmd_demo(args) -> int:
    import importlib.util

    missing = [m for m in ("gradio", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"error: the demo needs {', '.join(missing)}: pip install 'asymspec-mm[ui]'", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    # Import Gradio while the models load (much of both is I/O), so the page is up sooner.
    preload = threading.Thread(target=lambda: __import__("gradio"), name="import-gradio", daemon=True)
    preload.start()
    pipe = load_pipeline(args.preset, args.drafter, args.verifier, device=args.device, dtype=args.dtype,
                         ocr_engine=args.ocr_engine)
    print(f"asymspec-mm demo: loaded {pipe.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    preload.join()
    launch(pipe, host=args.host, port=args.port, share=args.share, max_upload_mb=args.max_upload_mb,
           concurrency_limit=args.concurrency, default_max_new_tokens=args.max_new_tokens)
    return 0


def add_demo_parser(subparsers) -> Any:
    """Register ``demo`` on an argparse sub-parsers object; its ``func(args)`` loads the models and serves."""
    p = subparsers.add_parser("demo", help="the steering inspector in your browser (Gradio)",
                              description="Serve the AsymSpec steering inspector (binds 127.0.0.1 by default).")
    from asymspec_mm.cli import add_model_args

    add_model_args(p)  # the same model options as `generate`
    s = p.add_argument_group("serving")
    s.add_argument("--host", default="127.0.0.1", help="address to bind [default: %(default)s]; "
                   "anything else exposes the demo to the network (a warning is printed)")
    s.add_argument("--port", type=int, default=7860, help="[default: %(default)s]")
    s.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")
    s.add_argument("--max-upload-mb", type=float, default=10, help="largest upload accepted [default: %(default)s]")
    s.add_argument("--concurrency", type=int, default=2, help="requests processed at once [default: %(default)s]")
    s.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="initial value of the max-new-tokens slider [default: %(default)s]")
    p.set_defaults(func=_cmd_demo)
    return p


if __name__ == "__main__":  # pragma: no cover
    import argparse

    _parser = argparse.ArgumentParser(prog="python -m ui.app")
    _sub = _parser.add_subparsers(dest="command", required=True)
    add_demo_parser(_sub)
    _args = _parser.parse_args(["demo", *sys.argv[1:]])
    sys.exit(_args.func(_args))
