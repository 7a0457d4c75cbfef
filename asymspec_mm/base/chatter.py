"""Other libraries' chatter through logging, and the command line's log handler.

The rule: what a library prints on its own (transformers' "Loading weights" bars and notices such as "Token indices
sequence length is longer...", RapidOCR's coloured ``[WARNING]`` lines, re-logged by
:mod:`captioning.ocr.rapidocr_engine` at INFO on ``captioning.ocr.rapidocr``) is shown only with INFO logging on for
the toolkit: ``asymspec-mm -v`` / ``asymspec-mm <command> --verbose``, or in Python
``logging.basicConfig(level=logging.INFO)``. Without it, progress bars of the toolkit's own (the batch command's)
stay intact and a server's log holds its requests and warnings only. The toolkit's own warnings (the tiny pair's
out-of-domain warning, :mod:`asymspec_mm.request.domain`) always show.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

#: The toolkit's loggers: INFO on them shows the libraries' chatter (``--verbose``).
TOOLKIT_LOGGERS = ("asymspec_mm", "captioning", "vision_cache", "ui")

_installed: dict[str, logging.Filterer] = {}  # the command line's handler and filter, replaced on each set-up


def chatter_shown() -> bool:
    """Whether the libraries' chatter is shown: INFO logging is on for the toolkit (``--verbose``)."""
    return logging.getLogger("asymspec_mm").isEnabledFor(logging.INFO)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while models load (its per-shard "Loading weights" bars), unless
    :func:`chatter_shown`; whatever was set before is restored after."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    if was_on and not chatter_shown():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


class SayOnce(logging.Filter):
    """Lets each distinct message of the ``asymspec_mm.domain`` logger through once (a command that answers one
    request, or many alike, says a warning once: the same request's warning before the models load and as it is set
    up); other records pass. It sits on the command line's handler, so other handlers (a log file, a test's capture)
    still see every record."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "asymspec_mm.domain":
            return True
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


class _LowerLevel(logging.Formatter):
    """``warning: message``: the command line's one-line style (as its ``error:`` lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}" + (
            f"\n{self.formatException(record.exc_info)}" if record.exc_info else ""
        )


def configure_cli_logging(verbose: bool, *, say_once: bool = False) -> None:
    """The command line's logging: one stderr handler (``warning: ...``) for WARNING and above; with ``verbose``
    INFO for the toolkit's loggers and the libraries' notices and bars; without, transformers' kept to errors and its
    bars off. ``say_once``: each distinct warning of :mod:`asymspec_mm.request.domain` once (:class:`SayOnce`)."""
    # transformers reads its verbosity as it is first imported, over any level set before: the variable first
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning" if verbose else "error")
    root = logging.getLogger()
    if "handler" in _installed:
        root.removeHandler(_installed.pop("handler"))  # type: ignore[arg-type]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowerLevel())
    root.addHandler(handler)
    _installed["handler"] = handler
    if say_once:
        handler.addFilter(SayOnce())
    for name in TOOLKIT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.NOTSET)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    if verbose:  # transformers' own default: its warnings and bars (its INFO is every file it reads)
        hf_logging.set_verbosity_warning()
        hf_logging.enable_progress_bar()
    else:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
