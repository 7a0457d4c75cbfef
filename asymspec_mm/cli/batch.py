"""``asymspec-mm batch``: answer a JSONL file of questions, one durable answer line per finished row.

Input: one JSON object a line, ``{"id", "image", "question", "caption"?, "ocr"?}``. ``image`` is a file path
(relative paths are resolved against ``--images-dir``, else the input file's folder; URLs are never fetched);
``caption`` / ``ocr`` as in :meth:`AsymSpecPipeline.prepare` (absent or null: produced by the toolkit; a string:
used as is; ``"ocr": false``: no OCR text). Ids are strings or integers, compared as text, unique in the file
(a line repeating an earlier id is a bad line).

Output (``ANSWERS.jsonl``): one line per answered id, in the order rows finish, appended, flushed and fsynced
as each row finishes (a kill loses at most the rows in flight): ``{"id", "answer", "warnings", "stats", "view":
{"caption", "ocr_text"}, "method", "config"}`` (``warnings``: :attr:`~asymspec_mm.request.session.MMResult.warnings`) plus ``"trace"`` with ``--trace``. The run's identity (models, method, the
effective config, dtype, OCR engine and layout, trace, package version) is in ``ANSWERS.jsonl.meta.json``; ``--resume``
skips the ids already answered and refuses a run whose identity differs, naming the keys. Bad lines (a line
that is not UTF-8, invalid JSON, a missing or mistyped field, text that is not valid Unicode such as a lone
surrogate ``\\ud800``, a repeated id, a URL, a missing or unreadable image) are reported on stderr with their line
number and written to ``ANSWERS.jsonl.errors.jsonl`` (the latest run's failures, so ``--resume`` reports a bad
line again until it is fixed); the run goes on and exits with 1 at the end, or stops at the first one with
``--on-error raise``. Ctrl-C stops the run (exit 130) with one line saying how many answers are kept and that
``--resume`` continues it.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from ..frontend.help import documented_parser
from ..frontend.identity import (
    checkpoint_identity,
    comparable,
    models_identity,
    ocr_engine_of,
    read_identity_file,
    show_value,
    write_identity_file,
)
from ..frontend.identity import identity_diff as shared_identity_diff
from ..frontend.options import add_decode_args, add_model_args, config_from_args, pipeline_from_args
from ..pipeline.presets import ocr_layout_of
from .batch_files import (
    DEFAULT_BATCH_SIZE,
    FORMAT,
    FORMAT_VERSION,
    JsonlAppender,
    LineError,
    TokenTexts,
    answer_record,
    answered_ids,
    errors_path,
    jsonable,
    meta_path,
    read_input,
)

#: What the tiny pair's out-of-domain warning (each answer's ``warnings``) advises a batch file's author: the line's
#: question, or the pair the command loads (a batch line has no choices field: the layout goes in its question).
DOMAIN_ADVICE = (
    "write the line's question as a MiniVista question in MathVista's layout ('Hint: ...', then 'Question: ...', then "
    "'Choices: (A) ...'; asymspec_mm/examples_data/examples.json holds such questions), or load a real pair (--preset qwen3)"
)

# ------------------------------------------------------------------------------------------- identity


def run_identity(args: argparse.Namespace, cfg: Any) -> tuple[dict[str, Any], str | None]:
    """What must not change between a run and its ``--resume``, and the preset name to load (None: a pair).

    Computed without loading a model: the pair (preset name; each checkpoint by path or id, revision and a hash of
    each file, as eval names them), the dtype they load in,
    method, the effective config, the OCR engine and text layout, whether traces are written and the package version.
    """
    from .. import __version__

    models, preset_name = models_identity(args.preset, args.drafter, args.verifier, args.device, args.dtype)
    if getattr(args, "sd_drafter", None) and args.method == "sd":  # another SD drafter makes other tokens
        models["sd_drafter"] = checkpoint_identity(args.sd_drafter)
    identity = {
        "models": {k: v for k, v in models.items() if k != "dtype"},
        "dtype": models["dtype"],
        "method": args.method,
        "config": jsonable(cfg.as_dict()),
        "ocr_engine": ocr_engine_of(args.ocr_engine, preset_name),
        "ocr_layout": ocr_layout_of(preset_name),
        "trace": bool(args.trace),
        "version": __version__,
    }
    return identity, preset_name


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"key (old -> new)"`` for every differing key; config fields are named by themselves (``k``, ``beta``)."""
    return [f"{key.removeprefix('config.')} ({show_value(a)} -> {show_value(b)})" for key, a, b in shared_identity_diff(old, new)]


def write_meta(path: Path, identity: Mapping[str, Any], input_path: Path) -> None:
    write_identity_file(path, FORMAT, FORMAT_VERSION, identity, input=str(input_path.resolve()))


