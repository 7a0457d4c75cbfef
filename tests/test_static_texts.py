"""Precomputed MathVista captions and OCR strings (StaticCaptioner, StaticOCR)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from asymspec_mm.base.errors import AsymSpecError, DatasetUnavailableError
from asymspec_mm.eval.mathvista import SHIPPED_DIR as MV_DATA
from captioning import StaticCaptioner, StaticOCR, render_mathvista, render_plain
from captioning.ocr import MissingOCRTextError, OCRParseError, parse_ocr_literal
from captioning.static import MissingCaptionError, refine_bard_caption

OCR_FILE = MV_DATA / "ocrs_easyocr.json"
CAPTION_FILE = MV_DATA / "captions_bard.json"
TESTMINI_FILE = MV_DATA / "testmini.json"


@pytest.fixture(scope="module")
def testmini_pids() -> list[str]:
    with TESTMINI_FILE.open(encoding="utf-8") as fh:
        return list(json.load(fh))


@pytest.fixture(scope="module")
def ocr_json() -> dict:
    with OCR_FILE.open(encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def static_ocr() -> StaticOCR:
    return StaticOCR(OCR_FILE)


@pytest.fixture(scope="module")
def captioner() -> StaticCaptioner:
    return StaticCaptioner(CAPTION_FILE)


# ---------------------------------------------------------------------------------------------
# OCR strings
# ---------------------------------------------------------------------------------------------


def test_every_mathvista_ocr_string_parses(ocr_json: dict, static_ocr: StaticOCR, testmini_pids) -> None:
    texts = ocr_json["texts"]
    assert len(testmini_pids) == 1000
    assert all(pid in static_ocr for pid in testmini_pids)
    lengths = {}
    for pid, raw in texts.items():
        # MathVista stores "" for a few images; everything else must be a literal list.
        value = ast.literal_eval(raw) if raw.strip() else []
        assert isinstance(value, list)
        lengths[pid] = len(value)
    # StaticOCR's own parsing (checked on testmini to keep the test fast) agrees.
    for pid in testmini_pids:
        assert len(static_ocr.for_pid(pid)) == lengths[pid]
    non_empty = [pid for pid in testmini_pids if static_ocr.for_pid(pid)]
    assert len(non_empty) == 618


def _official_refine_ocr(raw: str) -> str:
    """Independent re-statement of MathVista's refine_ocr (literal_eval instead of eval)."""
    try:
        entries = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return ""
    if not entries:
        return ""
    return str([([int(e[0][0][0]), int(e[0][0][1])], e[1]) for e in entries])


def test_mathvista_rendering_matches_official_prompt_form(ocr_json: dict, static_ocr: StaticOCR, testmini_pids) -> None:
    for pid in testmini_pids:
        expected = _official_refine_ocr(ocr_json["texts"][pid])
        assert render_mathvista(static_ocr.for_pid(pid)) == expected, pid
        assert static_ocr.text_for(pid) == expected


def test_static_ocr_known_entry(static_ocr: StaticOCR, ocr_json: dict) -> None:
    items = static_ocr.for_pid(1)  # int pids work too
    assert static_ocr.raw("1") == ocr_json["texts"]["1"]
    assert items[0].text == "The spring force does"
    assert items[0].box == ((161, 39), (766, 39), (766, 120), (161, 120))
    assert items[0].confidence == pytest.approx(0.912845069753024)
    # Rotated boxes are stored with float corners; they are truncated like MathVista does.
    assert items[-1].text == "Stop" and items[-1].box[0] == (240, 638)
    assert static_ocr.text_for("1", style="plain").splitlines()[0] == "The spring force does"
    assert static_ocr.metadata["model"] == "easyocr"


def test_static_ocr_missing_pid_and_fallback(tmp_path: Path) -> None:
    source = tmp_path / "ocr.json"
    source.write_text(json.dumps({"model": "easyocr", "texts": {"1": "[([[1, 2], [3, 2], [3, 4], [1, 4]], 'a', 0.5)]"}}))
    ocr = StaticOCR(source)
    with pytest.raises(MissingOCRTextError) as info:
        ocr.for_pid("999")
    assert isinstance(info.value, KeyError) and isinstance(info.value, AsymSpecError)
    assert "'999'" in str(info.value) and str(source) in str(info.value)
    with pytest.raises(KeyError):
        ocr.raw(999)
    lenient = StaticOCR(source, fallback="")
    assert lenient.for_pid("999") == [] and lenient.raw("999") == ""
    assert lenient.text_for("999") == ""
    assert [it.text for it in lenient.for_pid("1")] == ["a"]


