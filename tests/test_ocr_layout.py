"""OCR text layouts: how an engine's items become the text the verifier reads, and the tiny preset's choice.

The tiny pair was trained on MiniVista's OCR texts, which put a figure's texts on one line in reading order
(``10 8 6 4 2 0``); its preset must give the verifier that layout from a real engine's real reading of a
bundled MiniVista image. Other pairs keep one text line per line. Real engines, real models, nothing mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from asymspec_mm.base.errors import UnknownOptionError
from captioning import OCRItem, RapidOCREngine, compress
from captioning.ocr import OCR_LAYOUTS, check_ocr_layout, render_inline, render_plain, render_text

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "asymspec_mm" / "examples_data"


def _item(x: int, y: int, w: int, h: int, text: str) -> OCRItem:
    return OCRItem(box=[[x, y], [x + w, y], [x + w, y + h], [x, y + h]], text=text)


def test_inline_layout_is_reading_order_on_one_line() -> None:
    # an axis' tick labels (one a line) and a two-word title line above them, given out of order
    items = [_item(0, 50, 9, 11, "6"), _item(0, 10, 15, 11, "10"), _item(60, 0, 30, 8, "title"), _item(20, 1, 30, 8, "A"),
             _item(0, 30, 9, 11, "8"), _item(0, 70, 9, 11, " "), _item(0, 90, 9, 11, "4")]  # fmt: skip
    assert render_inline(items) == "A title 10 8 6 4"
    assert render_plain(items) == "A title\n10\n8\n6\n4"
    assert render_text(items, "inline") == render_inline(items) and render_inline([]) == ""


def test_unknown_layout_is_one_line_naming_the_choices() -> None:
    assert OCR_LAYOUTS == ("plain", "inline", "mathvista") and check_ocr_layout("inline") == "inline"
    with pytest.raises(UnknownOptionError, match=r"^Unknown OCR text layout 'lines'; use 'plain', 'inline', 'mathvista'\.$"):
        render_text([], "lines")


def test_compress_writes_the_engine_items_in_the_asked_layout() -> None:
    engine = RapidOCREngine()
    chart = Image.open(REPO / "examples" / "chart.png")
    plain = compress(chart, caption="", ocr_engine=engine)  # the default, as the real pair reads it
    inline = compress(chart, caption="", ocr_engine=engine, ocr_layout="inline")
    assert plain.ocr_text == "10\n8\n6\n4\n2\n0"
    assert inline.ocr_text == "10 8 6 4 2 0" and inline.ocr_items == plain.ocr_items


@pytest.fixture(scope="module")
def tiny():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", device="cpu")


def test_the_tiny_preset_reads_minivista_charts_in_their_training_layout(tiny) -> None:
    from asymspec_mm.eval import minivista as mv

    charts = [p for p in mv.example_problems() if mv.family_of(p) in ("figure", "mixed")]
    assert charts and tiny.ocr_layout == "inline"
    for problem in charts:
        view = tiny.compressed_view(EXAMPLES / f"minivista_{mv.family_of(problem)}_{problem['pid']}.png", caption="")
        assert view.ocr_text == problem["ocr"] == "10 8 6 4 2 0", problem["pid"]


def test_the_tiny_preset_answers_the_bundled_chart_as_trained(tiny) -> None:
    from asymspec_mm import mathvista_question
    from asymspec_mm.eval import minivista as mv

    problem = mv.example_problems()[0]  # examples/chart.png: which bar is the tallest (green)
    res = tiny.generate(REPO / "examples" / "chart.png", mathvista_question(problem["question"], choices=problem["choices"]))
    assert res.stats["ocr_engine"] == "rapidocr" and res.view.ocr_text == problem["ocr"]
    assert res.text == problem["response"] == "The green bar is the tallest, so the answer is (B)."


def test_other_pairs_keep_the_line_layout_and_a_bad_layout_stops_before_loading(tmp_path) -> None:
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.pipeline.presets import PRESETS, ocr_layout_of

    assert ocr_layout_of("qwen3") == ocr_layout_of(None) == "plain" and ocr_layout_of("tiny") == "inline"
    assert "ocr_layout" not in PRESETS["qwen3"]().pipeline_kwargs
    missing = tmp_path / "no-such-checkpoint"  # loading it would fail later, with another message
    with pytest.raises(UnknownOptionError, match="Unknown OCR text layout 'one-line'"):
        AsymSpecPipeline.from_pretrained(missing, missing, ocr_layout="one-line")
