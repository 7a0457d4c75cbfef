"""Per-forward CPU time of the paged row storage against the padded one, side by side in one run.

``python -m asymspec_mm.bench.paged_forward`` fills a ``PagedBatchEngine`` and a padded ``BatchEngine`` of the
preset's verifier with the same rows (random prompts of the given lengths, joined from single-row engines), then
times one ``extend`` of the same new tokens on each (rolled back after each forward, so every forward sees the same
contexts): decode steps of ``K + 1 = 5`` tokens at ``B = 1, 4, 8`` rows, and 8 decode rows beside one row whose
256-token prompt chunk goes in the same forward. One thread, process time; per arm the median of ``--forwards``
forwards, the best of ``--repeats`` repetitions, the arms alternating. Beside the times, the operators one forward
of each arm dispatches (top-level aten ops under ``torch.profiler``: on a model this small their count, not the
arithmetic, decides the time) and the paged pool's segments. The script imports only the storages'
public interface, so running this file (``python path/to/paged_forward.py``) with ``PYTHONPATH`` set to an older
checkout times that checkout's storage.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

CASES = {
    "B=1 decode": ([120], [5]),
    "B=4 decode": ([80, 110, 130, 160], [5] * 4),
    "B=8 decode": ([80, 90, 100, 110, 120, 130, 140, 160], [5] * 8),
    "B=8 decode + a 256-token chunk": ([80, 90, 100, 110, 120, 130, 140, 160, 16], [5] * 8 + [256]),
}


def filled(storage, model, lengths: list[int], rng: random.Random):
    """``storage`` with a row per length, each a random prompt prefilled on a single-row engine and joined."""
    from asymspec_mm.engines import TextEngine

    vocab = model.config.vocab_size
    for row, length in enumerate(lengths):
        single = TextEngine(model, "verifier")
        single.prefill(torch.tensor([rng.randrange(2, vocab) for _ in range(length)]))
        storage.join(row, single)
    return storage


def per_forward_ms(storage, ids: dict[int, torch.Tensor], forwards: int) -> float:
    """The median process time of one ``extend(ids)`` in ms (each rolled back, so every forward is the same)."""
    lengths = {r: storage.length(r) for r in ids}
    times = []
    for _ in range(forwards):
        t0 = time.process_time()
        storage.extend(ids)
        times.append(time.process_time() - t0)
        for r, n in lengths.items():
            storage.truncate(r, n)
    return 1000 * statistics.median(times)


def forward_ops(storage, ids: dict[int, torch.Tensor]) -> int:
    """Top-level aten ops dispatched by one ``extend(ids)`` (rolled back after)."""
    from torch.profiler import ProfilerActivity, profile

    lengths = {r: storage.length(r) for r in ids}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        storage.extend(ids)
    for r, n in lengths.items():
        storage.truncate(r, n)
    return sum(e.cpu_parent is None and e.name.startswith("aten::") for e in prof.events())


def main(argv: list[str] | None = None) -> int:
    from asymspec_mm.frontend.help import terminal_text

    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.paged_forward", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--forwards", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from asymspec_mm.engines.paged_rows import PagedBatchEngine
    from asymspec_mm.engines.rows import BatchEngine
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

    torch.set_num_threads(1)
    model = AsymSpecPipeline.from_preset(args.preset).verifier
    print("| case | padded (ms) | paged (ms) | paged / padded | logits equal | ops: padded / paged | pool segments |")
    print("|---|---|---|---|---|---|---|")
    for name, (lengths, news) in CASES.items():
        rng = random.Random(0)
        arms = {
            "padded": filled(BatchEngine(model, "verifier"), model, lengths, rng),
            "paged": filled(PagedBatchEngine(model, "verifier"), model, lengths, random.Random(0)),
        }
        ids = {r: torch.tensor([rng.randrange(2, model.config.vocab_size) for _ in range(n)]) for r, n in enumerate(news)}
        first = {kind: storage.extend(ids) for kind, storage in arms.items()}
        for storage in arms.values():
            for r, n in enumerate(news):
                storage.truncate(r, storage.length(r) - n)
        equal = all(torch.allclose(first["paged"][r], first["padded"][r], atol=1e-5) for r in ids)
        best = {kind: float("inf") for kind in arms}
        for _ in range(args.repeats):
            for kind, storage in arms.items():
                best[kind] = min(best[kind], per_forward_ms(storage, ids, args.forwards))
        ratio = best["paged"] / best["padded"]
        ops = {kind: forward_ops(storage, ids) for kind, storage in arms.items()}
        segments = len(arms["paged"].pool.segments)
        print(
            f"| {name} | {best['padded']:.2f} | {best['paged']:.2f} | {ratio:.2f}x | {'yes' if equal else 'no'} "
            f"| {ops['padded']} / {ops['paged']} | {segments} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
