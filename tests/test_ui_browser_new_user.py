"""Issue #41, "What a new user hit": the steering inspector in a real browser (Debian's chromium driven by Playwright),
step by step as the user went. Reuses tests/test_ui_browser.py's served demo (the shipped tiny pair when this checkout
has it) and helpers; never waits for "networkidle" (Gradio keeps connections open).
"""

from __future__ import annotations

import io
import re

import pytest
import test_ui_browser
from conftest import make_case
from test_ui_browser import (
    ARTIFACTS,
    DESKTOP,
    MAX_NEW,
    PHONE,
    TIMEOUT_MS,
    _example,
    _new_page,
    _press,
    _run_and_wait,
    answer_ids,
    fill,
    mark_status_stale,
    outside_requests,
    read_answer_tokens,
)

#: tests/test_ui_browser.py's fixture: the demo served on the shipped tiny pair (or random checkpoints), and chromium.
browser_env = test_ui_browser.browser_env

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*"),  # inside gradio's queue
]

FIELDS_EMPTY = (
    "() => document.querySelector('#asym-caption textarea').value === '' && document.querySelector('#asym-ocr textarea').value === ''"
)


def _triangle_and_square(path):
    """The user's own picture: a triangle and a square (no bars, no numbers)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (224, 224), "white")
    draw = ImageDraw.Draw(img)
    draw.polygon([(20, 190), (80, 40), (140, 190)], fill=(220, 40, 40))
    draw.rectangle([130, 110, 205, 185], fill=(40, 90, 220))
    img.save(path)
    return path


def _click_example(page, ex: dict) -> None:
    """Click (or tap) an example and wait until its question and image are in the page."""
    _press(page, page.get_by_text(ex["label"], exact=True).first)
    page.wait_for_function("q => document.querySelector('#asym-question textarea').value === q", arg=ex["question"])
    page.wait_for_selector("#asym-image img", state="attached")


def test_an_examples_text_goes_when_the_user_uploads_their_own_image(browser_env):
    """Item 1: the example "mixed: What is the sum..." fills in its caption and OCR; the user's own picture (a triangle
    and a square) then replaces the example's, and Run answers about that picture (the drafter's caption of it, the
    OCR engine's reading), not about the example's bar chart. The example's text stays while its own image is loaded;
    the words the user typed stay with any image."""
    env, pipe = browser_env, browser_env["pipe"]
    ex = _example("4")
    own = _triangle_and_square(env["tmp"] / "triangle_and_square.png")
    page = _new_page(env, env["url"], DESKTOP)
    caption, ocr = page.locator("#asym-caption textarea"), page.locator("#asym-ocr textarea")
    _click_example(page, ex)
    page.wait_for_timeout(1500)  # the page's answer to the example's image has arrived: the example's text stays
    assert caption.input_value() == ex["caption"] and ocr.input_value() == ex["ocr"]

    page.locator("#asym-image input[type=file]").set_input_files(str(own))
    page.wait_for_function(FIELDS_EMPTY)
    assert page.locator("#asym-caption.asym-generated, #asym-ocr.asym-generated").count() == 0
    _run_and_wait(page)
    ref = pipe.generate(str(own), ex["question"], caption=None, ocr=None, max_new_tokens=MAX_NEW)
    assert ref.view.caption != ex["caption"]
    page.wait_for_function("c => document.querySelector('#asym-caption textarea').value === c", arg=ref.view.caption)
    assert ocr.input_value() == ref.view.ocr_text
    assert page.locator("#asym-stats [data-stat='OCR engine']").inner_text() != "given"  # read from the picture
    want = answer_ids(pipe, ref)
    assert [t["id"] for t in read_answer_tokens(page, len(want))] == want  # the verifier read the user's picture

    # the example again, its caption edited by the user: their words stay with the next image, the example's OCR goes
    _click_example(page, ex)
    page.wait_for_function("c => document.querySelector('#asym-caption textarea').value === c", arg=ex["caption"])
    page.wait_for_selector("#asym-caption.asym-generated")  # marked as the example's text
    assert "The example's caption of its image" in page.locator("#asym-caption").inner_text()
    caption.click()
    caption.press("End")
    page.keyboard.type(" The triangle is red.")
    page.wait_for_function("() => !document.querySelector('#asym-caption').classList.contains('asym-generated')")
    mine = caption.input_value()
    assert "The example's caption" not in page.locator("#asym-caption").inner_text()  # the mark's line goes too
    page.locator("#asym-image input[type=file]").set_input_files(str(own))
    page.wait_for_function("() => document.querySelector('#asym-ocr textarea').value === ''")
    assert caption.input_value() == mine
    page.wait_for_function("() => !document.querySelector('#asym-ocr').innerText.includes(\"The example's OCR text\")")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inspector_own_image_after_example.png"), full_page=True)
    assert outside_requests(env["requests"]) == []
    page.context.close()


def _set_number(page, elem_id: str, value: str) -> None:
    """Type a slider's value until the slider holds it (an edit typed while an accordion opens can be dropped)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    number = page.locator(f"#{elem_id} input[type=number]")
    for attempt in range(6):
        number.fill(value)
        number.press("Enter")
        try:
            page.wait_for_function(
                "([id, v]) => Number(document.querySelector('#' + id + ' input[type=range]').value) === Number(v)",
                arg=[elem_id, value],
                timeout=10_000,
            )
            return
        except PlaywrightTimeout:
            if attempt == 5:
                raise


