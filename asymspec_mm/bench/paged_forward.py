"""Per-forward CPU time of the paged row storage against the padded one, side by side in one run.

``python -m asymspec_mm.bench.paged_forward`` fills a ``PagedBatchEngine`` and a padded ``BatchEngine`` of the
preset's verifier with the same rows (random prompts of the given lengths, joined from single-row engines), then
times one ``extend`` of the same new tokens on each (rolled back after each forward, so every forward sees the same
contexts): decode steps of ``K + 1 = 5`` tokens at ``B = 1, 4, 8`` rows, and 8 decode rows beside one row whose
256-token prompt chunk goes in the same forward; one row decoding one token (Floor's step) or ``K + 1`` at 2,000
tokens of context. Where the storage takes a pool ``layout``, both layouts are arms: ``segments`` and
``contiguous`` (the default one is marked). Cases of one row add the single-row engine (``single``: the contiguous
cache per stream a request alone decoded on before the direct path took the engine core's route), fed the same
prompt. ``--layers N`` runs a real-config verifier instead of the preset's: Qwen3-32B's config
(:mod:`asymspec_mm.checkpoints.standins`) with ``N`` layers at the stand-ins' width (``--width 0.6b``: at
Qwen3-0.6B's, 16 query and 8 KV heads of 128, hidden 1,024), random weights. One thread, process time; per arm the median of ``--forwards`` forwards, the best of
``--repeats`` repetitions, the arms alternating. Beside the times, the operators one forward of each arm
dispatches (top-level aten ops under ``torch.profiler``: on a model this small their count, not the arithmetic,
decides the time) and the paged pool's segments. The script imports only the storages' public interface, so
running this file (``python path/to/paged_forward.py``) with ``PYTHONPATH`` set to an older checkout times that
checkout's storage.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

CASES = {
    "B=1 decode": ([120], [5]),
    "B=1 one-token decode": ([120], [1]),
    "B=1 decode at 2000": ([2000], [5]),
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


class SingleRow:
    """A single-row engine (:class:`~asymspec_mm.engines.TextEngine`) behind the storages' ``{row: ids}`` interface,
    row 0 only: the arm a request alone decoded on before the engine core's route."""

    def __init__(self, model):
        from asymspec_mm.engines import TextEngine

        self.engine, self.pool = TextEngine(model, "verifier"), None

    def join(self, row: int, single) -> None:
        assert row == 0, "a single-row engine holds row 0 only"
        self.engine = single

    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        return {0: self.engine.extend(ids[0])}

    def length(self, row: int) -> int:
        return self.engine.length

    def truncate(self, row: int, length: int) -> None:
        self.engine.truncate(length)


def forward_ops(storage, ids: dict[int, torch.Tensor]) -> int:
    """Top-level aten ops dispatched by one ``extend(ids)`` (rolled back after)."""
    from torch.profiler import ProfilerActivity, profile

    lengths = {r: storage.length(r) for r in ids}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        storage.extend(ids)
    for r, n in lengths.items():
        storage.truncate(r, n)
    return sum(e.cpu_parent is None and e.name.startswith("aten::") for e in prof.events())


#: ``--width``: the stand-ins' own, or Qwen3-0.6B's attention and hidden sizes.
WIDTHS = {
    "standin": {},
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_heads": 16, "num_kv_heads": 8, "head_dim": 128},
}


def standin_verifier(layers: int, width: str = "standin"):
    """A real-config verifier of ``layers`` layers: Qwen3-32B's config at the stand-ins' width (or ``width``'s,
    :data:`WIDTHS`), random weights."""
    from dataclasses import replace

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from asymspec_mm.checkpoints.standins import StandinShape, verifier_standin_config

    cfg = verifier_standin_config(replace(StandinShape(), num_layers=layers, **WIDTHS[width]))
    cfg.pop("torch_dtype", None)
    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def paged_arms(model) -> dict[str, object]:
    """The paged storages to time: one per layout where the storage takes a ``layout`` (the default marked), else
    the one it has (an older checkout)."""
    from asymspec_mm.engines.paged_rows import PagedBatchEngine

    try:
        from asymspec_mm.engines.paged_kv import LAYOUTS
    except ImportError:
        return {"paged": PagedBatchEngine(model, "verifier")}
    default = PagedBatchEngine(model, "verifier").kv.layout
    return {
        f"paged {layout}" + (" (default)" if layout == default else ""): PagedBatchEngine(model, "verifier", layout=layout)
        for layout in LAYOUTS
    }


def main(argv: list[str] | None = None) -> int:
    from asymspec_mm.frontend.help import terminal_text

    ap = argparse.ArgumentParser(prog="python -m asymspec_mm.bench.paged_forward", description=terminal_text(__doc__.split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=0, help="a real-config verifier of this many layers instead of the preset's")
    ap.add_argument("--width", default="standin", choices=list(WIDTHS), help="with --layers: the stand-ins' width or Qwen3-0.6B's")
    ap.add_argument("--forwards", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = ap.parse_args(argv)
    from asymspec_mm.engines.rows import BatchEngine
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

    torch.set_num_threads(1)
    model = standin_verifier(args.layers, args.width) if args.layers else AsymSpecPipeline.from_preset(args.preset).verifier
    names = [*paged_arms(model), "single"]
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    print(f"{layers} layers; per arm: ms per forward, its ratio over padded, logits equal to padded, aten ops (single: one-row cases)")
    print("| case | padded (ms) | " + " | ".join(names) + " | ops: padded / " + " / ".join(names) + " | pool segments |")
    print("|---|---|" + "---|" * len(names) + "---|---|")
    for name in args.cases.split(","):
        lengths, news = CASES[name]
        rng = random.Random(0)
        arms = {"padded": filled(BatchEngine(model, "verifier"), model, lengths, rng)}
        for arm, storage in paged_arms(model).items():
            arms[arm] = filled(storage, model, lengths, random.Random(0))
        if len(lengths) == 1:
            arms["single"] = filled(SingleRow(model), model, lengths, random.Random(0))
        here = [k for k in arms if k != "padded"]
        ids = {r: torch.tensor([rng.randrange(2, model.config.vocab_size) for _ in range(n)]) for r, n in enumerate(news)}
        first = {kind: storage.extend(ids) for kind, storage in arms.items()}
        for storage in arms.values():
            for r, n in enumerate(news):
                storage.truncate(r, storage.length(r) - n)
        equal = {kind: all(torch.allclose(first[kind][r], first["padded"][r], atol=1e-5) for r in ids) for kind in here}
        best = {kind: float("inf") for kind in arms}
        for _ in range(args.repeats):
            for kind, storage in arms.items():
                best[kind] = min(best[kind], per_forward_ms(storage, ids, args.forwards))
        ops = {kind: forward_ops(storage, ids) for kind, storage in arms.items()}
        cells = [f"{best[k]:.2f} ({best[k] / best['padded']:.2f}x, {'equal' if equal[k] else 'NOT equal'})" for k in here]
        cells += ["-"] * ("single" not in arms)
        segments = len(arms[here[0]].pool.segments)
        print(
            f"| {name} | {best['padded']:.2f} | "
            + " | ".join(cells)
            + f" | {ops['padded']} / "
            + " / ".join(str(ops[k]) if k in ops else "-" for k in names)
            + f" | {segments} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
