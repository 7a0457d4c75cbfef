"""``asymspec-mm bench``: methods side by side in one process, interleaved, reported as medians and ratios.

What it measures (see ``BENCHMARKS.md`` for results):

* **Throughput**: decode tokens/s per method variant (Floor, drafter alone, symmetric SD, AsymSpec
  and its ablations) and the ratio to Floor. Repetitions are interleaved (every repetition runs
  every variant, the order rotating), and a ratio is the median over repetitions of the *paired*
  ratio ``tokens/s(variant, rep r) / tokens/s(Floor, rep r)``; a single absolute time is never the
  result (the machine is shared and noisy).
* **Per-step time split**: a request decodes on the engine core, as ``pipe.generate`` decodes it (``--engine static``
  and synthetic caches: on single-row engines); every decode-phase forward goes through a timing proxy
  (:class:`asymspec_mm.base.timing.TimedStorage` on the core's row storages, :class:`~asymspec_mm.base.timing.TimedEngine`
  on single-row engines), and the decoder times its gate and the trace's top-k through its ``timer``
  (:class:`asymspec_mm.base.timing.BucketTimer`):
  drafter-full forwards | drafter-comp forward | verifier forward | gate + fusion | trace top-k |
  the rest (host overhead), summing to the decode wall time (the prefill apart). On CUDA the clock synchronizes,
  so throughput there comes from separate un-instrumented runs.
* **Bookkeeping**: tokens forwarded per stream per emitted token, acceptance rate, mean accepted
  length (tokens per step), acceptance per draft position, vision-tower calls; every run is checked
  (forwarded counts match the loop's rules, the split sums to the step time).
* **Scaling**: per-token time against the length of the compressed view (a caption made that long)
  and tokens/s against K.
* **Batched decoding** (``--batch-sizes``, :mod:`.batching`): ``generate_batch(batch_size=B)`` against the
  sequential loop (B=1: ``pipe.generate`` one request after another), both on the engine core (synthetic caches:
  single-row caches), over the same requests: tokens/s and its ratio to B=1, time per decoder step, KV bytes per row.
* **Projection**: with random weights acceptance means nothing, so for random-weight pairs the
  AsymSpec / SD tokens/s are *projected* from the measured per-call costs for given acceptance
  statistics (the paper's AR 0.78-0.92, MAL 2.6-4.1); on a trained pair the same model is checked
  against the measurement.

Variants are written in :mod:`asymspec_mm.frontend.variants`' grammar (``asymspec@gate=fixed``; lists separated by
``;`` or ``,``).

Pairs (``--preset``, also spelled ``--pair``): ``tiny`` (the bundled trained pair; falls back to random
tiny checkpoints, and says so), ``random-tiny``, ``real-shapes`` (random weights with the published
shapes: a Qwen3-0.6B-shaped verifier stand-in and a Qwen3-VL-2B-shaped drafter, bf16, built in memory),
``real-shapes-32b`` (the paper's 2B / 32B shapes; GPU), ``dirs`` (``--drafter`` / ``--verifier`` checkpoints).
Prefill: ``pipeline`` (the real request path: prompts, vision cache, prefill) or ``synthetic``
(caches filled with random keys/values of the target length, so long contexts cost no prefill:
a decode-cost measurement, labelled as such).
"""

# This docstring is also ``asymspec-mm bench --help``'s description. The parts: settings (defaults, names,
# published shapes), pairs (pairs and inputs), runner (one run and its checks), aggregate (summaries, ratios,
# projection, targets), probes, batching (the batch sweep) and batch_cells (its cells), suite (run_bench), report
# (Markdown, PNG, JSON), cli.

from __future__ import annotations

from ..frontend.variants import Variant
from .aggregate import (
    TARGETS,
    call_costs,
    collect_checks,
    evaluate_targets,
    paired_ratios,
    project,
    projection,
    rep_summary,
    summarize,
    variant_summary,
)
from .batch_cells import BatchSweep, kv_bytes_per_token
from .batch_targets import batch_targets
from .batching import batch_sweep
from .cli import add_bench_parser, bench_main, main
from .pairs import BenchPair, bench_cases, build_real_shape_pair, context_limit, fits_context, load_pair, pad_caption
from .probes import probe_drafter_batching, probe_loop
from .report import render_chart, render_markdown, update_section, write_outputs
from .runner import ENGINES, Runner, check_run, engine_factory, synthetic_prefill
from .settings import DEFAULT_VARIANTS, PAIRS, PAPER_SCENARIOS, SPLIT_KEYS, SPLIT_LABELS, STREAMS, TIMER_BUCKETS
from .suite import run_bench

__all__ = [
    "DEFAULT_VARIANTS",
    "ENGINES",
    "PAIRS",
    "PAPER_SCENARIOS",
    "SPLIT_KEYS",
    "SPLIT_LABELS",
    "STREAMS",
    "TARGETS",
    "TIMER_BUCKETS",
    "BatchSweep",
    "BenchPair",
    "Runner",
    "Variant",
    "add_bench_parser",
    "batch_sweep",
    "batch_targets",
    "bench_cases",
    "bench_main",
    "build_real_shape_pair",
    "call_costs",
    "check_run",
    "collect_checks",
    "context_limit",
    "engine_factory",
    "evaluate_targets",
    "fits_context",
    "kv_bytes_per_token",
    "load_pair",
    "main",
    "pad_caption",
    "paired_ratios",
    "probe_drafter_batching",
    "probe_loop",
    "project",
    "projection",
    "render_chart",
    "render_markdown",
    "rep_summary",
    "run_bench",
    "summarize",
    "synthetic_prefill",
    "update_section",
    "variant_summary",
    "write_outputs",
]
