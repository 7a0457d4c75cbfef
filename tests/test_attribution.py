"""Region attribution of the drafter's steering (``pipe.attribute``) on the shipped tiny pair.

The batched occlusion is checked against an independent slow path: the drafter's full view prefilled from scratch
through the normal single-row engine with masked features built here by hand, one mask at a time; the unmasked numbers
against what the decoder itself wrote into the trace.
"""

from __future__ import annotations

import pytest
import torch

from asymspec_mm.attribution import NothingToAttributeError, region_cells, spans
from asymspec_mm.engines.single import TextEngine, VLEngine
from asymspec_mm.eval.minivista import HELDOUT_SEED, make_problem


def test_spans_cut_evenly_longer_runs_first():
    assert spans(4, 8) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert spans(5, 2) == [(0, 3), (3, 5)]
    assert spans(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert spans(16, 4) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    with pytest.raises(ValueError):
        spans(0, 2)


def test_region_cells_map_merged_patches_to_original_pixels():
    # 4x4 merged patches of a 128x128 image: one region per patch, 32 px each
    cells = region_cells(4, 4, 8, (128, 128))
    assert [c.box for c in cells[:5]] == [(0, 0, 32, 32), (32, 0, 64, 32), (64, 0, 96, 32), (96, 0, 128, 32), (0, 32, 32, 64)]
    assert [c.tokens for c in cells[:2]] == [(0,), (1,)] and cells[-1].tokens == (15,)
    # 5 rows x 3 cols of merged patches grouped 2x2 over a 300x100 original (the processor resized it): rows 0-2 and
    # 3-4, columns 0-1 and 2; boxes scale each axis on its own (x: 100 px a column, y: 20 px a row)
    cells = region_cells(5, 3, 2, (300, 100))
    assert [(c.row, c.col, c.box) for c in cells] == [
        (0, 0, (0, 0, 200, 60)),
        (0, 1, (200, 0, 300, 60)),
        (1, 0, (0, 60, 200, 100)),
        (1, 1, (200, 60, 300, 100)),
    ]
    assert cells[0].tokens == (0, 1, 3, 4, 6, 7) and cells[3].tokens == (11, 14)
    # every merged patch lies in exactly one region
    big = region_cells(17, 23, 8, (1000, 700))
    assert sorted(t for c in big for t in c.tokens) == list(range(17 * 23)) and len(big) == 64


@pytest.fixture(scope="module")
def figure(shipped_tiny):
    """A held-out bar-chart problem and the tiny pair's AsymSpec answer to it."""
    p = make_problem(HELDOUT_SEED, 1, "figure")
    res = shipped_tiny.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"])
    return p, res


def _reference_a(pipe, res, position: int, image_index: int, tokens: tuple[int, ...], mix: float = 1.0) -> torch.Tensor:
    """The drafter's full-view logits at ``position`` with ``tokens`` of image ``image_index`` moved ``mix`` of the way
    to that image's mean feature (1: set to it; deepstack layers too), through a fresh :class:`VLEngine` prefill: the
    slow path."""
    p = res.prompts
    feats, _ = pipe.encoder.encode(p.pixel_values, p.image_grid_thw)
    idx = list(tokens)

    def masked(x: torch.Tensor, i: int) -> torch.Tensor:
        x = x.clone()
        if i == image_index and idx:
            x[idx] = x[idx] + mix * (x.mean(0) - x[idx])
        return x

    from vision_cache.features import VisionFeatures

    hidden = VisionFeatures(
        tuple(masked(e, i) for i, e in enumerate(feats.embeds)),
        tuple(tuple(masked(x, i) for i, x in enumerate(layer)) for layer in feats.deepstack),
        feats.image_grid_thw,
    )
    answer = torch.tensor(_drafter_answer(res, position), dtype=torch.long)
    ids = torch.cat([p.drafter_full_ids[0], answer])
    types = torch.cat([p.mm_token_type_ids[0], torch.zeros_like(answer)])
    engine = VLEngine(pipe.drafter, "reference")
    engine.prefill_features(ids[:-1], types, hidden)
    return engine.extend(ids[-1:])[-1].float()


def _drafter_answer(res, position: int) -> list[int]:
    """The answer's first ``position`` tokens in the drafter's ids, as the decoder recorded them (a cross-family pair's
    trace holds both ids of each token)."""
    return [e.token_id if e.drafter_token_id is None else e.drafter_token_id for e in res.trace[:position]]


def _reference_b(pipe, res, position: int) -> torch.Tensor:
    answer = torch.tensor(_drafter_answer(res, position), dtype=torch.long)
    engine = VLEngine(pipe.drafter, "reference_comp")
    ids = torch.cat([res.prompts.drafter_comp_ids[0], answer])
    engine.prefill(ids[:-1])
    return engine.extend(ids[-1:])[-1].float()


def test_batched_occlusion_equals_the_single_engine_with_masked_features(shipped_tiny, figure):
    _, res = figure
    pos = next(i for i, ev in enumerate(res.trace) if ev.steered or ev.source == "fused")
    att = shipped_tiny.attribute(res, pos, grid=8)
    tok = att.token_id
    assert tok == res.trace[pos].token_id and att.method == "occlusion" and att.baseline == "mean"
    assert len(att.regions) == 16 and att.images[0].shape == (4, 4) and att.images[0].size == (128, 128)
    b = _reference_b(shipped_tiny, res, pos)
    a0 = _reference_a(shipped_tiny, res, pos, 0, ())
    assert att.delta == pytest.approx(float(a0[tok] - b[tok]), abs=1e-4)
    for region in (att.regions[0], att.regions[7], att.regions[-1]):
        row, col = region.cell
        a = _reference_a(shipped_tiny, res, pos, 0, (row * 4 + col,))
        assert region.delta == pytest.approx(float(a[tok] - b[tok]), abs=1e-4)
        assert region.score == pytest.approx(float(a0[tok] - a[tok]), abs=1e-4)
        assert region.draft == int(a.argmax())
    # scores are best first
    assert [r.score for r in att.regions] == sorted((r.score for r in att.regions), reverse=True)


def test_unmasked_numbers_equal_the_decoders_trace(shipped_tiny, figure):
    _, res = figure
    accepted = [i for i, ev in enumerate(res.trace) if ev.source == "accepted"][:3]
    assert accepted
    for pos in accepted:
        ev, att = res.trace[pos], shipped_tiny.attribute(res, pos, grid=4)
        assert att.draft == ev.token_id and att.accepted
        assert att.p_verifier == pytest.approx(ev.p_verifier, rel=1e-4, abs=1e-6)
        assert att.p_base == pytest.approx(ev.p_base, rel=1e-4, abs=1e-6)
        assert att.jsd == pytest.approx(ev.jsd, rel=1e-3, abs=1e-6)
        assert att.fused == pytest.approx(att.delta * res.config.beta + float(_verifier_logit(shipped_tiny, res, pos)), abs=1e-3)


def _verifier_logit(pipe, res, position: int) -> float:
    answer = torch.tensor([e.token_id for e in res.trace[:position]], dtype=torch.long)
    ids = torch.cat([res.prompts.verifier_ids[0], answer])
    engine = TextEngine(pipe.verifier, "reference_verifier")
    engine.prefill(ids[:-1])
    return float(engine.extend(ids[-1:])[-1][res.trace[position].token_id])


def test_the_same_result_gives_the_same_map(shipped_tiny, figure):
    _, res = figure
    first = shipped_tiny.attribute(res, 1, grid=8)
    again = shipped_tiny.attribute(res, 1, grid=8)
    assert [(r.box, r.score, r.draft, r.accepted) for r in first.regions] == [(r.box, r.score, r.draft, r.accepted) for r in again.regions]
    zero = shipped_tiny.attribute(res, 1, grid=8, baseline="zero")
    assert zero.baseline == "zero" and zero.delta == first.delta
    assert [r.score for r in zero.regions] != [r.score for r in first.regions]


def test_gradient_scores_are_the_first_order_change_of_the_drafters_logit(shipped_tiny, figure):
    """``method="gradient"``: each region's score is the derivative of ``a[token]`` along the move of its features
    towards the baseline, which a small finite move through the slow path measures independently."""
    _, res = figure
    pos = next(i for i, ev in enumerate(res.trace) if ev.steered or ev.source == "fused")
    att = shipped_tiny.attribute(res, pos, method="gradient", grid=8)
    occ = shipped_tiny.attribute(res, pos, grid=8)
    assert att.method == "gradient" and att.delta == pytest.approx(occ.delta, abs=1e-4) and att.draft == occ.draft
    assert len(att.regions) == 16 and att.timings["masks"] == 0
    tok, eps = att.token_id, 1e-2
    a0 = _reference_a(shipped_tiny, res, pos, 0, ())
    for region in (att.regions[0], att.regions[-1]):
        row, col = region.cell
        moved = _reference_a(shipped_tiny, res, pos, 0, (row * 4 + col,), mix=eps)
        assert region.score == pytest.approx(float(a0[tok] - moved[tok]) / eps, rel=0.05, abs=2e-3)
        assert region.delta == pytest.approx(att.delta - region.score, abs=1e-5)
    steps = []
    shipped_tiny.attribute(res, pos, method="gradient", grid=8, progress=lambda done, total: steps.append((done, total)))
    assert steps == [(0, 16), (16, 16)]


def test_progress_reports_each_batch_and_an_exception_in_it_stops_the_call(shipped_tiny, figure):
    _, res = figure
    steps = []
    shipped_tiny.attribute(res, 1, grid=8, batch=5, progress=lambda done, total: steps.append((done, total)))
    assert steps == [(0, 16), (4, 16), (9, 16), (14, 16), (16, 16)]  # the first batch also holds the unmasked row

    class Stop(Exception):
        pass

    def stop_after_first(done: int, total: int) -> None:
        if done:
            raise Stop

    with pytest.raises(Stop):
        shipped_tiny.attribute(res, 1, grid=8, batch=5, progress=stop_after_first)


def test_a_cross_family_result_is_attributed_in_the_verifiers_ids(figure):
    """``tiny-xfamily`` (two vocabularies): the drafter's streams re-read the answer in the drafter's ids, the gate
    runs in the verifier's; the unmasked numbers equal the trace's and a masked region's delta the slow path's."""
    from asymspec_mm import AsymSpecPipeline

    xfamily = AsymSpecPipeline.from_preset("tiny-xfamily", ocr="none")
    p, _ = figure
    res = xfamily.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], max_new_tokens=4)
    assert res.trace[0].drafter_token_id is not None
    pos = next(i for i, ev in enumerate(res.trace) if ev.source == "accepted" and i > 0)
    ev, att = res.trace[pos], xfamily.attribute(res, pos, grid=8)
    assert att.token_id == ev.token_id and att.draft == ev.token_id and att.accepted  # the verifier's id
    assert att.p_verifier == pytest.approx(ev.p_verifier, rel=1e-4, abs=1e-6)
    assert att.p_base == pytest.approx(ev.p_base, rel=1e-4, abs=1e-6)
    assert att.jsd == pytest.approx(ev.jsd, rel=1e-3, abs=1e-6)
    d_tok = ev.drafter_token_id
    b = _reference_b(xfamily, res, pos)
    region = att.regions[0]
    a = _reference_a(xfamily, res, pos, 0, (region.cell[0] * 4 + region.cell[1],))
    assert region.delta == pytest.approx(float(a[d_tok] - b[d_tok]), abs=1e-4)
    assert xfamily.attribute(res, pos, method="gradient", grid=8).delta == pytest.approx(att.delta, abs=1e-4)


