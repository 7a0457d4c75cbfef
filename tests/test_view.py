"""CompressedView rendering and the length limits of its parts."""

from __future__ import annotations

import pytest

from asymspec_mm.eval.mathvista import SHIPPED_DIR as MV_DATA
from captioning import CompressedView, StaticCaptioner, StaticOCR, truncate_text
from captioning.truncate import ELLIPSIS, truncate_caption, truncate_ocr_text, truncate_tokens
from captioning.view import CAPTION_LABEL, DEFAULT_CAPTION_CHARS, DEFAULT_OCR_CHARS, OCR_LABEL


def test_render_labels_and_empty_parts() -> None:
    view = CompressedView(caption=" A triangle. ", ocr_text="[([70, 74], '7')]")
    assert view.render() == f"{CAPTION_LABEL} A triangle.\n{OCR_LABEL} [([70, 74], '7')]"
    assert CompressedView(caption="only").render() == f"{CAPTION_LABEL} only"
    assert CompressedView(ocr_text="12").render() == f"{OCR_LABEL} 12"
    assert CompressedView().render() == "" and CompressedView(caption="  ").render() == ""


def test_truncate_keeps_short_text() -> None:
    assert truncate_text("short text", 100) == "short text"
    assert truncate_text("", 0) == ""
    assert truncate_text("exactly10!", 10) == "exactly10!"


def test_truncate_cuts_on_word_boundary_with_marker() -> None:
    text = "The image shows a right triangle with legs 3 and 4 and hypotenuse 5."
    out = truncate_text(text, 30)
    assert len(out) <= 30 and out.endswith(ELLIPSIS)
    kept = out[: -len(ELLIPSIS)]
    assert text.startswith(kept) and text[len(kept)] == " "  # cut between words
    assert kept == "The image shows a right"


def test_truncate_hard_cut_for_one_long_word_and_tiny_limits() -> None:
    word = "x" * 50
    assert truncate_text(word, 20) == "x" * 17 + ELLIPSIS
    assert truncate_text("hello world", 3) == "hel"  # no room for a marker
    with pytest.raises(ValueError):
        truncate_text("a", -1)


def test_default_budgets() -> None:
    long_text = ("word " * 2000).strip()
    caption = truncate_caption(long_text)
    ocr = truncate_ocr_text(long_text)
    assert len(caption) <= DEFAULT_CAPTION_CHARS and len(ocr) <= DEFAULT_OCR_CHARS
    assert caption.endswith(ELLIPSIS) and ocr.endswith(ELLIPSIS)
    assert len(caption) > DEFAULT_CAPTION_CHARS - 10  # nothing much wasted
    assert truncate_caption("short") == "short"


def test_token_truncation_with_a_real_tokenizer() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = "the image shows a triangle with sides three four and five units long".split()
    vocab = {"[UNK]": 0, ".": 1, "...": 2, **{w: i + 3 for i, w in enumerate(sorted(set(words)))}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()  # splits off "..."
    backend.decoder = tokenizers.decoders.WordPiece()  # joins tokens with spaces
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    text = " ".join(words)
    assert truncate_tokens(text, 100, tokenizer) == text
    out = truncate_tokens(text, 5, tokenizer)
    assert len(tokenizer.encode(out, add_special_tokens=False)) <= 5
    assert out.endswith(ELLIPSIS) and text.startswith(out[: -len(ELLIPSIS)])
    assert out == "the image shows a..."
    assert truncate_tokens(text, 0, tokenizer) == ""


def test_view_from_mathvista_static_sources() -> None:
    ocr_file, caption_file = MV_DATA / "ocrs_easyocr.json", MV_DATA / "captions_bard.json"
    ocr, captions = StaticOCR(ocr_file), StaticCaptioner(caption_file)
    items = ocr.for_pid("1")
    view = CompressedView(
        caption=truncate_caption(captions.caption_for("1")),
        ocr_text=truncate_ocr_text(ocr.text_for("1")),
        ocr_items=tuple(items),
    )
    text = view.render()
    caption_line, ocr_line = text.split(f"\n{OCR_LABEL} ")
    assert caption_line.startswith(f"{CAPTION_LABEL} The image shows a free body diagram")
    assert len(caption_line) <= len(CAPTION_LABEL) + 1 + DEFAULT_CAPTION_CHARS
    assert ocr_line.startswith("[([161, 39], 'The spring force does'), ([158, 104], ")
    assert view.ocr_items[0].text == "The spring force does"
