"""The steering inspector's HTML and chart rendering: pure functions of a trace, no Gradio needed.

A trace is a list of :class:`~asymspec_mm.decode.TokenEvent` objects or their ``as_dict()``; every
function here reads either through :func:`_get`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from .provenance import fusion_kind, fusion_line, gate_line, sampling_line

__all__ = [
    "METHOD_PANELS",
    "PANEL_STATES",
    "SOURCES",
    "SPECULATIVE_SOURCES",
    "STEERED_HELP",
    "esc",
    "jsd_gamma_chart",
    "jsd_gamma_figure",
    "method_subtitle",
    "method_title",
    "plain_text",
    "plural",
    "render_end",
    "render_legend",
    "render_panel",
    "render_stats_html",
    "render_token",
    "render_trace_html",
    "source_counts",
    "special_ids",
    "status_html",
    "visible_text",
]

#: Token sources, in legend order, with what each means.
SOURCES: dict[str, str] = {
    "accepted": "drafter token accepted by the gate",
    "fused": "emitted at a rejection: argmax of verifier + \u03b2\u00b7\u03b4 (underlined where it changed the verifier's token)",
    "bonus": "the verifier's own token after K acceptances",
    "corrected": "symmetric SD only: the verifier's own token where it rejected a draft (no fusion)",
    "greedy": "plain greedy decoding (Floor / drafter alone)",
}
#: What a panel's ``data-state`` can say (see :func:`render_panel`).
PANEL_STATES = ("running", "done", "stopped", "error", "off")
#: The sources a speculative method emits (counted in summaries; the rest is plain greedy decoding).
SPECULATIVE_SOURCES = ("accepted", "fused", "corrected", "bonus")
STEERED_HELP = "differs from the token the verifier alone would emit here"

#: Panel title and subtitle of each decoding method.
METHOD_PANELS: dict[str, tuple[str, str]] = {
    "asymspec": ("AsymSpec", "drafter sees the image and steers the text-only verifier"),
    "floor": ("Floor: verifier alone", "reads only the compressed view (caption + OCR)"),
    "drafter": ("Drafter alone", "the small VLM reads the image, no verifier"),
    "sd": ("Symmetric speculative decoding", "drafter on the compressed view, lossless w.r.t. Floor"),
}


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 token``, ``2 tokens`` (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def esc(text: str) -> str:
    """HTML-escape, plus the characters Gradio's HTML templating could interpret (``{ } $ ```)."""
    return html.escape(str(text), quote=True).replace("{", "&#123;").replace("}", "&#125;").replace("$", "&#36;").replace("`", "&#96;")


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
    """Field ``name`` of a trace event, whether it is a ``TokenEvent`` or its ``as_dict()``."""
    if isinstance(ev, dict):
        return ev.get(name, default)
    return getattr(ev, name, default)


class _Decoder:
    """Token id -> text, cached per render (``tokenizer`` may be None: ids are shown instead), and which ids are
    the tokenizer's special tokens (``<|im_end|>``, ...: drawn as the end of the answer, not as answer text)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}
        self.special = special_ids(tokenizer)

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


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of ``tokenizer``'s special tokens (none without a tokenizer)."""
    return frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", None) or ())


def _fmt(x: float | None, digits: int = 4) -> str:
    """A number for the tooltip (an em dash when absent)."""
    if x is None:
        return "\u2014"
    x = float(x)
    if math.isnan(x):
        return "nan"
    return f"{x:.{digits}g}"


def _num_attr(x: float | None) -> str | None:
    """A number for a ``data-*`` attribute, at full precision so that a page can compare it to the trace."""
    return None if x is None else repr(float(x))


def _tops_attr(tops: Iterable, dec: _Decoder) -> str:
    """Top alternatives as a JSON list of ``[id, p, text]`` for a ``data-*`` attribute."""
    return json.dumps([[int(i), float(p), dec(i)] for i, p in tops], ensure_ascii=False)


def _tops_text(tops: Iterable, dec: _Decoder) -> str:
    """Top alternatives for the tooltip: ``'text' p`` pairs."""
    parts = [f"{visible_text(dec(i))!r} {float(p):.3f}" for i, p in tops]
    return ", ".join(parts) if parts else "\u2014"


