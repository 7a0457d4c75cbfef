"""Command-line options shared by every subcommand, and the one way to load a pipeline from them.

The decoding options are generated from :class:`~asymspec_mm.base.config.AsymSpecConfig` (names, defaults,
choices), so the CLI, the demo, eval and bench cannot drift from the library. Torch-free at import.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import fields
from typing import Any

from ..base.config import CHOICES, METHODS, RANGES, AsymSpecConfig, range_error
from ..base.errors import AsymSpecError, UnknownOptionError

OCR_ENGINES = ("auto", "easyocr", "rapidocr", "none")
DTYPES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "auto")

#: Help text of each AsymSpecConfig field on the command line (fields without an entry get no option).
DECODE_HELP: dict[str, str] = {
    "k": "draft length K",
    "beta": "fusion strength (0 disables fusion)",
    "gamma": "acceptance threshold before the divergence discount",
    "gate": "threshold rule: cda = gamma*exp(-JSD) (the paper), fixed = gamma, tuned = gamma*exp(-lam*log-ratio at the "
    "draft) (Appendix B's text), tuned_kl = gamma*exp(-lam*KL(a||b)) (the released code's tuned gate), "
    "kl = gamma*exp(-KL(a||b)) (Table 14)",
    "lam": "lambda of the tuned gates (tuned, tuned_kl)",
    "delta": "steering signal: contrast = a-b (the paper), raw = a, scd = t-b",
    "drafter_view": "what the drafter's full stream reads besides the image",
    "bonus": "token after K acceptances: verifier = argmax t_{K+1} (the paper), gated = the drafter's through the gate",
    "max_new_tokens": "most tokens to generate",
    "temperature": "0 decodes greedily (the paper); above 0 every method samples (AsymSpec by the sampled rule)",
    "top_p": "sampling: keep the smallest set of top tokens holding this much probability (1 = off)",
    "top_k": "sampling: keep the k most likely tokens (0 = off)",
    "seed": "sampling: the random seed (default: a fresh one, printed in the stats)",
}


def finite_float(text: str) -> float:
    """argparse type: a float that is neither NaN nor infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum`` (``what`` names it in the type's docstring)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    parse.__doc__ = f"argparse type: {what}."
    return parse


positive_int = _int_at_least(1, "an integer >= 1")
non_negative_int = _int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0")
    return value


def stall_bound(text: str) -> float:
    """argparse type of ``--max-stall`` (``serve`` and ``demo``): a finite number >= 1 (a turn's cost over its step's)."""
    value = positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 (a turn costs at least its own step)")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--preset`` | ``--drafter``/``--verifier``, device, dtype and OCR engine (every command that loads models)."""
    g = p.add_argument_group("models")
    g.add_argument(
        "--preset", default=None, help="tiny | tiny-xfamily | qwen3 | auto (default: auto unless --drafter/--verifier are given)"
    )
    g.add_argument("--drafter", default=None, help="Qwen3-VL drafter: hub id or local directory")
    g.add_argument("--verifier", default=None, help="text verifier: hub id or local directory")
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:1 (default: cuda when available)")
    g.add_argument("--dtype", default=None, choices=DTYPES, help="default: bf16 on cuda, fp32 on cpu")
    g.add_argument(
        "--ocr-engine",
        default=None,
        choices=OCR_ENGINES,
        help="[default: the preset's: rapidocr for tiny (reads its 128px renders), auto (EasyOCR, else RapidOCR) otherwise]",
    )
    add_sd_drafter_arg(g)


def add_sd_drafter_arg(g: Any) -> None:
    """``--sd-drafter ID``: the SD baseline's own text drafter (every command whose methods include sd)."""
    g.add_argument(
        "--sd-drafter",
        default=None,
        metavar="ID",
        help="method sd drafts with this text causal LM (hub id or local directory, sharing the verifier's vocabulary; "
        "it reads the verifier's prompt), e.g. Qwen/Qwen3-1.7B as in the paper's SD baseline "
        "[default: the VL drafter on the compressed view]",
    )


#: ``--compression``'s value on every command that takes it (``serve``, ``generate``, ``chat``).
COMPRESSION_SPEC = "a compressor (truncate, question-only, signature, summary, llmlingua2) with settings, e.g. 'llmlingua2,rate=0.3,keep_last_turns=2' or a JSON object"


def add_compression_arg(p: Any, what: str) -> None:
    """``--compression SPEC`` (one spelling everywhere: :meth:`~asymspec_mm.request.compression.Compression.of` reads
    it); ``what`` says what it compresses on this command."""
    p.add_argument("--compression", default=None, metavar="SPEC", help=f"{what}: {COMPRESSION_SPEC} [default: none]")


def compression_from_args(args: argparse.Namespace) -> Any:
    """The checked :class:`~asymspec_mm.request.compression.Compression` of ``--compression`` (``None`` when not given):
    a bad setting is one line naming the option, before any model loads."""
    from ..request.compression import Compression

    return Compression.of(getattr(args, "compression", None), "--compression")


def add_decode_args(p: argparse.ArgumentParser, *, method: bool = True, skip: tuple[str, ...] = ()) -> None:
    """One option per documented :class:`AsymSpecConfig` field (``--max-new-tokens`` for ``max_new_tokens``),
    with its default, choices and range (:data:`~asymspec_mm.base.config.RANGES`), plus ``--method`` unless ``method=False``."""
    g = p.add_argument_group("decoding")
    if method:
        g.add_argument("--method", default="asymspec", choices=METHODS, help="[default: %(default)s]")
    for f in fields(AsymSpecConfig):
        if f.name not in DECODE_HELP or f.name in skip:
            continue
        kind = finite_float if isinstance(f.default, float) else int if f.default is None else type(f.default)
        span = f", {RANGES[f.name].text()}" if f.name in RANGES else ""
        g.add_argument(
            option_name(f.name),
            type=kind,
            default=f.default,
            choices=CHOICES.get(f.name),
            help=f"{DECODE_HELP[f.name]}{span} [default: %(default)s]",
        )


def option_name(field: str) -> str:
    """The command-line option of an :class:`AsymSpecConfig` field: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return f"--{field.replace('_', '-')}"


def check_option_ranges(values: dict[str, Any]) -> None:
    """Refuse the first value out of its :data:`~asymspec_mm.base.config.RANGES` entry in one line naming the option:
    ``--k 100 must be an integer >= 1 and <= 16``."""
    for name, value in values.items():
        if name in RANGES and (problem := range_error(name, value, f"{option_name(name)} {value}")) is not None:
            raise UnknownOptionError(problem)


def config_from_args(args: argparse.Namespace, base: AsymSpecConfig | None = None) -> AsymSpecConfig:
    """The :class:`AsymSpecConfig` the decoding options of ``args`` describe (fields not on ``args`` from ``base``)."""
    values = {f.name: getattr(args, f.name) for f in fields(AsymSpecConfig) if getattr(args, f.name, None) is not None}
    check_option_ranges(values)
    return (base or AsymSpecConfig()).with_(**values).validated()


def load_pipeline(
    preset: str | None = None,
    drafter: str | None = None,
    verifier: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    ocr_engine: str | None = None,
    **kwargs: Any,
):
    """The pipeline of ``drafter`` + ``verifier`` when given, else of the named preset (default ``auto``).

    ``ocr_engine=None`` keeps the preset's OCR engine (``auto`` for a drafter/verifier pair)."""
    from ..pipeline.facade import AsymSpecPipeline

    if drafter or verifier:
        if not (drafter and verifier):
            raise AsymSpecError("give both --drafter and --verifier (or a --preset)")
        return AsymSpecPipeline.from_pretrained(drafter, verifier, device=device, dtype=dtype, ocr=ocr_engine or "auto", **kwargs)
    extra = {k: v for k, v in (("device", device), ("dtype", dtype), ("ocr", ocr_engine)) if v is not None}
    return AsymSpecPipeline.from_preset(preset or "auto", **extra, **kwargs)


def pipeline_from_args(args: argparse.Namespace, **kwargs: Any):
    """:func:`load_pipeline` with the options :func:`add_model_args` registered."""
    if getattr(args, "sd_drafter", None):
        kwargs.setdefault("sd_drafter", args.sd_drafter)
    return load_pipeline(
        args.preset,
        args.drafter,
        args.verifier,
        device=args.device,
        dtype=args.dtype,
        ocr_engine=getattr(args, "ocr_engine", None),
        **kwargs,
    )
