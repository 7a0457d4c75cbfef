"""The bundled ``tiny`` pair: a small Qwen3-VL drafter and a Qwen3 verifier trained on MiniVista.

``python -m asymspec_mm.tiny.train --out DIR`` rebuilds the four-family pair (CPU, about 41 minutes on 2 cores; the
phases are options) and ``python -m asymspec_mm.tiny.finetune --from PAIR --out DIR`` continues that pair on the agent tasks (about 60
minutes); ``python -m asymspec_mm.tiny.results`` and ``python -m asymspec_mm.tiny.agent_results`` measure it. The shipped checkpoints live in
``asymspec_mm/presets_data/tiny/{drafter,verifier}``; see ``README.md`` beside this file.

Modules: ``train`` (the recipe, the workers and the command; re-exports the names of the next four),
``models`` (tokenizer, processor, model sizes), ``data`` (encoded examples, batches, the problem stream),
``losses``, ``evaluate`` (teacher-forced and greedy accuracy), ``results`` (the held-out measurements), ``finetune``
and ``agent_data`` (the agent tasks' training: the recipe, the added tokens, the requests), ``agent_results`` (their
measurements), ``runs`` (the commands' worker processes, export and report), ``xfamily`` and ``xfamily_results`` (the
``tiny-xfamily`` verifier of another tokenizer family: its training and its measurements without the loop).
"""

from __future__ import annotations

from pathlib import Path

from ..request.domain import IMAGE_SIZE  # training resolution (the out-of-domain rule reads it too)

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets_data" / "tiny"
DRAFTER_DIR = PRESET_DIR / "drafter"
VERIFIER_DIR = PRESET_DIR / "verifier"
