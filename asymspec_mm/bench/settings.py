"""The benchmark's fixed settings: default variants, pair names, stream and split names, published shapes."""

from __future__ import annotations

import sys
import time

DEFAULT_VARIANTS = (
    "floor",
    "drafter",
    "sd",
    "asymspec",
    "asymspec@gate=fixed",
    "asymspec@gate=tuned",
    "asymspec@delta=scd",
    "asymspec@beta=0",
    "asymspec@bonus=gated",
)
PAPER_SCENARIOS = ((0.78, 2.6), (0.92, 4.1))  # (acceptance rate, mean accepted length) reported by the paper
PAIRS = ("tiny", "random-tiny", "real-shapes", "real-shapes-32b", "dirs")
STREAMS = ("drafter_full", "drafter_comp", "verifier")
SPLIT_KEYS = ("drafter_full", "drafter_comp", "verifier", "gate", "trace", "other")
SPLIT_LABELS = {
    "drafter_full": "drafter-full fwd",
    "drafter_comp": "drafter-comp fwd",
    "verifier": "verifier fwd",
    "gate": "gate + fusion",
    "trace": "trace top-k",
    "other": "rest (host)",
}
# The blocks the decoding loops time through their ``timer``: the gate (+ fusion) and the trace's top-k rows.
TIMER_BUCKETS = ("gate", "trace")

# Published shapes (config.json of the hub checkpoints).
QWEN3_0_6B = dict(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072)
QWEN3_32B = dict(hidden_size=5120, num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=25600)
QWEN3_VL_2B = dict(
    hidden_size=2048,
    num_layers=28,
    num_heads=16,
    head_dim=128,
    intermediate_size=6144,
    vision_depth=24,
    vision_hidden=1024,
    patch_size=16,
    deepstack=(5, 11, 17),
)
QWEN3_VL_2B_VISION = dict(num_heads=16, intermediate_size=4096, num_position_embeddings=2304)
QWEN_VOCAB = 151936
REAL_IMAGE_SIDE = 448  # 448x448, patch 16, merge 2: 196 image tokens
SYNTHETIC_PENDING_TOKEN = 17
UNBOUNDED_CAPTION = 10**9  # max_caption_chars of a padded caption: the whole of it reaches the model

FILLER = (
    "the chart shows a bar labelled with a value on the axis and a red circle left of a blue square "
    "next to a green triangle above the line with the title at the top and the legend at the bottom"
).split()


def log(msg: str) -> None:
    """A timestamped progress line on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
