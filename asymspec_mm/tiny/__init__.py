"""The bundled ``tiny`` pair: a small Qwen3-VL drafter and a Qwen3 verifier trained on MiniVista.

``python -m asymspec_mm.tiny.train --out DIR`` rebuilds it (CPU, about 85 minutes on 2 cores; the phases are options);
``python -m asymspec_mm.tiny.results`` measures it. The shipped checkpoints live in
``asymspec_mm/presets_data/tiny/{drafter,verifier}``; see ``README.md`` beside this file.
"""

from __future__ import annotations

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets_data" / "tiny"
DRAFTER_DIR = PRESET_DIR / "drafter"
VERIFIER_DIR = PRESET_DIR / "verifier"
IMAGE_SIZE = 128  # training resolution; the processor resizes any image to about 128x128
