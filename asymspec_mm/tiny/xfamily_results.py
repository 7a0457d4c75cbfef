"""Measure the ``tiny-xfamily`` pair without the decode loop: each model alone, and the vocabulary map between them.

    python -m asymspec_mm.tiny.xfamily_results --n 300 --seed 1

Writes ``asymspec_mm/tiny/RESULTS_xfamily.md`` (``--out``): per family, Floor (the cross-family verifier alone: greedy
on its own prompt, in its own vocabulary, stopping at its ``<|eot_id|>``) and the drafter alone (the ``tiny`` drafter
on the full view, greedy), on held-out MiniVista problems as ``results.py`` draws them; the AsymSpec row is left
pending until the pipeline runs a pair of two vocabularies, with the command that fills it in (``results.py
--preset tiny-xfamily``, which keeps this file's map section). The map section: the map's coverage, and how the
answers and prompts fall inside it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import torch

from ..cli.help import terminal_text
from ..eval import minivista as mv
from . import DRAFTER_DIR
from .evaluate import greedy
from .xfamily import XFAMILY_VERIFIER_DIR, floor_accuracy, mapped_ids

RESULTS_XFAMILY_MD = Path(__file__).resolve().parent / "RESULTS_xfamily.md"
#: The section of RESULTS_xfamily.md that results.py keeps when it rewrites the tables.
MAP_SECTION = "## The vocabulary map"
FILL_COMMAND = "python -m asymspec_mm.tiny.results --preset tiny-xfamily --n 300 --seed 1 --ablation-n 0"


def load_pair(drafter_dir: Path = DRAFTER_DIR, verifier_dir: Path = XFAMILY_VERIFIER_DIR) -> dict[str, Any]:
    """The two models and their tokenizers (and the drafter's processor), each from its own folder."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    return {
        "drafter": Qwen3VLForConditionalGeneration.from_pretrained(drafter_dir).eval(),
        "processor": Qwen3VLProcessor.from_pretrained(drafter_dir),
        "drafter_tok": AutoTokenizer.from_pretrained(drafter_dir),
        "verifier": Qwen3ForCausalLM.from_pretrained(verifier_dir).eval(),
        "verifier_tok": AutoTokenizer.from_pretrained(verifier_dir),
    }


def drafter_accuracy(model, proc, tok, problems: list[dict[str, Any]], max_new: int = 40) -> dict[str, float]:
    """The drafter alone (greedy, the full view: image, compressed view and question), accuracy per family."""
    from ..requests.prompts import build_prompts

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    hits: dict[str, list[float]] = {}
    for p in problems:
        pr = build_prompts(proc, tok, p["decoded_image"], mv.view_text(p), p["query"], "image+text")
        inp = dict(
            input_ids=pr.drafter_full_ids,
            pixel_values=pr.pixel_values,
            image_grid_thw=pr.image_grid_thw,
            mm_token_type_ids=pr.mm_token_type_ids,
        )
        text = tok.decode(greedy(model, inp, eos, max_new), skip_special_tokens=True)
        hits.setdefault(mv.family_of(p), []).append(float(mv.is_correct(text, p)))
    return {f: sum(v) / len(v) for f, v in sorted(hits.items())}


def map_figures(drafter_tok, verifier_tok, problems: list[dict[str, Any]]) -> dict[str, Any]:
    """The map's coverage, and on ``problems``: the verifier's tokens of the answers and of the prompts inside the set
    (``corpus_coverage``), and the answers that tokenize to the same bytes in both vocabularies (the drafter's ids
    through the map equal the verifier's own)."""
    from ..base.vocab_map import vocab_map
    from ..requests.prompts import compressed_user_text

    m = vocab_map(drafter_tok, verifier_tok)
    enc = lambda t: verifier_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    answers = [i for p in problems for i in enc(p["response"])]
    prompts = [i for p in problems for i in enc(compressed_user_text(mv.view_text(p), p["query"]))]
    aligned = sum(mapped_ids(drafter_tok, verifier_tok, p["response"]) == enc(p["response"]) for p in problems)
    cov = m.coverage()
    only = [t for i, t in enumerate(verifier_tok.convert_ids_to_tokens(list(range(len(m.to_drafter))))) if m.to_drafter[i] < 0]
    kinds = {
        "numbers": sum(bool(re.fullmatch(r"▁?\d+", t)) for t in only),
        "byte pieces": sum(bool(re.fullmatch(r"<0x[0-9A-F]{2}>", t)) for t in only),
        "special tokens": sum(t in verifier_tok.all_special_tokens or t.startswith("<|") for t in only),
    }
    kinds["subwords"] = len(only) - sum(kinds.values())
    return {
        "verifier_only": kinds,
        "drafter_only": sum(v < 0 for v in m.to_verifier),
        **{k: cov[k] for k in ("shared_tokens", "drafter_vocabulary", "verifier_vocabulary", "drafter_share", "verifier_share")},
        "special_pairs": sorted(cov["special_pairs"]),
        "answer_tokens_inside": m.corpus_coverage(answers),
        "prompt_tokens_inside": m.corpus_coverage(prompts),
        "answers_aligned": aligned,
        "problems": len(problems),
    }