def test_the_seed_starts_empty_and_each_sampled_run_draws_its_own(browser_env):
    """Item 2: the Seed field is empty on load (its label says empty draws a fresh seed each run); two sampled runs
    report two different seeds in the status, and the field stays empty."""
    env = browser_env
    case = make_case(90)
    img = env["tmp"] / "seeded.png"
    case["image"].save(img)
    page = _new_page(env, env["url"], DESKTOP)
    fill(page, img, case["question"], "a chart", "")
    page.get_by_text("Sampling (temperature > 0)").click()
    seed = page.locator("#asym-seed :is(input, textarea)")
    seed.wait_for()
    assert seed.input_value() == ""
    _set_number(page, "asym-temperature", "0.9")
    seeds = []
    for _ in range(2):
        _run_and_wait(page)
        status = page.locator("#asym-status").inner_text()
        found = re.search(r"sampled at temperature 0\.9, seed (\d+)", status)
        assert found, status
        seeds.append(int(found.group(1)))
    assert seeds[0] != seeds[1], seeds
    assert seed.input_value() == ""
    page.context.close()


def test_the_tool_choice_says_what_the_chosen_value_does(browser_env):
    """Item 3: the tool choice's words follow its value (they said "required: the answer must call a tool" at auto)."""
    env = browser_env
    page = _new_page(env, env["url"], DESKTOP)
    page.get_by_text("Agent tools", exact=True).click()
    block = page.locator("#asym-tool-choice")
    block.wait_for()
    assert page.locator("#asym-tool-choice input").input_value() == "auto"
    text = block.inner_text()
    assert "must call a tool" not in text and "auto" in text and "decides" in text, text
    for choice, words in (("required", "must call a tool"), ("none", "no tool"), ("auto", "decides")):
        page.locator("#asym-tool-choice input").click()
        page.get_by_role("option", name=choice, exact=True).click()
        page.wait_for_function(
            "([c, w]) => document.querySelector('#asym-tool-choice input').value === c"
            " && document.querySelector('#asym-tool-choice').innerText.includes(w)",
            arg=[choice, words],
        )
    page.context.close()


CHART_DRAWN_JS = """() => { const i = document.querySelector('#asym-chart img');
  return !!i && i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0; }"""


