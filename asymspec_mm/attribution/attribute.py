"""``pipe.attribute(result, position)``: which image regions the drafter's steering at one emitted token came from.

For the token at ``position`` of a finished AsymSpec answer, the committed prefix is held fixed; the verifier's
logits ``t`` and the drafter's compressed-view logits ``b`` there do not read the image and are computed once; the
drafter's full-view logits ``a`` are recomputed with each region of each image masked (:mod:`.occlusion`). A
region's score is how much ``delta[token] = (a - b)[token]`` falls when it is hidden (positive: the region pushed
towards the token). Each region also records the fused score ``t + beta * delta`` at the token and what the gate
decides about the drafter's draft (``argmax a``) without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ..base.errors import AsymSpecError
from ..base.gate import context_gain, fusion_logits, gate_step
from ..core.loop_client import model_call
from .gradient import token_gradient_scores
from .occlusion import BASELINES, Mask, full_view_input, occluded_logits
from .regions import Box, merged_shape, region_cells

#: ``occlusion``: a forward of the full view per region (measured); ``gradient``: gradient x input on the vision
#: features, one forward and one backward whatever the grid (a first-order estimate of occlusion's scores).
METHODS = ("occlusion", "gradient")


class NothingToAttributeError(AsymSpecError):
    """A result whose tokens no image steered (text-only, Floor, SD, the drafter alone, a cross-family pair)."""


class Region(NamedTuple):
    """One image region's share in the steering of the token: ``box`` in the original image's pixels, ``score`` =
    the drop of ``delta[token]`` when it is masked; ``delta`` / ``fused``: ``delta[token]`` and ``(t + beta *
    delta)[token]`` with it masked; ``draft``: the drafter's draft then (``argmax a``) and ``accepted``: whether
    the gate accepts it; ``emitted``: whether the position would still emit the token; ``cell``: ``(row, col)`` in
    the image's region grid."""

    box: Box
    score: float
    image_index: int
    cell: tuple[int, int]
    delta: float
    fused: float
    draft: int
    accepted: bool
    emitted: bool


@dataclass
class ImageGrid:
    """The region grid of one image: ``size`` ``(W, H)`` of the original image, ``shape`` ``(rows, cols)`` of
    regions, ``merged`` ``(rows, cols)`` of merged patches."""

    image_index: int
    size: tuple[int, int]
    shape: tuple[int, int]
    merged: tuple[int, int]


@dataclass
class Attribution:
    """Where the steering of one emitted token came from.

    ``regions``: every region of every image, best first (highest score); ``images``: each image's grid;
    ``delta`` / ``fused`` / ``draft`` / ``accepted``: the same numbers with nothing masked (``accepted``: the gate's
    decision on the drafter's draft); ``p_verifier`` / ``p_base``: softmax(t) and softmax(b) at the token and
    ``jsd``: JSD(a, b) there, as the trace reports them; ``timings``: seconds of each phase.
    """

    position: int
    token_id: int
    token: str
    source: str
    method: str
    baseline: str
    grid: int
    delta: float
    fused: float
    draft: int
    accepted: bool
    regions: list[Region]
    images: list[ImageGrid]
    p_verifier: float = 0.0
    p_base: float = 0.0
    jsd: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    def top(self, image_index: int | None = None) -> Region:
        """The best region (of image ``image_index`` if given)."""
        return next(r for r in self.regions if image_index is None or r.image_index == image_index)

    def heat(self, image_index: int = 0) -> list[list[float]]:
        """The scores of image ``image_index`` as its region grid, ``rows x cols``."""
        shape = self.images[image_index].shape
        grid = [[0.0] * shape[1] for _ in range(shape[0])]
        for r in self.regions:
            if r.image_index == image_index:
                grid[r.cell[0]][r.cell[1]] = r.score
        return grid

    def as_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "token_id": self.token_id,
            "token": self.token,
            "source": self.source,
            "method": self.method,
            "baseline": self.baseline,
            "grid": self.grid,
            "delta": self.delta,
            "fused": self.fused,
            "draft": self.draft,
            "accepted": self.accepted,
            "p_verifier": self.p_verifier,
            "p_base": self.p_base,
            "jsd": self.jsd,
            "images": [vars(g) for g in self.images],
            "regions": [r._asdict() for r in self.regions],
            "timings": dict(self.timings),
        }


def result_images(result) -> list:
    """The images of the request ``result`` answers, loaded as the set-up loaded them (one question: its image; a
    conversation: every image of every turn, in order)."""
    from vision_cache.image import load_image

    request = result.request
    if request is None:
        return []
    if request.image is not None:
        return [load_image(request.image)]
    if request.messages:
        from ..request.conversation import parse_messages

        return [load_image(request.image_of(part.source)) for turn in parse_messages(request.messages) for part in turn.images]
    return []


