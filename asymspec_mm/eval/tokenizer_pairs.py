"""Real tokenizers of two families against each other, offline (issue #44, item 3).

    python -m asymspec_mm.eval.tokenizer_pairs [--minivista-n 300] [--json FILE]

The drafter's tokenizer is Qwen3's (the hub files the package ships, ``checkpoints.qwen_files``); the verifiers' are
Mistral's from the ``mistral-common`` wheel (``checkpoints.mistral``: SentencePiece v1, v3, v7 and Tekken). For each
pair it reports the vocabulary map's shared tokens (beside the paper's Qwen3/Llama-3 figure) and the round trips
text -> drafter ids -> map -> verifier ids -> text on two corpora: MiniVista's held-out prompts (the verifier's user
text: compressed view and question) and the 587 prompts of the paper's MathVista subset (``--protocol paper``'s
verifier text). A round trip is exact when every drafter token lies inside the map's set and the verifier's
``decode`` gives the text back byte for byte; a token outside the set is counted as such (never dropped), and so is a
text whose mapped ids decode to something else. Since the map pairs identical bytes, a text whose drafter tokens all
lie inside the set can only fail through a decoder's quirk; the counts that matter are those outside. The other way
round, the verifier's own tokenization of each text is counted inside the set or not: what a loop restricted to the
set can still write the way the verifier itself would.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..frontend.help import terminal_text

#: The paper's Table 10: tokens Qwen3's and Llama-3's vocabularies spell identically.
PAPER_QWEN3_LLAMA3_SHARED = 109_566
VERIFIERS = ("v1", "v3", "v7", "tekken")


@dataclass
class RoundTrips:
    """Round trips of one corpus through one map: ``exact`` of ``texts``; ``outside_texts`` texts with at least one
    drafter token outside the map's set (``outside_tokens`` such tokens of ``tokens``); ``mismatched`` texts whose
    mapped ids all exist but decode to other text; ``verifier_inside_texts`` texts whose verifier tokenization lies
    inside the set (``verifier_inside_tokens`` of its ``verifier_tokens``); ``examples``: up to three failing texts'
    first failing token."""

    texts: int = 0
    exact: int = 0
    tokens: int = 0
    outside_texts: int = 0
    outside_tokens: int = 0
    mismatched: int = 0
    verifier_inside_texts: int = 0
    verifier_tokens: int = 0
    verifier_inside_tokens: int = 0
    examples: list[str] = field(default_factory=list)


def mapped(text: str, drafter: Any, to_verifier: list[int]) -> tuple[list[int], list[int]]:
    """(``text``'s drafter ids, their verifier ids through ``to_verifier``: -1 for a token outside the set)."""
    ids = drafter(text, add_special_tokens=False)["input_ids"]
    return ids, [to_verifier[i] for i in ids]


def round_trips(texts: list[str], drafter: Any, verifier: Any, to_verifier: list[int], to_drafter: list[int]) -> RoundTrips:
    """:class:`RoundTrips` of ``texts``: drafter ids, the map, the verifier's ``decode`` (special tokens kept, no
    clean-up of spaces); and the verifier's own ids against the set (``to_drafter``)."""
    out = RoundTrips(texts=len(texts))
    for text in texts:
        own = verifier(text, add_special_tokens=False)["input_ids"]
        inside = sum(to_drafter[v] >= 0 for v in own)
        out.verifier_tokens += len(own)
        out.verifier_inside_tokens += inside
        out.verifier_inside_texts += inside == len(own)
        ids, v_ids = mapped(text, drafter, to_verifier)
        out.tokens += len(ids)
        missing = [i for i, v in zip(ids, v_ids) if v < 0]
        if missing:
            out.outside_texts += 1
            out.outside_tokens += len(missing)
            if len(out.examples) < 3:
                out.examples.append(f"outside the set: {drafter.convert_ids_to_tokens(missing[0])!r}")
            continue
        back = verifier.decode(v_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back == text:
            out.exact += 1
        else:
            out.mismatched += 1
            if len(out.examples) < 3:
                at = next((k for k, (a, b) in enumerate(zip(back, text)) if a != b), min(len(back), len(text)))
                out.examples.append(f"decodes differently at character {at}: {back[at : at + 12]!r} for {text[at : at + 12]!r}")
    return out


def minivista_texts(n: int = 300, seed: int = 1) -> list[str]:
    """The verifier's user texts of MiniVista problems ``0..n-1`` of ``seed`` (compressed view, blank line, question)."""
    from ..request.prompts import compressed_user_text
    from . import minivista as mv

    return [compressed_user_text(mv.view_text(p), p["query"]) for p in mv.generate(n, seed)]


def paper_subset_texts() -> list[str]:
    """The verifier's user texts of the paper's 587 MathVista problems (the bundled testmini slice, ``--protocol
    paper``: Bard caption, EasyOCR text, MathVista's query and the step-by-step suffix)."""
    from .mathvista.paper_prompts import in_paper_subset, paper_user_texts
    from .mathvista.problems import load_local_problems
    from .mathvista.texts import TextData

    text = TextData.load()
    out = []
    for p in load_local_problems():
        if in_paper_subset(p, text):
            pid = str(p["pid"])
            out.append(paper_user_texts(p, text.queries.get(pid, p.get("query", "")), text)["verifier_user_text"])
    return out


def qwen3_tokenizer() -> Any:
    """Qwen3's tokenizer from the shipped hub files (Qwen3-32B's; Qwen3-VL's vocabulary is the same)."""
    from transformers import AutoTokenizer

    from ..checkpoints.qwen_files import VERIFIER, hub_snapshot

    return AutoTokenizer.from_pretrained(hub_snapshot(VERIFIER, tempfile.mkdtemp(prefix="qwen3-tokenizer-")))


def measure(drafter: Any, verifiers: dict[str, Any], corpora: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per verifier: the map's coverage, its build time and the round trips of each corpus."""
    from ..base.vocab_map import build_vocab_map

    out: dict[str, dict[str, Any]] = {}
    for name, verifier in verifiers.items():
        t0 = time.perf_counter()
        m = build_vocab_map(drafter, verifier)
        row: dict[str, Any] = {"build_s": round(time.perf_counter() - t0, 2), **m.coverage()}
        row["special_pairs"] = sorted(row["special_pairs"])
        row["round_trips"] = {c: asdict(round_trips(texts, drafter, verifier, m.to_verifier, m.to_drafter)) for c, texts in corpora.items()}
        out[name] = row
    return out


def markdown(results: dict[str, dict[str, Any]]) -> str:
    """The shared-token table and the round-trip table (docs/cross-family.md)."""
    lines = [
        "| Qwen3 (151,669) → | shared tokens | share of Qwen3's vocabulary | share of the verifier's | special pairs |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| Mistral {name} ({r['verifier_vocabulary']:,}) | {r['shared_tokens']:,} | {r['drafter_share']:.1%} | "
            f"{r['verifier_share']:.1%} | {', '.join(r['special_pairs'])} |"
        )
    lines.append(f"| Llama-3 (the paper, Table 10) | {PAPER_QWEN3_LLAMA3_SHARED:,} | | | |")
    corpora = list(next(iter(results.values()))["round_trips"])
    lines += [
        "",
        "| verifier | corpus | exact round trips | texts with a Qwen3 token outside the set (tokens) | decoded otherwise "
        "| texts the verifier tokenizes inside the set (its tokens inside) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        for c in corpora:
            t = r["round_trips"][c]
            lines.append(
                f"| Mistral {name} | {c} | {t['exact']} of {t['texts']} | {t['outside_texts']} ({t['outside_tokens']} of "
                f"{t['tokens']:,}) | {t['mismatched']} | {t['verifier_inside_texts']} of {t['texts']} "
                f"({t['verifier_inside_tokens'] / max(1, t['verifier_tokens']):.2%}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command (``--help``): prints the two tables, optionally writes the numbers as JSON."""
    from ..checkpoints.mistral import mistral_tokenizer

    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minivista-n", type=int, default=300, help="held-out MiniVista problems (seed 1) [default: %(default)s]")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.minivista_n < 1:
        ap.error(f"--minivista-n must be >= 1 (got {args.minivista_n})")
    corpora = {
        f"MiniVista ({args.minivista_n} prompts)": minivista_texts(args.minivista_n),
        "MathVista (587 prompts)": paper_subset_texts(),
    }
    results = measure(qwen3_tokenizer(), {v: mistral_tokenizer(v) for v in VERIFIERS}, corpora)
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
