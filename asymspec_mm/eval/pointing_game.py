"""The pointing game: does attribution point at the object the question asks about?

MiniVista records each drawn object's box (:mod:`.minivista_scenes`). For a held-out problem whose answer names an
object (a bar's colour, the value read from one bar, a shape's colour or name), the answer token that names it is
attributed (:func:`asymspec_mm.attribution.attribute`) when the drafter accepted or steered it, and the top region
*hits* when it overlaps the asked object's box. Two chance levels: ``chance``, the share of the image's regions that
overlap the box (what a region drawn at random scores), and ``area``, the box's share of the image's area.

``python -m asymspec_mm.eval.pointing_game --per-family 30 --out runs/pointing`` writes ``pointing.json`` (every
attributed token) and ``pointing.md`` (the tables BENCHMARKS.md quotes). ``--methods occlusion gradient`` plays
both methods on the same tokens and adds how well they agree (:func:`agreement`): the share of tokens whose top
region is the same, and the mean Spearman rank correlation of their region scores.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..attribution import BASELINES, METHODS, region_cells
from ..attribution.regions import box_overlap
from .minivista import HELDOUT_SEED, make_problem

#: The families whose answers name one drawn object (``count`` and ``geometry`` answers name none).
POINTING_FAMILIES = ("figure", "visual", "mixed")
#: Token sources the game attributes: the drafter's accepted drafts and the tokens fusion emitted.
ATTRIBUTED_SOURCES = ("accepted", "fused")


@dataclass(frozen=True)
class Target:
    """An answer word that names an object, and that object's box ``[x0, y0, x1, y1]`` in pixels."""

    word: str
    box: tuple[float, float, float, float]


@dataclass
class Point:
    """One attributed token: where the top region fell and whether it hit the asked object."""

    pid: str
    family: str
    kind: str
    method: str
    baseline: str
    token: str
    position: int
    source: str
    top_box: tuple[int, int, int, int]
    target_box: tuple[float, float, float, float]
    hit: bool
    chance: float
    area: float
    seconds: float
    scores: tuple[float, ...] = ()  # every region's score, in the grid's row-major order (for the agreement)


def targets(problem: dict[str, Any]) -> list[Target]:
    """The answer words of ``problem`` that name one object, with its box (empty where none does)."""
    fam, kind, scene = problem["metadata"]["family"], problem["metadata"]["kind"], problem["scene"]
    if fam == "figure":
        colour = problem["answer"] if kind in ("tallest", "shortest") else None
        if colour is not None:
            return [Target(colour, tuple(scene["boxes"][scene["colors"].index(colour)]))]
        # "What is the value of the red bar?": the value is read from that bar
        asked = next(c for c in scene["colors"] if f"the {c} bar" in problem["question"])
        return [Target(problem["answer"], tuple(scene["boxes"][scene["colors"].index(asked)]))]
    if fam == "visual" and kind != "count":
        target = problem["decisive"]
        if kind == "color":  # "What color is the triangle?": the colour of the (unique) triangle
            index = scene["kinds"].index(problem["question"].split("the ")[-1].rstrip("?"))
        else:  # the leftmost / rightmost shape
            xs = [c % 4 for c in scene["cells"]]
            index = xs.index(min(xs) if kind == "leftmost" else max(xs))
        return [Target(target, tuple(scene["boxes"][index]))]
    if fam == "mixed":
        return [
            Target(str(scene["values"][scene["colors"].index(c)]), tuple(scene["boxes"][scene["colors"].index(c)])) for c in scene["asked"]
        ]
    return []


def find_token(trace: list, word: str, start: int = 0) -> int | None:
    """The first position from ``start`` whose token is ``word`` (spaces and case aside), or None."""
    for i in range(start, len(trace)):
        if trace[i].text.strip().lower() == word.lower():
            return i
    return None


def chance_levels(box: tuple[float, ...], size: tuple[int, int], merged: tuple[int, int], grid: int) -> tuple[float, float]:
    """``(share of the regions that overlap box, box area / image area)``."""
    cells = region_cells(merged[0], merged[1], grid, size)
    overlapping = sum(box_overlap(c.box, box) > 0 for c in cells)
    area = (box[2] - box[0]) * (box[3] - box[1]) / (size[0] * size[1])
    return overlapping / len(cells), area


def play(
    pipe, problem: dict[str, Any], baselines: tuple[str, ...] = BASELINES, grid: int = 8, methods: tuple[str, ...] = ("occlusion",)
) -> tuple[list[Point], dict[str, int]]:
    """Answer ``problem`` with AsymSpec and attribute each named object's token; also counts why tokens were skipped
    (``wrong``: the answer does not name the asked object there; ``verifier``: the verifier emitted it alone)."""
    res = pipe.generate(problem["decoded_image"], problem["query"], caption=problem["caption"], ocr=problem["ocr"] or False)
    points, skipped, start = [], {"wrong": 0, "verifier": 0}, 0
    for target in targets(problem):
        pos = find_token(res.trace, target.word, start)
        if pos is None:
            skipped["wrong"] += 1
            continue
        start = pos + 1
        ev = res.trace[pos]
        if ev.source not in ATTRIBUTED_SOURCES and not ev.steered:
            skipped["verifier"] += 1
            continue
        for method in methods:
            for baseline in baselines:
                t0 = time.perf_counter()
                att = pipe.attribute(res, pos, method=method, grid=grid, baseline=baseline)
                seconds = time.perf_counter() - t0
                top = att.top(0)
                image = att.images[0]
                chance, area = chance_levels(target.box, image.size, image.merged, grid)
                by_cell = sorted((r.cell, r.score) for r in att.regions if r.image_index == 0)
                points.append(
                    Point(
                        problem["pid"],
                        problem["metadata"]["family"],
                        problem["metadata"]["kind"],
                        method,
                        baseline,
                        ev.text,
                        pos,
                        ev.source,
                        top.box,
                        target.box,
                        box_overlap(top.box, target.box) > 0,
                        chance,
                        area,
                        seconds,
                        tuple(score for _, score in by_cell),
                    )  # fmt: skip
                )
    return points, skipped


