"""The ``asymspec-mm serve`` sub-command. Stdlib-only at import (the CLI registers it on every start)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

from ..base.errors import AsymSpecError
from ..core.setup_pool import DEFAULT_SETUP_WORKERS
from ..frontend.options import (
    add_compression_arg,
    add_model_args,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    stall_bound,
)
from .drain import DEFAULT_DRAIN_LINGER, DEFAULT_DRAIN_TIMEOUT
from .responses_store import STORE_MAX_BYTES, STORE_MAX_RESPONSES
from .sampling_fields import GENERATION_CONFIGS

DEFAULTS = {"max_batch_size": 16, "max_queue": 64, "max_request_mb": 20.0, "max_images": 8}  # as the DEFAULT_* of app and schema
#: OCR worker processes of a server (BENCHMARKS.md, "OCR beside the loop": reading in the set-up thread stalls the
#: decode loop; one worker suffices, the scheduler sets one request up at a time)
DEFAULT_OCR_WORKERS = 1
#: The OpenAI APIs the server answers, by their paths under ``/v1`` (the start-up line and the help name them all).
SERVED_APIS = {"chat/completions": "chat completions", "completions": "completions", "responses": "Responses"}


def announcement(name: str, url: str) -> str:
    """The line ``serve`` prints once it listens: the pair, the base URL and every OpenAI API served under it."""
    apis = ", ".join(f"{what} (POST /v1/{path})" for path, what in SERVED_APIS.items())
    return f"asymspec-mm serve: serving {name} on {url}/v1 (OpenAI-compatible: {apis})"


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``serve`` on an argparse sub-parsers object; its ``func(args)`` loads the models and serves."""
    p = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (chat completions, completions, Responses)",
        description="Serve the pair behind OpenAI's chat completions, completions and Responses APIs, decoding concurrent "
        "requests in shared steps. "
        "Binds 127.0.0.1 by default; never fetches remote image URLs.",
    )
    add_model_args(p)
    s = p.add_argument_group("serving")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind [default: %(default)s]; anything else exposes the server (a warning is printed)",
    )
    s.add_argument("--port", type=int, default=8000, help="[default: %(default)s; 0 = any free port]")
    s.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=DEFAULTS["max_batch_size"],
        help="rows decoded together in shared steps [default: %(default)s]",
    )
    s.add_argument(
        "--max-queue",
        type=positive_int,
        default=DEFAULTS["max_queue"],
        help="requests waiting for a row before further ones get 429 [default: %(default)s]",
    )
    s.add_argument(
        "--max-kv-bytes",
        type=positive_int,
        default=None,
        help="KV cache bytes the rows may allocate; rows are admitted by what they need now and preempted (recomputed "
        "later, the same answer) when they cannot grow [default: no bound]",
    )
    s.add_argument(
        "--max-request-mb",
        type=positive_float,
        default=DEFAULTS["max_request_mb"],
        help="largest request body, image included (413 beyond) [default: %(default)s]",
    )
    s.add_argument(
        "--max-images",
        type=positive_int,
        default=DEFAULTS["max_images"],
        help="images one request may hold, over all its messages (400 beyond) [default: %(default)s]",
    )
    s.add_argument(
        "--api-key",
        default=os.environ.get("ASYMSPEC_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on /v1 and /metrics [default: $ASYMSPEC_API_KEY, else no key]",
    )
    s.add_argument(
        "--allow-local-images",
        metavar="DIR",
        default=None,
        help="let requests name image files under DIR (a path or file:// URL); by default only data: URLs are read",
    )
    s.add_argument(
        "--generation-config",
        choices=GENERATION_CONFIGS,
        default="none",
        help="what a request without temperature gets: none = greedy (the paper's rule), model = the verifier's own "
        "generation_config.json sampling defaults (temperature, top_p, top_k) [default: %(default)s]",
    )
    s.add_argument(
        "--ocr-workers",
        type=non_negative_int,
        default=DEFAULT_OCR_WORKERS,
        help="worker processes that read the images' text beside the decode loop (one compute thread each); 0 reads "
        "in the set-up thread, where OCR slows the loop's steps [default: %(default)s]",
    )
    s.add_argument(
        "--max-stall",
        type=stall_bound,
        default=None,
        help="bound a turn's vision tower passes and prompt pieces to this multiple (>= 1) of the decode step they "
        "ride beside, by costs the loop measures, so that decoding rows do not stall while new requests arrive; "
        "admission then takes longer [default: no bound]",
    )
    s.add_argument(
        "--setup-workers",
        type=positive_int,
        default=DEFAULT_SETUP_WORKERS,
        help="threads that set requests up at once (images, caption, OCR, prompts, grammar); while one waits for its "
        "caption or vision tower, which the decode loop runs, another goes on [default: %(default)s]",
    )
    s.add_argument(
        "--responses-store",
        metavar="FILE",
        default=None,
        help="keep the Responses API's stored conversations (previous_response_id) in this SQLite file, shared by every "
        "server on this host started with the same FILE, so that a conversation continues on any replica behind a "
        f"router; the last {STORE_MAX_RESPONSES} responses and {STORE_MAX_BYTES // 2**20} MB in the file, all servers "
        "together [default: this process's memory]",
    )
    s.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="seconds a server stopped with SIGTERM lets its requests in flight finish (new ones get 503 with "
        "Retry-After, /ready says draining); requests still running then end with a 503 error, and the server exits "
        "[default: %(default)s]",
    )
    s.add_argument(
        "--drain-linger",
        type=non_negative_float,
        default=DEFAULT_DRAIN_LINGER,
        help="seconds a server stopped with SIGTERM stays up at least, refusing new requests with 503, however soon its "
        "last request ends, so that a router takes it out of rotation before its port closes (0: exit once idle; at "
        "most --drain-timeout) [default: %(default)s]",
    )
    s.add_argument(
        "--load-format",
        choices=("sglang", "vllm-router"),
        default="sglang",
        help="the shape of GET /get_load: sglang = SGLang's list (SGLang's gateway reads it), vllm-router = "
        '{"load": n} (what vllm-router 0.1.17 reads) [default: %(default)s]',
    )
    add_compression_arg(s, "compress the verifier's view of each chat request turn by turn unless it sets asymspec.compression")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"), help="[default: %(default)s]")
    p.set_defaults(func=cmd_serve)
    return p


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the stack, bind the port (before the models load, so a busy port fails at once), load, serve."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"error: serve needs {', '.join(missing)}: pip install 'asymspec-mm[serve]'",
            file=sys.stderr,
        )
        return 2
    if args.allow_local_images is not None and not os.path.isdir(args.allow_local_images):
        raise AsymSpecError(f"--allow-local-images {args.allow_local_images!r} is not a directory")
    from ..frontend.options import compression_from_args, pipeline_from_args
    from .app import create_app
    from .loading import LoadingResponder
    from .responses_store import open_response_store
    from .server import bind_socket, serve, url_of, warn_if_exposed

    args.compression = compression_from_args(args)  # a bad setting fails before the models load
    store = open_response_store(args.responses_store)  # a bad path fails at once, before the port and the models
    sock = bind_socket(args.host, args.port)
    pipe = None
    on_main = threading.current_thread() is threading.main_thread()  # only the main thread may set a signal handler
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if on_main else None  # while loading: unwind, so the clean-up runs
    loading = LoadingResponder(sock).start()  # probes and clients get 503 "loading" rather than a hanging connection
    try:
        warn_if_exposed(args.host, sock.getsockname()[1], args.api_key)
        print(f"asymspec-mm serve: loading the models; {url_of(sock)} answers 503 until they are loaded", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        pipe = pipeline_from_args(args, ocr_workers=args.ocr_workers)
        print(f"asymspec-mm serve: loaded {pipe.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        loading.stop()  # the app takes the socket over from here
        app = create_app(
            pipe,
            max_batch_size=args.max_batch_size,
            max_queue=args.max_queue,
            max_kv_bytes=args.max_kv_bytes,
            setup_workers=args.setup_workers,
            max_stall=args.max_stall,
            api_key=args.api_key,
            allow_local_images=args.allow_local_images,
            max_request_mb=args.max_request_mb,
            max_images=args.max_images,
            generation_config=args.generation_config,
            responses_store=store,
            drain_timeout=args.drain_timeout,
            drain_linger=args.drain_linger,
            load_format=args.load_format,
            compression=args.compression,
        )
        print(announcement(pipe.name, url_of(sock)), file=sys.stderr, flush=True)
        serve(app, sock, log_level=args.log_level)
    finally:
        loading.stop()
        if on_main:
            signal.signal(signal.SIGTERM, previous)
        sock.close()
        store.close()
        if pipe is not None:
            pipe.close()  # the OCR worker processes
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM before the server runs (the models loading): exit through the ``finally`` clauses (status 143, as a
    process killed by SIGTERM reports), not at once, which would leave the OCR worker processes running."""
    raise SystemExit(128 + signum)