def recovery(acc: float | None, floor: float, drafter: float) -> str:
    """(acc - Floor) / (drafter - Floor) as a percentage; "–" where the drafter is not better than Floor or no
    accuracy is known yet."""
    if acc is None or drafter - floor <= 1e-9:
        return "–"
    return f"{(acc - floor) / (drafter - floor):.0%}"


def needed(floor: float, drafter: float, share: float = 0.8) -> str:
    """The accuracy (%) that recovers ``share`` of the Floor -> drafter gap; "–" where there is no gap."""
    return "–" if drafter - floor <= 1e-9 else f"{(floor + share * (drafter - floor)) * 100:.1f}"


def markdown(floor: dict[str, float], drafter: dict[str, float], figures: dict[str, Any], n: int, seed: int) -> str:
    """RESULTS_xfamily.md: the per-family table (AsymSpec pending) and the map section."""
    lines = [
        "# MiniVista results of the tiny-xfamily pair",
        "",
        f"`python -m asymspec_mm.tiny.xfamily_results --n {n} --seed {seed}` (held-out seed {seed}, {n} problems, families "
        "rotating; greedy; CPU). The pair: the `tiny` preset's drafter (byte-level BPE, Qwen's special tokens, 755 tokens) "
        f"and the verifier trained by `python -m asymspec_mm.tiny.xfamily` ({figures['verifier_vocabulary']:,} tokens: "
        "SentencePiece-style BPE with byte fallback, Llama-3's special tokens and chat template). Floor: the verifier "
        "alone, greedy on its own prompt in its own vocabulary. Drafter alone: the full view (image + compressed view + "
        "question). Recovery = (method − Floor) / (drafter − Floor).",
        "",
        f"**AsymSpec is pending the two-vocabulary loop** (issue #44 item 2): the pipeline refuses a pair of two "
        f"vocabularies until it lands. Then `{FILL_COMMAND}` writes the full table here (Floor, the drafter alone and "
        "AsymSpec through the pipeline, per family), keeping the map section below.",
        "",
        "| family | n | Floor (%) | drafter alone (%) | AsymSpec (%) | recovery of the gap | AsymSpec needed for 80 % "
        "recovery (%) | map: answer tokens inside |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    per = n // len(mv.FAMILIES)
    for fam in mv.FAMILIES:
        if fam not in floor:
            continue
        lines.append(
            f"| {fam} | {per} | {floor[fam] * 100:.1f} | {drafter[fam] * 100:.1f} | pending the two-vocabulary loop | "
            f"{recovery(None, floor[fam], drafter[fam])} | {needed(floor[fam], drafter[fam])} | {figures['answer_tokens_inside']:.1%} |"
        )
    lines += ["", *map_section(figures)]
    return "\n".join(lines) + "\n"


def map_section(f: dict[str, Any]) -> list[str]:
    """The vocabulary map's figures (the section results.py keeps)."""
    return [
        MAP_SECTION,
        "",
        f"`vocab_map(tiny drafter, tiny-xfamily verifier)`: **{f['shared_tokens']:,} tokens spelled alike** of the drafter's "
        f"{f['drafter_vocabulary']:,} ({f['drafter_share']:.1%}) and the verifier's {f['verifier_vocabulary']:,} "
        f"({f['verifier_share']:.1%}); special tokens paired by role: {', '.join(f['special_pairs'])}. The verifier's "
        f"other {sum(f['verifier_only'].values())}: "
        + ", ".join(f"{n} {kind}" for kind, n in f["verifier_only"].items())
        + " (the numbers 181..999 are one token each, as in Llama-3; a byte piece whose character is also a piece is "
        f"never emitted and stays out of the map); the drafter's other {f['drafter_only']}: its vision and thinking "
        "markers, the agent training's tool tokens and subwords of the captioning prompt.",
        "",
        "| on the held-out problems | inside the map's set |",
        "| --- | ---: |",
        f"| the verifier's tokens of the reference answers | {f['answer_tokens_inside']:.1%} |",
        f"| the verifier's tokens of the prompts (compressed view + question) | {f['prompt_tokens_inside']:.1%} |",
        f"| answers whose drafter tokens, mapped, are the verifier's own tokens | {f['answers_aligned']} of {f['problems']} |",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    """The command (``--help``); writes ``--out`` and prints it."""
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="held-out problems, families rotating [default: %(default)s]")
    ap.add_argument("--seed", type=int, default=mv.HELDOUT_SEED)
    ap.add_argument("--out", default=str(RESULTS_XFAMILY_MD), help="Markdown output ('-': stdout only)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    if args.n < len(mv.FAMILIES):
        ap.error(f"--n must be at least {len(mv.FAMILIES)} (one problem a family), got {args.n}")
    torch.set_num_threads(args.threads)
    pair = load_pair()
    problems = mv.generate(args.n, args.seed)
    floor = floor_accuracy(pair["verifier"], pair["verifier_tok"], problems)
    drafter = drafter_accuracy(pair["drafter"], pair["processor"], pair["drafter_tok"], problems)
    md = markdown(floor, drafter, map_figures(pair["drafter_tok"], pair["verifier_tok"], problems), args.n, args.seed)
    print(md)
    if args.out != "-":
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
