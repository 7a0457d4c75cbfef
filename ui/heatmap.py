"""The inspector's heat-map panel as HTML: where one token's steering came from (:func:`render_token_map`), every
steered token's top region at once (:func:`render_footprint`), and the panel's one-line states (:func:`panel_note`).

Pure functions of an :class:`~asymspec_mm.attribution.Attribution` and the request's images (PIL); the maps are
drawn by :mod:`asymspec_mm.attribution.heatmap` and inlined as PNG data URIs, so the page fetches nothing. Every
figure carries what a test or a script needs to check it without reading pixels: ``data-image-index``,
``data-top-box`` (the best region, ``x0,y0,x1,y1`` in the original image's pixels) and ``data-top-score``.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from typing import Any

from .render import esc

#: Longest side of a map as sent to the page: a large upload is shown scaled down (the boxes stay in its pixels).
MAX_SIDE = 384
#: How many of an image's regions the ranked list shows.
RANKED = 5
#: Outline colours of the footprint, one per steered token (cycled).
FOOTPRINT_COLOURS = ("#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324")

#: How the panel names a token's origin (its trace ``source``); ``steered`` adds that the verifier alone would
#: have written another token.
SOURCE_WORDS = {
    "accepted": "the drafter's draft, accepted",
    "fused": "fused at a rejection (t + beta * delta)",
    "bonus": "the verifier's own (bonus)",
    "greedy": "the verifier's own",
}

HINT = "Click a token of the answer to see which part of the image its steering came from."


def origin(source: str, steered: bool) -> str:
    """The token's origin in words: accepted, fused or the verifier's own, and whether it was steered."""
    words = SOURCE_WORDS.get(source, source)
    return f"{words}; steered (the verifier alone would have written another token)" if steered else words


def png_data_uri(image: Any, max_side: int = MAX_SIDE) -> str:
    """``image`` (PIL) as a ``data:image/png;base64,...`` URI, scaled down to ``max_side`` pixels at most."""
    if max(image.size) > max_side:
        scale = max_side / max(image.size)
        image = image.resize((max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale))))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _box_attr(box: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in box)


def panel_note(state: str, text: str) -> str:
    """The panel holding one line: ``state`` is ``empty`` (nothing clicked yet), ``nothing`` (nothing to
    attribute), ``running`` (computing, ``text`` says how far), ``cancelled`` or ``error``."""
    spinner = '<span class="asym-heat-spinner" aria-hidden="true"></span>' if state == "running" else ""
    role = ' role="status" aria-live="polite"' if state == "running" else ""
    return f'<div class="asym-heatmap" data-state="{esc(state)}"{role}>{spinner}<span class="asym-heat-note">{esc(text)}</span></div>'


def progress_text(token: str, position: int, done: int, total: int, of_tokens: tuple[int, int] | None = None) -> str:
    """The running panel's line: ``done`` of ``total`` regions masked (and which token of the footprint)."""
    which = f"token {of_tokens[0]} of {of_tokens[1]}, " if of_tokens else ""
    return f"Attributing {token!r} (position {position}): {which}{done} of {total} regions done. Cancel stops it."


def _ranked_rows(att: Any, image_index: int) -> str:
    rows = []
    for rank, r in enumerate((r for r in att.regions if r.image_index == image_index), start=1):
        if rank > RANKED:
            break
        still = "yes" if r.emitted else "no"
        rows.append(
            f'<tr data-rank="{rank}" data-box="{_box_attr(r.box)}"><td>{rank}</td><td>({_box_attr(r.box)})</td>'
            f"<td>{r.score:+.3f}</td><td>{r.delta:+.3f}</td><td>{still}</td></tr>"
        )
    head = "<tr><th>#</th><th>region (x0,y0,x1,y1)</th><th>score</th><th>delta without it</th><th>still emitted</th></tr>"
    return f'<table class="asym-heat-ranked">{head}{"".join(rows)}</table>'


