"""The tiny pair's training examples: MiniVista problems encoded as the pipeline's prompts plus the answer
(and the drafter's auxiliary captioning and description tasks), the vision probe's per-token targets,
right-padded batches, and the stream of fresh training problems."""

from __future__ import annotations

from typing import Any

import torch

from ..eval import minivista as mv

PAD_LABEL = -100


def answer_ids(text: str, tok) -> torch.Tensor:
    """``[n]`` long tensor: the target answer ``text`` as token ids, then ``<|im_end|>``."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return torch.tensor(tok(text, add_special_tokens=False)["input_ids"] + [eos], dtype=torch.long)


def _image_prompt(problem: dict[str, Any], proc, prompt: str) -> dict[str, Any]:
    """The drafter's chat prompt of the problem's image and the instruction ``prompt``: ``full`` ``[L]``
    ids, ``mm`` ``[L]`` token types, ``pixel_values`` and ``grid`` (``[1, 3]``) as the processor gives them."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = proc(text=[text], images=[problem["decoded_image"]], return_tensors="pt")
    return {
        "full": enc["input_ids"][0],
        "pixel_values": enc["pixel_values"],
        "grid": enc["image_grid_thw"],
        "mm": enc["mm_token_type_ids"][0],
    }


def mixed_answer_ids(tok) -> list[int]:
    """Token ids of every answer a ``mixed`` problem can have (`` 1`` .. `` 17``, single tokens)."""
    return [tok(f" {k}", add_special_tokens=False)["input_ids"][0] for k in mv.MIXED_ANSWERS]


def prompt_fields(pr) -> dict[str, Any]:
    """An example's prompt entries from a request's :class:`~asymspec_mm.request.prompts.Prompts`: the three views' ids
    (``full``, ``comp``, ``ver``, each ``[L]``), ``pixel_values``, ``grid`` (``[n_images, 3]``) and ``mm`` (``[L]``)."""
    return {
        "full": pr.drafter_full_ids[0],
        "comp": pr.drafter_comp_ids[0],
        "ver": pr.verifier_ids[0],
        "pixel_values": pr.pixel_values,
        "grid": pr.image_grid_thw,
        "mm": pr.mm_token_type_ids[0],
    }


def encode(problem: dict[str, Any], proc, tok) -> dict[str, Any]:
    """Token ids of the three prompts (via build_prompts) and the answer, for one problem."""
    from ..request.prompts import build_prompts

    pr = build_prompts(proc, tok, problem["decoded_image"], mv.view_text(problem), problem["query"], "image+text")
    ans = answer_ids(problem["response"], tok)
    dec_idx = mv.decisive_token_index(problem, tok)
    mixed = mv.family_of(problem) == "mixed"
    return {
        **prompt_fields(pr),
        "ans": ans,
        "dec_idx": dec_idx,
        # mixed: the drafter learns the two readings (weighted like a decisive token); at the computed
        # numbers (the result and the final answer) its target is flat over every possible answer
        "read_idx": mv.reading_token_indices(problem, tok),
        "flat_idx": [dec_idx, len(ans) - 3] if mixed else [],
        "flat_ids": mixed_answer_ids(tok) if mixed else [],
        "final_idx": len(ans) - 3,
        "family": mv.family_of(problem),
        "img_targets": image_colour_targets(problem, tok),
        "tok_targets": token_targets(problem),
        "problem": problem,
    }


def encode_caption(problem: dict[str, Any], proc, tok) -> dict[str, Any]:
    """The drafter's captioning task (the pipeline's DrafterCaptioner prompt -> the generator's caption)."""
    from captioning.captioner import CAPTION_PROMPT

    return {
        **_image_prompt(problem, proc, CAPTION_PROMPT),
        "ans": answer_ids(problem["caption"], tok),
        "family": "caption",
        "tok_targets": token_targets(problem),
        "problem": problem,
    }


PERCEPTION_PROMPT = "Describe the image."


