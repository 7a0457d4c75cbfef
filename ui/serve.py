"""Serving the steering inspector: the safe launch defaults and the ``asymspec-mm demo`` sub-command.

Torch- and Gradio-free at import (the CLI registers the sub-command on every start).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asymspec_mm.frontend.options import add_model_args, finite_float, load_pipeline, pipeline_from_args, positive_int, stall_bound
from asymspec_mm.serve.net import is_loopback

from .jobs import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_NEW_TOKENS

if TYPE_CHECKING:  # pragma: no cover
    import gradio as gr

    from asymspec_mm.pipeline.facade import AsymSpecPipeline

__all__ = ["add_demo_parser", "is_loopback", "launch", "launch_options", "main", "port_in_use_error", "serve", "startup_line"]


def port_in_use_error(host: str, port: int | None) -> str | None:
    """The one-line error when ``host:port`` cannot be bound (another server uses it), else None. Checked before
    the models load; ``port`` None or 0 lets Gradio pick a free one."""
    if not port:
        return None
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: a port in TIME_WAIT is free
            s.bind((host, port))
    except OSError as exc:
        why = "is already in use" if exc.errno in (98, 48, 10048) else f"cannot be bound ({exc.strerror or exc})"
        return f"port {port} on {host} {why}: stop the other server or pick another port with --port N"
    return None


def launch(
    pipe_or_preset: AsymSpecPipeline | str = "auto",
    host: str = "127.0.0.1",
    port: int | None = 7860,
    share: bool = False,
    *,
    drafter: str | None = None,
    verifier: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    ocr_engine: str | None = None,
    examples: Sequence[dict] | None = None,
    max_upload_mb: float = 10,
    concurrency_limit: int | None = None,
    max_queue: int = 64,
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_stall: float | None = None,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    share_hint: str = "share=True",
    **launch_kwargs,
) -> gr.Blocks:
    """Load the models once (unless a pipeline is given), build the app and serve it.

    Binds ``127.0.0.1`` by default; any other host prints a warning (the demo has no authentication).
    No share link unless ``share=True``. Analytics are off. Returns the running Blocks (call
    ``.close()`` to stop; with ``prevent_thread_lock=False`` this blocks until interrupted).
    Concurrent runs share decoding steps (up to ``max_batch_size`` rows); ``concurrency_limit`` runs are
    handled at once (default ``max_batch_size``), see :func:`ui.app.build_app`; ``max_stall``: the scheduler's stall
    bound (``None``: off, see :meth:`~asymspec_mm.pipeline.facade.AsymSpecPipeline.scheduler`). ``share_hint``: how the start-up
    line (:func:`startup_line`) tells to make a public link.
    """
    from .app import build_app  # not at the top: ui.app re-exports this module's names

    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    if isinstance(pipe_or_preset, str) or pipe_or_preset is None:
        pipe = load_pipeline(pipe_or_preset, drafter, verifier, device=device, dtype=dtype, ocr_engine=ocr_engine)
    else:
        pipe = pipe_or_preset
    demo = build_app(
        pipe,
        examples=examples,
        max_upload_mb=max_upload_mb,
        concurrency_limit=concurrency_limit,
        max_queue=max_queue,
        default_max_new_tokens=default_max_new_tokens,
        max_batch_size=max_batch_size,
        max_stall=max_stall,
    )
    return serve(
        demo,
        host=host,
        port=port,
        share=share,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        share_hint=share_hint,
        **launch_kwargs,
    )


def serve(
    demo: gr.Blocks,
    host: str = "127.0.0.1",
    port: int | None = 7860,
    share: bool = False,
    *,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    share_hint: str = "share=True",
    **launch_kwargs,
) -> gr.Blocks:
    """Serve a Blocks made by :func:`build_app` with the demo's safe defaults: no share link unless asked,
    Gradio's upload limit set to the app's ``max_upload_mb``, no SSR/monitoring/MCP/PWA extras, the bundled
    examples' folder allowed. Extra keyword arguments go to ``Blocks.launch``. Unless ``quiet``, one line on stderr
    names the URL (:func:`startup_line`, with ``share_hint``) in place of Gradio's start-up lines."""
    if not is_loopback(host):
        msg = (
            f"serving the demo on {host}: anyone who can reach this machine on port {port} can use it "
            "(there is no authentication). Use the default --host 127.0.0.1 to keep it local."
        )
        warnings.warn(msg, stacklevel=2)
        print(f"asymspec-mm demo: WARNING: {msg}", file=sys.stderr)
    if share:
        print("asymspec-mm demo: WARNING: --share creates a public link through Gradio's tunnel service.", file=sys.stderr)
    max_mb = getattr(demo, "asymspec_max_upload_mb", 10)
    allowed = list(launch_kwargs.pop("allowed_paths", None) or []) + list(getattr(demo, "asymspec_allowed_paths", []))
    opts = dict(
        server_name=host,
        server_port=port,
        share=bool(share),
        max_file_size=f"{max_mb}mb",
        show_error=True,
        # Gradio's own lines ("set `share=True` in `launch()`") name its keywords, not the command's flags:
        # start quietly, print this project's line, then block as Gradio would.
        prevent_thread_lock=True,
        quiet=True,
        allowed_paths=allowed,
        inbrowser=False,
        ssr_mode=False,
        enable_monitoring=False,
        mcp_server=False,
        pwa=False,
        footer_links=["api", "settings"],
    )
    opts.update(launch_kwargs)
    demo.launch(**opts)
    if not quiet:
        print(startup_line(demo, share_hint), file=sys.stderr, flush=True)
    interactive = bool(getattr(sys, "ps1", sys.flags.interactive))
    if not prevent_thread_lock and not interactive:  # as Blocks.launch: a script waits, an interactive session goes on
        demo.block_thread()
    return demo


