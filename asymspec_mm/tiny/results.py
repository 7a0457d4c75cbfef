"""Measure the tiny pair on MiniVista: Floor, drafter alone, SD, AsymSpec and ablations.

    python -m asymspec_mm.tiny.results --n 300 --seed 1
    python -m asymspec_mm.tiny.results --preset tiny-xfamily --n 300 --seed 1 --ablation-n 0

Writes a Markdown table per task family to ``asymspec_mm/tiny/RESULTS.md`` (``RESULTS_xfamily.md`` for the
cross-family pair; ``--out``) and the raw
numbers to ``--json``. Every method decodes greedily through :class:`AsymSpecPipeline` with the
generator's caption and OCR text as the compressed view (no captioner, no OCR engine).

Columns: accuracy; recovery = (method - Floor) / (drafter - Floor); acceptance rate and mean
accepted length (tokens committed per step); tokens/s (decode only). The decisive-token table
looks at the token that decides the answer (the colour, value, count or shape the image tells; the
computed angle, sum or difference): its mean JSD, how it was emitted (accepted draft / fused at a
rejection / verifier's bonus) and how often it is right. For ``mixed`` a last table splits the
problem in two: the two bar readings (pixels) and the arithmetic on them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..eval import minivista as mv
from ..frontend.help import terminal_text

RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
#: Each shipped pair's results file (``--preset``).
RESULTS_FOR = {"tiny": RESULTS_MD, "tiny-xfamily": RESULTS_MD.parent / "RESULTS_xfamily.md"}


def runs() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, method, config overrides) of every row."""
    base = dict(k=4, beta=1.0, gamma=0.5, gate="cda")
    return [
        ("Floor (verifier alone)", "floor", {}),
        ("Drafter alone (full view)", "drafter", {}),
        ("AsymSpec, bonus=verifier", "asymspec", dict(base, bonus="verifier")),
        ("AsymSpec, bonus=gated", "asymspec", dict(base, bonus="gated")),
        ("SD (K=4)", "sd", dict(k=4)),
        ("AsymSpec fixed gamma, bonus=verifier", "asymspec", dict(base, gate="fixed", bonus="verifier")),
        ("AsymSpec fixed gamma, bonus=gated", "asymspec", dict(base, gate="fixed", bonus="gated")),
        ("AsymSpec beta=0, bonus=verifier", "asymspec", dict(base, beta=0.0, bonus="verifier")),
        ("AsymSpec beta=0, bonus=gated", "asymspec", dict(base, beta=0.0, bonus="gated")),
    ]


def decisive_event(result, problem: dict[str, Any], tokenizer) -> tuple[Any | None, bool]:
    """The trace event at the decisive token: the last token before ' so' (or the reference's
    decisive position) and whether it is the reference's decisive token."""
    ref = tokenizer(problem["response"], add_special_tokens=False)["input_ids"]
    idx = mv.decisive_token_index(problem, tokenizer)
    if idx is None or idx >= len(result.trace):
        return None, False
    ev = result.trace[idx]
    ok = result.token_ids[: idx + 1] == ref[: idx + 1]
    return ev, ok


def reading_events(result, problem: dict[str, Any], tokenizer) -> tuple[list[Any], bool] | None:
    """``mixed`` only: the trace events at the two bar readings (``"Red is 7, blue is 3; ..."``: the values
    of the two bars asked about, in the reference's order) and whether the output matches the reference
    up to the second one."""
    if mv.family_of(problem) != "mixed":
        return None
    ref = tokenizer(problem["response"], add_special_tokens=False)["input_ids"]
    idx = mv.reading_token_indices(problem, tokenizer)
    ok = result.token_ids[: idx[-1] + 1] == ref[: idx[-1] + 1]
    return [result.trace[i] for i in idx if i < len(result.trace)], ok


MAIN_ROWS = 4  # Floor, drafter and AsymSpec in both bonus modes run on all problems; SD and the ablations on --ablation-n