def _tooltip(ev: Any, dec: _Decoder) -> str:
    """The plain-text provenance of one token (source, verifier's own choice, probabilities, alternatives)."""
    source = _get(ev, "source", "greedy")
    token = int(_get(ev, "token_id"))
    text = _get(ev, "text") or dec(token)
    vmax = _get(ev, "verifier_argmax")
    draft = _get(ev, "draft_token")
    steered = bool(_get(ev, "steered", False))
    drafter_id = _get(ev, "drafter_token_id")  # a cross-family pair: the same token's id in the drafter's vocabulary
    ids = f"id {token}" if drafter_id is None else f"verifier id {token}, drafter id {int(drafter_id)}"
    lines = [
        f"#{_get(ev, 'index', 0)}  {source}  (step {_get(ev, 'step', 0)}, position {_get(ev, 'position', 0)})",
        f"token     {visible_text(text)!r} ({ids})",
    ]
    if _get(ev, "verifier_alone", False):
        lines.append("the verifier's best token is not in the drafter's vocabulary: the verifier decided alone (no steering)")
    if vmax is not None:
        mark = "  <- STEERED: differs" if steered else "  (same)"
        lines.append(f"verifier  {visible_text(dec(vmax))!r} (id {int(vmax)}){mark}")
    if draft is not None:
        lines.append(f"draft     {visible_text(dec(draft))!r} (id {int(draft)}) rejected")
    gate = gate_line(ev, visible_text(dec(draft)) if draft is not None else "")
    if gate:
        lines.append(gate)
    fusion = fusion_line(ev, visible_text(dec(vmax)) if vmax is not None else "")
    if fusion:
        lines.append(fusion)
    sampled = sampling_line(ev)
    if sampled:
        lines.append(sampled)
    lines.append(f"p_verifier {_fmt(_get(ev, 'p_verifier'))}   p_base {_fmt(_get(ev, 'p_base'))}")
    lines.append(f"JSD        {_fmt(_get(ev, 'jsd'))}   gamma_eff {_fmt(_get(ev, 'gamma_eff'))}")
    top_v = _get(ev, "top_verifier") or []
    top_f = _get(ev, "top_fused") or []
    if source != "fused":  # no fusion made this token: the fused alternatives, computed for the gate, would mislead
        if top_v:
            lines.append(f"verifier's top: {_tops_text(top_v, dec)}")
        return "\n".join(lines)
    if top_v:
        lines.append(f"top before fusion: {_tops_text(top_v, dec)}")
    if top_f:
        lines.append(f"top after fusion:  {_tops_text(top_f, dec)}")
    return "\n".join(lines)


def render_end(ev: Any, dec: _Decoder) -> str:
    """A special token (the end of the answer) as a neutral ``span.tok-end`` mark, not as answer text: no source
    colour, no hover box; its title names the token and what emitted it."""
    token = int(_get(ev, "token_id"))
    source = str(_get(ev, "source", "greedy"))
    title = f"end of the answer: {_get(ev, 'text') or dec(token)} (id {token}, {source})"
    return f'<span class="tok-end" data-token-id="{token}" data-source="{esc(source)}" title="{esc(title)}">end</span>'


def render_token(ev: Any, dec: _Decoder, shown: str | None = None) -> str:
    """One token as ``<span class="tok tok-SOURCE [tok-steered]" data-...>text<span class="tok-tip">...</span></span>``;
    a special token as :func:`render_end`. ``shown``: the text drawn instead of the token's own (part of it; the
    hover box still names the whole token)."""
    source = str(_get(ev, "source", "greedy"))
    if source not in SOURCES:
        source = "greedy"
    token = int(_get(ev, "token_id"))
    if token in dec.special:
        return render_end(ev, dec)
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
        ("data-fusion", fusion_kind(ev)),
        ("data-p-verifier", _num_attr(_get(ev, "p_verifier"))),
        ("data-p-base", _num_attr(_get(ev, "p_base"))),
        ("data-jsd", _num_attr(_get(ev, "jsd"))),
        ("data-gamma-eff", _num_attr(_get(ev, "gamma_eff"))),
        ("data-drafter-token-id", None if _get(ev, "drafter_token_id") is None else str(int(_get(ev, "drafter_token_id")))),
        ("data-verifier-alone", "1" if _get(ev, "verifier_alone", False) else None),
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
    attr_html = " ".join(f'{k}="{esc(v)}"' for k, v in attrs if v is not None)
    tip = esc(_tooltip(ev, dec))
    return f'<span {attr_html}><span class="tok-text">{esc(visible_text(text if shown is None else shown))}</span><span class="tok-tip" role="tooltip">{tip}</span></span>'


