"""Shared fixtures: small random-weight checkpoints built once per session and loaded through the real path."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

WORDS = (
    "red blue green chart bar value axis circle square triangle angle degrees label title "
    "left right top bottom count total sum largest smallest number line point area"
).split()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """(drafter_dir, verifier_dir) of correlated random tiny checkpoints."""
    from asymspec_mm.testing import build_tiny_checkpoints

    return build_tiny_checkpoints(tmp_path_factory.mktemp("tiny_ckpt"))


@pytest.fixture(scope="session")
def tiny_pipe(tiny_dirs):
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")


def make_image(seed: int, size: tuple[int, int] | None = None):
    """A deterministic image with a few coloured rectangles."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    w, h = size or (rng.randint(40, 160), rng.randint(40, 160))
    img = Image.new("RGB", (w, h), tuple(rng.randint(0, 255) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x0, y0 = rng.randint(0, w - 2), rng.randint(0, h - 2)
        draw.rectangle([x0, y0, rng.randint(x0 + 1, w), rng.randint(y0 + 1, h)], fill=tuple(rng.randint(0, 255) for _ in range(3)))
    return img


def make_case(seed: int) -> dict:
    """A deterministic (image, question, caption, ocr) request."""
    rng = random.Random(1000 + seed)
    return {
        "image": make_image(seed),
        "question": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) + "?",
        "caption": " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))),
        "ocr": " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(0, 5))),
    }
