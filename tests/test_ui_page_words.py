"""Issue #49 (a fourth new user's trial of the demo), the units behind the page: every example sets every field an
example may use, an upload that is no readable image is refused at once, the chart counts tokens in whole numbers, an
empty OCR field says what happened to the image's text, the hover box names fusion only where it happened, and the
status and the alignment say what each counts. The page itself: tests/test_ui_browser_new_user.py."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import make_case  # noqa: E402
from test_ui import FakeTokenizer, demo_args, parse, sample_trace  # noqa: E402

from asymspec_mm.decode import TokenEvent  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio


# ------------------------------------------------------------------------------------------ item 2: examples


def test_every_example_sets_every_field_an_example_uses():
    """A plain example empties the tools an agent example wrote (and sets the choice back to auto); an agent example
    sets its own. Before, a plain example set only the image, question, caption and OCR."""
    from ui.examples import EXAMPLE_FIELDS, example_row, load_agent_examples, load_examples

    plain, agent = load_examples(), load_agent_examples()
    if not plain or not agent:
        pytest.skip("the bundled examples are not in this checkout")
    assert EXAMPLE_FIELDS == ("image", "question", "caption", "ocr", "tools", "tool_choice")
    for ex in plain:
        row = dict(zip(EXAMPLE_FIELDS, example_row(ex)))
        assert row == {**{f: ex[f] for f in ("image", "question", "caption", "ocr")}, "tools": "", "tool_choice": "auto"}
    for ex in agent:
        row = dict(zip(EXAMPLE_FIELDS, example_row(ex)))
        assert row == {f: ex[f] for f in EXAMPLE_FIELDS}
        assert {t["function"]["name"] for t in json.loads(row["tools"])} == {"add", "subtract"}


# ------------------------------------------------------------------------------------------ item 4: uploads


def _refused(state, path, session: str) -> tuple:
    """The page's image.change for an upload of ``path``: (the image box's update, the status)."""
    from ui.outputs import RUN_OUTPUTS

    out = state.new_image({"path": str(path)}, "", "", session)
    return out[0], out[1 + RUN_OUTPUTS.index("status")]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, as it reads the 144 MP header
def test_an_upload_that_is_no_readable_image_is_refused_at_once(state, tmp_path):
    """Bytes that are no image under a .png name, and a 12000x12000 picture: the image box empties and the status
    says why, in the run's own words; the box's own change that follows keeps the error. A good picture stays, and the
    status with it (a run pressed at once may have written it)."""
    import gradio as gr
    from PIL import Image

    from ui.outputs import RUN_OUTPUTS

    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2)
    image, status = _refused(state, corrupt, "c")
    assert image is None and 'data-status="error"' in status
    assert "is not a recognised image" in status and "corrupt.png" in status and "\n" not in status
    after = state.new_image(None, "", "", "c")  # the emptied box's change: the error stays
    assert after[1 + RUN_OUTPUTS.index("status")] == gr.skip()

    huge = tmp_path / "huge.png"
    Image.new("1", (12000, 12000)).save(huge)  # 144 megapixels, a small file
    image, status = _refused(state, huge, "h")
    assert image is None and 'data-status="error"' in status and "12000x12000" in status

    good = tmp_path / "good.png"
    make_case(3)["image"].save(good)
    image, status = _refused(state, good, "h")
    assert image == gr.skip() and status == gr.skip()


# ------------------------------------------------------------------------------------------ item 13: what the page says


def _tick_values(fig) -> list[float]:
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    return [float(t) for t in ax.get_xticks() if lo <= t <= hi]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_charts_token_axis_has_whole_number_ticks(n):
    """A few tokens gave matplotlib's default ticks 0, 0.25, 0.5, ...: the x axis counts emitted tokens."""
    from ui.render import jsd_gamma_figure

    trace = [TokenEvent(index=i, token_id=5, text="a", source="accepted", step=1, position=1, jsd=0.1 * i, gamma_eff=0.5) for i in range(n)]
    ticks = _tick_values(jsd_gamma_figure(trace))
    assert ticks and all(t == int(t) for t in ticks), ticks