def test_static_ocr_from_bare_mapping_and_refined_form() -> None:
    ocr = StaticOCR({7: "[([5, 3], 'baking dish'), ([177, 5], '$4.00')]"})  # few-shot form
    items = ocr.for_pid("7")
    assert [it.text for it in items] == ["baking dish", "$4.00"]
    assert all(it.confidence == 1.0 for it in items)
    assert render_mathvista(items) == "[([5, 3], 'baking dish'), ([177, 5], '$4.00')]"
    assert render_plain(items) == "baking dish $4.00"


def test_python_expressions_are_rejected_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    payloads = [
        "__import__('os').system('x')",
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        "[([[0, 0], [1, 0], [1, 1], [0, 1]], __import__('os').getcwd(), 1.0)]",
    ]
    for payload in payloads:
        with pytest.raises(OCRParseError):
            parse_ocr_literal(payload)
        with pytest.raises(OCRParseError):
            StaticOCR({"1": payload}).for_pid("1")
    assert not marker.exists()
    with pytest.raises(OCRParseError):
        StaticOCR({}, fallback="__import__('os')")


@pytest.mark.parametrize(
    "raw",
    [
        "{'a': 1}",
        "[1, 2]",
        "[([1, 2], 3)]",
        "[([1, 2], 'a', 'high')]",
        "[([[1, 2], [3]], 'a')]",
        "[(",
    ],
)
def test_malformed_ocr_strings(raw: str) -> None:
    with pytest.raises(OCRParseError):
        parse_ocr_literal(raw)


def test_missing_files_raise_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError, match="not found"):
        StaticOCR(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DatasetUnavailableError):
        StaticCaptioner(bad)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(DatasetUnavailableError):
        StaticCaptioner(listing)


# ---------------------------------------------------------------------------------------------
# captions
# ---------------------------------------------------------------------------------------------


def test_bard_captions_cover_930_testmini_pids(captioner: StaticCaptioner, testmini_pids) -> None:
    covered = [pid for pid in testmini_pids if pid in captioner]
    assert len(covered) == 930
    assert captioner.metadata["model"] == "bard"
    for pid in covered:
        caption = captioner.caption_for(pid)
        assert "Sure. " not in caption
        assert not caption.startswith("Sure, I can do that.")
        assert caption == caption.strip()


def test_known_caption_is_cleaned(captioner: StaticCaptioner) -> None:
    assert captioner.raw("1").startswith("Sure. The image shows a free body diagram")
    assert captioner.caption_for(1).startswith("The image shows a free body diagram")


def test_refine_bard_caption_mirrors_official_rules() -> None:
    assert refine_bard_caption("Sure. The image shows a cat.") == "The image shows a cat."
    assert refine_bard_caption("Sure, I can do that.\n\nThe image shows  a dog.") == "The image shows a dog."
    assert refine_bard_caption("A plot. I hope this helps!") == "A plot."
    assert refine_bard_caption("I can't process this file.") == ""
    assert refine_bard_caption(None) == ""
    # The official code removes only its fixed phrases: other prefaces stay.
    assert refine_bard_caption("Sure, here it is.") == "Sure, here it is."


def test_missing_caption_error_and_fallback(captioner: StaticCaptioner, testmini_pids) -> None:
    missing = next(pid for pid in testmini_pids if pid not in captioner)
    with pytest.raises(MissingCaptionError) as info:
        captioner.caption_for(missing)
    assert isinstance(info.value, KeyError) and isinstance(info.value, AsymSpecError)
    assert repr(missing) in str(info.value) and str(CAPTION_FILE) in str(info.value)
    lenient = StaticCaptioner(CAPTION_FILE, fallback="")
    assert lenient.caption_for(missing) == ""
    assert StaticCaptioner({"texts": {"1": "Sure. A"}}, fallback="n/a").caption_for("2") == "n/a"


def test_caption_source_forms() -> None:
    bare = StaticCaptioner({1: "Sure. A square."})
    assert bare.caption_for("1") == "A square." and len(bare) == 1 and bare.pids == ["1"]
    raw = StaticCaptioner({"texts": {"1": "Sure. A square."}}, refine=False)
    assert raw.caption_for(1) == "Sure. A square."
