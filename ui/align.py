"""The outputs of a run side by side: AsymSpec, Floor and the drafter alone, aligned token by token.

Tokens are aligned by their position in the answer (token #i of each output in column i), as speculative
decoding compares them: the outputs agree up to their first difference. A column is marked where the outputs
differ there (or one has ended); a cell is marked where it differs from the first output's token.
Pure functions of traces (``TokenEvent`` objects or their ``as_dict()``), no Gradio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .render import esc, plural, visible_text

__all__ = ["POSITIONS_MEANING", "alignment_columns", "alignment_summary", "render_alignment_html"]

#: What the count of differing positions counts, beside the status's steered tokens (which count less).
POSITIONS_MEANING = (
    "Each output goes on from its own earlier tokens, so the positions after a difference count too; a steered token "
    "(the status's count) is one the verifier alone would not have picked after the same text."
)


def _get(ev: Any, name: str) -> Any:
    return ev.get(name) if isinstance(ev, dict) else getattr(ev, name)


def alignment_columns(traces: Sequence[Sequence[Any]]) -> list[tuple[list[int | None], bool]]:
    """One column per position: (each output's token id there, None past its end; whether they differ)."""
    width = max((len(t) for t in traces), default=0)
    cols = []
    for i in range(width):
        ids = [int(_get(t[i], "token_id")) if i < len(t) else None for t in traces]
        cols.append((ids, len(set(ids)) > 1))
    return cols


def alignment_summary(n_diff: int, width: int, first: int | None) -> str:
    """``3 of 20 positions differ; first difference at token #4``, ``1 of 20 positions differs; ...``, or
    ``all 20 positions agree`` (``first``: the first differing position, None when none differs)."""
    if first is None:
        return "the one position agrees" if width == 1 else f"all {width} positions agree"
    of = f"{n_diff} of {plural(width, 'position')}" if width == 1 else f"{n_diff} of {width} positions"
    return f"{of} {'differs' if n_diff == 1 else 'differ'}; first difference at token #{first}"


def render_alignment_html(rows: Sequence[tuple[str, Sequence[Any]]], *, note: str = "", special_ids: Iterable[int] = ()) -> str:
    """A table with one row per output (``rows``: (title, trace), the first is the reference) and one column per
    token position; differing columns carry ``data-differ="1"`` and class ``al-differ``, a cell that differs
    from the reference row's token class ``al-diff``. ``note`` replaces the table when no output has tokens.
    A special token (``special_ids``: ``<|im_end|>``, ...) reads ``end`` (class ``al-eos``), not as answer text."""
    special = {int(i) for i in special_ids}
    traces = [list(t) for _, t in rows]
    cols = alignment_columns(traces)
    if len(rows) < 2:
        return f'<div class="asym-align" data-columns="0"><span class="asym-empty">{esc(note or "Nothing to compare (comparison off).")}</span></div>'
    if not cols:
        return f'<div class="asym-align" data-columns="0"><span class="asym-empty">{esc(note or "The aligned outputs appear here.")}</span></div>'
    n_diff = sum(d for _, d in cols)
    first = next((i for i, (_, d) in enumerate(cols) if d), None)
    summary = alignment_summary(n_diff, len(cols), first)
    head = "".join(f'<th class="{"al-differ" if d else ""}" data-differ="{int(d)}">{i}</th>' for i, (_, d) in enumerate(cols))
    body = []
    for r, (title, trace) in enumerate(rows):
        cells = []
        for i, (ids, differ) in enumerate(cols):
            if i >= len(trace):
                cells.append(f'<td class="al-end{" al-differ" if differ else ""}" data-differ="{int(differ)}">\u2205</td>')
                continue
            eos = ids[r] in special
            text = "end" if eos else visible_text(_get(trace[i], "text") or f"<{ids[r]}>")
            classes = (
                ["al-tok"]
                + (["al-eos"] if eos else [])
                + (["al-differ"] if differ else [])
                + (["al-diff"] if r and ids[r] != ids[0] else [])
            )
            cells.append(f'<td class="{" ".join(classes)}" data-differ="{int(differ)}" data-token-id="{ids[r]}">{esc(text)}</td>')
        body.append(f'<tr data-output="{esc(title)}"><th class="al-name">{esc(title)}</th>{"".join(cells)}</tr>')
    return (
        f'<div class="asym-align" data-columns="{len(cols)}" data-differing="{n_diff}">'
        f'<div class="asym-align-sum">Aligned by position: {esc(summary)} (marked; \u2205: that output had ended). '
        f"{esc(POSITIONS_MEANING)}</div>"
        f'<div class="asym-align-scroll"><table><thead><tr><th class="al-name">#</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div></div>"
    )