def render_trace_html(trace: Sequence[Any], tokenizer: Any = None, *, done: bool = True, empty: str = "No tokens yet.") -> str:
    """The answer as HTML: one ``span.tok.tok-<source>`` per emitted token (``tok-steered`` added where the
    token differs from the verifier's own argmax), with the hover data as ``data-*`` attributes and a
    hover box (shown on hover, keyboard focus or tap, one at a time: ``ui.page_js``). Token text is HTML-escaped.
    The tokenizer's special tokens (``<|im_end|>``, ...) are drawn as a neutral end mark (``span.tok-end``), not as
    answer tokens; ``data-tokens`` counts the answer tokens.

    ``trace``: :class:`~asymspec_mm.decode.TokenEvent` objects or their ``as_dict()``. ``tokenizer``
    (optional) decodes the verifier's argmax, the rejected draft and the top alternatives.
    ``done=False`` adds a blinking cursor (streaming). ``empty`` is shown while there are no tokens.
    """
    dec = _Decoder(tokenizer)
    spans = [render_token(ev, dec) for ev in trace]
    body = "".join(spans)
    if not spans and empty:
        body = f'<span class="asym-empty">{esc(empty)}</span>'
    cursor = "" if done else '<span class="tok-cursor">&nbsp;</span>'
    n = sum(int(_get(ev, "token_id")) not in dec.special for ev in trace)
    return f'<div class="asym-trace" data-tokens="{n}" data-done="{1 if done else 0}">{body}{cursor}</div>'


def plain_text(trace: Sequence[Any], special_ids: Iterable[int] = ()) -> str:
    """The answer's text from its events, without special tokens (``<|im_end|>``, ...: ``special_ids``), as the
    finished answer's text reads, so that a streamed answer never shows them."""
    special = {int(i) for i in special_ids}
    return "".join(_get(ev, "text") or "" for ev in trace if int(_get(ev, "token_id")) not in special)


def source_counts(trace: Sequence[Any]) -> dict[str, int]:
    """Tokens per source, plus ``steered``: how many differ from the verifier's own argmax."""
    counts = {s: 0 for s in SOURCES}
    for ev in trace:
        s = _get(ev, "source", "greedy")
        counts[s] = counts.get(s, 0) + 1
    counts["steered"] = sum(bool(_get(ev, "steered", False)) for ev in trace)
    return counts


def render_legend() -> str:
    """The colour key: one sample token per source, and the steered underline."""
    items = [f'<span class="tok tok-{s}" title="{esc(h)}">{s}</span> <span>{esc(h)}</span>' for s, h in SOURCES.items()]
    items.append(f'<span class="tok tok-greedy tok-steered" title="{esc(STEERED_HELP)}">steered</span> <span>{esc(STEERED_HELP)}</span>')
    return '<div class="asym-legend">' + "".join(f"<span>{i}</span>" for i in items) + "</div>"


def render_panel(
    title: str,
    trace: Sequence[Any],
    tokenizer: Any = None,
    *,
    subtitle: str = "",
    done: bool = True,
    stats: dict | None = None,
    empty: str = "No tokens yet.",
    legend: bool = False,
    state: str | None = None,
) -> str:
    """A titled panel around :func:`render_trace_html` with a one-line summary under it.

    ``state`` (the panel's ``data-state``): ``running`` or ``done`` (the default, from ``done``), ``stopped``
    (decoding was stopped: the tokens so far, the summary says stopped), ``error`` (``empty`` says why when
    there are no tokens) or ``off``; the last three have no cursor.
    """
    if state is None:
        state = "done" if done else "running"
    if state not in PANEL_STATES:
        raise ValueError(f"state={state!r}: expected one of {', '.join(PANEL_STATES)}")
    done = state != "running"
    parts = []
    if trace:
        c = source_counts(trace)
        parts = [plural(len(trace), "token")]
        parts += [f"{c[s]} {s}" + (_fused_note(trace) if s == "fused" else "") for s in SPECULATIVE_SOURCES if c.get(s)]
        if any(_get(ev, "verifier_argmax") is not None for ev in trace) and _get(trace[0], "source") != "greedy":
            parts.append(f"{c['steered']} steered")
        if stats and state == "done":
            parts.append(f"{stats.get('tokens_per_s', 0.0):.1f} tok/s")
    if state == "stopped":
        parts.append("stopped")
    elif state == "error":
        parts.append("failed")
    sep = " \u00b7 "
    foot = f'<div class="asym-panel-foot">{esc(sep.join(parts))}</div>' if parts else ""
    sub = f' <span class="asym-panel-sub">{esc(subtitle)}</span>' if subtitle else ""
    return (
        f'<div class="asym-panel" data-state="{state}"><div class="asym-panel-title">{esc(title)}{sub}</div>'
        f"{render_legend() if legend else ''}"
        f"{render_trace_html(trace, tokenizer, done=done, empty=empty)}{foot}</div>"
    )


