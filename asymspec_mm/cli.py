"""``asymspec-mm``: generate, quickstart, demo, eval, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .errors import AsymSpecError

SOURCE_MARK = {"accepted": "", "fused": "*", "bonus": "+", "greedy": ""}


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model-choice options shared by `generate` and `demo`."""
    g = p.add_argument_group("models")
    g.add_argument("--preset", default=None, help="tiny | qwen3 | auto (default: auto unless --drafter/--verifier are given)")
    g.add_argument("--drafter", default=None, help="Qwen3-VL drafter: hub id or local directory")
    g.add_argument("--verifier", default=None, help="text verifier: hub id or local directory")
    g.add_argument("--device", default=None, help="cpu | cuda | cuda:1 (default: cuda when available)")
    g.add_argument("--dtype", default=None, help="bf16 | fp16 | fp32 (default: bf16 on cuda, fp32 on cpu)")
    g.add_argument("--ocr-engine", default="auto", help="auto | easyocr | rapidocr | none [default: %(default)s]")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--method", default="asymspec", choices=["asymspec", "floor", "drafter", "sd"])
    g.add_argument("--k", type=int, default=4, help="draft length K [default: %(default)s]")
    g.add_argument("--beta", type=float, default=1.0, help="fusion strength [default: %(default)s]")
    g.add_argument("--gamma", type=float, default=0.5, help="acceptance threshold [default: %(default)s]")
    g.add_argument("--gate", default="cda", choices=["cda", "fixed", "tuned"])
    g.add_argument("--lam", type=float, default=0.1, help="lambda of the tuned gate [default: %(default)s]")
    g.add_argument("--delta", default="contrast", choices=["contrast", "raw", "scd"])
    g.add_argument("--bonus", default="verifier", choices=["verifier", "gated"])
    g.add_argument("--drafter-view", default="image+text", choices=["image+text", "image"])
    g.add_argument("--max-new-tokens", type=int, default=512)


def load_pipeline(args: argparse.Namespace):
    """The pipeline named by --preset or --drafter/--verifier."""
    from .pipeline import AsymSpecPipeline

    common: dict[str, Any] = {"ocr": getattr(args, "ocr_engine", "auto")}
    if args.drafter or args.verifier:
        if not (args.drafter and args.verifier):
            raise AsymSpecError("give both --drafter and --verifier (or a --preset)")
        return AsymSpecPipeline.from_pretrained(args.drafter, args.verifier, device=args.device, dtype=args.dtype, **common)
    extra = {k: v for k, v in (("device", args.device), ("dtype", args.dtype)) if v is not None}
    return AsymSpecPipeline.from_preset(args.preset or "auto", **common, **extra)


def _config(args: argparse.Namespace):
    from .decode import AsymSpecConfig

    return AsymSpecConfig(
        k=args.k, beta=args.beta, gamma=args.gamma, gate=args.gate, lam=args.lam, delta=args.delta,
        bonus=args.bonus, drafter_view=args.drafter_view, max_new_tokens=args.max_new_tokens,
    )


def format_provenance(res) -> str:
    """The answer with each token tagged: plain = accepted draft, [*x] = fused at a rejection, [+x] = verifier bonus."""
    parts = []
    for ev in res.trace:
        if ev.source in ("fused", "bonus"):
            parts.append(f"[{SOURCE_MARK[ev.source]}{ev.text}]")
        else:
            parts.append(ev.text)
    return "".join(parts)


def print_result(res, as_json: bool = False, out=None) -> None:
    out = out if out is not None else sys.stdout  # resolved per call: sys.stdout may be swapped
    if as_json:
        json.dump(res.as_dict(), out, indent=1)
        out.write("\n")
        return
    s = res.stats
    print(f"answer: {res.text}", file=out)
    if res.method == "asymspec":
        print(f"provenance: {format_provenance(res)}", file=out)
        print("  (plain = drafter token accepted by the gate, [*x] = delta-fused at a rejection, [+x] = verifier bonus)", file=out)
        counts = {src: sum(ev.source == src for ev in res.trace) for src in ("accepted", "fused", "bonus")}
        print(f"tokens: {len(res.trace)} ({counts['accepted']} accepted, {counts['fused']} fused, {counts['bonus']} bonus; "
              f"{s.get('steered', 0)} differ from the verifier alone)", file=out)
        print(f"acceptance rate {s['acceptance_rate']:.2f}, mean accepted length {s['mean_accepted_length']:.2f}, "
              f"accepted per position {s['accepted_per_position']}", file=out)
    print(f"steps {s['steps']}, new tokens {s['new_tokens']}, {s['tokens_per_s']:.1f} tok/s, wall {s['wall_s']:.2f}s, "
          f"vision calls {s['vision_calls']} (cache hits {s['vision_cache_hits']}), tokens forwarded {s['tokens_forwarded']}",
          file=out)
    print(f"compressed view: caption {len(res.view.caption)} chars, OCR {len(res.view.ocr_text)} chars", file=out)