def check_resume(output: Path, identity: Mapping[str, Any]) -> None:
    """Refuse to continue ``output`` when its sidecar is missing or names another run."""
    mp = meta_path(output)
    old = read_identity_file(mp, FORMAT, "--overwrite to start over")
    if old is None:
        raise AsymSpecError(f"{output} has no {mp.name}, so this run cannot be checked against it: --overwrite to start over")
    diff = identity_diff(comparable(old), comparable(identity))
    if diff:
        raise AsymSpecError(
            f"--resume: {output} was written by a different run; differing: {', '.join(diff)}. "
            "Resume with the same options, or --overwrite / a new --output"
        )


# ------------------------------------------------------------------------------------------------ run


class _Progress:
    """tqdm on stderr (a no-op when disabled or tqdm is missing); :meth:`write` prints above the bar."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        if enabled and total:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc="batch", unit="q", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # pragma: no cover - tqdm comes with transformers
                self.bar = None

    def update(self, postfix: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def load_batch_pipeline(args: argparse.Namespace, preset_name: str | None):
    """The pipeline of the run (the preset already resolved, so ``auto`` is decided once)."""
    ns = argparse.Namespace(**vars(args))
    if preset_name is not None:
        ns.preset = preset_name
    return pipeline_from_args(ns)


def answer_all(
    pipe: Any,
    todo: list[Any],
    args: argparse.Namespace,
    cfg: Any,
    answered: Callable[[Any, Any], None],
    failed: Callable[[Any, BaseException, str], None],
) -> None:
    """Answer every item of ``todo`` through an engine loop of ``--batch-size`` rows (``pipe.scheduler``: set-up on
    its threads ahead of the rows, prompts chunked into the decode forwards, a finished row's place to the next
    request at once), telling ``answered(item, result)`` or ``failed(item, error, stage)`` (``prepare`` when its
    set-up failed, ``decode`` after) in the order requests finish. At most twice ``--batch-size`` requests are in
    the loop at once, so a large file's images are read as rows free up. Stopping (Ctrl-C, ``--on-error raise``)
    cancels the requests in the loop."""
    from ..core.request_state import RequestStatus

    ended: queue.Queue = queue.Queue()
    upcoming = iter(todo)
    in_loop: dict[Any, Any] = {}  # handle -> item
    kw = {"method": args.method, "config": cfg, "domain_advice": DOMAIN_ADVICE}
    sched = pipe.scheduler(max_batch_size=args.batch_size)

    def submit() -> None:
        while len(in_loop) < 2 * args.batch_size and (item := next(upcoming, None)) is not None:
            image = str(item.image) if item.image is not None else None
            try:
                handle = sched.submit(image, item.question, caption=item.caption, ocr=item.ocr, **kw)
            except (ValueError, OSError) as exc:  # refused before its set-up (an option out of range)
                failed(item, exc, "prepare")
                continue
            in_loop[handle] = item
            handle.listen(lambda kind, value, h=handle: kind == "events" or ended.put((h, kind, value)))

    try:
        submit()
        while in_loop:
            handle, kind, value = ended.get()
            item = in_loop.pop(handle)
            if kind == "result":
                answered(item, value)
            else:
                failed(item, value, "decode" if RequestStatus.READY in handle.times else "prepare")
            submit()
    finally:
        for handle in in_loop:
            handle.cancel()
        sched.close()


def cmd_batch(args: argparse.Namespace) -> int:
    """Answer every line of ``--input``; 0 when all were answered, 1 when some failed."""
    inp, output = Path(args.input), Path(args.output)
    if args.batch_size < 1:
        raise AsymSpecError(f"--batch-size {args.batch_size}: must be >= 1")
    if inp.resolve() == output.resolve():
        raise AsymSpecError("--output must differ from --input")
    images_dir = Path(args.images_dir).expanduser() if args.images_dir else None
    if images_dir is not None and not images_dir.is_dir():
        raise AsymSpecError(f"--images-dir {images_dir} is not a folder")
    if not inp.is_file():
        raise AsymSpecError(f"--input {inp} is not a file")
    cfg = config_from_args(args)
    identity, preset_name = run_identity(args, cfg)

    started = output.exists() and output.stat().st_size > 0
    if started and not (args.resume or args.overwrite):
        raise AsymSpecError(f"{output} already holds answers: pass --resume to continue it or --overwrite to start over")
    resuming = started and args.resume
    if resuming:
        check_resume(output, identity)
    items, line_errors = read_input(inp, images_dir)
    if line_errors and args.on_error == "raise":
        e = line_errors[0]
        raise AsymSpecError(f"{inp}:{e.line}: {e.message}")

    # every check passed: now the files change
    output.parent.mkdir(parents=True, exist_ok=True)
    done = answered_ids(output) if resuming else set()
    if not resuming:
        output.write_bytes(b"")
        write_meta(meta_path(output), identity, inp)
    err_file = errors_path(output)
    err_file.unlink(missing_ok=True)  # the errors file holds the latest run's failures
    todo = [it for it in items if it.key not in done]
    skipped = len(items) - len(todo)

    answers, errors = JsonlAppender(output), JsonlAppender(err_file)
    stack = contextlib.ExitStack()
    progress = _Progress(0, False)  # the bar starts once the models are loaded
    failed = 0
    answered = 0
    interrupted = False

    def fail(err: LineError) -> None:
        nonlocal failed
        failed += 1
        errors.write(err.record())
        progress.write(f"{inp}:{err.line}: {err.message}")
        if args.on_error == "raise":
            raise AsymSpecError(f"{inp}:{err.line}: {err.message}")

    try:
        for err in line_errors:
            fail(err)
        if not args.no_progress:  # log lines (warnings; libraries' chatter with --verbose) print above the bar
            from tqdm.contrib.logging import logging_redirect_tqdm

            stack.enter_context(logging_redirect_tqdm())
        if todo:
            pipe = load_batch_pipeline(args, preset_name)
            progress = _Progress(len(todo), not args.no_progress)
            text_of = TokenTexts(pipe.tokenizer) if args.trace else None
            drafted = accepted = 0  # summed over the answers: the bar shows pooled acceptance, as eval reports

            def answered_one(item: Any, res: Any) -> None:
                nonlocal answered, drafted, accepted
                answers.write(answer_record(item, res, text_of))
                answered += 1
                drafted += int(res.stats.get("drafted") or 0)
                accepted += int(res.stats.get("accepted") or 0)
                postfix = f"accept (pooled)={accepted / drafted:.2f}" if drafted else ""
                progress.update(f"{postfix} failed={failed}".strip())

            def failed_one(item: Any, exc: BaseException, stage: str) -> None:
                fail(LineError(item.line, item.id, str(exc) or type(exc).__name__, stage=stage))
                progress.update(f"failed={failed}")

            answer_all(pipe, todo, args, cfg, answered_one, failed_one)
    except KeyboardInterrupt:  # Ctrl-C: every finished row is already durable, so say how to go on
        interrupted = True
    finally:
        progress.close()
        stack.close()
        answers.close()
        errors.close()

    if interrupted:
        kept = len(answered_ids(output))  # the file says what is kept (a Ctrl-C can land between a write and a count)
        print(interrupted_message(output, kept, len(todo) + skipped - kept, bool(args.overwrite)), file=sys.stderr)
        return 130

    parts = [f"{answered} answered"]
    if skipped:
        parts.append(f"{skipped} already answered")
    if failed:
        parts.append(f"{failed} failed (see {err_file})")
    print(f"asymspec-mm batch: {', '.join(parts)} -> {output}", file=sys.stderr)
    return 1 if failed else 0


def interrupted_message(output: Path, kept: int, left: int, overwrite: bool) -> str:
    """The line a Ctrl-C'd run ends with: what it kept and how to continue it."""
    how = "the same command with --resume" + (" in place of --overwrite" if overwrite else "")
    return f"asymspec-mm batch: interrupted; {kept} answers kept in {output}, {left} not answered; to continue, run {how}"


def add_batch_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``batch`` on a subparsers object."""
    p = documented_parser(subparsers, "batch", "answer a JSONL file of questions (continuous batching, resumable)", __doc__)
    io = p.add_argument_group("files")
    io.add_argument(
        "--input",
        required=True,
        metavar="QUESTIONS.jsonl",
        help='one {"id", "image"?, "question", "caption"?, "ocr"?} a line (no image: a text question)',
    )
    io.add_argument("--output", required=True, metavar="ANSWERS.jsonl", help="answers, appended as rows finish")
    io.add_argument("--images-dir", default=None, help="folder relative image paths are resolved against [default: the input's folder]")
    mode = io.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="skip the ids already in --output (refused if the run's identity differs)")
    mode.add_argument("--overwrite", action="store_true", help="start --output over")
    run = p.add_argument_group("run")
    run.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows decoded together [default: %(default)s]")
    run.add_argument("--trace", action="store_true", help="write each answer's per-token provenance (with token texts)")
    run.add_argument(
        "--on-error",
        choices=("continue", "raise"),
        default="continue",
        help="a bad line: report it and go on (exit 1 at the end), or stop [default: %(default)s]",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_batch)
    return p