def default_positions(res: Any) -> list[int]:
    """The tokens worth attributing when none are named: those the image steered (the verifier alone would have
    emitted another) or fusion emitted; without any, the drafter's accepted drafts."""
    steered = [i for i, ev in enumerate(res.trace) if ev.steered or ev.source == "fused"]
    return steered or [i for i, ev in enumerate(res.trace) if ev.source == "accepted"]


def nothing_to_attribute(pipe, result) -> str | None:
    """Why no token of ``result`` can be attributed, in one line (``"nothing to attribute: ..."``), or None when
    its tokens can be."""
    if result.method != "asymspec":
        return f"nothing to attribute: a {result.method!r} answer is not steered by the drafter's view of the image; attribute an asymspec result"
    if result.prompts is None or result.prompts.pixel_values is None:
        return "nothing to attribute: the request has no image (a text-only answer)"
    if result.config.delta == "scd":
        return "nothing to attribute: delta='scd' (t - b) does not read the image"
    if not isinstance(pipe.stream_models("asymspec")["drafter_full"], torch.nn.Module):
        return "attribution needs the drafter's full view on transformers (it is served elsewhere)"
    return None


def _checked(pipe, result, position: int, method: str, grid: int, baseline: str) -> None:
    """One-line refusals, before any model runs."""
    if method not in METHODS:
        raise AsymSpecError(f"unknown attribution method {method!r}; choose one of {METHODS}")
    if baseline not in BASELINES:
        raise AsymSpecError(f"unknown masking baseline {baseline!r}; choose one of {BASELINES}")
    if not isinstance(grid, int) or grid < 1:
        raise AsymSpecError(f"grid must be a positive integer (regions per image side), got {grid!r}")
    reason = nothing_to_attribute(pipe, result)
    if reason is not None:
        raise NothingToAttributeError(reason)
    if not 0 <= position < len(result.trace):
        raise AsymSpecError(f"position {position} is outside the answer's {len(result.trace)} tokens (0..{len(result.trace) - 1})")


@torch.no_grad()
def _stream_logits(engine, ids: torch.Tensor) -> torch.Tensor:
    """The next-token logits ``[V]`` (float32) of a fresh single-row ``engine`` after ``ids`` ``[L]``: the prompt as
    a prefill, its last token forwarded as decoding forwards a pending token."""
    engine.prefill(ids[:-1])
    return engine.extend(ids[-1:])[-1].float().cpu()