def summary(points: list[Point]) -> list[dict[str, Any]]:
    """Hit rate, chance and area fraction per (family, method, baseline), and over all families."""
    rows = []
    keys = sorted({(p.family, p.method, p.baseline) for p in points}) + sorted({("all", p.method, p.baseline) for p in points})
    for fam, method, baseline in keys:
        sel = [p for p in points if p.method == method and p.baseline == baseline and (fam == "all" or p.family == fam)]
        n = len(sel)
        rows.append({
            "family": fam, "method": method, "baseline": baseline, "tokens": n,
            "hit_rate": sum(p.hit for p in sel) / n, "chance": sum(p.chance for p in sel) / n,
            "area": sum(p.area for p in sel) / n, "seconds": sum(p.seconds for p in sel) / n,
        })  # fmt: skip
    return rows


def ranks(values: tuple[float, ...]) -> list[float]:
    """The rank of each value (0 = smallest), ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    """Spearman's rank correlation of two equally long score lists (0 where either is constant)."""
    rx, ry = ranks(x), ranks(y)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


def agreement(points: list[Point], method: str = "gradient", reference: str = "occlusion") -> list[dict[str, Any]]:
    """Per (family, baseline) and over all families: of the tokens both methods attributed, the share whose top
    region is the same (``same_top``) and the mean Spearman correlation of their region scores (``spearman``)."""
    by_key = {(p.pid, p.position, p.baseline, p.method): p for p in points}
    pairs = [(p, by_key.get((p.pid, p.position, p.baseline, method))) for p in points if p.method == reference]
    pairs = [(ref, other) for ref, other in pairs if other is not None]
    rows = []
    keys = sorted({(r.family, r.baseline) for r, _ in pairs}) + sorted({("all", r.baseline) for r, _ in pairs})
    for fam, baseline in keys:
        sel = [(r, o) for r, o in pairs if r.baseline == baseline and (fam == "all" or r.family == fam)]
        n = len(sel)
        rows.append({
            "family": fam, "baseline": baseline, "tokens": n, "same_top": sum(r.top_box == o.top_box for r, o in sel) / n,
            "spearman": sum(spearman(r.scores, o.scores) for r, o in sel) / n,
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = ["| family | method | baseline | tokens | hit rate | chance (regions) | chance (box area) | s / token |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['method']} | {r['baseline']} | {r['tokens']} | {r['hit_rate']:.0%} | {r['chance']:.0%} "
            f"| {r['area']:.1%} | {r['seconds']:.3f} |"
        )
    return "\n".join(lines)


def agreement_table(rows: list[dict[str, Any]]) -> str:
    """:func:`agreement` as a Markdown table."""
    lines = ["| family | baseline | tokens | same top region | Spearman (mean) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['baseline']} | {r['tokens']} | {r['same_top']:.0%} | {r['spearman']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the pointing game of attribution on held-out MiniVista problems")
    ap.add_argument("--per-family", type=int, default=30, help="problems per family [default: %(default)s]")
    ap.add_argument("--seed", type=int, default=HELDOUT_SEED, help="MiniVista seed [default: the held-out seed]")
    ap.add_argument("--grid", type=int, default=8)
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=["occlusion"], help="attribution methods [default: occlusion]")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", type=Path, required=True, help="folder for pointing.json and pointing.md")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: no waiting at barriers on a shared machine)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from ..pipeline.facade import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
    points: list[Point] = []
    skipped = {"wrong": 0, "verifier": 0, "problems": 0}
    for fam in POINTING_FAMILIES:
        for i in range(args.per_family):
            prob = make_problem(args.seed, i, fam)
            if not targets(prob):
                continue
            skipped["problems"] += 1
            got, why = play(pipe, prob, grid=args.grid, methods=tuple(args.methods))
            points.extend(got)
            for k, v in why.items():
                skipped[k] += v
            print(f"{fam} {i}: {sum(p.hit for p in got)} of {len(got)} hits", flush=True)
    rows = summary(points)
    agree = agreement(points) if {"occlusion", "gradient"} <= set(args.methods) else []
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pointing.json").write_text(
        json.dumps({"summary": rows, "agreement": agree, "counts": skipped, "points": [asdict(p) for p in points]}, indent=1)
    )
    text = table(rows) + ("\n\n" + agreement_table(agree) if agree else "")
    (args.out / "pointing.md").write_text(text + "\n")
    print(text)
    print(json.dumps(skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
