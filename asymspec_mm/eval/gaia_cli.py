"""``asymspec-mm eval gaia``: the paper's GAIA harness (:mod:`.gaia`) over a local copy of GAIA, or over the
bundled GAIA-shaped tasks (``--bundled``: a protocol check, not a score), against a running server (``--url``) or a
``asymspec-mm serve`` it starts on a loopback port with the model options. Attachments are read as text
(:mod:`.gaia_files`: spreadsheets, PDFs, Word documents, text files). Writes ``records.jsonl`` (one line per row and
task, each request's server figures), ``run.json`` (the run's identity), ``summary.json`` and ``table4.md`` (the
paper's Table 4 layout) into ``--out``; ``--resume`` continues a run cut short (:mod:`.gaia_runs`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from ..frontend.help import documented_parser
from ..frontend.options import add_model_args

DEFAULT_OUT = "runs/gaia"


def add_harness_parser(
    sub: Any, name: str, help: str, doc: str | None, *, max_steps: int, out: str
) -> tuple[argparse.ArgumentParser, Any, Any]:
    """The options the agent harnesses (``eval gaia``, ``eval simpleqa``) share: ``--bundled``, ``--tool-cache``
    and ``--limit`` (data), Table 4's rows, the ReAct loop's compression, K, beta, the step and token bounds and the
    system prompt (harness), the server, the output folder and ``--resume`` (run), the model options. Returns the
    parser and its data and harness groups, for the benchmark's own options."""
    from .gaia import REACT_COMPRESSION, ROWS

    g = documented_parser(sub, name, help, doc)
    d = g.add_argument_group("data")
    d.add_argument("--bundled", action="store_true", help="the bundled tasks of the benchmark's shape: a protocol check, not a score")
    d.add_argument(
        "--tool-cache", default=None, help="cached web_search / visit_webpage returns [default: tool_cache.json beside the data]"
    )
    d.add_argument("--limit", type=int, default=None, help="the first N tasks")
    h = g.add_argument_group("harness")
    h.add_argument("--rows", default=",".join(ROWS), help=f"Table 4's rows, a comma list of {', '.join(ROWS)} [default: %(default)s]")
    h.add_argument("--compression", default=REACT_COMPRESSION, help="the ReAct loop's per-turn compression [default: %(default)s]")
    h.add_argument("--k", type=int, default=2, help="draft length K [default: %(default)s]")
    h.add_argument("--beta", type=float, default=1.0, help="fusion weight beta [default: %(default)s]")
    h.add_argument("--max-steps", type=int, default=max_steps, help="ReAct steps per task [default: %(default)s]")
    h.add_argument("--max-tokens", type=int, default=1024, help="new tokens per request [default: %(default)s]")
    h.add_argument(
        "--system-prompt",
        choices=["smolagents", "short"],
        default="smolagents",
        help="the CodeAgent's system prompt: smolagents' own (some 5,700 tokens) or a short one for small windows "
        "(the tiny pair's 4,096) [default: %(default)s]",
    )
    r = g.add_argument_group("run")
    r.add_argument("--url", default=None, help="a running asymspec-mm server (http://127.0.0.1:8000) [default: load and serve the models]")
    r.add_argument("--model", default=None, help="the model name the server answers to [default: the one its /v1/models lists]")
    r.add_argument("--out", default=out, help="output folder [default: %(default)s]")
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue the records in --out, skipping finished (row, task) pairs; refused when the run differs from "
        "the one in --out/run.json (new rows and another selection are allowed)",
    )
    add_model_args(g)
    return g, d, h


def add_gaia_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``eval gaia`` on ``eval``'s subparsers."""
    from .gaia_files import MAX_ATTACHMENT_MB

    g, d, h = add_harness_parser(
        sub,
        "gaia",
        "the paper's GAIA harness (smolagents ReAct loop, per-turn compression): Table 4",
        __doc__,
        max_steps=8,
        out=DEFAULT_OUT,
    )
    d.add_argument("--gaia-dir", default=None, help="a GAIA split's folder: metadata.jsonl and its files (e.g. DIR/2023/validation)")
    d.add_argument("--level", type=int, default=None, choices=[1, 2, 3], help="only this GAIA level")
    d.add_argument(
        "--max-attachment-mb",
        type=float,
        default=MAX_ATTACHMENT_MB,
        help="the largest attachment read (a larger one fails its task) [default: %(default)s]",
    )
    h.add_argument(
        "--file-limit",
        type=int,
        default=2000,
        help="file-QA: the verifier's truncation of the file's text, in tokens [default: %(default)s]",
    )
    h.add_argument(
        "--file-harness", choices=["single-shot", "react"], default="single-shot", help="tasks with an attachment [default: %(default)s]"
    )
    return g


