"""Whose text the compressed view's fields hold when the image changes (#41): an example's caption and OCR text belong
to the example's image, the app's to the image it was made from, and the user's typed words stay. Through DemoApp's
handlers (the page's image.change, typing), with the bundled examples' real images; a run on the tiny random pair."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import make_image  # noqa: E402
from test_ui import demo_args  # noqa: E402

from ui.examples import load_examples  # noqa: E402
from ui.view_marks import MARK_CLASS, ExampleTexts, image_key  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio


@pytest.fixture
def examples(state):
    """The bundled examples, given to the app as build_app gives them; the two "mixed" ones share their OCR text."""
    shown = {e["pid"]: e for e in load_examples()}
    if not {"4", "12"} <= set(shown):
        pytest.skip("the bundled mixed examples are not in this checkout")
    state.add_examples(shown.values())
    assert shown["4"]["ocr"] == shown["12"]["ocr"] and shown["4"]["caption"] != shown["12"]["caption"]
    return shown


def own_picture(tmp_path) -> str:
    path = tmp_path / "mine.png"
    make_image(5).save(path)
    return str(path)


def kept(update: dict) -> bool:
    return "value" not in update


def click(state, example: dict, session: str, image_change_first: bool = False) -> tuple:
    """A click on ``example`` as the page sends it: the example's record and the image's change, in either order (the
    page sends both at once); returns the fields' updates of the later one."""
    calls = [
        lambda: state.example_loaded({"path": example["image"]}, example["caption"], example["ocr"], session),
        lambda: state.image_changed(example["caption"], example["ocr"], session, {"path": example["image"]}),
    ]
    if image_change_first:
        calls.reverse()
    return [call() for call in calls][-1]


@pytest.mark.parametrize("image_change_first", [False, True], ids=["record-first", "image-change-first"])
def test_an_examples_text_stays_with_its_image_and_goes_with_another(state, examples, tmp_path, image_change_first):
    ex, other = examples["4"], examples["12"]
    # the click on the example: its text stays, marked as the example's
    cap, ocr = click(state, ex, "s", image_change_first)
    assert kept(cap) and kept(ocr)
    assert cap["elem_classes"] == [MARK_CLASS] and "The example's caption of its image" in cap["info"]
    assert ocr["elem_classes"] == [MARK_CLASS] and "The example's OCR text" in ocr["info"]
    # a copy of the example's picture (as Gradio caches a file) is the example's image: same content, same key
    copy = tmp_path / "copy.png"
    shutil.copy(ex["image"], copy)
    assert image_key({"path": str(copy)}) == image_key(ex["image"]) != image_key(own_picture(tmp_path))
    assert all(map(kept, state.image_changed(ex["caption"], ex["ocr"], "s", {"path": str(copy)})))
    # another example with the same OCR text: its own text stays, whichever of its two events comes first
    assert all(map(kept, click(state, other, "s", image_change_first)))
    click(state, ex, "s", image_change_first)
    # the user's own picture replaces the example's: both go, unmarked; removing the image does the same
    cap, ocr = state.image_changed(ex["caption"], ex["ocr"], "s", {"path": own_picture(tmp_path)})
    assert cap["value"] == "" and ocr["value"] == "" and cap["elem_classes"] == [] and not cap["info"]
    click(state, ex, "t", image_change_first)
    cap, ocr = state.image_changed(ex["caption"], ex["ocr"], "t", None)
    assert cap["value"] == "" and ocr["value"] == ""


def test_the_users_words_stay(state, examples, tmp_path):
    import gradio as gr

    ex = examples["4"]
    click(state, ex, "u")
    # the user edits the example's caption: it is theirs (its mark goes), the OCR is still the example's
    mine = ex["caption"] + " The triangle is red."
    cap, ocr = state.view_edited(mine, ex["ocr"], "u")
    assert cap["elem_classes"] == [] and not cap["info"] and ocr == gr.skip()
    cap, ocr = state.image_changed(mine, ex["ocr"], "u", {"path": own_picture(tmp_path)})
    assert kept(cap) and ocr["value"] == ""
    # the example's picture uploaded as a file and its OCR text typed (no click on the example): the user's text
    state.image_changed("", "", "w", {"path": ex["image"]})
    cap, ocr = state.image_changed("", ex["ocr"], "w", {"path": own_picture(tmp_path)})
    assert kept(ocr) and ocr["elem_classes"] == []


def test_a_run_with_the_examples_text_keeps_it_the_examples(state, examples, tmp_path):
    """A run sends the example's text as the view: after it, the fields are still the example's (marked so), and the
    next image empties them."""
    ex = examples["4"]
    click(state, ex, "r")
    list(state.run(*demo_args(ex["image"], ex, max_new_tokens=4), session="r"))
    cap, ocr = state.view_marks(ex["caption"], ex["ocr"], "r")
    assert "The example's caption" in cap["info"] and "The example's OCR text" in ocr["info"]
    cap, ocr = state.image_changed(ex["caption"], ex["ocr"], "r", {"path": own_picture(tmp_path)})
    assert cap["value"] == "" and ocr["value"] == ""


def test_example_texts_by_image_content(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    make_image(1).save(a)
    make_image(2).save(b)
    texts = ExampleTexts([{"image": str(a), "caption": "bars", "ocr": "1 2"}, {"image": str(b), "caption": "", "ocr": "1 2"}])
    ka, kb = image_key(str(a)), image_key(str(b))
    assert texts.belongs("caption", "bars", ka) and not texts.belongs("caption", "bars", kb)
    assert texts.elsewhere("caption", "bars", kb) and texts.elsewhere("caption", "bars", None)
    assert not texts.elsewhere("ocr", "1 2", kb) and not texts.elsewhere("caption", "my words", kb)
    assert not texts.elsewhere("caption", "", None) and image_key(str(tmp_path / "missing.png")) is None


def test_an_image_change_before_the_examples_record_leaves_its_marks_alone(state, examples, tmp_path):
    """The page sends a click's image.change and its record at once, and their answers may reach it in either order:
    the image.change that comes first must not unmark the example's text (the record marks it), or the field ends
    unmarked whenever its answer lands last (#49: the image check made that answer slower)."""
    import gradio as gr

    ex = examples["4"]
    state.image_changed("", "", "m", {"path": own_picture(tmp_path)})
    assert state.image_changed(ex["caption"], ex["ocr"], "m", {"path": ex["image"]}) == (gr.skip(), gr.skip())
    cap, ocr = state.example_loaded({"path": ex["image"]}, ex["caption"], ex["ocr"], "m")
    assert cap["elem_classes"] == [MARK_CLASS] and ocr["elem_classes"] == [MARK_CLASS]