def _drawn_pixels(png: bytes, box: dict) -> tuple[int, int]:
    """Inside ``box`` (page coordinates) of a full-page screenshot: the pixels of the chart's two lines (purple JSD,
    teal gamma_eff) and those with any ink (lines, axes, ticks, titles; a blank box has only its download button)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    crop = img.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    raw = crop.tobytes()
    pixels = list(zip(raw[0::3], raw[1::3], raw[2::3]))
    lines = sum(1 for r, g, b in pixels if (b > 150 and r > 80 and g < 110) or (g > 110 and b > 140 and r < 60))
    return lines, sum(1 for r, g, b in pixels if r + g + b < 600)


def test_on_a_phone_the_answer_is_a_tap_from_run_and_the_chart_is_drawn(browser_env):
    """Item 5: on a phone the answer stood 1.5 screens below Run. After Run, a link right under it (next to the status)
    jumps to the answer; the JSD chart, far down the page, is drawn without being scrolled to (it was a lazy image,
    blank in a full-page screenshot)."""
    env, pipe = browser_env, browser_env["pipe"]
    ex = _example("4")
    page = _new_page(env, env["url"], PHONE)
    _click_example(page, ex)
    page.evaluate("() => window.scrollTo(0, 0)")
    _run_and_wait(page)
    ref = pipe.generate(ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"], max_new_tokens=MAX_NEW)
    read_answer_tokens(page, len(answer_ids(pipe, ref)))
    run = page.locator("#asym-run").bounding_box()
    jump = page.locator("#asym-status a.asym-jump")
    assert jump.is_visible()
    box = jump.bounding_box()
    assert 0 <= box["y"] - run["y"] < PHONE["height"] / 3, (run, box)  # under Run, on the same screen
    page.wait_for_function(CHART_DRAWN_JS, timeout=TIMEOUT_MS)  # loaded while off screen
    chart = page.locator("#asym-chart").bounding_box()
    chart["y"] += page.evaluate("() => window.scrollY")  # page coordinates, as in the full-page screenshot
    assert chart["y"] > 2 * PHONE["height"]  # the test means something: the chart is far below the first screen
    ARTIFACTS.mkdir(exist_ok=True)
    png = page.screenshot(path=str(ARTIFACTS / "inspector_phone_full.png"), full_page=True)
    lines, ink = _drawn_pixels(png, chart)
    assert lines > 30 and ink > 1000, (lines, ink)

    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "inspector_phone_run.png"))
    _press(page, jump)
    page.wait_for_function(  # scrolled until the answer's top is at the top of the screen
        "() => { const r = document.querySelector('#asym-answer').getBoundingClientRect(); return r.top >= 0 && r.top < 40; }"
    )
    page.screenshot(path=str(ARTIFACTS / "inspector_phone_answer.png"))
    # on a desktop the answer stands beside Run: no link
    page.set_viewport_size(DESKTOP)
    page.wait_for_timeout(300)
    assert not jump.is_visible()
    page.context.close()


# ------------------------------------------------------------------------------------- issue 49: a fourth trial


def test_a_plain_example_after_an_agent_example_runs_without_its_tools(browser_env):
    """Item 2: the agent example ("What is the blue bar's value ... subtract"), then the figure example "Which bar is the
    tallest?": the tools the agent example wrote went with the second example's run (the answer read the tools' prompt,
    353 verifier tokens instead of 104). Every example now sets the tools and the tool choice: the plain one empties
    them, and Run answers as the example does on a fresh page. Picking an example ends the conversation."""
    from ui.examples import load_agent_examples

    env, pipe = browser_env, browser_env["pipe"]
    agents = load_agent_examples()
    if not agents:
        pytest.skip("the bundled agent examples are not in this checkout")
    ex = _example("1")
    page = _new_page(env, env["url"], DESKTOP)
    page.get_by_text("Agent tools", exact=True).click()
    page.locator("#asym-tools textarea").wait_for()
    _click_example(page, agents[0])
    page.wait_for_function("() => document.querySelector('#asym-tools textarea').value.includes('\"subtract\"')")
    _click_example(page, ex)
    page.wait_for_function("() => document.querySelector('#asym-tools textarea').value === ''", timeout=10_000)
    assert page.locator("#asym-tool-choice input").input_value() == "auto"
    _run_and_wait(page)
    ref = pipe.generate(ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"], max_new_tokens=MAX_NEW)
    want = answer_ids(pipe, ref)
    assert [t["id"] for t in read_answer_tokens(page, len(want))] == want
    assert "No tools offered" in page.locator("#asym-tool-calls").inner_text()
    page.wait_for_selector('#asym-conversation .asym-conversation[data-turns="1"]')
    _press(page, page.get_by_text(ex["label"], exact=True).first)  # the same example again: a new conversation
    page.wait_for_selector('#asym-conversation .asym-conversation[data-turns="0"]', timeout=10_000)
    page.context.close()


def test_stop_turns_off_after_a_refused_request_and_a_corrupt_upload_is_refused(browser_env):
    """Item 4: a whitespace question, seed "abc" and seed "-5" each give their one-line error, and Stop (red and on while
    the run was handed over) turns off again; it stayed on. A .png of bytes that are no image is refused as it is
    uploaded: the box empties (it kept the file, with a broken-image icon) and the status says why."""
    env = browser_env
    case = make_case(8)
    good, corrupt = env["tmp"] / "refused_good.png", env["tmp"] / "corrupt.png"
    case["image"].save(good)
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2)  # a PNG's signature, then no PNG
    page = _new_page(env, env["url"], DESKTOP)
    stop = page.locator("#asym-stop")
    fill(page, good, case["question"], "a chart", "")
    page.get_by_text("Sampling (temperature > 0)").click()
    seed = page.locator("#asym-seed :is(input, textarea)")
    seed.wait_for()
    for question, seed_text, words in (
        ("   ", "", "the question is empty"),
        (case["question"], "abc", "seed='abc' must be a whole number"),
        (case["question"], "-5", "seed='-5' must be a whole number"),
    ):
        page.locator("#asym-question textarea").fill(question)
        seed.fill(seed_text)
        mark_status_stale(page)
        _press(page, "#asym-run")
        page.wait_for_selector('#asym-status [data-status="error"]:not([data-stale])', timeout=TIMEOUT_MS)
        assert words in page.locator("#asym-status").inner_text()
        page.wait_for_function("() => document.querySelector('#asym-stop').disabled", timeout=10_000)
        assert "stop" not in stop.get_attribute("class").split(), words

    mark_status_stale(page)
    page.locator("#asym-image input[type=file]").set_input_files(str(corrupt))
    page.wait_for_selector('#asym-status [data-status="error"]:not([data-stale])', timeout=10_000)
    status = page.locator("#asym-status [data-status]").inner_text()
    assert "'corrupt.png' is not a recognised image" in status and "\n" not in status.strip(), status
    page.wait_for_function("() => !document.querySelector('#asym-image img')", timeout=10_000)
    page.wait_for_timeout(500)  # the emptied box's own change: the error stays
    assert page.locator('#asym-status [data-status="error"]').count() == 1 and stop.is_disabled()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inspector_refused_upload.png"))
    page.context.close()


def test_what_the_page_says_after_a_run_and_after_a_new_image(browser_env):
    """Item 13, on one run of the figure example with its OCR field left empty: the empty OCR field says what happened
    (it kept "empty: OCR engine (if auto-fill is on and one is installed)"); the status and the alignment say what
    each counts (they read as a contradiction, "1 token differs" beside "2 of 15 positions differ"); an accepted
    token's hover box names no fusion (it listed a "top after fusion"). A new image then clears the old answer, its
    stats, chart and downloads with the conversation (they stayed)."""
    from ui.align import POSITIONS_MEANING
    from ui.outputs import STEERED_MEANING
    from ui.view_marks import OCR_PLACEHOLDER, ocr_outcome

    env, pipe = browser_env, browser_env["pipe"]
    ex = _example("1")
    page = _new_page(env, env["url"], DESKTOP)
    fill(page, ex["image"], ex["question"], ex["caption"], "")  # auto-fill on: the OCR engine reads the image
    _run_and_wait(page)
    ref = pipe.generate(ex["image"], ex["question"], caption=ex["caption"], ocr=None, max_new_tokens=MAX_NEW)
    toks = read_answer_tokens(page, len(answer_ids(pipe, ref)))
    assert ref.view.ocr_text == "" and page.locator("#asym-ocr textarea").input_value() == ""
    said = ocr_outcome(ref.stats["ocr_engine"])
    assert said != OCR_PLACEHOLDER
    page.wait_for_function("p => document.querySelector('#asym-ocr textarea').placeholder === p", arg=said, timeout=10_000)

    steered = sum(ev.steered for ev in ref.trace)
    status = page.locator("#asym-status").inner_text()
    assert f"; {steered} token{'' if steered == 1 else 's'} steered ({STEERED_MEANING})" in status, status
    assert "differ" not in status, status
    assert POSITIONS_MEANING in page.locator("#asym-align .asym-align-sum").inner_text()

    i = next(i for i, ev in enumerate(ref.trace) if ev.source == "accepted" and ev.top_fused)
    tok = page.locator("#asym-answer .asym-trace .tok").nth(i)
    assert toks[i]["source"] == "accepted"
    tok.hover()
    tip = tok.locator(".tok-tip")
    tip.wait_for(state="visible")
    assert "fusion" not in tip.inner_text() and "verifier's top" in tip.inner_text(), tip.inner_text()

    page.wait_for_selector("#asym-chart img")
    page.wait_for_selector("#asym-trace-json a", state="attached")
    page.wait_for_selector('#asym-conversation .asym-conversation[data-turns="1"]')
    page.locator("#asym-image input[type=file]").set_input_files(str(_triangle_and_square(env["tmp"] / "next_picture.png")))
    page.wait_for_function("() => document.querySelectorAll('#asym-answer .asym-trace .tok').length === 0", timeout=10_000)
    assert page.locator("#asym-answer-text textarea").input_value() == ""
    assert "Statistics appear here after a run." in page.locator("#asym-stats").inner_text()
    page.wait_for_function("() => !document.querySelector('#asym-chart img') && !document.querySelector('#asym-trace-json a')")
    assert page.locator("#asym-floor .asym-trace .tok").count() == 0 and page.locator("#asym-align table").count() == 0
    page.wait_for_selector('#asym-conversation .asym-conversation[data-turns="0"]')
    assert page.locator("#asym-ocr textarea").get_attribute("placeholder") == OCR_PLACEHOLDER
    assert outside_requests(env["requests"]) == []
    page.context.close()
