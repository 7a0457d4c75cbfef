"""The page's handlers as Gradio calls them: each :class:`~ui.jobs.DemoApp` handler with the session (Gradio's
request's session hash) put in, and the Stop button's two looks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .jobs import DEFAULT_MAX_NEW_TOKENS, DemoApp

#: The Stop button while the session has no run (off, not red) and while it has one.
STOP_IDLE: dict[str, Any] = {"interactive": False, "variant": "secondary"}
STOP_ACTIVE: dict[str, Any] = {"interactive": True, "variant": "stop"}


class _SessionHandlers(NamedTuple):
    run: Callable
    enqueue: Callable
    stop: Callable
    stopped: Callable
    settle: Callable
    describe: Callable
    image_changed: Callable
    view_edited: Callable
    example_loaded: Callable
    forget: Callable
    clear: Callable


def _session_handlers(state: DemoApp, request_type: type) -> _SessionHandlers:
    """The page's handlers with Gradio's request (for its session hash) injected.

    Gradio finds the request parameter by its annotation; this module's annotations are strings that it
    cannot resolve (Gradio is not imported here at import time), so the real type is set on each function.
    """
    import gradio as gr

    def run(
        image,
        question,
        caption,
        ocr,
        autofill=False,
        method="asymspec",
        k=4,
        beta=1.0,
        gamma=0.5,
        gate="cda",
        delta="contrast",
        bonus="verifier",
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
        drafter_view="image+text",
        compare=True,
        followup=False,
        tools="",
        tool_choice="auto",
        temperature=0.0,
        top_p=1.0,
        seed=None,
        compression="",
        request=None,
    ):
        yield from state.run(
            image,
            question,
            caption,
            ocr,
            autofill,
            method,
            k,
            beta,
            gamma,
            gate,
            delta,
            bonus,
            max_new_tokens,
            drafter_view,
            compare,
            followup,
            tools,
            tool_choice,
            temperature,
            top_p,
            seed,
            compression,
            session=_session_of(request),
        )

    def enqueue(image=None, question=None, request=None):
        return state.enqueue(_session_of(request), image, question), gr.update(**STOP_ACTIVE)

    def stop(request=None):
        return state.stop(_session_of(request))

    def stopped(request=None):
        return state.stopped(_session_of(request))

    def settle(caption="", ocr="", request=None):
        session = _session_of(request)
        return *state.view_marks(caption, ocr, session), gr.update(**(STOP_ACTIVE if state.busy(session) else STOP_IDLE))

    def describe(image, caption="", ocr="", request=None):
        return state.describe(image, caption, ocr, session=_session_of(request))

    def image_changed(image=None, caption="", ocr="", method="asymspec", request=None):
        return state.new_image(image, caption, ocr, _session_of(request), method)

    def view_edited(caption="", ocr="", request=None):
        return state.view_edited(caption, ocr, _session_of(request))

    def example_loaded(image=None, caption="", ocr="", request=None):
        return state.example_chosen(image, caption, ocr, _session_of(request))

    def forget(request=None):
        state.forget(_session_of(request))

    def clear(request=None):
        return state.clear_conversation(_session_of(request))

    handlers = _SessionHandlers(run, enqueue, stop, stopped, settle, describe, image_changed, view_edited, example_loaded, forget, clear)
    for fn in handlers:
        fn.__annotations__ = {"request": request_type}
    run.__doc__ = DemoApp.run.__doc__
    describe.__doc__ = DemoApp.describe.__doc__
    return handlers


def _session_of(request: Any) -> str | None:
    return getattr(request, "session_hash", None) if request is not None else None
