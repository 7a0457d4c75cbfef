"""The inspector's heat maps in a real browser (Debian's chromium driven by Playwright): a bundled example runs, a
click on a steered token of the answer shows its heat map over the image (the top region the same as
``pipe.attribute``'s, the picture tinted where the plain image is not), the footprint toggle outlines every steered
token's top region, and Cancel, shown only while a map is computed, stops an attribution that is waiting for the
models. Never uses
wait_until="networkidle" (Gradio keeps connections open)."""

from __future__ import annotations

import base64
import io
import json

import pytest
from conftest import held_forwards
from test_ui_browser import MAX_NEW, _example, _run_and_wait, browser_env, open_page, outside_requests  # noqa: F401 - browser_env: the fixture

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")]

PANEL = "#asym-heatmap .asym-heatmap"
CANCEL = "#asym-heat-cancel"


def _png(data_uri: str):
    from PIL import Image

    assert data_uri.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(data_uri.split(",", 1)[1]))).convert("RGB")


def _click_token(page, position: int) -> None:
    page.locator(f'#asym-answer .asym-trace .tok[data-index="{position}"]').click()


def test_click_a_steered_token_shows_its_map_footprint_cancel_and_cache(browser_env):  # noqa: F811 - the imported fixture
    from PIL import Image

    from asymspec_mm.attribution import default_positions

    env, pipe = browser_env, browser_env["pipe"]
    ex = _example("1")  # "Which bar is the tallest?": the drafter reads the colour from the bars
    page = open_page(env)
    assert page.locator(PANEL).get_attribute("data-state") == "empty"
    assert page.locator(CANCEL).is_hidden()  # nothing is being computed
    page.get_by_text(ex["label"], exact=True).first.click()
    page.wait_for_function("q => document.querySelector('#asym-question textarea').value === q", arg=ex["question"])
    _run_and_wait(page)
    ref = pipe.generate(ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"] or False, max_new_tokens=MAX_NEW)
    steered = default_positions(ref)
    assert steered, ref.text
    pos = steered[0]

    # a click on the steered token: its map over the image, the same top region as the API's
    _click_token(page, pos)
    page.wait_for_selector(f'{PANEL}[data-state="done"][data-view="token"][data-position="{pos}"]')
    assert page.locator(CANCEL).is_hidden()  # the map is drawn: nothing left to cancel
    want = pipe.attribute(ref, pos, grid=8)
    fig = page.locator(f'{PANEL} .asym-heat-figure[data-image-index="0"]')
    assert fig.count() == 1 and fig.get_attribute("data-top-box") == ",".join(map(str, want.top(0).box))
    panel = page.locator(PANEL)
    assert panel.get_attribute("data-source") == ref.trace[pos].source
    assert float(panel.get_attribute("data-delta")) == pytest.approx(want.delta, abs=1e-4)
    # the picture is the example's image, tinted red on the top region and untouched where the map is 0
    shown = _png(fig.locator("img").get_attribute("src"))
    plain = Image.open(ex["image"]).convert("RGB")
    assert shown.size == plain.size
    x0, y0, x1, y1 = want.top(0).box
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    assert shown.getpixel((cx, cy)) != plain.getpixel((cx, cy)) and shown.getpixel((cx, cy))[0] > shown.getpixel((cx, cy))[2]
    cold = next(r for r in reversed(want.regions) if r.score <= 0)
    assert shown.getpixel((cold.box[0], cold.box[1])) == plain.getpixel((cold.box[0], cold.box[1]))
    assert str(pos) in panel.inner_text() and "delta" in panel.inner_text()

    # the footprint: every steered token's top region at once
    page.locator("#asym-footprint input").check()
    page.wait_for_selector(f'{PANEL}[data-state="done"][data-view="footprint"]')
    marks = json.loads(page.locator(f"{PANEL} .asym-heat-figure").get_attribute("data-footprint"))
    expected = []
    for p in steered:
        top = pipe.attribute(ref, p, grid=8).top(0)
        if top.score > 0:
            expected.append({"position": p, "box": list(top.box)})
    assert marks == expected and page.locator(PANEL).get_attribute("data-tokens") == str(len(steered))
    assert page.locator(CANCEL).is_hidden()
    page.locator("#asym-footprint input").uncheck()
    page.wait_for_selector(f'{PANEL}[data-state="done"][data-view="token"][data-position="{pos}"]')

    # Cancel: an attribution waiting for the models (held here) is stopped; nothing comes after it
    other = next(i for i in range(len(ref.trace)) if i not in steered)
    with held_forwards(pipe):
        _click_token(page, other)
        page.wait_for_selector(f'{PANEL}[data-state="running"]')
        assert "regions done" in page.locator(PANEL).inner_text() and page.locator(CANCEL).is_visible()
        page.locator(CANCEL).click()
        page.wait_for_selector(f'{PANEL}[data-state="cancelled"]')
        assert page.locator(CANCEL).is_hidden()
    page.wait_for_timeout(600)
    assert page.locator(PANEL).get_attribute("data-state") == "cancelled"
    _click_token(page, other)  # the same token again: computed this time
    page.wait_for_selector(f'{PANEL}[data-state="done"][data-position="{other}"]')

    # the first token's map is cached: it comes back while the models are busy (a fresh one would wait for them: the
    # models are held until it has come, so the page's default timeout bounds a hang, not the time a cached map takes)
    with held_forwards(pipe):
        _click_token(page, pos)
        page.wait_for_selector(f'{PANEL}[data-state="done"][data-position="{pos}"]')
    assert outside_requests(env["requests"]) == []
    page.close()
