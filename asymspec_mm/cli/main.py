"""``asymspec-mm``: generate, chat, explain, quickstart, batch, demo, eval, bench, serve."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from ..base.config import BONUS_RULES
from ..base.errors import AsymSpecError, UnknownOptionError
from ..base.unicode_check import check_text_fields
from ..frontend.options import (
    add_compression_arg,
    add_decode_args,
    add_model_args,
    compression_from_args,
    config_from_args,
    pipeline_from_args,
)
from ..request.questions import check_question
from .output import Progress, config_line, format_provenance, print_result  # noqa: F401 - format_provenance: re-exported

ANSWER_TYPES = ("integer", "float1", "float2", "list")  # mathvista_question's answer types
VERBOSE_HELP = "show the libraries' warnings, notices and loading bars, and tracebacks"


def compose_question(question: str, choices: list[str] | None, answer_type: str | None) -> str:
    """The question as given, or, with ``--choices`` / ``--answer-type``, in MathVista's layout."""
    question = check_question(question)
    check_text_fields({"--choices": choices})
    if not choices and not answer_type:
        return question
    if choices and answer_type:
        raise UnknownOptionError("give --choices (multiple choice) or --answer-type (free form), not both")
    from ..request.mathvista_query import mathvista_question

    return mathvista_question(question, choices, answer_type)


def image_size(path: str) -> tuple[int, int] | None:
    """The image's (width, height) from its header, or ``None`` when unreadable (:func:`read_image` says why)."""
    import warnings

    try:
        from PIL import Image

        with warnings.catch_warnings():  # the size is judged by size_error, against the library's own limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return im.size
    except Exception:
        return None


def size_error(path: str, size: tuple[int, int] | None, limit: int) -> str | None:
    """The one-line refusal of an image over ``limit`` pixels (from its header), naming the variable that raises the
    limit; ``None`` when it fits or its size is unknown."""
    if size is None or size[0] * size[1] <= limit:
        return None
    return f"--image {path} is {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels, over the limit of {limit:,} pixels: {oversize_advice(limit)}"


def oversize_advice(limit: int) -> str:
    """What the CLI tells a user whose image is over ``limit`` pixels: downscale it, or raise the limit with the
    environment variable (the command has no flag for it)."""
    side = math.isqrt(limit)
    return f"downscale it (e.g. to fit {side}x{side}), or set ASYMSPEC_MAX_INPUT_PIXELS to a larger pixel count"


def read_image(path: str) -> Any:
    """The ``--image`` file decoded to RGB before any model loads; a missing, empty, corrupt or oversized file is
    one :class:`AsymSpecError` line naming ``--image`` and the fix."""
    from vision_cache.errors import InvalidImageError
    from vision_cache.image import DEFAULT_MAX_INPUT_PIXELS, load_image

    if (problem := size_error(path, image_size(path), DEFAULT_MAX_INPUT_PIXELS)) is not None:
        raise AsymSpecError(problem)
    try:
        return load_image(path, oversize_advice=oversize_advice(DEFAULT_MAX_INPUT_PIXELS), limit_option="ASYMSPEC_MAX_INPUT_PIXELS")
    except InvalidImageError as exc:
        raise AsymSpecError(f"--image: {exc}") from None


#: What the tiny pair's out-of-domain warning advises on the command line (its flags; see ``domain_advice``).
DOMAIN_ADVICE = (
    "use a bundled example (asymspec-mm quickstart, asymspec_mm/examples_data), add --choices to a "
    "MiniVista question, or load a real pair (--preset qwen3)"
)


def warn_out_of_domain(question: str, size: tuple[int, int]) -> None:
    """The tiny pair's warning before it loads (logged as the request's own, which the command says once)."""
    from ..request.domain import TINY, warn_request

    warn_request(TINY, question, [size], DOMAIN_ADVICE)


