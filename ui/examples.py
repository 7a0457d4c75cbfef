"""The bundled examples of the steering inspector (``asymspec_mm/examples_data/examples.json``)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["EXAMPLES_DIR", "example_label", "load_examples"]

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "asymspec_mm" / "examples_data"


def load_examples(path: str | Path | None = None) -> list[dict]:
    """Bundled examples from ``examples.json`` (a list of {image, question, caption, ocr}; ``image`` relative
    to the JSON's folder). Entries whose image is missing are skipped; no file (or a bad one) gives []."""
    index = Path(path) if path is not None else EXAMPLES_DIR / "examples.json"
    if index.is_dir():
        index = index / "examples.json"
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for ex in raw if isinstance(raw, list) else []:
        if not isinstance(ex, dict) or not ex.get("image") or not ex.get("question"):
            continue
        img = (index.parent / str(ex["image"])).resolve()
        if not img.is_file():
            continue
        out.append(
            {
                "image": str(img),
                "question": str(ex["question"]),
                "caption": str(ex.get("caption") or ""),
                "ocr": str(ex.get("ocr") or ""),
                "label": example_label(ex),
            }
        )
    return out


def example_label(ex: dict) -> str:
    """A short button label: the family and the question line of a MiniVista prompt, cut to 70 characters."""
    q = str(ex.get("question", ""))
    for line in q.splitlines():
        if line.lower().startswith("question:"):
            q = line.split(":", 1)[1].strip()
            break
    fam = ex.get("family")
    label = f"{fam}: {q}" if fam else q
    return label if len(label) <= 70 else label[:67] + "..."