def attribute(
    pipe,
    result,
    position: int,
    method: str = "occlusion",
    grid: int = 8,
    *,
    baseline: str = "mean",
    batch: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> Attribution:
    """Attribute the token at ``position`` (0-based, an index of ``result.trace``) of an AsymSpec ``result`` to the
    regions of its images, at most ``grid x grid`` regions an image; ``method``: :data:`METHODS`; ``baseline``:
    :data:`BASELINES`; ``batch``: masks per forward. ``progress(done, total)``: called with the regions done so far
    (occlusion: after each batch; gradient: 0 then all); an exception it raises stops the call (how the inspector
    cancels). Deterministic: the same result gives the same map.

    ``gradient`` scores are first-order estimates of occlusion's (:mod:`.gradient`); each region's ``delta`` and
    ``fused`` are the estimates of those numbers with it hidden, and its ``draft``, ``accepted`` and ``emitted`` the
    unmasked ones (no masked forward runs)."""
    _checked(pipe, result, position, method, grid, baseline)
    from ..engines.single import TextEngine, VLEngine

    t0 = time.perf_counter()
    p, cfg, ev = result.prompts, result.config, result.trace[position]
    drafter = pipe.stream_models("asymspec")["drafter_full"]
    vision = drafter.config.vision_config
    merge = vision.spatial_merge_size
    # a cross-family pair decodes in the verifier's ids: the drafter's streams read the same answer in its own ids
    bridge = getattr(getattr(pipe, "models", None), "vocab", None)
    answer_v = [e.token_id for e in result.trace[:position]]
    answer = answer_v if bridge is None else bridge.drafter_ids(torch.tensor(answer_v, dtype=torch.long)).tolist()
    tok_d = ev.token_id if bridge is None else bridge.drafter_id(ev.token_id)
    if tok_d is None:
        raise AsymSpecError(f"the token at position {position} has no id in the drafter's vocabulary: it cannot be attributed")
    images = result_images(result)
    # each model call in the loop that runs the pipeline's models (a scheduler's, else its direct loop's turn)
    features, _ = model_call(pipe, lambda: pipe.encoder.encode(p.pixel_values, p.image_grid_thw))
    t_features = time.perf_counter()
    grids, masks = [], [Mask(0, ())]  # the first row masks nothing: the reference in the same batched numerics
    cells = []
    for i, thw in enumerate(p.image_grid_thw.tolist()):
        rows, cols = merged_shape(tuple(thw), merge)
        size = images[i].size if i < len(images) else (cols * merge * vision.patch_size, rows * merge * vision.patch_size)
        image_cells = region_cells(rows, cols, grid, size)
        grids.append(ImageGrid(i, tuple(size), (image_cells[-1].row + 1, image_cells[-1].col + 1), (rows, cols)))
        for c in image_cells:
            masks.append(Mask(i, c.tokens))
            cells.append((i, c))
    view = full_view_input(p.drafter_full_ids[0], p.mm_token_type_ids[0], answer, p.image_grid_thw, merge)
    tok = ev.token_id
    regions_total = len(masks) - 1

    def report(done: int, total: int) -> None:  # masks include the unmasked reference row
        if progress is not None:
            progress(max(0, done - (total - regions_total)), regions_total)

    def full_view_logits() -> tuple[torch.Tensor, Any]:
        if method == "occlusion":
            return occluded_logits(drafter, view, features, masks, baseline, batch, report), None
        report(0, len(masks))
        a0, scores = token_gradient_scores(drafter, view, features, tok_d, baseline)
        report(len(masks), len(masks))
        return a0[None], scores

    # each model call in the loop that runs the pipeline's models (a scheduler's, else its direct loop's turn)
    a, per_token = model_call(pipe, full_view_logits)
    t_masks = time.perf_counter()
    models = pipe.stream_models("asymspec")
    comp_ids = torch.cat([p.drafter_comp_ids[0].cpu(), torch.tensor(answer, dtype=torch.long)])
    b = model_call(pipe, lambda: _stream_logits(VLEngine(models["drafter_comp"], "drafter_comp"), comp_ids))
    verifier_ids = torch.cat([p.verifier_ids[0].cpu(), torch.tensor(answer_v, dtype=torch.long)])
    t = model_call(pipe, lambda: _stream_logits(TextEngine(models["verifier"], "verifier"), verifier_ids))
    t_streams = time.perf_counter()
    alone = None
    if bridge is not None:  # the gate's space: the verifier's ids, restricted to the tokens both vocabularies have
        a, b = bridge.verifier_order(a), bridge.verifier_order(b)
        t, alone = bridge.restrict(t)
    n = a.shape[0]
    b_rows, t_rows = b.expand(n, -1), t.expand(n, -1)
    drafts = a.argmax(-1)
    gated = gate_step(
        a, b_rows, t_rows, drafts, gamma=cfg.gamma, beta=cfg.beta, gate=cfg.gate, delta=cfg.delta, lam=cfg.lam,
        alone=None if alone is None else alone.expand(n),
    )  # fmt: skip
    delta = context_gain(a, b_rows, t_rows, cfg.delta)
    fused = fusion_logits(t_rows, delta, cfg.beta)
    emitted = torch.where(gated.accepted, drafts, gated.fused) == tok
    d_tok, f_tok = delta[:, tok].tolist(), fused[:, tok].tolist()
    if method == "occlusion":
        regions = [
            Region(
                c.box, d_tok[0] - d_tok[k], i, (c.row, c.col), d_tok[k], f_tok[k], int(drafts[k]), bool(gated.accepted[k]), bool(emitted[k])
            )
            for k, (i, c) in enumerate(cells, start=1)
        ]
    else:
        regions = []
        for i, c in cells:
            score = float(per_token[i][list(c.tokens)].sum())
            regions.append(
                Region(
                    c.box,
                    score,
                    i,
                    (c.row, c.col),
                    d_tok[0] - score,
                    f_tok[0] - cfg.beta * score,
                    int(drafts[0]),
                    bool(gated.accepted[0]),
                    bool(emitted[0]),
                )
            )
    regions.sort(key=lambda r: (-r.score, r.image_index, r.cell))
    t_end = time.perf_counter()
    timings = {
        "features_s": t_features - t0,
        "masked_forwards_s" if method == "occlusion" else "gradient_s": t_masks - t_features,
        "streams_s": t_streams - t_masks,
        "total_s": t_end - t0,
        "masks": float(regions_total if method == "occlusion" else 0),
    }
    return Attribution(
        position,
        tok,
        ev.text,
        ev.source,
        method,
        baseline,
        grid,
        d_tok[0],
        f_tok[0],
        int(drafts[0]),
        bool(gated.accepted[0]),
        regions,
        grids,
        float(t.softmax(-1)[tok]),
        float(b.softmax(-1)[tok]),
        float(gated.jsd[0]),
        timings,
    )