def cmd_generate(args: argparse.Namespace) -> int:
    pipe, res = answer_from_args(args)
    print_result(res, pipe.tokenizer, args.json)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Answer as ``generate`` does, then write the trace JSON (and with ``--attribute`` the heat maps beside it)."""
    from pathlib import Path

    from .explain_files import write_explanation

    pipe, res = answer_from_args(args)
    print_result(res, pipe.tokenizer)
    kw = dict(attribute=args.attribute, positions=args.positions, grid=args.grid, baseline=args.baseline, method=args.attribution_method)
    for path in write_explanation(pipe, res, Path(args.trace_json), **kw):
        print(f"wrote {path}")
    return 0


def answer_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(pipeline, result)``: the question of ``generate``'s arguments answered."""
    question = compose_question(args.question, args.choices, args.answer_type)
    # an undecodable byte on the command line arrives as a lone surrogate: refuse it before any model loads
    check_text_fields({"--caption": args.caption, "--ocr": args.ocr})
    cfg = config_from_args(args)
    compression = compression_from_args(args)
    if compression is not None and args.image:
        raise UnknownOptionError(
            "--compression compresses a conversation's older turns, and a question about an image is one turn: use "
            "asymspec-mm chat --messages FILE, or leave --compression out"
        )
    image = read_image(args.image) if args.image else None  # before the domain warning and the models: a bad file is refused at once
    if args.preset == "tiny" and image is not None:  # before loading: the answer would be meaningless (prepare warns for "auto")
        warn_out_of_domain(question, image.size)
    progress = Progress(enabled=not args.quiet)
    progress(f"loading the models ({args.preset or 'auto'})" if not args.drafter else "loading the models")
    pipe = pipeline_from_args(args)
    ocr: Any = None
    if args.no_ocr:
        ocr = False
    elif args.ocr is not None:
        ocr = args.ocr
    # without an image the question is the one-turn conversation (all a text-only pair answers), compressed if asked
    extra: dict[str, Any] = {"compression": compression} if compression is not None else {}
    # set up here (its phases told to the progress lines), decoded on the engine core as the first read asks
    stream = pipe.stream(
        image,
        question,
        caption=args.caption,
        ocr=ocr,
        method=args.method,
        config=cfg,
        on_phase=progress,
        domain_advice=DOMAIN_ADVICE,
        **extra,
    )
    progress(f"decoding ({config_line(args.method, cfg)})")
    return pipe, stream.result


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Answer a bundled example question with the bundled tiny pair, showing the token provenance."""
    from pathlib import Path

    from ..pipeline.facade import AsymSpecPipeline

    data = Path(__file__).resolve().parents[1] / "examples_data"
    index = data / "examples.json"
    if not index.exists():
        raise AsymSpecError(f"no bundled examples at {index}; reinstall asymspec-mm")
    examples = json.loads(index.read_text())
    ex = examples[args.example % len(examples)]
    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    print(f"image: {data / ex['image']}\nquestion: {ex['question']}\nexpected answer: {ex['answer']}")
    print(f"the verifier reads only: {ex.get('caption', '')!r} + OCR {ex.get('ocr', '')!r}\n")
    for method in ("floor", "drafter", "asymspec"):
        res = pipe.generate(
            data / ex["image"],
            ex["question"],
            caption=ex.get("caption", ""),
            ocr=ex.get("ocr") or False,
            method=method,
            max_new_tokens=args.max_new_tokens,
            bonus=args.bonus,
        )
        label = {"floor": "verifier alone (Floor)", "drafter": "drafter alone", "asymspec": "AsymSpec"}[method]
        print(f"== {label}")
        print_result(res, pipe.tokenizer)
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asymspec-mm", description="Cross-modal AsymSpec: a vision-language drafter steers a text-only verifier."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="{generate,chat,explain,quickstart,batch,demo,eval,bench,serve}")
    sub.required = True

    g = sub.add_parser("generate", help="answer a question about an image (or, without --image, a text question)")
    add_question_args(g)
    add_compression_arg(g, "a text question (no --image) as a one-turn conversation, compressed")
    g.add_argument("--json", action="store_true", help="print the full result (trace, stats) as JSON")
    g.set_defaults(func=cmd_generate)

    from .chat import add_chat_parser

    add_chat_parser(sub)

    e = sub.add_parser("explain", help="answer a question and write its trace as JSON (--attribute: heat maps beside it)")
    add_question_args(e)
    e.add_argument("--trace-json", required=True, metavar="PATH", help="where to write the trace JSON")
    e.add_argument("--attribute", action="store_true", help="write each chosen token's heat maps as PNGs next to the JSON")
    e.add_argument("--positions", type=int, nargs="+", default=None, help="tokens to attribute [default: the steered or fused ones]")
    e.add_argument("--grid", type=int, default=8, help="at most GRID x GRID regions an image [default: %(default)s]")
    e.add_argument("--baseline", default="mean", choices=("mean", "zero"), help="what a masked region becomes [default: %(default)s]")
    e.add_argument(
        "--attribution-method",
        default="occlusion",
        choices=("occlusion", "gradient"),
        help="occlusion (a forward per region) or gradient (a cheaper first-order estimate) [default: %(default)s]",
    )
    e.set_defaults(func=cmd_explain)

    q = sub.add_parser("quickstart", help="run a bundled example on the bundled tiny pair")
    q.add_argument("--example", type=int, default=0)
    q.add_argument("--max-new-tokens", type=int, default=64)
    q.add_argument("--bonus", default="verifier", choices=BONUS_RULES, help="bonus-token rule [default: %(default)s]")
    q.set_defaults(func=cmd_quickstart)
    add_edges(sub)
    add_verbose(parser)
    return parser


def add_question_args(g: argparse.ArgumentParser) -> None:
    """The question, its image and views, the models and the decoding settings (``generate`` and ``explain``)."""
    g.add_argument("--image", default=None, help="image file (leave it out for a text question: a text-only drafter takes no image)")
    g.add_argument("--question", required=True, help="the question (with --choices/--answer-type: the bare question)")
    g.add_argument(
        "--choices", nargs="+", default=None, metavar="CHOICE", help="answer options: asks in MathVista's multiple-choice layout"
    )
    g.add_argument("--answer-type", default=None, choices=ANSWER_TYPES, help="asks in MathVista's free-form layout with this hint")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    g.add_argument("--caption", default=None, help="caption for the verifier (default: generated by the drafter)")
    g.add_argument("--ocr", default=None, help="OCR text for the verifier (default: produced by the OCR engine)")
    g.add_argument("--no-ocr", action="store_true", help="give the verifier no OCR text")
    add_model_args(g)
    add_decode_args(g)


def add_edges(sub: Any) -> None:
    """The subcommands of the optional parts (each unavailable, with the extra to install, when its part is missing)."""
    for module, adder in (
        ("asymspec_mm.cli.batch", "add_batch_parser"),
        ("ui.serve", "add_demo_parser"),
        ("asymspec_mm.eval.cli", "add_eval_parser"),
        ("asymspec_mm.bench", "add_bench_parser"),
        ("asymspec_mm.serve.cli", "add_serve_parser"),
    ):
        try:
            mod = __import__(module, fromlist=[adder])
        except ImportError as exc:  # an optional part whose extra is not installed
            name = {
                "asymspec_mm.cli.batch": "batch",
                "ui.serve": "demo",
                "asymspec_mm.eval.cli": "eval",
                "asymspec_mm.bench": "bench",
                "asymspec_mm.serve.cli": "serve",
            }[module]
            extra = {"batch": "eval", "demo": "ui", "eval": "eval", "bench": "eval", "serve": "serve"}[name]
            p = sub.add_parser(name, help=f"(unavailable: {exc.name} missing; pip install 'asymspec-mm[{extra}]')")
            p.set_defaults(func=lambda a, e=exc, x=extra: _missing(e, x))
            continue
        getattr(mod, adder)(sub)


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` on every subcommand too (``asymspec-mm serve -v`` as ``asymspec-mm -v serve``): suppressed
    when absent, so a subcommand's default does not undo the top-level flag."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases repeat a parser
                if "--verbose" not in sub._option_string_actions:
                    sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
                add_verbose(sub)


def _missing(exc: ImportError, extra: str) -> int:
    print(f"error: this command needs {exc.name}: pip install 'asymspec-mm[{extra}]'", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    from ..base.chatter import configure_cli_logging

    # a command that answers one request (or a file of them) says each distinct warning once; a server, per request
    configure_cli_logging(args.verbose, say_once=args.command in ("generate", "chat", "explain", "quickstart", "batch"))
    if not args.verbose:
        import warnings

        warnings.filterwarnings("ignore")
    try:
        rc = args.func(args)
    except AsymSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


def run() -> None:
    """The ``asymspec-mm`` command (the console script and ``python -m asymspec_mm.cli``): :func:`main`, then exit
    with its status. Before the exit, every object left is frozen (``gc.freeze``): the interpreter's last full
    collections would walk the half a million objects torch and transformers leave (seconds: 5 s to 9 s after a
    server's shutdown on a busy machine, longer than the shutdown itself) to free memory the exit frees anyway. Not
    in :func:`main`, which a caller may run in a process that lives on."""
    import gc

    rc = main()
    gc.freeze()
    sys.exit(rc)


if __name__ == "__main__":  # pragma: no cover
    run()