def _fused_note(trace: Sequence[Any]) -> str:
    """`` (n changed the verifier's token)`` for a panel's fused count."""
    changed = sum(fusion_kind(ev) == "changed" for ev in trace)
    return f" ({changed} changed the verifier's token)"


def render_stats_html(stats: dict | None, method: str = "asymspec") -> str:
    """The stats panel: a grid of labelled values (each value carries ``data-stat``)."""
    if not stats:
        return '<div class="asym-stats"><span class="asym-empty">Statistics appear here after a run.</span></div>'

    def f(x: Any) -> str:
        return "\u2014" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)

    def sec(x: float | None) -> str:
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
        ("prefix KV cache hit", None if "prefix_cache_hit" not in stats else "yes" if stats["prefix_cache_hit"] else "no"),
        ("caption time (s)", sec(stats.get("caption_s"))),
        ("OCR time (s)", sec(stats.get("ocr_s"))),
        ("OCR engine", stats.get("ocr_engine")),
        ("steered tokens", stats.get("steered")),
        ("fused tokens", stats.get("fused")),
        ("stopped by", stats.get("stopped_by")),
        ("rows per decoding step (max)", stats.get("batch_size")),
    ]
    optional = ("prefix KV cache hit", "rows per decoding step (max)")
    rows = [(k, v) for k, v in rows if not (k in optional and v is None)]
    cells = "".join(
        f'<div class="asym-stat"><div class="asym-stat-k">{esc(k)}</div>'
        f'<div class="asym-stat-v" data-stat="{esc(k)}">{esc("" if v is None else v)}</div></div>'
        for k, v in rows
    )
    return f'<div class="asym-stats"><div class="asym-stats-grid">{cells}</div></div>'


def jsd_gamma_chart(trace: Sequence[Any]) -> Any:
    """A small PNG-ready chart (PIL image) of JSD and gamma_eff per emitted position; None without data."""
    fig = jsd_gamma_figure(trace)
    if fig is None:
        return None
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    return Image.open(buf).convert("RGB")


def jsd_gamma_figure(trace: Sequence[Any]) -> Any:
    """The matplotlib figure of :func:`jsd_gamma_chart` (its x axis counts emitted tokens: whole-number ticks only);
    None without data."""
    xs = [int(_get(ev, "index", i)) for i, ev in enumerate(trace)]
    jsd = [float("nan") if _get(ev, "jsd") is None else float(_get(ev, "jsd")) for ev in trace]
    gam = [float("nan") if _get(ev, "gamma_eff") is None else float(_get(ev, "gamma_eff")) for ev in trace]
    if not trace or all(math.isnan(v) for v in jsd + gam):
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # token numbers: no tick between two tokens
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.85)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def status_html(kind: str, text: str, warning: str | None = None) -> str:
    """The status line: ``kind`` is idle, run, ok or error (styled by ``.asym-status-<kind>``). A ``warning`` (the
    request is outside what the loaded models can answer) stands in a box of its own under it, from the moment the
    run starts, apart from the outcome (the status line stays next to Run, where a phone shows it)."""
    box = (
        f'<div class="asym-warning" data-warning="1" role="note"><strong>\u26a0 Outside what these models learned.</strong> {esc(warning)}</div>'
        if warning
        else ""
    )
    # Where the answer stands below the inputs (a phone), the status under Run links to it (ui/style.css shows the link
    # only there); idle and error lines have no answer to go to.
    jump = '<a class="asym-jump" href="#asym-answer">Jump to the answer \u2193</a>' if kind in ("run", "ok") else ""
    return f'<div class="asym-status asym-status-{kind}" data-status="{kind}">{esc(text)}{jump}</div>{box}'


def method_title(method: str) -> str:
    """The panel title of ``method`` (the method's name when it has none)."""
    return METHOD_PANELS.get(method, (method, ""))[0]


def method_subtitle(method: str) -> str:
    """The one-line description under a method's panel title ("" when it has none)."""
    return METHOD_PANELS.get(method, (method, ""))[1]
