"""The inspector's heat-map handlers without a browser (:class:`ui.attributions.TokenAttributions`): a conversation's
answer gets a map over each of its images, the footprint marks each steered token's top region, Floor and
text-only answers say in one line that there is nothing to attribute, a cancelled attribution is not cached, and
one replaced by a new run leaves the panel to it."""

from __future__ import annotations

import html
import json
import re

import pytest
from conftest import held_forwards

from asymspec_mm.eval.minivista import HELDOUT_SEED, make_problem
from ui.attributions import TokenAttributions


def _final(panels) -> str:
    *_, last = panels
    return last


def _attr(panel: str, name: str) -> list[str]:
    return [html.unescape(v) for v in re.findall(rf'{name}="([^"]*)"', panel)]


@pytest.fixture(scope="module")
def conversation(shipped_tiny):
    p1, p2 = make_problem(HELDOUT_SEED, 1, "figure"), make_problem(HELDOUT_SEED, 2, "visual")
    messages = [
        {"role": "user", "content": [{"type": "image", "image": p1["decoded_image"]}, {"type": "text", "text": p1["query"]}]},
        {"role": "assistant", "content": "The answer is (A)."},
        {"role": "user", "content": [{"type": "image", "image": p2["decoded_image"]}, {"type": "text", "text": p2["query"]}]},
    ]
    return shipped_tiny.chat(
        messages, caption=[p1["caption"], p2["caption"]], ocr=[p1["ocr"] or False, p2["ocr"] or False], max_new_tokens=4
    )


def test_a_conversations_token_gets_a_map_over_each_image(shipped_tiny, conversation):
    state = TokenAttributions(shipped_tiny)
    state.finished("s", conversation)
    panels = list(state.explain("1:1", "s"))
    panel = panels[-1]
    want = shipped_tiny.attribute(conversation, 1, grid=8)
    assert 'data-state="done"' in panel and 'data-position="1"' in panel
    assert _attr(panel, "data-image-index") == ["0", "1"]
    assert _attr(panel, "data-top-box") == [",".join(map(str, want.top(i).box)) for i in (0, 1)]
    assert panel.count("data:image/png;base64,") == 2 and panel.count('data-rank="1"') == 2
    # the second click comes from the cache: the same panel, without a running state before it
    assert list(state.explain("1:2", "s")) == [panel]


def test_the_footprint_marks_each_steered_tokens_top_region(shipped_tiny, conversation):
    from asymspec_mm.attribution import default_positions

    state = TokenAttributions(shipped_tiny)
    state.finished("s", conversation)
    panel = _final(state.footprint(True, "s"))
    positions = default_positions(conversation)
    assert f'data-tokens="{len(positions)}"' in panel
    for i, marks in enumerate(_attr(panel, "data-footprint")):
        want = []
        for p in positions:
            top = shipped_tiny.attribute(conversation, p, grid=8).top(i)
            if top.score > 0:
                want.append({"position": p, "box": list(top.box)})
        assert json.loads(marks) == want
    assert _final(state.footprint(False, "s")).count('data-state="empty"') == 1  # no token clicked yet: the hint


def test_floor_and_text_only_answers_have_nothing_to_attribute_in_one_line(shipped_tiny):
    p = make_problem(HELDOUT_SEED, 1, "figure")
    floor = shipped_tiny.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method="floor", max_new_tokens=3)
    text = shipped_tiny.chat([{"role": "user", "content": "What is 2 + 3?"}], max_new_tokens=3)
    state = TokenAttributions(shipped_tiny)
    for result, why in ((floor, "'floor' answer"), (text, "no image")):
        state.finished("s", result)
        for panel in (_final(state.explain("0:1", "s")), _final(state.footprint(True, "s"))):
            text = html.unescape(re.sub(r"<[^>]+>", "", panel))
            assert 'data-state="nothing"' in panel and why in text and text.startswith("Nothing to attribute") and "\n" not in text


def test_no_answer_yet_and_a_cancelled_attribution(shipped_tiny, conversation):
    state = TokenAttributions(shipped_tiny)
    assert 'data-state="empty"' in _final(state.explain("0:1", "s"))  # before any run finished
    state.finished("s", conversation)
    with held_forwards(shipped_tiny):  # the attribution waits for the models: Cancel comes first
        panels = state.explain("2:1", "s")
        first = next(panels)
        assert 'data-state="running"' in first and "regions done" in first
        assert 'data-state="cancelled"' in state.cancel("s")
    assert 'data-state="cancelled"' in _final(panels)
    assert (2, "occlusion") not in state._sessions["s"].maps  # nothing cached: a later click computes it
    assert 'data-state="done"' in _final(state.explain("2:2", "s"))
    # a new run or image while a map is computed: the panel shows the hint, and the old handler adds nothing after it
    with held_forwards(shipped_tiny):
        panels = state.explain("0:3", "s")
        assert 'data-state="running"' in next(panels)
        assert 'data-state="empty"' in state.reset("s")
    assert list(panels) == []