def evaluate(
    pipe, problems: list[dict[str, Any]], progress: bool = True, ablation_n: int | None = None, part: tuple[int, int] = (0, 1)
) -> dict[str, Any]:
    from ..decode import AsymSpecConfig

    tok = pipe.tokenizer
    out: dict[str, Any] = {}
    for row, (label, method, over) in enumerate(runs()):
        if row % part[1] != part[0]:
            continue
        cfg = AsymSpecConfig(max_new_tokens=40, trace_top=0, **over)
        rows: dict[str, dict[str, list[float]]] = {}
        t0 = time.time()
        probs = problems if row < MAIN_ROWS or ablation_n is None else problems[:ablation_n]
        if not probs:  # --ablation-n 0: main rows only
            continue
        correct: list[int] = []
        for p in probs:
            res = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, config=cfg)
            fam = mv.family_of(p)
            r = rows.setdefault(
                fam,
                {
                    k: []
                    for k in ("acc", "acc_rate", "mal", "tok", "wall", "dec_jsd", "dec_src", "dec_ok", "read_ok", "read_right", "read_src")
                },
            )
            r["acc"].append(float(mv.is_correct(res.text, p)))
            correct.append(int(r["acc"][-1]))
            st = res.stats
            r["tok"].append(st["new_tokens"])
            r["wall"].append(st["decode_wall_s"])
            if method in ("asymspec", "sd"):
                r["acc_rate"].append(st["acceptance_rate"])
                r["mal"].append(st["mean_accepted_length"])
            ev, ok = decisive_event(res, p, tok)
            r["dec_ok"].append(float(ok))
            if ev is not None and method == "asymspec":
                if ev.jsd is not None:
                    r["dec_jsd"].append(ev.jsd)
                r["dec_src"].append(ev.source)
            reads = reading_events(res, p, tok)
            if reads is not None:
                r["read_ok"].append(float(reads[1]))
                r["read_right"].append(float(reads[1]) * r["acc"][-1])
                if method == "asymspec":
                    r["read_src"].extend(e.source for e in reads[0])
        out[label] = {"method": method, "config": over, "families": {}, "correct": correct, "row": row}
        for fam, r in rows.items():
            n = len(r["acc"])
            out[label]["families"][fam] = {
                "n": n,
                "accuracy": sum(r["acc"]) / n,
                "acceptance_rate": (sum(r["acc_rate"]) / len(r["acc_rate"])) if r["acc_rate"] else None,
                "mean_accepted_length": (sum(r["mal"]) / len(r["mal"])) if r["mal"] else None,
                "tokens_per_s": sum(r["tok"]) / max(1e-9, sum(r["wall"])),
                "decisive_correct": sum(r["dec_ok"]) / n,
                "decisive_jsd": (sum(r["dec_jsd"]) / len(r["dec_jsd"])) if r["dec_jsd"] else None,
                "decisive_source": _shares(r["dec_src"]),
                "readings_correct": (sum(r["read_ok"]) / n) if r["read_ok"] else None,
                "readings_source": _shares(r["read_src"]),
                "arithmetic_given_readings": (sum(r["read_right"]) / sum(r["read_ok"])) if sum(r["read_ok"]) else None,
            }
        if progress:
            accs = " ".join(f"{f}={v['accuracy']:.3f}" for f, v in sorted(out[label]["families"].items()))
            print(f"{label:40s} {accs}  ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    return out


def _shares(sources: list[str]) -> dict[str, float] | None:
    """How often each source (accepted / fused / bonus) occurs, or None for no events."""
    return {s: sources.count(s) / len(sources) for s in sorted(set(sources))} if sources else None


def _subset_acc(res: dict[str, Any], label: str, fam: str, n_fam: int) -> float:
    """Accuracy of ``label`` on the first ``n_fam`` problems of family ``fam`` (ablation rows use a prefix)."""
    fams = [mv.FAMILIES[i % len(mv.FAMILIES)] for i in range(len(res[label]["correct"]))]
    vals = [c for c, f in zip(res[label]["correct"], fams) if f == fam][:n_fam]
    return sum(vals) / len(vals) if vals else 0.0


def _f(x, fmt="{:.1f}", scale=1.0) -> str:
    return "–" if x is None else fmt.format(x * scale)


def recovery_cell(acc: float, floor: float, drafter: float) -> str:
    """(acc - Floor) / (drafter - Floor) as a percentage; "above both" where ``acc`` beats the drafter as well
    (a ratio over 100 % would only say how small the drafter's lead over Floor is); "–" where the drafter is
    not better than Floor."""
    gap = drafter - floor
    if gap <= 1e-9:
        return "–"
    if acc > drafter + 1e-9:
        return "above both"
    return _f((acc - floor) / gap, "{:.0f}%", 100)


def _source_cells(shares: dict[str, float] | None) -> str:
    """``accepted | fused | bonus`` table cells (percent of events; '–' where none)."""
    shares = shares or {}
    return " | ".join(_f(shares.get(s), "{:.0f}%", 100) for s in ("accepted", "fused", "bonus"))


def markdown(res: dict[str, Any], n: int, seed: int, name: str, ablation_n: int | None = None, preset: str = "tiny") -> str:
    fams = [f for f in mv.FAMILIES if f in res["Floor (verifier alone)"]["families"]]
    option = "" if preset == "tiny" else f" --preset {preset}"
    lines = [
        f"# MiniVista results of the {preset} pair",
        "",
        f"`python -m asymspec_mm.tiny.results{option} --n {n} --seed {seed}{f' --ablation-n {ablation_n}' if ablation_n is not None else ''}` "
        f"({name}; held-out seed {seed}, {n} problems, "
        "families rotating; greedy; CPU). AsymSpec: CDA gate, K=4, beta=1, gamma=0.5 unless stated. "
        "Recovery = (method − Floor) / (drafter − Floor) on the same problems. Acceptance = accepted drafts / drafted; "
        "accepted length = tokens committed per step. SD and the ablation rows (fixed gamma, beta=0) run on the first "
        f"{ablation_n or n} problems (1/{len(fams)} per family); their recovery uses Floor and drafter on those problems. "
        "Recovery is left blank where the drafter is not better than Floor, and reads 'above both' where the method beats the drafter too. tokens/s: decode only, one CPU thread, "
        "on a shared machine (noisy).",
        "",
    ]
    for fam in fams:
        lines += [
            f"## {fam} ({mv.FAMILY_TASK[fam]}, n={res['Floor (verifier alone)']['families'][fam]['n']})",
            "",
            f"Floor {_subset_acc(res, 'Floor (verifier alone)', fam, 10**9) * 100:.1f}%, drafter alone "
            f"{_subset_acc(res, 'Drafter alone (full view)', fam, 10**9) * 100:.1f}%.",
            "",
            "| method | n | accuracy (%) | recovery | acceptance | accepted length | tokens/s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, r in sorted(res.items(), key=lambda kv: kv[1]["row"]):
            v = r["families"][fam]
            f_sub, d_sub = (
                _subset_acc(res, "Floor (verifier alone)", fam, v["n"]),
                _subset_acc(res, "Drafter alone (full view)", fam, v["n"]),
            )
            rec = recovery_cell(v["accuracy"], f_sub, d_sub) if r["method"] in ("asymspec", "sd") else "–"
            lines.append(
                f"| {label} | {v['n']} | {v['accuracy'] * 100:.1f} | {rec} | {_f(v['acceptance_rate'], '{:.2f}')} | "
                f"{_f(v['mean_accepted_length'], '{:.2f}')} | {v['tokens_per_s']:.0f} |"
            )
        lines.append("")
    lines += [
        "## At the decisive token",
        "",
        "The token that decides the answer: the colour, bar value, count or shape the image tells; the computed angle (geometry), "
        "sum or difference (mixed). "
        "JSD = JSD(softmax a ‖ softmax b) there; emitted as: accepted draft / fused at a rejection / bonus "
        "(verifier's own token after K acceptances); correct = the output matches the reference up to and including it.",
        "",
        "| method | family | n | correct (%) | mean JSD | accepted | fused | bonus |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, r in sorted(res.items(), key=lambda kv: kv[1]["row"]):
        for fam in fams:
            v = r["families"][fam]
            if r["method"] != "asymspec" and label not in ("Floor (verifier alone)", "Drafter alone (full view)"):
                continue
            lines.append(
                f"| {label} | {fam} | {v['n']} | {v['decisive_correct'] * 100:.1f} | {_f(v['decisive_jsd'], '{:.3f}')} | {_source_cells(v['decisive_source'])} |"
            )
    lines.append("")
    if "mixed" in fams:
        lines += mixed_table(res)
    return "\n".join(lines)


def mixed_table(res: dict[str, Any]) -> list[str]:
    """``mixed`` split in two: the bar readings (pixels) and the arithmetic on them."""
    lines = [
        "## mixed: the readings and the arithmetic",
        "",
        "readings right = the output matches the reference up to the second bar value (both values read from the "
        "pixels); arithmetic right = of those, the final answer is right; sources: how AsymSpec emitted the two "
        "reading tokens.",
        "",
        "| method | n | readings right (%) | arithmetic right (%) | accuracy (%) | readings accepted | fused | bonus |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, r in sorted(res.items(), key=lambda kv: kv[1]["row"]):
        v = r["families"].get("mixed")
        if not v or v["readings_correct"] is None:
            continue
        reads, acc = v["readings_correct"], v["accuracy"]
        arith = _f(v["arithmetic_given_readings"], "{:.1f}", 100)
        lines.append(f"| {label} | {v['n']} | {reads * 100:.1f} | {arith} | {acc * 100:.1f} | {_source_cells(v['readings_source'])} |")
    lines.append("")
    return lines


def load_pipeline(drafter: str | None, verifier: str | None, preset: str = "tiny"):
    """The pair in ``drafter``/``verifier`` (a retrained pair's folders), else the shipped ``preset``; no OCR."""
    from ..frontend.options import load_pipeline as load

    return load(preset, drafter, verifier, device="cpu", dtype="fp32", ocr_engine="none", local_files_only=True)


#: Sections of the output file that other commands write and a rewrite keeps: agent_results.py's, and the
#: vocabulary map of a cross-family pair (xfamily_results.py).
KEPT_SECTIONS = ("\n## Agent tasks\n", "\n## The vocabulary map\n")


def kept_tail(old: str) -> str:
    """The part of an old results file from the first of :data:`KEPT_SECTIONS` on ('' when none is there)."""
    starts = [old.index(s) for s in KEPT_SECTIONS if s in old]
    return old[min(starts) :] if starts else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=mv.HELDOUT_SEED)
    ap.add_argument("--pair", default=None, help="a directory with drafter/ and verifier/ (default: the shipped --preset)")
    ap.add_argument(
        "--preset",
        default="tiny",
        choices=sorted(RESULTS_FOR),
        help="the shipped pair to measure when no --pair is given [default: %(default)s]",
    )
    ap.add_argument(
        "--out", default=None, help="Markdown output ('-': stdout only) [default: the preset's results file beside this module]"
    )
    ap.add_argument("--json", default=None, help="also write the raw numbers here")
    ap.add_argument("--ablation-n", type=int, default=None, help="problems for the ablation rows (default: --n)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--part", default="0/1", help="run only rows i::k ('i/k'), writing --json; combine with --merge")
    ap.add_argument("--merge", nargs="*", default=None, help="build the table from these --json files instead of running")
    args = ap.parse_args(argv)
    pair = Path(args.pair) if args.pair else None
    name = f"pair {pair}" if pair else f"shipped {args.preset} preset"
    out = args.out or str(RESULTS_FOR[args.preset])
    if args.merge:
        res = {}
        for f in args.merge:
            res.update(json.loads(Path(f).read_text()))
    else:
        import torch

        pipe = load_pipeline(str(pair / "drafter") if pair else None, str(pair / "verifier") if pair else None, args.preset)
        torch.set_num_threads(args.threads)
        problems = mv.generate(args.n, args.seed)
        i, k = (int(x) for x in args.part.split("/"))
        res = evaluate(pipe, problems, ablation_n=args.ablation_n, part=(i, k))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        if k > 1:
            return 0
    md = markdown(res, args.n, args.seed, name, args.ablation_n, args.preset)
    print(md)
    if out != "-":  # the sections other commands write stay
        old = Path(out).read_text() if Path(out).is_file() else ""
        Path(out).write_text(md.rstrip("\n") + "\n" + kept_tail(old))
    return 0


if __name__ == "__main__":
    sys.exit(main())