def harness_settings(args: argparse.Namespace, **more: Any) -> Any:
    """The :class:`~.gaia.HarnessSettings` of the shared options (:func:`add_harness_parser`) and ``more``, checked."""
    from .gaia import SHORT_SYSTEM_PROMPT, HarnessSettings

    return HarnessSettings(
        compression=args.compression,
        k=args.k,
        beta=args.beta,
        max_steps=args.max_steps,
        max_tokens=args.max_tokens,
        system_prompt=SHORT_SYSTEM_PROMPT if args.system_prompt == "short" else None,
        **more,
    ).checked()


def parse_rows(spec: str) -> list[str]:
    """``--rows``' comma list, checked against Table 4's rows."""
    from .gaia import check_rows

    return check_rows([r.strip() for r in spec.split(",") if r.strip()])


#: the model options ``eval gaia`` passes on to the ``serve`` it starts
SERVE_OPTIONS = ("preset", "drafter", "verifier", "device", "dtype", "ocr_engine", "sd_drafter")


def serve_command(args: argparse.Namespace) -> list[str]:
    """``asymspec-mm serve`` on a free loopback port with ``args``' model options."""
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    for name in SERVE_OPTIONS:
        if getattr(args, name, None) is not None:
            cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return cmd


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    """``--url``, or a ``serve`` subprocess with the models (its URL read from its start-up line; stopped after)."""
    if args.url:
        yield args.url
        return
    proc = subprocess.Popen(serve_command(args), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url, seen = None, []
        for line in proc.stderr:  # the models load first: minutes for a real pair
            seen.append(line)
            if "serving" in line and " on http://" in line:
                url = line.split(" on ", 1)[1].split()[0].removesuffix("/v1")
                break
        if url is None:
            raise AsymSpecError("the server did not start: " + (seen[-1].strip() if seen else f"exit code {proc.wait()}"))
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AsymSpecError(f"the server at {url} did not become healthy")


@contextlib.contextmanager
def served(args: argparse.Namespace, settings: Any) -> Iterator[tuple[str, Any]]:
    """The server's URL (:func:`_server`) and ``settings`` with the model name it answers to."""
    import dataclasses

    from .gaia import served_model

    with _server(args) as url:
        yield url, dataclasses.replace(settings, model_id=args.model or served_model(url))


def cmd_gaia(args: argparse.Namespace) -> int:
    """Run ``eval gaia``; a bad option or a missing dataset is one line (``run_eval`` prints it)."""
    from .gaia import FILE_COMPRESSION, run_gaia, run_identity, table4
    from .gaia_data import ToolCache, load_gaia, write_bundled_tasks
    from .gaia_runs import write_summary

    if args.bundled == bool(args.gaia_dir):
        raise AsymSpecError("give --gaia-dir DIR (a GAIA split: metadata.jsonl and its files) or --bundled, one of them")
    rows = parse_rows(args.rows)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_bundled_tasks(tmp) if args.bundled else Path(args.gaia_dir)
        tasks = load_gaia(root, limit=args.limit, level=args.level)
        if not tasks:
            raise AsymSpecError(f"no GAIA task selected in {root}: check --level / --limit")
        settings = harness_settings(
            args,
            file_compression={**FILE_COMPRESSION, "limit": args.file_limit},
            file_harness=args.file_harness,
            max_attachment_mb=args.max_attachment_mb,
        )
        folder = root if root.is_dir() else root.parent
        cache_file = Path(args.tool_cache) if args.tool_cache else folder / "tool_cache.json"
        cache = ToolCache.load(cache_file)
        print(f"{len(tasks)} tasks x {len(rows)} rows: {', '.join(rows)}")
        with served(args, settings) as (url, settings):
            identity = run_identity("gaia", [folder / "metadata.jsonl", folder / "captions.json", cache_file], settings)
            note = "Bundled GAIA-shaped tasks: a protocol check, not a GAIA score.\n\n" if args.bundled else ""
            records = run_gaia(url, tasks, rows, settings, cache, out=out, note=note, identity=identity, resume=args.resume)
    write_summary(out, records, bundled=args.bundled)
    print(table4(records))
    return 0