def test_the_tower_runs_once_per_image(shipped_tiny, figure):
    _, res = figure
    before = shipped_tiny.encoder.tower_calls
    for pos in range(3):
        shipped_tiny.attribute(res, pos, grid=8)
    assert shipped_tiny.encoder.tower_calls == before  # cached since the answer's own prefill


def test_a_conversations_images_each_get_their_regions(shipped_tiny):
    p1, p2 = make_problem(HELDOUT_SEED, 1, "figure"), make_problem(HELDOUT_SEED, 2, "visual")
    wide = p2["decoded_image"].resize((256, 128))
    messages = [
        {"role": "user", "content": [{"type": "image", "image": p1["decoded_image"]}, {"type": "text", "text": p1["query"]}]},
        {"role": "assistant", "content": "The answer is (A)."},
        {"role": "user", "content": [{"type": "image", "image": wide}, {"type": "text", "text": p2["query"]}]},
    ]
    res = shipped_tiny.chat(
        messages, caption=[p1["caption"], p2["caption"]], ocr=[p1["ocr"] or False, p2["ocr"] or False], max_new_tokens=8
    )
    att = shipped_tiny.attribute(res, 1, grid=8)
    assert [g.size for g in att.images] == [(128, 128), (256, 128)]
    by_image = {i: [r for r in att.regions if r.image_index == i] for i in (0, 1)}
    assert len(by_image[0]) == 16 and len(by_image[1]) == att.images[1].shape[0] * att.images[1].shape[1]
    assert max(r.box[2] for r in by_image[1]) == 256 and max(r.box[3] for r in by_image[1]) == 128
    # one mask of the second image against the slow path
    region = by_image[1][0]
    rows, cols = att.images[1].merged
    assert att.images[1].shape == (rows, cols)  # fewer merged patches than 8 a side: one region each
    a = _reference_a(shipped_tiny, res, 1, 1, (region.cell[0] * cols + region.cell[1],))
    b = _reference_b(shipped_tiny, res, 1)
    assert region.delta == pytest.approx(float(a[att.token_id] - b[att.token_id]), abs=1e-4)


