"""How the steering inspector reports errors: user errors (bad input or option) as their own one-line text,
anything else with its type; on the page and through the API as a ``gr.Error``."""

from __future__ import annotations

import re

#: A ``<`` that HTML would read as the start of a tag, comment or end tag.
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


class DemoInputError(Exception):
    """A request the page refuses before it reaches the models (message is shown to the user)."""


def _is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix (a bad input or option), not a failure of the app."""
    from asymspec_mm.base.errors import AsymSpecError

    return isinstance(exc, (AsymSpecError, DemoInputError))


def _gr_error(exc_or_msg: BaseException | str, title: str) -> Exception:
    """A ``gr.Error`` for the page and the API: the message as it is (``gamma=-1.0 must be >= 0``, not ``&gt;=``,
    which the API would pass on), except a ``<`` that could open a tag (the page's toast reads it as sanitised
    HTML): that one becomes ``&lt;``."""
    import gradio as gr

    msg = exc_or_msg if isinstance(exc_or_msg, str) else _error_text(exc_or_msg)
    user = isinstance(exc_or_msg, str) or _is_user_error(exc_or_msg)
    return gr.Error(_TAG_OPEN.sub("&lt;", msg), title=title, print_exception=not user)


def _error_text(exc: BaseException) -> str:
    """The message shown for an error: a user error's own text, anything else with its type."""
    if _is_user_error(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
