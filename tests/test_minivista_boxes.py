"""MiniVista records where it drew each object (bars, shapes, text labels) without changing any problem, and the
pointing game reads the asked object's box from it."""

from __future__ import annotations

import hashlib
import json

import pytest

from asymspec_mm.eval.minivista import COLORS, HELDOUT_SEED, TRAIN_SEED, make_problem
from asymspec_mm.eval.pointing_game import chance_levels, targets

#: sha256 over the pixels and texts of the first 40 problems of each seed, taken before the boxes were recorded
DIGESTS = {
    HELDOUT_SEED: "12f969d283008ba5ea2ba538da4c6c01fc2b76033e275b5f352446256247faca",
    TRAIN_SEED: "4ca5dd1cccb6f939715a3ab1cb73656610d3c03785e12d38cf4886683fbaa74a",
    7: "7c565af72c2532fb958d8c66344b3389b41973221e93f9c4e3f08f7abedf44a9",
}
TEXT_KEYS = ("question", "choices", "answer", "caption", "ocr", "response", "decisive", "query")


@pytest.mark.parametrize("seed", sorted(DIGESTS))
def test_recording_boxes_changes_no_image_and_no_text(seed):
    h = hashlib.sha256()
    for i in range(40):
        p = make_problem(seed, i)
        h.update(p["decoded_image"].tobytes())
        h.update(json.dumps({k: p[k] for k in TEXT_KEYS}, sort_keys=True).encode())
    assert h.hexdigest() == DIGESTS[seed]


def test_the_agent_tasks_are_unchanged_too():
    from asymspec_mm.eval.minivista_agent import make_agent_problem

    h = hashlib.sha256()
    for i in range(20):
        p = make_agent_problem(HELDOUT_SEED, i)
        h.update(p["image"].tobytes())
        h.update(json.dumps(p["messages"], sort_keys=True, default=str).encode())
    assert h.hexdigest() == "7d6775c47458ce06e16a44d40541ff63acd4502993799d98dc2cd2b3c657ecf9"  # taken before the boxes


def _pixels_of(image, rgb, within=(0, 0, 128, 128)):
    x0, y0, x1, y1 = within
    px = image.load()
    return [(x, y) for y in range(max(0, y0), min(128, y1)) for x in range(max(0, x0), min(128, x1)) if px[x, y] == rgb]


@pytest.mark.parametrize("family", ["figure", "mixed"])
def test_a_bars_box_is_exactly_where_its_colour_is(family):
    for i in range(12):
        p = make_problem(HELDOUT_SEED, i, family)
        scene = p["scene"]
        for colour, box in zip(scene["colors"], scene["boxes"]):
            pts = _pixels_of(p["decoded_image"], COLORS[colour])
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            assert [min(xs), min(ys), max(xs) + 1, max(ys) + 1] == box