def startup_line(demo: Any, share_hint: str = "share=True") -> str:
    """The line a started demo prints: its URL, and its public link or how to make one (``share_hint``)."""
    url = getattr(demo, "local_url", None) or "?"
    public = getattr(demo, "share_url", None)
    if public:
        return f"asymspec-mm demo: serving on {url} and on the public link {public}"
    return f"asymspec-mm demo: serving on {url} (open it in a browser; {share_hint} makes a public link)"


def _cmd_demo(args: argparse.Namespace) -> int:
    """The ``demo`` sub-command: check the extras, load the models once, serve until interrupted."""
    import importlib.util

    missing = [m for m in ("gradio", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"error: the demo needs {', '.join(missing)}: pip install 'asymspec-mm[ui]'", file=sys.stderr)
        return 2
    busy = port_in_use_error(args.host, args.port)
    if busy:  # before the models load, so the user learns it at once
        print(f"error: {busy}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    # Import Gradio while the models load (much of both is I/O), so the page is up sooner.
    preload = threading.Thread(target=lambda: __import__("gradio"), name="import-gradio", daemon=True)
    preload.start()
    pipe = pipeline_from_args(args)
    print(f"asymspec-mm demo: loaded {pipe.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    preload.join()
    launch(pipe, **launch_options(args))
    return 0


def launch_options(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`launch`'s keyword arguments from the ``demo`` sub-command's parsed flags (all but the models')."""
    return dict(
        host=args.host,
        port=args.port,
        share=args.share,
        max_upload_mb=args.max_upload_mb,
        concurrency_limit=args.concurrency,
        default_max_new_tokens=args.max_new_tokens,
        max_batch_size=args.max_batch_size,
        max_stall=args.max_stall,
        share_hint="--share",
    )


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``demo`` on an argparse sub-parsers object; its ``func(args)`` loads the models and serves."""
    p = subparsers.add_parser(
        "demo",
        help="the steering inspector in your browser (Gradio)",
        description="Serve the AsymSpec steering inspector (binds 127.0.0.1 by default).",
    )
    add_model_args(p)  # the same model options as `generate`
    s = p.add_argument_group("serving")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind [default: %(default)s]; anything else exposes the demo to the network (a warning is printed)",
    )
    s.add_argument("--port", type=int, default=7860, help="[default: %(default)s]")
    s.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")
    s.add_argument("--max-upload-mb", type=finite_float, default=10, help="largest upload accepted [default: %(default)s]")
    s.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=DEFAULT_MAX_BATCH_SIZE,
        help="rows decoded together in shared steps; each run is up to 3 rows (its method, Floor, the drafter alone) "
        "[default: %(default)s]",
    )
    s.add_argument(
        "--max-stall",
        type=stall_bound,
        default=None,
        help="bound a turn's vision tower passes and prompt pieces to this multiple (>= 1) of the decode step they ride "
        "beside, so that running answers keep streaming while new runs are set up; a new run then starts later "
        "(as serve --max-stall) [default: no bound]",
    )
    s.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="runs handled at once (their rows wait for a free row of the batch, the page shows their place in line; "
        "further runs queue) [default: 4 x the max batch size, at most 32]",
    )
    s.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help="initial value of the max-new-tokens slider [default: %(default)s]",
    )
    p.set_defaults(func=_cmd_demo)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m ui.serve") -> int:
    """``python -m ui.serve [demo options]``: the ``demo`` sub-command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog=prog)
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
