"""The Python API path emits no warnings: loading the bundled tiny pair and answering about a bundled image.

It runs in a fresh interpreter: a warning that torch raises only once per process (the quantized-tensor
deprecation behind EasyOCR's int8 models) would otherwise be hidden by whichever test triggered it first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every warning of the API path is recorded ("always": repeats included); the OCR engines are named, so the
# EasyOCR set-up (where torch's quantization warnings came from) runs whatever the preset's default is.
SCRIPT = r"""
import json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from asymspec_mm import AsymSpecPipeline
    with open("asymspec_mm/examples_data/examples.json", encoding="utf-8") as f:
        example = json.load(f)[0]
    from PIL import Image, ImageDraw, ImageFont
    lettered = Image.new("RGB", (360, 120), "white")  # text for the OCR engine to read (its recognizer runs)
    ImageDraw.Draw(lettered).text((20, 30), "42 17 bar", fill="black", font=ImageFont.load_default(size=48))
    images = ["asymspec_mm/examples_data/" + example["image"], lettered]
    texts, ocr_texts = [], []
    for ocr in json.loads(sys.argv[1]):
        pipe = AsymSpecPipeline.from_preset("tiny", **({} if ocr is None else {"ocr": ocr}))
        for image in images:
            result = pipe.generate(image, example["question"], max_new_tokens=6)
            texts.append(result.text)
            ocr_texts.append(result.view.ocr_text)
print(json.dumps({
    "texts": texts,
    "ocr_texts": ocr_texts,
    "warnings": [f"{w.category.__name__} at {w.filename}:{w.lineno}: {str(w.message)[:200]}" for w in caught],
}))
"""


def test_tiny_preset_generate_emits_no_warnings():
    engines = [None] + (["easyocr"] if importlib.util.find_spec("easyocr") else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(engines)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["texts"]) == 2 * len(engines) and all(out["texts"])  # the path really ran and answered
    if "easyocr" in engines:
        assert "42" in out["ocr_texts"][-1]  # EasyOCR's recognizer ran on the lettered image
    assert out["warnings"] == []