def perception_target(problem: dict[str, Any]) -> str:
    """A dense description of what only the pixels show (an auxiliary drafter task: every token depends
    on the image, so the vision path learns from every position rather than one token in sixteen)."""
    fam, sc = mv.family_of(problem), problem["scene"]
    if fam in mv.CHART_FAMILIES:
        return "bars: " + ", ".join(f"{c} {v}" for c, v in zip(sc["colors"], sc["values"])) + "."
    if fam == "visual":
        items = sorted(zip(sc["cells"], sc["kinds"], sc["colors"]), key=lambda t: (t[0] % 4, t[0] // 4))
        return f"{len(items)} shapes: " + ", ".join(f"{c} {k} {cell % 4}" for cell, k, c in items) + "."
    return "angles: " + ", ".join(f"{v} {sc['angles'][v]}" for v in "ABC") + "."


GRID = 4  # 128x128 image, patch 16, merge 2 -> 4x4 merged image tokens, raster order
N_COLOR_CLASSES = len(mv.COLORS) + 1  # + "nothing here"
N_ATTR_CLASSES = 9 + len(mv.SHAPES) + 1  # bar value 1..9 | shape kind | "no shape"
# visual: a shape in the leftmost occupied column | in the rightmost | in both (all shapes in one column) |
# neither (another shape, or an empty cell)
SIDE_LEFT, SIDE_RIGHT, SIDE_BOTH, SIDE_NONE = range(4)
N_SIDE_CLASSES = 4
N_PROBE_CLASSES = N_COLOR_CLASSES + N_ATTR_CLASSES + N_SIDE_CLASSES


def token_targets(problem: dict[str, Any]) -> torch.Tensor:
    """What each merged image token should tell, for the vision-tower probe: ``[16, 3]`` long tensor of
    (colour class, attribute class, side class) per token in raster order; -100 (ignored) for geometry,
    and for the side of a chart's tokens.

    figure and mixed (bar charts): every token of column c carries bar c's colour and value (so the tower gathers a whole bar
    into each token of its column); visual: the shape in that cell (each 32-px cell is one token), and whether
    that shape is in the leftmost or rightmost occupied column. The side is what "Which shape is furthest to
    the left?" asks: with it in the token, the answer position finds that shape by content, as it finds the
    shape a colour question names, rather than by comparing the columns of every shape."""
    fam, sc = mv.family_of(problem), problem["scene"]
    out = torch.full((GRID * GRID, 3), PAD_LABEL, dtype=torch.long)
    colors = list(mv.COLORS)
    if fam in mv.CHART_FAMILIES:
        for r in range(GRID):
            for c, (col, v) in enumerate(zip(sc["colors"], sc["values"])):
                out[r * GRID + c, :2] = torch.tensor([colors.index(col), v - 1])
    elif fam == "visual":
        out[:, 0] = len(colors)
        out[:, 1] = N_ATTR_CLASSES - 1
        out[:, 2] = SIDE_NONE
        xs = [cell % GRID for cell in sc["cells"]]
        for cell, kind, col in zip(sc["cells"], sc["kinds"], sc["colors"]):
            left, right = cell % GRID == min(xs), cell % GRID == max(xs)
            side = SIDE_BOTH if left and right else SIDE_LEFT if left else SIDE_RIGHT if right else SIDE_NONE
            out[cell] = torch.tensor([colors.index(col), 9 + mv.SHAPES.index(kind), side])
    return out


def image_colour_targets(problem: dict[str, Any], tok) -> torch.Tensor:
    """``[16]`` token ids of the colour word each image token shows (-100 where none / geometry): the
    target of the language-model head at the image positions (see :func:`.losses.image_position_loss`)."""
    ids = [tok(" " + c, add_special_tokens=False)["input_ids"][0] for c in mv.COLORS]
    cls = token_targets(problem)[:, 0]
    out = torch.full_like(cls, PAD_LABEL)
    for k, tid in enumerate(ids):
        out[cls == k] = tid
    return out


def encode_perception(problem: dict[str, Any], proc, tok) -> dict[str, Any]:
    """The drafter's description task (:data:`PERCEPTION_PROMPT` -> :func:`perception_target`), with the
    colour words at the image positions as targets."""
    return {
        **_image_prompt(problem, proc, PERCEPTION_PROMPT),
        "ans": answer_ids(perception_target(problem), tok),
        "family": "perception",
        "img_targets": image_colour_targets(problem, tok),
    }


_PERCEPTION_PROMPTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def encode_perception_of(encoded: dict[str, Any], proc, tok) -> dict[str, Any]:
    """:func:`encode_perception` for the image of an already encoded problem, without re-processing it: the
    prompt's ids depend only on the image grid (kept per grid), and the pixels are the problem's own (the
    step that uses this shares one vision-tower pass between the two batches)."""
    grid = tuple(encoded["grid"].flatten().tolist())
    if grid not in _PERCEPTION_PROMPTS:
        e = encode_perception(encoded["problem"], proc, tok)
        _PERCEPTION_PROMPTS[grid] = (e["full"], e["mm"])
    ids, mm = _PERCEPTION_PROMPTS[grid]
    return {
        "full": ids,
        "pixel_values": encoded["pixel_values"],
        "grid": encoded["grid"],
        "mm": mm,
        "ans": answer_ids(perception_target(encoded["problem"]), tok),
        "family": "perception",
        "img_targets": encoded["img_targets"],
    }


def collate(examples: list[dict[str, Any]], view: str, pad_id: int, dec_weight: float = 1.0, final_weight: float = 1.0) -> dict[str, Any]:
    """Right-padded batch of prompt+answer for ``view`` in {"full", "comp", "ver"}; labels on answers only.

    The drafter's views (``full``, ``comp``) of a ``mixed`` problem weight the two bar readings by
    ``dec_weight`` and have no label at the computed numbers (the result and the final answer); those
    positions go to ``batch["flat"]`` (rows, label positions, candidate ids) for :func:`.losses.flat_loss`: the
    drafter is taught to read the chart, and that it cannot do the sum, in both views alike. (A drafter
    trained on the arithmetic learned it, so AsymSpec could not beat it; one never taught anything after
    the readings disagreed with itself across views there, and delta outvoted the verifier.)"""
    seqs = [torch.cat([e[view], e["ans"]]) for e in examples]
    L = max(len(s) for s in seqs)
    B = len(seqs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    labels = torch.full((B, L), PAD_LABEL, dtype=torch.long)
    weights = torch.ones((B, L))
    ans_start, flat = [], ([], [], [])
    for i, (e, s) in enumerate(zip(examples, seqs)):
        n, p = len(s), len(e[view])
        ids[i, :n] = s
        mask[i, :n] = 1
        labels[i, p:n] = e["ans"]
        if e.get("final_idx") is not None:
            weights[i, p + e["final_idx"]] = final_weight
        if e.get("dec_idx") is not None:
            weights[i, p + e["dec_idx"]] = dec_weight
        if view != "ver" and e.get("read_idx"):
            weights[i, [p + j for j in e["read_idx"]]] = dec_weight
        if view != "ver" and e.get("flat_idx"):
            for j in e["flat_idx"]:
                labels[i, p + j] = PAD_LABEL
                flat[0].append(i), flat[1].append(p + j), flat[2].append(e["flat_ids"])
        ans_start.append(p)
    batch: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "ans_start": ans_start,
        "weights": weights,
        "flat": flat,
    }
    if view == "full":
        mm = torch.zeros((B, L), dtype=torch.long)
        for i, e in enumerate(examples):
            mm[i, : len(e["mm"])] = e["mm"]
        batch["mm_token_type_ids"] = mm
        img_labels = torch.full((B, L), PAD_LABEL, dtype=torch.long)
        for i, e in enumerate(examples):
            if e.get("img_targets") is not None:
                pos = (e["mm"] == 1).nonzero().flatten()
                if len(pos) == len(e["img_targets"]):
                    img_labels[i, pos] = e["img_targets"]
        batch["img_labels"] = img_labels
        with_images = [e for e in examples if e["pixel_values"] is not None]  # text-only requests have none
        if with_images:
            batch["pixel_values"] = torch.cat([e["pixel_values"] for e in with_images])
            batch["image_grid_thw"] = torch.cat([e["grid"] for e in with_images])
    return batch


def model_inputs(batch: dict[str, Any], with_pixels: bool = True) -> dict[str, Any]:
    """The forward's inputs; ``with_pixels=False`` when the vision features are passed in instead."""
    keys = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    return {k: batch[k] for k in keys if k in batch and (with_pixels or k != "pixel_values")}


class Stream:
    """Fresh training problems (seed TRAIN_SEED, indices ``start, start + stride, ...``), encoded on
    demand; the n-th problem taken is of family ``mix[n % len(mix)]`` (default: every family in turn;
    e.g. ``("figure", "figure", "visual", "geometry")`` for twice as many charts). The family follows
    the stream's own count, not the problem index: with ``stride`` 2 an index rotation would give each
    worker only every other family."""

    def __init__(self, proc, tok, start: int = 0, stride: int = 1, mix: tuple[str, ...] | None = None):
        self.proc, self.tok, self.i, self.stride, self.n = proc, tok, start, stride, 0
        self.mix = tuple(mix) if mix else mv.FAMILIES

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` problems, encoded (:func:`encode`)."""
        out = []
        for _ in range(n):
            fam = self.mix[self.n % len(self.mix)]
            out.append(encode(mv.make_problem(mv.TRAIN_SEED, self.i, fam), self.proc, self.tok))
            self.i += self.stride
            self.n += 1
        return out
