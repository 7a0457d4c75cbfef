"""The vocabulary-map section of the ``tiny-xfamily`` pair's results: how the two vocabularies meet.

    python -m asymspec_mm.tiny.xfamily_results --n 300 --seed 1

Rewrites the section "The vocabulary map" of ``asymspec_mm/tiny/RESULTS_xfamily.md`` (``--out``; the tables above it
are ``results.py --preset tiny-xfamily``'s, :data:`FILL_COMMAND`, which keeps this section): the map's coverage, the
verifier's tokens the map leaves out by kind, and how the held-out answers and prompts fall inside the shared set.
It reads the two tokenizers only; no model runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ..eval import minivista as mv
from ..frontend.help import terminal_text
from . import DRAFTER_DIR
from .xfamily import XFAMILY_VERIFIER_DIR, mapped_ids

RESULTS_XFAMILY_MD = Path(__file__).resolve().parent / "RESULTS_xfamily.md"
#: The section of RESULTS_xfamily.md that results.py keeps when it rewrites the tables.
MAP_SECTION = "## The vocabulary map"
FILL_COMMAND = "python -m asymspec_mm.tiny.results --preset tiny-xfamily --n 300 --seed 1 --ablation-n 0"


def map_figures(drafter_tok, verifier_tok, problems: list[dict[str, Any]]) -> dict[str, Any]:
    """The map's coverage, and on ``problems``: the verifier's tokens of the answers and of the prompts inside the set
    (``corpus_coverage``), and the answers that tokenize to the same bytes in both vocabularies (the drafter's ids
    through the map equal the verifier's own)."""
    from ..base.vocab_map import vocab_map
    from ..request.prompts import compressed_user_text

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


def with_map_section(old: str, section: list[str]) -> str:
    """``old`` (a results file, or '') with its map section, to the end of the file, replaced by ``section``."""
    at = old.find("\n" + MAP_SECTION + "\n")
    kept = old[: at + 1] if at >= 0 else (old.rstrip("\n") + "\n\n" if old.strip() else "")
    return kept + "\n".join(section)


def main(argv: list[str] | None = None) -> int:
    """The command (``--help``); rewrites the map section of ``--out`` and prints it."""
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="held-out problems, families rotating [default: %(default)s]")
    ap.add_argument("--seed", type=int, default=mv.HELDOUT_SEED)
    ap.add_argument("--out", default=str(RESULTS_XFAMILY_MD), help="Markdown file whose map section is rewritten ('-': stdout only)")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be at least 1, got {args.n}")
    tokenizers = (AutoTokenizer.from_pretrained(DRAFTER_DIR), AutoTokenizer.from_pretrained(XFAMILY_VERIFIER_DIR))
    section = map_section(map_figures(*tokenizers, mv.generate(args.n, args.seed)))
    print("\n".join(section))
    if args.out != "-":
        out = Path(args.out)
        out.write_text(with_map_section(out.read_text() if out.exists() else "", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
