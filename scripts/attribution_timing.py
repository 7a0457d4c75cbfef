"""Seconds per attributed token (``pipe.attribute``) at grid 4 / 8 / 16, on CPU.

Two pairs: the shipped tiny pair on a held-out MiniVista chart (its processor caps images at 16,384 pixels, so a
128 x 128 chart is 4 x 4 merged patches and every grid gives 16 masks), and the real-layout Qwen3-VL-2B / Qwen3
stand-ins (the real processor and config shapes, small random weights) on a 512 x 512 image: 16 x 16 merged
patches, so grid 4 / 8 / 16 give 16 / 64 / 256 masks. Each grid is timed with each method (``occlusion``: a forward
per mask; ``gradient``: one forward and one backward whatever the grid), side by side. Prints a Markdown table.

    python scripts/attribution_timing.py [--repeats 3] [--threads 1] [--methods occlusion gradient]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def measure(
    pipe, res, position: int, grids: tuple[int, ...], repeats: int, methods: tuple[str, ...]
) -> list[tuple[int, str, int, float, int]]:
    """``(grid, method, regions, median seconds, tail tokens)`` per grid and method."""
    rows = []
    for grid in grids:
        for method in methods:
            times, att = [], None
            for _ in range(repeats):
                t0 = time.perf_counter()
                att = pipe.attribute(res, position, method=method, grid=grid)
                times.append(time.perf_counter() - t0)
            tail = int(res.prompts.drafter_full_ids.shape[1]) - int((res.prompts.mm_token_type_ids[0] == 1).nonzero()[0]) + position
            rows.append((grid, method, len(att.regions), statistics.median(times), tail))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: no waiting at barriers on a shared machine)")
    ap.add_argument("--methods", nargs="+", default=["occlusion", "gradient"])
    args = ap.parse_args()
    methods = tuple(args.methods)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.checkpoints.standins import build_standin_pair
    from asymspec_mm.eval.minivista import HELDOUT_SEED, make_problem

    grids = (4, 8, 16)
    lines = ["| pair | image | grid | regions | method | tokens re-read per forward | s / token (median) |"]
    lines.append("|---|---|---|---|---|---|---|")
    tiny = AsymSpecPipeline.from_preset("tiny", ocr="none")
    p = make_problem(HELDOUT_SEED, 1, "figure")
    res = tiny.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=False)
    for grid, method, regions, s, tail in measure(tiny, res, 1, grids, args.repeats, methods):
        lines.append(f"| tiny | 128 x 128 | {grid} | {regions} | {method} | {tail} | {s:.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        stand = AsymSpecPipeline.from_pretrained(*build_standin_pair(tmp), ocr="none")
        image = p["decoded_image"].resize((512, 512))
        res = stand.generate(image, "What is the tallest bar?", caption="a bar chart", ocr=False, max_new_tokens=4)
        for grid, method, regions, s, tail in measure(stand, res, 1, grids, args.repeats, methods):
            lines.append(f"| Qwen3-VL-2B / Qwen3 stand-ins | 512 x 512 | {grid} | {regions} | {method} | {tail} | {s:.2f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