def test_an_empty_ocr_field_says_what_happened():
    """The OCR field's placeholder after a run left it empty: the engine read nothing, there is no engine, or auto-fill
    was off (before, it kept "empty: OCR engine (if auto-fill is on and one is installed)")."""
    from ui.view_marks import OCR_PLACEHOLDER, ocr_outcome

    assert ocr_outcome("rapidocr") == "empty: the OCR engine (rapidocr) found no text in this image"
    assert "without an OCR engine" in ocr_outcome("none")
    assert ocr_outcome("off", ["OCR skipped (No usable OCR engine.)"]) == (
        "empty: OCR skipped (No usable OCR engine.); the verifier read no OCR text"
    )
    assert "auto-fill is off" in ocr_outcome("off")
    assert ocr_outcome(None) == ocr_outcome("given") == OCR_PLACEHOLDER


def test_after_a_run_the_ocr_placeholder_says_what_happened_and_a_new_image_resets_it(state, tmp_path):
    """Through the page's handlers: a run with auto-fill on and the "none" engine (the test pair's) leaves the field
    empty and its placeholder says why; a new image, which nothing has read yet, brings the first placeholder back."""
    from ui.view_marks import OCR_PLACEHOLDER

    case = make_case(5)
    path = tmp_path / "a.png"
    case["image"].save(path)
    out = list(state.run(*demo_args(path, {**case, "caption": "a chart", "ocr": ""}, autofill=True, max_new_tokens=2), session="o"))
    assert out[-1][9] == ""  # the OCR field after the run: empty
    _, ocr = state.view_marks("a chart", "", "o")
    assert "without an OCR engine" in ocr["placeholder"]
    _, ocr = state.image_changed("a chart", "", "o", {"path": str(path)})
    assert ocr["placeholder"] == OCR_PLACEHOLDER
    assert state.view_marks("a chart", "", "o")[1]["placeholder"] == OCR_PLACEHOLDER


def test_the_hover_box_names_fusion_only_where_fusion_happened():
    """An accepted (or bonus) token's box showed "top after fusion" though no fusion made it; a fused token's box keeps
    both lists."""
    from ui.render import render_trace_html

    trace = sample_trace()  # an accepted token with fused alternatives recorded, a fused one, a bonus, a greedy
    boxes = {t["attrs"]["data-source"]: t["tip"] for t in parse(render_trace_html(trace, FakeTokenizer())).tokens}
    assert trace[0].source == "accepted" and trace[0].top_fused  # the case of the report
    assert "top after fusion" in boxes["fused"] and "top before fusion" in boxes["fused"]
    for source in ("accepted", "bonus", "greedy"):
        assert "fusion" not in boxes[source], (source, boxes[source])
    assert "verifier's top: 't5' 0.250, '<b>' 0.200" in boxes["accepted"]


def test_the_status_and_the_alignment_say_what_each_counts():
    """The report: "1 token differs from the verifier alone" beside "2 of 15 positions differ". The status counts the
    steered tokens (where the verifier alone would have picked another token after the same text); the table counts
    every position where the outputs differ, the ones after a first difference too. Both now say so."""
    from ui.align import POSITIONS_MEANING, render_alignment_html
    from ui.outputs import STEERED_MEANING, done_summary

    def ev(i, tok, steered=False):
        return TokenEvent(
            index=i, token_id=tok, text=f"t{tok}", source="accepted", step=1, position=1, verifier_argmax=tok, steered=steered
        )

    # "The green bar ... (B)" against the verifier alone's "The red bar ... (A)": one steered token, two positions apart
    asymspec = [ev(0, 1), ev(1, 2, steered=True), ev(2, 3), ev(3, 4)]
    floor = [ev(0, 1), ev(1, 9), ev(2, 3), ev(3, 8)]
    status = done_summary(1.0, asymspec, "asymspec")
    assert status.endswith(f"; 1 token steered ({STEERED_MEANING})") and "differ" not in status
    table = render_alignment_html([("AsymSpec", asymspec), ("Floor", floor)])
    assert 'data-differing="2"' in table and "2 of 4 positions differ" in table
    assert POSITIONS_MEANING.replace("'", "&#x27;") in table or POSITIONS_MEANING in table
