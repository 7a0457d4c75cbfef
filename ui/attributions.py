"""The inspector's heat maps on demand: a click on a token of the answer attributes it (``pipe.attribute``) and shows
where in the image its steering came from; a toggle shows the answer's footprint (every steered token's top region).

Nothing runs until a token is clicked. Each session keeps its last finished main result and the attributions made
for it (one per token: a second click on a token is instant); a new run forgets both. The attribution runs on a
worker thread while the handler yields the progress (regions done) at least every :data:`HEARTBEAT_S`, so that
Gradio can close it; Cancel (or a closed handler) sets the work's cancel event, which the attribution's progress
callback turns into an exception between two batches of masks.

The page side: a click on an answer token writes ``"position:nonce"`` into a hidden textbox and fires its
``input`` event (:data:`TOKEN_CLICK_JS`), which calls :meth:`TokenAttributions.explain`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .heatmap import HINT, panel_note, progress_text, render_footprint, render_token_map

#: A running handler yields at least this often (Gradio closes a cancelled handler only between two yields).
HEARTBEAT_S = 0.25
#: Masks per forward in the demo: smaller than the API's default, so that progress and Cancel come more often.
DEMO_BATCH = 8

STYLESHEET = Path(__file__).with_name("heatmap.css")

#: The page's script: a click on a finished answer's token asks for its map (the hover box still opens).
TOKEN_CLICK_JS = r"""
if (!window.__asymHeatClicks) {
  window.__asymHeatClicks = true;
  let nonce = 0;
  document.addEventListener('click', (e) => {
    const tok = e.target && e.target.closest ? e.target.closest('#asym-answer .asym-trace .tok') : null;
    const box = document.querySelector('#asym-heat-token textarea, #asym-heat-token input');
    if (!tok || !box || tok.dataset.index === undefined) return;
    nonce += 1;
    box.value = tok.dataset.index + ':' + nonce;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }, true);
}
"""


class AttributionCancelled(Exception):
    """The session's Cancel (or a closed handler) stopped an attribution between two batches."""


@dataclass
class _Work:
    """One attribution (or a footprint's series) on a worker thread: its progress, outcome and cancel event."""

    fn: Callable[[_Work], Any]
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    progress: tuple[int, int, int, int] = (0, 0, 0, 0)  # regions done, regions, token k, tokens
    result: Any = None
    error: BaseException | None = None

    def report(self, done: int, total: int) -> None:
        """The attribution's progress callback: raises once the work is cancelled."""
        if self.cancel.is_set():
            raise AttributionCancelled()
        self.progress = (done, total, *self.progress[2:])

    def start(self) -> _Work:
        def main() -> None:
            try:
                self.result = self.fn(self)
            except BaseException as exc:  # handed to the handler, which shows it
                self.error = exc
            finally:
                self.done.set()

        threading.Thread(target=main, name="asymspec-attribute", daemon=True).start()
        return self


@dataclass
class _Session:
    result: Any = None
    images: list | None = None
    maps: dict[tuple[int, str], Any] = field(default_factory=dict)  # (position, method) -> Attribution
    work: _Work | None = None
    shown: int | None = None  # the position whose map the panel shows