def cmd_generate(args: argparse.Namespace) -> int:
    pipe = load_pipeline(args)
    ocr: Any = None
    if args.no_ocr:
        ocr = False
    elif args.ocr is not None:
        ocr = args.ocr
    res = pipe.generate(args.image, args.question, caption=args.caption, ocr=ocr, method=args.method, config=_config(args))
    print_result(res, args.json)
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Answer a bundled example question with the bundled tiny pair, showing the token provenance."""
    from pathlib import Path

    from .pipeline import AsymSpecPipeline

    data = Path(__file__).resolve().parent / "examples_data"
    index = data / "examples.json"
    if not index.exists():
        raise AsymSpecError(f"no bundled examples at {index}; reinstall asymspec-mm")
    examples = json.loads(index.read_text())
    ex = examples[args.example % len(examples)]
    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    print(f"image: {data / ex['image']}\nquestion: {ex['question']}")
    print(f"the verifier reads only: {ex.get('caption', '')!r} + OCR {ex.get('ocr', '')!r}\n")
    for method in ("floor", "drafter", "asymspec"):
        res = pipe.generate(data / ex["image"], ex["question"], caption=ex.get("caption", ""), ocr=ex.get("ocr") or False,
                            method=method, max_new_tokens=args.max_new_tokens, bonus=args.bonus)
        label = {"floor": "verifier alone (Floor)", "drafter": "drafter alone", "asymspec": "AsymSpec"}[method]
        print(f"== {label}")
        print_result(res)
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asymspec-mm", description="Cross-modal AsymSpec: a vision-language drafter steers a text-only verifier.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show library warnings and tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="{generate,quickstart,demo,eval,bench}")
    sub.required = True

    g = sub.add_parser("generate", help="answer a question about an image")
    g.add_argument("--image", required=True, help="image file")
    g.add_argument("--question", required=True)
    g.add_argument("--caption", default=None, help="caption for the verifier (default: generated by the drafter)")
    g.add_argument("--ocr", default=None, help="OCR text for the verifier (default: produced by the OCR engine)")
    g.add_argument("--no-ocr", action="store_true", help="give the verifier no OCR text")
    g.add_argument("--json", action="store_true", help="print the full result (trace, stats) as JSON")
    add_model_args(g)
    _add_decode_args(g)
    g.set_defaults(func=cmd_generate)

    q = sub.add_parser("quickstart", help="run a bundled example on the bundled tiny pair")
    q.add_argument("--example", type=int, default=0)
    q.add_argument("--max-new-tokens", type=int, default=64)
    q.add_argument("--bonus", default="verifier", choices=["verifier", "gated"])
    q.set_defaults(func=cmd_quickstart)

    for module, adder in (("ui.app", "add_demo_parser"), ("asymspec_mm.eval.cli", "add_eval_parser"), ("asymspec_mm.bench", "add_bench_parser")):
        try:
            mod = __import__(module, fromlist=[adder])
        except ImportError as exc:  # an optional part whose extra is not installed
            name = {"ui.app": "demo", "asymspec_mm.eval.cli": "eval", "asymspec_mm.bench": "bench"}[module]
            extra = {"demo": "ui", "eval": "eval", "bench": "eval"}[name]
            p = sub.add_parser(name, help=f"(unavailable: {exc.name} missing; pip install 'asymspec-mm[{extra}]')")
            p.set_defaults(func=lambda a, e=exc, x=extra: _missing(e, x))
            continue
        getattr(mod, adder)(sub)
    return parser


def _missing(exc: ImportError, extra: str) -> int:
    print(f"error: this command needs {exc.name}: pip install 'asymspec-mm[{extra}]'", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    if not args.verbose:
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:  # the per-shard "Loading weights" bars drown the answer on a terminal
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except Exception:  # pragma: no cover - older transformers
            pass
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        rc = args.func(args)
    except AsymSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