def test_a_scheduler_result_attributes_like_generate(shipped_tiny, figure):
    p, res = figure
    sched = shipped_tiny.scheduler(max_batch_size=2)
    try:
        served = sched.submit(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"]).result()
    finally:
        sched.close()
    assert served.token_ids == res.token_ids
    a, b = shipped_tiny.attribute(served, 1, grid=8), shipped_tiny.attribute(res, 1, grid=8)
    assert [r.box for r in a.regions] == [r.box for r in b.regions]
    assert [r.score for r in a.regions] == pytest.approx([r.score for r in b.regions], abs=1e-5)


def test_nothing_to_attribute_is_one_line(shipped_tiny, figure):
    p, _ = figure
    floor = shipped_tiny.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method="floor", max_new_tokens=4)
    with pytest.raises(NothingToAttributeError, match="nothing to attribute") as err:
        shipped_tiny.attribute(floor, 0)
    assert "\n" not in str(err.value)
    text = shipped_tiny.chat([{"role": "user", "content": "What is 2 + 3?"}], max_new_tokens=4)
    with pytest.raises(NothingToAttributeError, match="no image") as err:
        shipped_tiny.attribute(text, 0)
    assert "\n" not in str(err.value)


def test_bad_arguments_are_named(shipped_tiny, figure):
    _, res = figure
    with pytest.raises(ValueError, match="outside the answer"):
        shipped_tiny.attribute(res, len(res.trace))
    with pytest.raises(ValueError, match="unknown masking baseline 'blur'"):
        shipped_tiny.attribute(res, 0, baseline="blur")
    with pytest.raises(ValueError, match="unknown attribution method"):
        shipped_tiny.attribute(res, 0, method="gradcam")
    with pytest.raises(ValueError, match="'occlusion', 'gradient'"):
        shipped_tiny.attribute(res, 0, method="rollout")