class TokenAttributions:
    """Per session: the last finished main result, its attributions, and the work running for it."""

    def __init__(self, pipe: Any, *, grid: int = 8, method: str = "occlusion", batch: int = DEMO_BATCH) -> None:
        self.pipe, self.grid, self.method, self.batch = pipe, grid, method, batch
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}

    # ------------------------------------------------------------ state
    def finished(self, session: str | None, result: Any) -> None:
        """The session's run finished with ``result`` (its main panel's): later clicks attribute its tokens."""
        with self._lock:
            old = self._sessions.get(session or "")
            self._sessions[session or ""] = _Session(result)
        _drop_work(old)

    def reset(self, session: str | None) -> str:
        """A new run (or image) began: forget the old result and its maps, stop their work; the panel's hint."""
        with self._lock:
            old = self._sessions.pop(session or "", None)
        _drop_work(old)
        return panel_note("empty", HINT)

    forget = reset

    def cancel(self, session: str | None) -> str:
        """The Cancel button: stop the session's running attribution (the maps already made stay)."""
        with self._lock:
            s = self._sessions.get(session or "")
            work = s.work if s is not None else None
        if work is None or work.done.is_set():
            return panel_note("cancelled", "Nothing is being attributed.")
        work.cancel.set()
        return panel_note("cancelled", "Cancelled. Click a token to attribute it again.")

    def _images(self, s: _Session) -> list:
        if s.images is None:
            from asymspec_mm.attribution import result_images

            s.images = result_images(s.result)
        return s.images

    def _attribution(self, s: _Session, position: int, work: _Work) -> Any:
        key = (position, self.method)
        if key not in s.maps:
            s.maps[key] = self.pipe.attribute(s.result, position, self.method, self.grid, batch=self.batch, progress=work.report)
        return s.maps[key]

    # ------------------------------------------------------------ handlers
    def explain(self, value: str, session: str | None) -> Iterator[str]:
        """A click on answer token ``value`` (``"position:nonce"``): its heat map, computed unless cached."""
        try:
            position = int(str(value).split(":")[0])
        except ValueError:
            yield panel_note("error", f"not a token position: {value!r}")
            return
        with self._lock:
            s = self._sessions.get(session or "")
        if s is None or s.result is None:
            yield panel_note("empty", "No finished answer to attribute yet: click a token once a run is done.")
            return
        if not 0 <= position < len(s.result.trace):
            yield panel_note("error", f"position {position} is outside the answer's {len(s.result.trace)} tokens")
            return
        ev = s.result.trace[position]
        reason = _why_nothing(self.pipe, s.result)
        if reason is not None:
            yield _nothing(reason)
            return

        def one(work: _Work) -> str:
            att = self._attribution(s, position, work)
            return render_token_map(att, self._images(s), bool(ev.steered))

        s.shown = position
        yield from self._run(s, one, lambda w: progress_text(ev.text, position, *w.progress[:2]))

    def footprint(self, on: bool, session: str | None) -> Iterator[str]:
        """The footprint toggle: on, every steered token's top region at once (each map computed unless cached);
        off, the map of the last clicked token (or the hint)."""
        with self._lock:
            s = self._sessions.get(session or "")
        if not on:
            if s is not None and s.shown is not None and (s.shown, self.method) in s.maps:
                yield render_token_map(s.maps[(s.shown, self.method)], self._images(s), bool(s.result.trace[s.shown].steered))
            else:
                yield panel_note("empty", HINT)
            return
        if s is None or s.result is None:
            yield panel_note("empty", "No finished answer to attribute yet: turn the footprint on once a run is done.")
            return
        from asymspec_mm.attribution import default_positions

        reason = _why_nothing(self.pipe, s.result)
        if reason is not None:
            yield _nothing(reason)
            return
        positions = default_positions(s.result)
        if not positions:
            yield panel_note("nothing", "No token of this answer was steered or accepted: the footprint is empty.")
            return

        def series(work: _Work) -> str:
            atts = []
            for k, pos in enumerate(positions, start=1):
                work.progress = (0, 0, k, len(positions))
                atts.append(self._attribution(s, pos, work))
            return render_footprint(atts, self._images(s), len(atts[0].images))

        def line(w: _Work) -> str:
            k = max(1, w.progress[2])
            return progress_text(s.result.trace[positions[k - 1]].text, positions[k - 1], *w.progress[:2], of_tokens=(k, len(positions)))

        yield from self._run(s, series, line)

    def _run(self, s: _Session, fn: Callable[[_Work], str], line: Callable[[_Work], str]) -> Iterator[str]:
        """Run ``fn`` on a worker, yielding the progress ``line`` as it changes (and at each heartbeat), then its
        panel, or the refusal or error in one line. Once something replaces the work (a newer click, a new run or
        image) the handler yields nothing more: the panel belongs to what replaced it."""
        from asymspec_mm.attribution import NothingToAttributeError

        old, work = s.work, _Work(fn)
        s.work = work  # first: the older handler reads it once its work has stopped
        if old is not None:
            old.cancel.set()  # a newer click replaces the older one
        work.start()
        try:
            if not work.done.wait(0.05):  # a cached map comes at once; otherwise the indicator does
                yield panel_note("running", line(work))
            while not work.done.wait(HEARTBEAT_S):  # each yield is a point where Gradio can close the handler
                if s.work is not work:
                    return
                yield panel_note("running", line(work))
            if s.work is not work:
                return
            if isinstance(work.error, AttributionCancelled):
                yield panel_note("cancelled", "Cancelled. Click a token to attribute it again.")
            elif isinstance(work.error, NothingToAttributeError):
                yield _nothing(str(work.error))
            elif work.error is not None:
                yield panel_note("error", f"Attribution failed: {work.error}")
            else:
                yield work.result
        finally:
            if not work.done.is_set():
                work.cancel.set()


