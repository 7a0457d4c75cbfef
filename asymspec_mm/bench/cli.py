"""``asymspec-mm bench`` on the command line (also ``python -m asymspec_mm.bench``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..frontend.help import documented_parser
from ..frontend.options import add_sd_drafter_arg, finite_float
from ..frontend.variants import build_variants, parse_list
from .aggregate import target_verdict
from .report import render_markdown, update_section, write_outputs
from .runner import ENGINES
from .settings import DEFAULT_VARIANTS, PAIRS
from .spread import spread_phrase
from .suite import run_bench

VARIANT_GRAMMAR = "method[@field=value,...] items separated by ';' or ','"


def _ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; an empty string is an empty list (a skipped sweep)."""
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def scenarios_arg(text: str) -> list[tuple[float, float]]:
    """argparse type: ``AR:MAL`` pairs separated by commas, each number finite."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        ar, sep, mal = item.partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r} is not AR:MAL")
        out.append((finite_float(ar), finite_float(mal)))
    return out


def sweep_values(option: str, spec: str | None) -> list[float] | None:
    """The values of ``--beta`` / ``--gamma`` (a comma list of finite numbers; None when not given)."""
    from ..base.errors import UnknownOptionError

    try:
        return parse_list(spec, finite_float)
    except (argparse.ArgumentTypeError, UnknownOptionError) as exc:
        raise UnknownOptionError(f"--{option} {spec!r}: {exc}") from None


def main_variants(spec: str, beta: str | None = None, gamma: str | None = None) -> str | list[str]:
    """``--variants`` multiplied by the ``--beta`` / ``--gamma`` sweeps, as eval's (the values enter the names,
    e.g. ``asymspec@gamma=0.4``); ``spec`` itself when neither is given."""
    betas, gammas = sweep_values("beta", beta), sweep_values("gamma", gamma)
    if (betas is None and gammas is None) or not spec.strip():
        return spec
    return [v.name for v in build_variants(spec, beta=betas, gamma=gammas)]


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on a subparsers object (``func`` = :func:`bench_main`)."""
    p = documented_parser(
        subparsers, "bench", "side-by-side speed benchmark: methods interleaved, medians and ratios", sys.modules[__package__].__doc__
    )
    p.add_argument(
        "--preset",
        "--pair",
        dest="preset",
        default="tiny",
        choices=PAIRS,
        metavar="PAIR",
        help=f"the pair to benchmark: {' | '.join(PAIRS)} (--pair is the same option) [default: %(default)s]",
    )
    p.add_argument("--drafter", default=None, help="drafter checkpoint directory (pair 'dirs')")
    p.add_argument("--verifier", default=None, help="verifier checkpoint directory (pair 'dirs')")
    p.add_argument(
        "--variants",
        default=";".join(DEFAULT_VARIANTS),
        help=f"the main comparison's variants, {VARIANT_GRAMMAR} ('' skips the main comparison) [default: %(default)s]",
    )
    p.add_argument("--beta", default=None, help="beta value(s): a comma list sweeps the main comparison's asymspec variants")
    p.add_argument(
        "--gamma", default=None, help="gamma value(s): a comma list sweeps the main comparison's asymspec variants, e.g. 0.4,0.5,0.6,0.7"
    )
    add_sd_drafter_arg(p)
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions [default: %(default)s]")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds (every variant, 2 tokens) before timing [default: %(default)s]")
    p.add_argument("--cases", type=int, default=2, help="requests per cell (MiniVista held-out problems) [default: %(default)s]")
    p.add_argument(
        "--case-families", default="", help="MiniVista families the cases rotate through, e.g. figure,visual [default: all four]"
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per request [default: %(default)s]")
    p.add_argument("--k", type=int, default=4, help="draft length K outside the K sweep [default: %(default)s]")
    p.add_argument("--trace-top", type=int, default=None, help="trace top-k per token [library default]")
    p.add_argument(
        "--lengths",
        default="256,1024,4096",
        help="compressed-view lengths of the length sweep; the first is also the synthetic context ('' skips) [default: %(default)s]",
    )
    p.add_argument(
        "--length-variants", default="floor;asymspec", help=f"the length sweep's variants, {VARIANT_GRAMMAR} [default: %(default)s]"
    )
    p.add_argument("--k-values", default="1,2,4,8", help="K sweep ('' skips) [default: %(default)s]")
    p.add_argument("--k-variants", default="asymspec", help=f"the K sweep's variants, {VARIANT_GRAMMAR} [default: %(default)s]")
    p.add_argument(
        "--scenarios",
        type=scenarios_arg,
        default="0.78:2.6,0.92:4.1",
        help="acceptance-rate:mean-accepted-length pairs for the projection [default: %(default)s]",
    )
    p.add_argument(
        "--prefill",
        choices=["auto", "pipeline", "synthetic"],
        default="auto",
        help="pipeline: the real request path; synthetic: caches of random keys/values, decode cost only; "
        "auto: synthetic for real-shape pairs on CPU [default: %(default)s]",
    )
    p.add_argument("--image-tokens", type=int, default=None, help="synthetic prefill: image positions on the full stream")
    p.add_argument(
        "--ignore-eos",
        choices=["auto", "yes", "no"],
        default="auto",
        help="decode exactly --max-new-tokens tokens; auto: yes for random weights [default: %(default)s]",
    )
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:1 (default: cpu for the tiny pairs, else cuda when available)")
    p.add_argument(
        "--dtype", default=None, help="bf16 | fp16 | fp32 (default: fp32 for the tiny pairs, bf16 for real shapes, the pipeline's for dirs)"
    )
    p.add_argument(
        "--plain-runs",
        choices=["auto", "yes", "no"],
        default="auto",
        help="tokens/s from separate un-instrumented runs; auto: yes on CUDA, where the timing clocks synchronize [default: %(default)s]",
    )
    p.add_argument("--no-probe", action="store_true", help="skip the probes (batching, loop alone)")
    p.add_argument("--loop-vocabs", default="", help="extra vocab sizes for the loop-alone probe, e.g. 151936")
    p.add_argument(
        "--batch-sizes",
        default="",
        help="batch sweep: generate_batch at these batch sizes against the sequential loop (B=1: pipe.generate one "
        "request after another), e.g. 1,4,8,16 ('' skips) [default: skipped]",
    )
    p.add_argument("--batch-cases", type=int, default=16, help="batch sweep: requests (MiniVista held-out problems) [default: %(default)s]")
    p.add_argument(
        "--batch-variants", default="floor;asymspec", help=f"batch sweep: the variants, {VARIANT_GRAMMAR} [default: %(default)s]"
    )
    p.add_argument(
        "--batch-engine",
        choices=["dynamic", "static", "static-compile"],
        default="dynamic",
        help="batch sweep: the row storage at B > 1 of generate_batch and the stepped engine core: dynamic (the paged "
        "default) or static slots (StaticBatchEngine, max_rows = B), optionally with compiled fixed-shape forwards "
        "[default: %(default)s]",
    )
    p.add_argument("--batch-max-len", type=int, default=2048, help="batch sweep: static slots' columns [default: %(default)s]")
    p.add_argument("--out", default="runs/bench", help="output folder for bench.json / bench.md / bench.png [default: %(default)s]")
    p.add_argument("--stem", default=None, help="output file stem [default: bench-<pair>]")
    p.add_argument(
        "--update-benchmarks",
        default=None,
        metavar="MD",
        help="also write the tables into this Markdown file, in the section named after --stem (else the pair)",
    )
    p.add_argument("--title", default=None, help="the Markdown section's title [default: Benchmark: <pair>]")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads during the bench [default: torch's]")
    p.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="dynamic",
        help="stream engines: dynamic (requests decode on the engine core, as pipe.generate) or the single-row "
        "static-KV-cache ones, optionally with a compiled one-token decode (untested on GPU) [default: %(default)s]",
    )
    p.add_argument(
        "--cost-ratio",
        default="",
        metavar="R,R,...",
        help="the speed-up curve instead of the default bench: for each ratio r, a cost-emulating twin of the tiny "
        "verifier (same tokens, a forward of K+1 tokens costs r drafter forwards), then Floor, SD, AsymSpec and the "
        "drafter alone side by side, e.g. 2,4,8,16,32 (uses --reps, --max-new-tokens, --k, --out, --threads)",
    )
    p.add_argument("--cost-cases", type=int, default=6, help="cost curve: MiniVista problems a repetition [default: %(default)s]")
    p.add_argument(
        "--cost-batch", type=int, default=8, help="cost curve: the batch size also measured (0 or 1 skips) [default: %(default)s]"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=bench_main)
    return p


def _tri(x: str) -> bool | None:
    """``auto`` | ``yes`` | ``no`` -> None | True | False."""
    return None if x == "auto" else x == "yes"


def bench_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`run_bench` keywords the parsed options describe (the pair's name is ``args.preset``)."""
    return dict(
        drafter=args.drafter,
        verifier=args.verifier,
        sd_drafter=args.sd_drafter,
        variants=main_variants(args.variants, args.beta, args.gamma),
        reps=args.reps,
        warmup=args.warmup,
        cases=args.cases,
        case_families=[f.strip() for f in args.case_families.split(",") if f.strip()] or None,
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        trace_top=args.trace_top,
        prompt_lengths=_ints(args.lengths),
        length_variants=args.length_variants,
        k_values=_ints(args.k_values),
        k_variants=args.k_variants,
        scenarios=args.scenarios,
        prefill=args.prefill,
        image_tokens=args.image_tokens,
        ignore_eos=_tri(args.ignore_eos),
        device=args.device,
        dtype=args.dtype,
        plain_runs=_tri(args.plain_runs),
        probe_batching=not args.no_probe,
        workdir=args.out,
        threads=args.threads,
        engine=args.engine,
        loop_vocabs=_ints(args.loop_vocabs),
        batch_sizes=_ints(args.batch_sizes),
        batch_cases=args.batch_cases,
        batch_variants=args.batch_variants,
        batch_engine=args.batch_engine,
        batch_max_len=args.batch_max_len,
        progress=not args.quiet,
    )


def bench_main(args: argparse.Namespace) -> int:
    """Run the benchmark the options describe, write its outputs and print where; 2 on a bad option."""
    from ..base.errors import AsymSpecError

    if args.cost_ratio:
        return cost_curve_main(args)
    try:
        res = run_bench(args.preset, **bench_options(args))
    except AsymSpecError as e:
        print(f"asymspec-mm bench: {e}", file=sys.stderr)
        return 2
    paths = write_outputs(res, args.out, args.stem or f"bench-{args.preset}")
    if args.update_benchmarks:
        update_section(args.update_benchmarks, args.stem or args.preset, render_markdown(res, args.title))
        paths["benchmarks"] = Path(args.update_benchmarks)
    for kind, pth in paths.items():
        print(f"{kind}: {pth}")
    for t in res["targets"]:
        print(target_line(t))
    return 0


def cost_curve_main(args: argparse.Namespace) -> int:
    """``bench --cost-ratio``: the speed-up curve on cost-emulating twins (:mod:`.cost_curve`); its outputs and targets."""
    from .cost_curve import EMULATOR, run_cost_curve
    from .cost_report import targets, write_cost_outputs

    try:
        ratios = [finite_float(x) for x in args.cost_ratio.split(",") if x.strip()]
    except argparse.ArgumentTypeError as exc:
        print(f"asymspec-mm bench: --cost-ratio {args.cost_ratio!r}: {exc}", file=sys.stderr)
        return 2
    if not ratios or any(r < 1 for r in ratios):
        print(f"asymspec-mm bench: --cost-ratio {args.cost_ratio!r}: give ratios >= 1, e.g. 2,4,8,16,32", file=sys.stderr)
        return 2
    if args.preset != "tiny" or args.drafter or args.verifier:
        print(
            "asymspec-mm bench: --cost-ratio runs on the shipped tiny pair (its verifier's twins); drop --preset/--drafter/--verifier",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    res = run_cost_curve(
        ratios,
        cases=args.cost_cases,
        reps=args.reps,
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        batch=args.cost_batch,
        device=args.device or "cpu",
        log=log,
    )
    paths = write_cost_outputs(res, args.out, args.stem or "cost-curve")
    if args.update_benchmarks:
        from .cost_report import render_markdown

        update_section(args.update_benchmarks, args.stem or "cost-curve", render_markdown(res))
        paths["benchmarks"] = Path(args.update_benchmarks)
    for kind, pth in paths.items():
        print(f"{kind}: {pth}")
    print(f"({EMULATOR})")
    for t in targets(res):
        print(f"target {t['target']}: {t['measured']:.2f} at r = {t['at']:.1f} -> {'met' if t['met'] else 'NOT met'}")
    return 0


def target_line(t: dict[str, Any]) -> str:
    """One target of the result as the console prints it: its median with the spread over repetitions, the verdict
    by every repetition (:func:`~asymspec_mm.bench.aggregate.target_verdict`: met, NOT met or inconclusive) and,
    when not met, the measured cause."""
    which = f" ({t['variant']})" if t.get("variant") else ""
    measured = spread_phrase(t["reps"]) if t.get("reps") else f"measured {t['measured']:.4f}"
    line = f"target {t['target']}{which}: {measured} -> {target_verdict(t)}"
    return line + (f"; cause: {t['cause']}" if t.get("cause") else "")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asymspec_mm.bench [bench options]``."""
    parser = argparse.ArgumentParser(prog="asymspec-mm")
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