def render_token_map(att: Any, images: Sequence[Any], steered: bool) -> str:
    """One token's panel: a line with the token, its origin, delta and fused score, then per image the heat map
    over it and its best regions ranked. ``images``: the request's images (PIL), in ``att.images`` order."""
    from asymspec_mm.attribution import heat_image, overlay

    figures = []
    for grid in att.images:
        i = grid.image_index
        top = att.top(i)
        flat = top.score <= 0
        picture = overlay(images[i], heat_image(att, i))
        caption = f"Image {i + 1} of {len(att.images)}" if len(att.images) > 1 else "The image"
        caption += ": no region raised delta (a flat map)" if flat else f": the best region is ({_box_attr(top.box)})"
        figures.append(
            f'<figure class="asym-heat-figure" data-image-index="{i}" data-top-box="{_box_attr(top.box)}" '
            f'data-top-score="{top.score!r}" data-flat="{1 if flat else 0}">'
            f'<img class="asym-heat-img" alt="heat map over image {i + 1}" src="{png_data_uri(picture)}" '
            f'width="{min(256, MAX_SIDE)}" data-width="{grid.size[0]}" data-height="{grid.size[1]}">'
            f"<figcaption>{esc(caption)}</figcaption>{_ranked_rows(att, i)}</figure>"
        )
    line = (
        f"<strong>{esc(repr(att.token))}</strong> at position {att.position}: {esc(origin(att.source, steered))}. "
        f"delta = {att.delta:+.3f}, fused = {att.fused:+.3f}, p_verifier = {att.p_verifier:.3f}, p_base = {att.p_base:.3f} "
        f"({esc(att.method)}, {att.timings.get('total_s', 0.0):.2f} s)"
    )
    return (
        f'<div class="asym-heatmap" data-state="done" data-view="token" data-position="{att.position}" '
        f'data-token-id="{att.token_id}" data-source="{esc(att.source)}" data-steered="{1 if steered else 0}" '
        f'data-method="{esc(att.method)}" data-delta="{att.delta!r}">'
        f'<div class="asym-heat-line">{line}</div><div class="asym-heat-figures">{"".join(figures)}</div>'
        f'<div class="asym-heat-help">Red: the regions whose hiding lowers the token\'s delta most (the score, in '
        f"logits); the list ranks them. See Region attribution in the docs.</div></div>"
    )


def footprint_image(image: Any, boxes: Sequence[tuple[int, Sequence[int]]]) -> Any:
    """``image`` (RGB copy) with each ``(k, box)`` outlined in footprint colour ``k`` and numbered ``k + 1``."""
    from PIL import ImageDraw

    out = image.convert("RGB").copy()
    draw = ImageDraw.Draw(out)
    width = max(1, round(max(out.size) / 128))
    for k, (x0, y0, x1, y1) in boxes:
        colour = FOOTPRINT_COLOURS[k % len(FOOTPRINT_COLOURS)]
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=colour, width=width)
        draw.text((x0 + width + 1, y0 + width), str(k + 1), fill=colour)
    return out


def render_footprint(atts: Sequence[Any], images: Sequence[Any], n_images: int) -> str:
    """The answer's footprint: every attributed token's top region outlined on each image (a token whose map is
    flat on an image marks nothing there), with a numbered list of the tokens."""
    figures = []
    for i in range(n_images):
        marks = [(k, att.top(i).box) for k, att in enumerate(atts) if att.top(i).score > 0]
        data = json.dumps([{"position": atts[k].position, "box": list(box)} for k, box in marks])
        figures.append(
            f'<figure class="asym-heat-figure" data-image-index="{i}" data-footprint="{esc(data)}">'
            f'<img class="asym-heat-img" alt="footprint on image {i + 1}" src="{png_data_uri(footprint_image(images[i], marks))}" '
            f'width="256"><figcaption>{"Image " + str(i + 1) if n_images > 1 else "The image"}: '
            f"{len(marks)} of {len(atts)} tokens' top regions</figcaption></figure>"
        )
    items = "".join(
        f'<li style="color:{FOOTPRINT_COLOURS[k % len(FOOTPRINT_COLOURS)]}" data-position="{att.position}">'
        f"<span>{esc(repr(att.token))} (position {att.position}, {esc(att.source)}, delta {att.delta:+.2f})</span></li>"
        for k, att in enumerate(atts)
    )
    return (
        f'<div class="asym-heatmap" data-state="done" data-view="footprint" data-tokens="{len(atts)}">'
        f'<div class="asym-heat-line">The answer\'s footprint: the top region of each of its {len(atts)} steered tokens.</div>'
        f'<div class="asym-heat-figures">{"".join(figures)}</div><ol class="asym-heat-tokens">{items}</ol></div>'
    )