def wire_heatmap_panel(state: TokenAttributions, run_button: Any, image: Any) -> Any:
    """Lay the heat-map panel out (inside the caller's Blocks) and wire it: the hidden token box, the footprint
    toggle, Cancel, and the resets when Run is pressed or the image changes. Returns the panel."""
    import gradio as gr

    with gr.Accordion("Where in the image: click a token of the answer", open=True, elem_id="asym-heat-box"):
        panel = gr.HTML(
            state.reset(None),
            js_on_load=TOKEN_CLICK_JS,
            head=f"<style>{STYLESHEET.read_text(encoding='utf-8')}</style>",
            elem_id="asym-heatmap",
            label="heatmap_html",
        )
        with gr.Row():
            footprint = gr.Checkbox(value=False, label="Footprint: every steered token's top region at once", elem_id="asym-footprint")
            cancel = gr.Button("Cancel", size="sm", elem_id="asym-heat-cancel", min_width=80)
        token = gr.Textbox(value="", show_label=False, elem_id="asym-heat-token", elem_classes=["asym-hidden"], container=False)

    def explain(value, request=None):
        yield from state.explain(value, _session_of(request))

    def toggle(on, request=None):
        yield from state.footprint(bool(on), _session_of(request))

    def stop(request=None):
        return state.cancel(_session_of(request))

    def reset(request=None):
        return state.reset(_session_of(request)), False

    for fn in (explain, toggle, stop, reset):  # Gradio finds the request by its annotation (see ui.handlers)
        fn.__annotations__ = {"request": gr.Request}

    quiet = dict(api_visibility="private", show_progress="hidden")
    limits = dict(concurrency_id="attribute", concurrency_limit=2)
    clicked = token.change(explain, [token], [panel], **limits, **quiet)
    toggled = footprint.input(toggle, [footprint], [panel], **limits, **quiet)
    cancel.click(stop, None, [panel], cancels=[clicked, toggled], queue=False, **quiet)
    run_button.click(reset, None, [panel, footprint], queue=False, **quiet)
    image.change(reset, None, [panel, footprint], queue=False, **quiet)
    return panel


def _drop_work(old: _Session | None) -> None:
    """Stop the work of a session being replaced (a new result, a reset); its handler then ends without a panel."""
    work = old.work if old is not None else None
    if work is not None:
        old.work = None  # first: the handler reads it once its work has stopped
        work.cancel.set()


def _why_nothing(pipe: Any, result: Any) -> str | None:
    # imported here: ui is imported without torch (``asymspec-mm --help`` stays fast)
    from asymspec_mm.attribution import nothing_to_attribute

    return nothing_to_attribute(pipe, result)


def _nothing(reason: str) -> str:
    """The panel's one line for a result with nothing to attribute (``reason``: the API's refusal)."""
    return panel_note("nothing", reason[:1].upper() + reason[1:] + ".")


def _session_of(request: Any) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None
