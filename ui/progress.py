"""What the status line and the panels say while a run's rows are set up, wait for a place in the batch, or decode.

The app's scheduler sets rows up on a few set-up threads (the compressed view, then prefill) and keeps a line of rows
that wait for a place in the batch. A run's own rows stand in that line too: while its first rows take every set-up
thread, the next ones wait behind them, which is not waiting for other users. These pure functions tell the two apart from each
row's place in line (:class:`Row`), so a lone user reads what is happening to their rows, and a user behind
others reads how many rows of other users are ahead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .render import plural

__all__ = ["Row", "ordinal", "others_ahead", "panel_wait_text", "progress_text", "setup_steps", "waiting_sentence"]


@dataclass(frozen=True)
class Row:
    """One row of a run as the status reads it."""

    name: str  # as the status names it: "AsymSpec", "Floor", "the drafter alone"
    tokens: int  # committed so far
    state: str  # running, done, stopped or error
    #: Rows ahead of it in the scheduler's line for a row (0: next); None once it has one (prefill or decoding).
    position: int | None = None
    known: bool = True  # whether the scheduler says where the row stands (False: position means nothing)
    waited: float | None = None  # seconds in line so far
    setup: str = "prefill"  # what its set-up does (:func:`setup_steps`)
    #: the scheduler's stage of the row (``Handle.stage``); None: read where it stands from ``position`` alone
    stage: str | None = None

    @property
    def pending(self) -> bool:
        """Running, no token yet."""
        return self.state == "running" and not self.tokens

    @property
    def waiting(self) -> bool:
        """In line for its set-up (a row set up ahead counts as waiting for its row, not as being set up)."""
        if self.stage is not None:
            return self.pending and self.known and self.stage in ("queued", "set_up")
        return self.pending and self.known and isinstance(self.position, int)

    @property
    def setting_up(self) -> bool:
        if self.stage is not None:
            return self.pending and self.known and self.stage not in ("queued", "set_up")
        return self.pending and self.known and self.position is None


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _join(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) < 2 else ", ".join(items[:-1]) + " and " + items[-1]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def setup_steps(caption: bool, ocr: bool) -> str:
    """What setting a request up does: ``writing the caption`` (``caption``: the drafter writes it), ``reading the
    text (OCR)`` (``ocr``: the OCR engine reads it), then always ``prefill`` (the models read the prompts)."""
    steps = (["writing the caption"] if caption else []) + (["reading the text (OCR)"] if ocr else []) + ["prefill"]
    return ", ".join(steps[:-1]) + (", then " if len(steps) > 1 else "") + steps[-1]


def _place(row: Row) -> int:
    """A waiting row's place in line (0: next)."""
    return row.position if isinstance(row.position, int) else 0


def others_ahead(row: Row, rows: Sequence[Row]) -> int:
    """Rows of other users ahead of waiting ``row`` in the line: its place minus this run's own rows ahead of it."""
    # this run's rows still in line ahead of it (waiting, or being set up where the scheduler keeps their place)
    mine = sum(r.known and isinstance(r.position, int) and r.position < _place(row) for r in rows if r is not row)
    return max(0, _place(row) - mine)


def _verb(rows: Sequence[Row], one: str, many: str) -> str:
    return one if len(rows) == 1 else many


def waiting_sentence(waiting: Sequence[Row], rows: Sequence[Row], *, live_rows: int = 0, max_batch_size: int | None = None) -> str:
    """Where a run's waiting rows stand: behind the run's own set-up, behind other users' rows, or at the head of a
    full batch's line."""
    names = _join(r.name for r in waiting)
    behind = min(others_ahead(r, rows) for r in waiting)
    if behind:
        places = _join(ordinal(_place(r) + 1) for r in waiting)
        waited = max((r.waited for r in waiting if r.waited is not None), default=None)
        text = (
            f"{_cap(names)} {_verb(waiting, 'waits', 'wait')} behind {plural(behind, 'row')} of other users for a place "
            f"in the batch ({places} in line)"
        )
        return text + (f"; waiting {waited:.1f} s." if waited is not None else ".")
    if any(r.setting_up for r in rows):
        return f"{_cap(names)} {_verb(waiting, 'follows', 'follow')} once a set-up thread is free."
    if max_batch_size is not None and live_rows >= max_batch_size:
        return f"{_cap(names)} {_verb(waiting, 'waits', 'wait')} for a free row: the batch is full ({plural(live_rows, 'row')} decoding)."
    return f"{_cap(names)} {_verb(waiting, 'is', 'are')} next to be set up."


def progress_text(rows: Sequence[Row], *, waiting_total: int = 0, live_rows: int = 0, max_batch_size: int | None = None) -> str:
    """The status while a run is under way, e.g. ``Setting up AsymSpec: writing the caption, then prefill. Floor and
    the drafter alone follow once a set-up thread is free.`` or ``Running AsymSpec 5 tokens, Floor 12 tokens
    (done). The drafter alone waits behind 2 rows of other users for a place in the batch (3rd in line); waiting
    1.2 s.`` ``waiting_total``: rows in the scheduler's line (shown when it does not say where rows stand)."""
    started = [r for r in rows if not r.pending]
    setting_up = [r for r in rows if r.setting_up]
    waiting = [r for r in rows if r.waiting]
    unknown = [r for r in rows if r.pending and not r.known]
    parts = []
    if started:
        shown = [f"{r.name} {plural(r.tokens, 'token')}" + ("" if r.state == "running" else f" ({r.state})") for r in started]
        parts.append("Running " + ", ".join(shown) + ".")
    if setting_up:
        steps = setting_up[0].setup
        parts.append(f"Setting up {_join(r.name for r in setting_up)}: {steps}.")
    if waiting:
        parts.append(waiting_sentence(waiting, rows, live_rows=live_rows, max_batch_size=max_batch_size))
    if unknown:
        more = f" ({plural(waiting_total, 'row')} waiting for a place in the batch)" if waiting_total else ""
        head = "" if parts else "Running "
        parts.append(f"{head}{_join(r.name for r in unknown)}: waiting for the models{more}...")
    return " ".join(parts)


def panel_wait_text(row: Row, rows: Sequence[Row]) -> str:
    """What an empty running panel says: its set-up, its place behind other users' rows, or that it follows."""
    if row.setting_up:
        return f"setting up: {row.setup}..."
    if row.waiting:
        behind = others_ahead(row, rows)
        if behind:
            return f"waiting behind {plural(behind, 'row')} of other users ({ordinal(_place(row) + 1)} in line)"
        return "next: once a set-up thread is free" if any(r.setting_up for r in rows) else "next to be set up..."
    return "waiting for the models..."
