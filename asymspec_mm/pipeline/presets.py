"""Named drafter/verifier pairs.

- ``tiny``: the trained tiny pair shipped inside the package (offline, CPU, seconds); its OCR text is
  one line (``ocr_layout="inline"``), the layout of the MiniVista texts it was trained on.
- ``tiny-xfamily``: a cross-family pair (issue #44): the ``tiny`` drafter and a tiny verifier of another tokenizer
  family (SentencePiece-style BPE with Llama-3's special tokens and chat template), trained on the same data; the
  pipeline steers it through the map of the tokens both vocabularies spell alike (:mod:`asymspec_mm.base.vocab_map`).
- ``qwen3``: Qwen/Qwen3-VL-2B-Instruct + Qwen/Qwen3-32B, the paper's cross-modal pair.
- ``auto``: ``qwen3`` when a CUDA device is present and both checkpoints are already on disk, else ``tiny``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import UnknownOptionError

log = logging.getLogger("asymspec_mm")

TINY_DIR = Path(__file__).resolve().parents[1] / "presets_data" / "tiny"
TINY_XFAMILY_DIR = TINY_DIR.parent / "tiny-xfamily"
QWEN3_DRAFTER = "Qwen/Qwen3-VL-2B-Instruct"
QWEN3_VERIFIER = "Qwen/Qwen3-32B"


@dataclass(frozen=True)
class Preset:
    name: str
    drafter: str
    verifier: str
    pipeline_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def tiny_ocr_engine() -> str:
    """RapidOCR when it can run offline: it reads the tick labels of MiniVista's 128px renders, which
    EasyOCR misses (and it starts in a fraction of EasyOCR's time); else ``auto``."""
    from captioning.ocr.rapidocr_engine import rapidocr_problems

    return "rapidocr" if not rapidocr_problems() else "auto"


# MiniVista writes a figure's texts on one line in reading order ("10 8 6 4 2 0"): the OCR text the tiny
# pair was trained on. The engine's default layout (one text line per line) puts each tick label on a
# line of its own, which the tiny verifier never saw and which derails it.
TINY_OCR_LAYOUT = "inline"


def tiny_preset() -> Preset:
    if not (TINY_DIR / "drafter").is_dir() or not (TINY_DIR / "verifier").is_dir():
        raise UnknownOptionError(
            f"the tiny pair is missing from {TINY_DIR}: reinstall asymspec-mm, or rebuild it with "
            "`python -m asymspec_mm.tiny.train --out asymspec_mm/presets_data/tiny`"
        )
    return Preset(
        "tiny",
        str(TINY_DIR / "drafter"),
        str(TINY_DIR / "verifier"),
        {"device": "cpu", "dtype": "fp32", "local_files_only": True, "ocr": tiny_ocr_engine(), "ocr_layout": TINY_OCR_LAYOUT},
        "trained tiny Qwen3-VL drafter + Qwen3 verifier (MiniVista)",
    )


def tiny_xfamily_preset() -> Preset:
    """The ``tiny`` preset's drafter folder (not a copy) and the cross-family verifier, with ``tiny``'s settings."""
    if not (TINY_XFAMILY_DIR / "verifier").is_dir():
        raise UnknownOptionError(
            f"the tiny-xfamily verifier is missing from {TINY_XFAMILY_DIR}: reinstall asymspec-mm, or rebuild it with "
            "`python -m asymspec_mm.tiny.xfamily --out asymspec_mm/presets_data/tiny-xfamily`"
        )
    tiny = tiny_preset()
    return Preset(
        "tiny-xfamily",
        tiny.drafter,
        str(TINY_XFAMILY_DIR / "verifier"),
        dict(tiny.pipeline_kwargs),
        "trained tiny Qwen3-VL drafter + a tiny verifier of another tokenizer family (MiniVista)",
    )


PRESETS = {
    "qwen3": lambda: Preset("qwen3", QWEN3_DRAFTER, QWEN3_VERIFIER, {}, "Qwen3-VL-2B-Instruct drafter + Qwen3-32B verifier"),
    "tiny": tiny_preset,
    "tiny-xfamily": tiny_xfamily_preset,
}


def ocr_layout_of(preset_name: str | None) -> str:
    """The OCR text layout a run uses: the preset's (``tiny``: ``inline``), else ``plain`` (the engine's lines)."""
    if preset_name in PRESETS:
        return str(PRESETS[preset_name]().pipeline_kwargs.get("ocr_layout", "plain"))
    return "plain"


def _on_disk(repo_id: str) -> bool:
    """Whether a hub checkpoint is already in the local cache (no network)."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, local_files_only=True)
        return True
    except Exception:
        return False


def resolve_preset(name: str) -> Preset:
    """Look a preset up by name; ``auto`` decides between ``qwen3`` and ``tiny`` and says so on stderr."""
    if name == "auto":
        import torch

        if torch.cuda.is_available() and _on_disk(QWEN3_DRAFTER) and _on_disk(QWEN3_VERIFIER):
            chosen = PRESETS["qwen3"]()
        else:
            chosen = PRESETS["tiny"]()
        print(
            f"asymspec-mm: using the '{chosen.name}' pair ({chosen.description}); choose with preset='tiny'|'qwen3' "
            "or --preset / --drafter --verifier",
            file=sys.stderr,
        )
        return chosen
    if name not in PRESETS:
        raise UnknownOptionError(f"unknown preset {name!r}; choose one of auto, {', '.join(PRESETS)}")
    return PRESETS[name]()