def test_a_shapes_box_holds_every_pixel_of_it():
    for i in range(20):
        p = make_problem(HELDOUT_SEED, i, "visual")
        scene = p["scene"]
        for cell, colour, box in zip(scene["cells"], scene["colors"], scene["boxes"]):
            around = ((cell % 4) * 32, (cell // 4) * 32, (cell % 4) * 32 + 32, (cell // 4) * 32 + 32)
            pts = _pixels_of(p["decoded_image"], COLORS[colour], around)
            assert pts, "the shape is drawn in its cell"
            assert all(box[0] <= x < box[2] and box[1] <= y < box[3] for x, y in pts)
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            assert [min(xs), min(ys), max(xs) + 1, max(ys) + 1] == box  # and no larger


def test_text_labels_have_boxes_around_their_ink():
    p = make_problem(HELDOUT_SEED, 0, "geometry")
    labels = dict(p["scene"]["labels"])
    assert {"A", "B", "C"} <= set(labels)
    for s, box in labels.items():
        ink = _pixels_of(p["decoded_image"], (0, 0, 0), tuple(int(v) for v in box))
        assert ink, f"no ink inside the box of {s!r}"


def test_targets_name_the_asked_object():
    # held-out figure problem 1 asks for the tallest bar: blue, value 9, third bar (x 80..94)
    p = make_problem(HELDOUT_SEED, 1, "figure")
    assert p["metadata"]["kind"] == "tallest" and p["answer"] == "blue"
    assert targets(p) == [type(targets(p)[0])("blue", (80, 26, 94, 116))]
    mixed = make_problem(HELDOUT_SEED, 0, "mixed")
    scene = mixed["scene"]
    assert [t.word for t in targets(mixed)] == [str(scene["values"][scene["colors"].index(c)]) for c in scene["asked"]]
    counting = next(
        make_problem(HELDOUT_SEED, i, "visual") for i in range(40) if make_problem(HELDOUT_SEED, i, "visual")["metadata"]["kind"] == "count"
    )
    assert targets(counting) == []
    assert targets(make_problem(HELDOUT_SEED, 0, "geometry")) == []


def test_chance_levels_count_the_regions_a_box_meets():
    # a bar in the third column from y 26 to 116 meets rows 0..3 of that column: 4 of 16 regions
    chance, area = chance_levels((80, 26, 94, 116), (128, 128), (4, 4), 8)
    assert chance == 4 / 16 and area == pytest.approx(14 * 90 / 128**2)


def test_the_pointing_game_scores_an_answer_with_the_tiny_pair(shipped_tiny):
    from asymspec_mm.eval.pointing_game import agreement, play, spearman, summary, table

    # held-out visual 0: "Which shape is furthest to the right?", answered with the drafter's accepted draft
    problem = make_problem(HELDOUT_SEED, 0, "visual")
    points, skipped = play(shipped_tiny, problem, methods=("occlusion", "gradient"))
    assert skipped == {"wrong": 0, "verifier": 0}
    assert [(p.method, p.baseline, p.token.strip(), p.source) for p in points] == [
        (m, b, problem["decisive"], "accepted") for m in ("occlusion", "gradient") for b in ("mean", "zero")
    ]
    target = targets(problem)[0]
    for p in points:
        assert p.target_box == target.box and len(p.scores) == 16
        assert p.chance == chance_levels(target.box, (128, 128), (4, 4), 8)[0]
    assert all(p.hit for p in points if p.method == "occlusion")  # the top region meets the rightmost shape
    rows = summary(points)
    assert [(r["family"], r["method"], r["baseline"], r["tokens"]) for r in rows] == [
        ("visual", "gradient", "mean", 1),
        ("visual", "gradient", "zero", 1),
        ("visual", "occlusion", "mean", 1),
        ("visual", "occlusion", "zero", 1),
        ("all", "gradient", "mean", 1),
        ("all", "gradient", "zero", 1),
        ("all", "occlusion", "mean", 1),
        ("all", "occlusion", "zero", 1),
    ]
    assert table(rows).splitlines()[4].startswith("| visual | occlusion | mean | 1 | 100% |")
    # the agreement of the two methods on this token: the same numbers computed here from the points
    occ, grad = (next(p for p in points if p.method == m and p.baseline == "mean") for m in ("occlusion", "gradient"))
    agree = {(r["family"], r["baseline"]): r for r in agreement(points)}
    assert agree[("all", "mean")]["same_top"] == float(occ.top_box == grad.top_box)
    assert agree[("all", "mean")]["spearman"] == pytest.approx(spearman(occ.scores, grad.scores))


def test_spearman_equals_scipys():
    from scipy.stats import spearmanr

    from asymspec_mm.eval.pointing_game import spearman

    x = (0.5, -1.0, 2.0, 2.0, 0.0, 3.5, 0.5)
    y = (1.0, 0.0, 1.5, 3.0, -2.0, 2.0, 0.25)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert spearman(x, x) == pytest.approx(1.0) and spearman(x, (1.0,) * 7) == 0.0
