"""Train the bundled ``tiny`` pair from scratch on MiniVista (CPU).

    python -m asymspec_mm.tiny.train --out DIR

1. A byte-level BPE tokenizer (``checkpoints.build_tokenizer``) on the MiniVista training corpus;
   every colour, shape, option letter and number 0..180 is a single token (checked).
2. A Qwen3-VL drafter and a Qwen3 verifier (several times the drafter's text parameters) built
   by ``checkpoints.drafter_config`` / ``verifier_config`` from that tokenizer.
3. Training data from the MiniVista generator (seed ``TRAIN_SEED``, a fresh problem each time),
   tokenized with :func:`asymspec_mm.prompts.build_prompts` -- exactly what the pipeline feeds the
   models at inference. Loss on the answer tokens only (the reference response + ``<|im_end|>``).
   The drafter trains on both of its views (image+text full view and text-only compressed view);
   the verifier on the compressed view only.
4. The two models train in two worker processes (one CPU thread each), in parallel, for a fixed
   number of steps with fixed seeds; at ``--drafter-widen-at`` the drafter waits for the verifier to
   finish and takes the freed core (``--threads``); each logs teacher-forced accuracies on a held-out slice
   (exact = greedy would reproduce the reference; dec = the decisive token; fin = the final answer
   token) and saves its checkpoint every ``--eval-every`` steps.
   - verifier: ``--verifier-steps`` at ``--verifier-lr``, then a second phase (fresh schedule,
     ``--verifier-phase2-steps`` at ``--verifier-phase2-lr``) with the final answer token weighted x4;
   - drafter: ``--drafter-phases`` (each a fresh schedule from the previous checkpoint, with its own
     problem mix): full view (+2 captioning examples) with the decisive token weighted x8, a quarter
     batch of the compressed view, short dense descriptions of the same images ("bars: red 9, ...") so
     the vision path gets a signal at every position, a throwaway linear probe that makes each merged
     vision token tell its colour and bar value / shape, and the LM head trained at every layer's
     image positions to name the colour each image token shows. All of them read one vision-tower
     pass a step (``shared_vision_step``).
5. ``save_pair`` writes ``DIR/drafter`` and ``DIR/verifier``; a greedy evaluation of each model
   alone is printed at the end (``--eval-n``).

``--only``, ``--phase2-only`` and ``--drafter-resume-from`` continue a run from the checkpoints in
``DIR/_work`` (see README.md beside this file), and ``--export-from DIR/_work`` exports the latest
checkpoints without training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..eval import minivista as mv
from . import IMAGE_SIZE

EVAL_START = 100_000  # monitoring slice of the held-out seed, far from the indices results.py uses
PAD_LABEL = -100


# ---------------------------------------------------------------------------------------------
# Tokenizer, processor, configs
# ---------------------------------------------------------------------------------------------


def build_tokenizer_and_processor(vocab_size: int = 768):
    from ..checkpoints import build_processor, build_tokenizer

    from captioning.captioner import CAPTION_PROMPT

    texts = mv.corpus(3000, mv.TRAIN_SEED) + ["user\nassistant\n"] * 200 + [CAPTION_PROMPT] * 100
    tok = build_tokenizer(texts, vocab_size=vocab_size)
    proc = build_processor(tok, min_pixels=IMAGE_SIZE * IMAGE_SIZE, max_pixels=IMAGE_SIZE * IMAGE_SIZE)
    check_single_tokens(tok)
    return tok, proc


def check_single_tokens(tok) -> None:
    words = [" " + c for c in mv.COLORS] + [c.capitalize() for c in mv.COLORS] + [" " + s for s in mv.SHAPES] + [f" {i}" for i in range(181)] + list("ABCD")
    bad = [w for w in words if len(tok(w, add_special_tokens=False)["input_ids"]) != 1]
    if bad:
        raise RuntimeError(f"not single tokens: {bad}")


DRAFTER_KW = dict(hidden_size=96, num_layers=4, num_heads=3, head_dim=32, intermediate_size=256, vision_depth=3, vision_hidden=128, deepstack=(0,))
DRAFTER_DECISIVE_WEIGHT = 8.0
PERCEPTION_BATCH = 16  # auxiliary dense-description examples per drafter step (short sequences)
IMAGE_COLOUR_WEIGHT = 0.3  # the LM head at image positions names the colour there (image_position_loss)
# The drafter's phases, "steps:lr:families[:colour weight]", each after the first from the previous phase's
# checkpoint with a fresh schedule and optimizer. Problems cycle through the listed families ("all": the
# generator's own rotation by problem index); the colour weight defaults to IMAGE_COLOUR_WEIGHT. The shipped
# drafter's recipe: a first phase without the colour loss, half of it visual questions (the lookup of the
# leftmost / rightmost shape forms in this phase or not at all), two chart-heavy phases with the colour loss
# (the third also reads the charts of `mixed`), and a short last one that shows every family again (without
# it the drafter's two views disagree on geometry, and fusion outvotes the verifier there).
DRAFTER_PHASES = "1200:2e-3:visual,figure,visual,geometry:0;800:1.5e-3:figure,figure,visual;600:1e-3:figure,figure,visual,mixed;300:1e-3:figure,visual,geometry,mixed"
# The verifier: two phases (the second with the final answer token weighted), its problems cycling through
# VERIFIER_MIX. With `mixed` in the rotation, lr 2.5e-3 (the three-family recipe) left it stuck at a loss of
# ~0.5 (it learned nothing, geometry included, in 1,100 steps); at 1.2e-3 it learns. `mixed` comes twice:
# two arithmetic formats share " - " and " = ", and the verifier has to master both.
VERIFIER_STEPS = (1300, 600)
VERIFIER_LR = (1.2e-3, 1.0e-3)
VERIFIER_MIX = "figure,visual,geometry,mixed,mixed"
# The verifier's 1,900 steps take about 21 minutes on one thread; the drafter reaches this step at about the
# same time (about 0.92 s a step on one thread) and then takes both cores (about 0.74 s a step). At step 1,250
# it waited about two minutes with a core idle.
DRAFTER_WIDEN_AT = 1380
VERIFIER_FINAL_WEIGHT = 4.0  # phase 2: the final answer token (copy of the value / option lookup)
VERIFIER_KW = dict(hidden_size=160, num_layers=4, num_heads=5, head_dim=32, intermediate_size=448)


def parse_families(spec: str) -> tuple[str, ...]:
    """``"figure,mixed,mixed"`` -> ``("figure", "mixed", "mixed")``; ``"all"`` -> ``()`` (every family in turn)."""
    if spec.strip() == "all":
        return ()
    fams = tuple(f.strip() for f in spec.split(","))
    bad = [f for f in fams if f not in mv.FAMILIES]
    if bad:
        raise ValueError(f"unknown famil{'ies' if len(bad) > 1 else 'y'} {', '.join(map(repr, bad))}; choose among {', '.join(mv.FAMILIES)} or 'all'")
    return fams


def parse_phases(spec: str) -> list[tuple[int, float, tuple[str, ...], float]]:
    """``"steps:lr:fam,fam[:colour];..."`` -> ``[(steps, lr, families, colour_weight), ...]`` ('' -> none;
    families ``()`` for "all")."""
    phases = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        try:
            fields = part.split(":")
            if len(fields) not in (3, 4):
                raise ValueError
            colour = float(fields[3]) if len(fields) == 4 else IMAGE_COLOUR_WEIGHT
            steps, lr = int(fields[0]), float(fields[1])
        except ValueError:
            raise ValueError(f"bad drafter phase {part!r}: expected steps:lr:family,family,...[:colour weight]") from None
        try:
            fams = parse_families(fields[2])
        except ValueError as exc:
            raise ValueError(f"bad drafter phase {part!r}: {exc}") from None
        if steps <= 0 or colour < 0:
            raise ValueError(f"bad drafter phase {part!r}: steps must be > 0 and the colour weight >= 0")
        phases.append((steps, lr, fams, colour))
    return phases


def build_models(tok, seed: int = 0):
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from ..checkpoints import drafter_config, verifier_config

    torch.manual_seed(seed)
    drafter = Qwen3VLForConditionalGeneration(drafter_config(tok, **DRAFTER_KW))
    torch.manual_seed(seed + 1)
    verifier = Qwen3ForCausalLM(verifier_config(tok, **VERIFIER_KW))
    return drafter, verifier


def n_params(model) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n or n.startswith("visual.") or "model.visual" in n)
    return {"total": total, "vision": vis, "text": total - vis}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def mixed_answer_ids(tok) -> list[int]:
    """Token ids of every answer a ``mixed`` problem can have (`` 1`` .. `` 17``, single tokens)."""
    return [tok(f" {k}", add_special_tokens=False)["input_ids"][0] for k in mv.MIXED_ANSWERS]


def encode(problem: dict[str, Any], proc, tok) -> dict[str, Any]:
    """Token ids of the three prompts (via build_prompts) and the answer, for one problem."""
    from ..prompts import build_prompts

    pr = build_prompts(proc, tok, problem["decoded_image"], mv.view_text(problem), problem["query"], "image+text")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ans = tok(problem["response"], add_special_tokens=False)["input_ids"] + [eos]
    dec_idx = mv.decisive_token_index(problem, tok)
    mixed = mv.family_of(problem) == "mixed"
    return {
        "full": pr.drafter_full_ids[0],
        "comp": pr.drafter_comp_ids[0],
        "ver": pr.verifier_ids[0],
        "pixel_values": pr.pixel_values,
        "grid": pr.image_grid_thw,
        "mm": pr.mm_token_type_ids[0],
        "ans": torch.tensor(ans, dtype=torch.long),
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

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": CAPTION_PROMPT}]}]
    text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = proc(text=[text], images=[problem["decoded_image"]], return_tensors="pt")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ans = tok(problem["caption"], add_special_tokens=False)["input_ids"] + [eos]
    return {"full": enc["input_ids"][0], "pixel_values": enc["pixel_values"], "grid": enc["image_grid_thw"],
            "mm": enc["mm_token_type_ids"][0], "ans": torch.tensor(ans, dtype=torch.long), "family": "caption",
            "tok_targets": token_targets(problem), "problem": problem}


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
    target of the language-model head at the image positions (see :func:`image_position_loss`)."""
    ids = [tok(" " + c, add_special_tokens=False)["input_ids"][0] for c in mv.COLORS]
    cls = token_targets(problem)[:, 0]
    out = torch.full_like(cls, PAD_LABEL)
    for k, tid in enumerate(ids):
        out[cls == k] = tid
    return out


class LayerTap:
    """Forward hooks that keep the outputs of the drafter's text decoder layers during one forward."""

    def __init__(self, model):
        lm = model.model.language_model
        self.model, self.out = model, []
        self.handles = [layer.register_forward_hook(self._keep) for layer in lm.layers[:-1]]  # the last one is the logits

    def _keep(self, module, args, output) -> None:
        self.out.append(output[0] if isinstance(output, tuple) else output)

    def clear(self) -> None:
        self.out = []


def image_position_loss(logits: torch.Tensor, batch: dict[str, Any], tap: LayerTap | None = None) -> torch.Tensor:
    """Cross-entropy of the drafter's own LM head at the image-token positions against the colour word
    each token shows, on the final logits and (``tap``) on every earlier layer's output read through the
    final norm and the LM head. Those positions' logits are otherwise unused; the loss makes the text
    model carry the colour at the image positions, from the first layers on, in the form the answer
    needs (the word's embedding), which the answer position then only has to copy by attention.
    Without it the text model never read colour (it read bar heights, shapes and positions)."""
    labels = batch.get("img_labels")
    if labels is None or not bool((labels != PAD_LABEL).any()):
        return logits.sum() * 0.0
    mask = labels != PAD_LABEL
    target = labels[mask]
    losses = [torch.nn.functional.cross_entropy(logits[mask].float(), target)]
    if tap is not None:
        lm = tap.model.model.language_model
        for h in tap.out:
            losses.append(torch.nn.functional.cross_entropy(tap.model.lm_head(lm.norm(h[mask])).float(), target))
        tap.clear()
    return torch.stack(losses).mean()


def probe_loss(probe: torch.nn.Linear, feats: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a linear probe on merged vision tokens ``feats`` ``[N, hidden]`` against
    ``targets`` ``[N, 3]`` (colour class, attribute class, side class; -100 ignored), summed over the three.
    A throwaway head: it trains the tower to put colour, bar value / shape kind and the side of the scene
    into the very token the text model attends to."""
    logits = probe(feats)  # [N, N_PROBE_CLASSES]
    loss = logits.sum() * 0.0
    start = 0
    for k, n in enumerate((N_COLOR_CLASSES, N_ATTR_CLASSES, N_SIDE_CLASSES)):
        if bool((targets[:, k] != PAD_LABEL).any()):
            loss = loss + torch.nn.functional.cross_entropy(logits[:, start : start + n], targets[:, k], ignore_index=PAD_LABEL)
        start += n
    return loss


def _perception_answer(problem: dict[str, Any], tok) -> torch.Tensor:
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return torch.tensor(tok(perception_target(problem), add_special_tokens=False)["input_ids"] + [eos], dtype=torch.long)


def encode_perception(problem: dict[str, Any], proc, tok) -> dict[str, Any]:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PERCEPTION_PROMPT}]}]
    text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = proc(text=[text], images=[problem["decoded_image"]], return_tensors="pt")
    return {"full": enc["input_ids"][0], "pixel_values": enc["pixel_values"], "grid": enc["image_grid_thw"],
            "mm": enc["mm_token_type_ids"][0], "ans": _perception_answer(problem, tok), "family": "perception",
            "img_targets": image_colour_targets(problem, tok)}


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
    return {"full": ids, "pixel_values": encoded["pixel_values"], "grid": encoded["grid"], "mm": mm,
            "ans": _perception_answer(encoded["problem"], tok), "family": "perception", "img_targets": encoded["img_targets"]}


def collate(examples: list[dict[str, Any]], view: str, pad_id: int, dec_weight: float = 1.0, final_weight: float = 1.0) -> dict[str, Any]:
    """Right-padded batch of prompt+answer for ``view`` in {"full", "comp", "ver"}; labels on answers only.

    The drafter's views (``full``, ``comp``) of a ``mixed`` problem weight the two bar readings by
    ``dec_weight`` and have no label at the computed numbers (the result and the final answer); those
    positions go to ``batch["flat"]`` (rows, label positions, candidate ids) for :func:`flat_loss`: the
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
    batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "labels": labels, "ans_start": ans_start, "weights": weights, "flat": flat}
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
        batch["pixel_values"] = torch.cat([e["pixel_values"] for e in examples])
        batch["image_grid_thw"] = torch.cat([e["grid"] for e in examples])
    return batch


def model_inputs(batch: dict[str, Any], with_pixels: bool = True) -> dict[str, Any]:
    """The forward's inputs; ``with_pixels=False`` when the vision features are passed in instead."""
    keys = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
    return {k: batch[k] for k in keys if k in batch and (with_pixels or k != "pixel_values")}


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over answer tokens; ``weights`` ([B, L], aligned with labels) reweights tokens."""
    if weights is None:
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=PAD_LABEL)
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=PAD_LABEL, reduction="none")
    w = weights[:, 1:].reshape(-1) * (labels[:, 1:].reshape(-1) != PAD_LABEL)
    return (ce * w).sum() / w.sum()


def flat_loss(logits: torch.Tensor, flat: tuple[list[int], list[int], list[list[int]]]) -> torch.Tensor:
    """Mean KL(uniform over the candidates || model) at the label positions ``flat`` = (rows, positions,
    candidate ids) of a batch (logits ``[B, L, V]``; the prediction for position p is read at p - 1);
    0 where the model puts all its mass evenly on the candidates. A zero tensor when there are none."""
    rows, pos, cand = flat
    if not rows:
        return logits.new_zeros((), dtype=torch.float32)
    logp = torch.log_softmax(logits[rows, [q - 1 for q in pos]].float(), dim=-1)  # [N, V]
    return torch.stack([-logp[n, c].mean() - math.log(len(c)) for n, c in enumerate(cand)]).mean()


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
        out = []
        for _ in range(n):
            fam = self.mix[self.n % len(self.mix)]
            out.append(encode(mv.make_problem(mv.TRAIN_SEED, self.i, fam), self.proc, self.tok))
            self.i += self.stride
            self.n += 1
        return out


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def teacher_forced(model, examples: list[dict[str, Any]], view: str, pad_id: int, bs: int = 32) -> dict[str, dict[str, float]]:
    """Per family: exact (greedy would reproduce the reference), dec (decisive token), final (answer token)."""
    model.eval()
    stats: dict[str, dict[str, list[float]]] = {}
    for s in range(0, len(examples), bs):
        chunk = examples[s : s + bs]
        batch = collate(chunk, view, pad_id)
        logits = model(**model_inputs(batch), use_cache=False).logits
        pred = logits.argmax(-1)
        for i, e in enumerate(chunk):
            p0 = batch["ans_start"][i]
            n = len(e["ans"])
            got = pred[i, p0 - 1 : p0 - 1 + n]
            ok = got == e["ans"]
            st = stats.setdefault(e["family"], {"exact": [], "dec": [], "final": []})
            st["exact"].append(float(ok.all()))
            if e["dec_idx"] is not None:
                st["dec"].append(float(ok[e["dec_idx"]]))
            st["final"].append(float(ok[e["final_idx"]]))
    model.train()
    return {f: {k: (sum(v) / len(v) if v else float("nan")) for k, v in st.items()} for f, st in sorted(stats.items())}


def fmt_tf(res: dict[str, dict[str, float]]) -> str:
    return " ".join(f"{f[:3]}:ex{r['exact']:.2f}/dec{r['dec']:.2f}/fin{r['final']:.2f}" for f, r in res.items())


@torch.no_grad()
def greedy(model, prompt: dict[str, Any], eos_id: int, max_new: int = 32) -> list[int]:
    """Greedy decoding of one prompt without a cache (tiny models; prompt: model inputs, batch 1)."""
    ids = prompt["input_ids"]
    extra = {k: v for k, v in prompt.items() if k not in ("input_ids", "mm_token_type_ids")}
    mm = prompt.get("mm_token_type_ids")
    out: list[int] = []
    for _ in range(max_new):
        kw = dict(extra, input_ids=ids, use_cache=False)
        if mm is not None:
            kw["mm_token_type_ids"] = torch.cat([mm, torch.zeros((1, ids.shape[1] - mm.shape[1]), dtype=mm.dtype)], 1)
        nxt = int(model(**kw).logits[0, -1].argmax())
        if nxt == eos_id:
            break
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return out


def greedy_accuracy(model, problems: list[dict[str, Any]], view: str, proc, tok) -> dict[str, float]:
    """Accuracy of one model alone (greedy) per family; view in {"full", "comp", "ver"}."""
    from ..prompts import build_prompts

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.eval()
    hits: dict[str, list[float]] = {}
    for p in problems:
        pr = build_prompts(proc, tok, p["decoded_image"], mv.view_text(p), p["query"], "image+text")
        if view == "full":
            inp = dict(input_ids=pr.drafter_full_ids, pixel_values=pr.pixel_values, image_grid_thw=pr.image_grid_thw, mm_token_type_ids=pr.mm_token_type_ids)
        else:
            inp = dict(input_ids=pr.drafter_comp_ids if view == "comp" else pr.verifier_ids)
        text = tok.decode(greedy(model, inp, eos), skip_special_tokens=True)
        hits.setdefault(mv.family_of(p), []).append(float(mv.is_correct(text, p)))
    return {f: sum(v) / len(v) for f, v in sorted(hits.items())}


def _image_subset(feats, n: int):
    """The first ``n`` images' entries of ``get_image_features``' output (per-image tuples)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    sub = BaseModelOutputWithDeepstackFeatures(pooler_output=feats.pooler_output[:n])
    sub.deepstack_features = [layer[:n] for layer in feats.deepstack_features]
    return sub


def shared_vision_step(model, probe: torch.nn.Linear, tap: LayerTap | None, ex: list[dict[str, Any]], caps: list[dict[str, Any]],
                       proc, tok, pad_id: int, colour_weight: float, n_perception: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The drafter's losses with one vision-tower pass: the full-view batch (``ex`` + ``caps``), the dense
    descriptions of the first ``n_perception`` of the same images, and the token probe all read the same
    merged tokens (gradients from all three meet in the tower). Returns (loss, parts); the caller steps.
    Replaces two extra tower passes a step (a separate description batch and a separate probe batch),
    which were about half of the step's cost."""
    bf = collate(ex + caps, "full", pad_id, dec_weight=DRAFTER_DECISIVE_WEIGHT)
    feats = model.model.get_image_features(bf["pixel_values"], bf["image_grid_thw"], return_dict=True)
    if tap is not None:
        tap.clear()
    logits = model(**model_inputs(bf, with_pixels=False), mm_encoder_outputs={"image": feats}, use_cache=False).logits
    lf = lm_loss(logits, bf["labels"], bf["weights"])
    li = image_position_loss(logits, bf, tap)
    lt = probe_loss(probe, torch.cat(feats.pooler_output), torch.cat([e["tok_targets"] for e in ex + caps]))
    lflat = flat_loss(logits, bf["flat"])
    loss = 0.6 * (lf + lflat) + colour_weight * li + lt
    parts = {"full": lf.item(), "imgcol": li.item(), "tok": lt.item(), "flat": lflat.item()}
    if n_perception:
        bp = collate([encode_perception_of(e, proc, tok) for e in ex[:n_perception]], "full", pad_id)
        if tap is not None:
            tap.clear()
        logits = model(**model_inputs(bp, with_pixels=False), mm_encoder_outputs={"image": _image_subset(feats, n_perception)}, use_cache=False).logits
        lp = lm_loss(logits, bp["labels"])
        loss = loss + 0.5 * lp + colour_weight * image_position_loss(logits, bp, tap)
        parts["perc"] = lp.item()
    bc = collate(ex[: len(ex) // 4], "comp", pad_id)
    logits = model(**model_inputs(bc), use_cache=False).logits
    lc = lm_loss(logits, bc["labels"]) + flat_loss(logits, bc["flat"])
    parts["comp"] = lc.item()
    return loss + 0.4 * lc, parts


# ---------------------------------------------------------------------------------------------
# Training workers
# ---------------------------------------------------------------------------------------------


def lr_at(step: int, steps: int, lr: float, warmup: int = 100) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _widen(widen: tuple[int, int, Any]) -> None:
    """Wait for the other worker to finish (``widen[2]``, an event), then take ``widen[1]`` threads."""
    widen[2].wait()
    torch.set_num_threads(widen[1])


def train_worker(role: str, workdir: str, steps: int, batch: int, lr: float, seed: int, eval_every: int, threads: int, log_path: str,
                 resume_from: int = 0, mix: tuple[str, ...] | None = None, image_colour_weight: float = 0.0,
                 widen: tuple[int, int, Any] | None = None) -> None:
    """Train one model (``role`` in {"drafter", "verifier"}) and save it to ``workdir/role``.

    ``resume_from`` > 0 continues from the saved checkpoint (a later phase: fresh problems, schedule and
    optimizer). ``widen = (at_step, threads, event)``: at global step ``at_step`` wait for ``event`` (the
    other worker has finished) and go on with ``threads`` threads. The step is fixed rather than "as soon
    as the core is free" because the thread count changes float rounding: a fixed step keeps runs
    reproducible on any machine."""
    from transformers import AutoTokenizer, Qwen3VLProcessor

    torch.set_num_threads(threads)
    if widen is not None and resume_from >= widen[0]:
        _widen(widen)
    torch.manual_seed(seed)
    log = open(log_path, "a", buffering=1)
    tok = AutoTokenizer.from_pretrained(Path(workdir) / "tokenizer")
    proc = Qwen3VLProcessor.from_pretrained(Path(workdir) / "processor")
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    drafter, verifier = build_models(tok, seed)
    model = drafter if role == "drafter" else verifier
    del drafter, verifier
    if resume_from:  # a second phase: continue from the saved checkpoint, fresh problems, fresh schedule
        model = type(model).from_pretrained(Path(workdir) / role)
        seed += resume_from
        torch.manual_seed(seed)
    model.train()
    params = list(model.parameters())
    probe = None
    if role == "drafter":
        probe = torch.nn.Linear(model.config.text_config.hidden_size, N_PROBE_CLASSES)
        params += list(probe.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    tap = LayerTap(model) if role == "drafter" and image_colour_weight else None
    # the two workers draw disjoint problems from the training stream
    stream = Stream(proc, tok, start=(0 if role == "drafter" else 1) + 2 * batch * resume_from, stride=2, mix=mix)
    evals = [encode(p, proc, tok) for p in mv.generate(120, mv.HELDOUT_SEED, start=EVAL_START)]
    t0 = time.time()
    for step in range(steps):
        if widen is not None and resume_from + step == widen[0] and step:
            _widen(widen)
            print(f"[{role}] step {resume_from + step}: {widen[1]} threads from here", file=log)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr)
        if role == "verifier":
            b = collate(stream.take(batch), "ver", pad_id, final_weight=VERIFIER_FINAL_WEIGHT if resume_from else 1.0)
            loss = lm_loss(model(**model_inputs(b), use_cache=False).logits, b["labels"], b["weights"])
            parts = {"ver": loss.item()}
        else:
            ex = stream.take(batch)
            caps = [encode_caption(mv.make_problem(mv.TRAIN_SEED, 10_000_000 + step * 2 + j), proc, tok) for j in range(2)]
            loss, parts = shared_vision_step(model, probe, tap, ex, caps, proc, tok, pad_id, image_colour_weight, min(PERCEPTION_BATCH, len(ex)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(f"[{role}] step {resume_from + step} t={time.time() - t0:.0f}s " + " ".join(f"{k}={v:.3f}" for k, v in parts.items()), file=log)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            views = ["ver"] if role == "verifier" else ["full", "comp"]
            for v in views:
                print(f"[{role}] EVAL step {resume_from + step + 1} t={time.time() - t0:.0f}s {v}: {fmt_tf(teacher_forced(model, evals, v, pad_id))}", file=log)
            model.save_pretrained(Path(workdir) / role)
    model.save_pretrained(Path(workdir) / role)
    print(f"[{role}] done in {time.time() - t0:.0f}s", file=log)


def _drafter_phases(work: str, args, log_path: str, phases: list[tuple[int, float, tuple[str, ...], float]], start: int, widen=None) -> None:
    """Each phase in turn, the first from scratch (or, ``start`` > 0, from the checkpoint trained that many
    steps), the others from the previous phase's checkpoint."""
    for steps, lr, mix, colour in phases:
        train_worker("drafter", work, steps, args.batch, lr, args.seed, args.eval_every, 1, log_path,
                     resume_from=start, mix=mix or None, image_colour_weight=colour, widen=widen)
        start += steps


def _verifier_phases(work: str, args, log_path: str, done=None) -> None:
    """The verifier's phase 1 (unless ``--phase2-only``) and phase 2; sets ``done`` at the end (the drafter
    then takes the freed core)."""
    try:
        if not args.phase2_only:
            train_worker("verifier", work, args.verifier_steps, args.batch, args.verifier_lr, args.seed, args.eval_every, 1, log_path,
                         mix=args.verifier_mix)
        if args.verifier_phase2_steps:
            train_worker("verifier", work, args.verifier_phase2_steps, args.batch, args.verifier_phase2_lr, args.seed, args.eval_every, 1, log_path,
                         resume_from=args.verifier_steps, mix=args.verifier_mix)
    finally:  # also on failure: the drafter must not wait for ever (main stops it)
        if done is not None:
            done.set()


def export_pair(work: Path, out: Path):
    """Write ``out/drafter`` and ``out/verifier`` (save_pair) from the workers' latest checkpoints in ``work``."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    from ..checkpoints import save_pair

    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    proc = Qwen3VLProcessor.from_pretrained(work / "processor")
    drafter = Qwen3VLForConditionalGeneration.from_pretrained(work / "drafter")
    verifier = Qwen3ForCausalLM.from_pretrained(work / "verifier")
    save_pair(drafter, verifier, tok, proc, out)
    return drafter, verifier, tok, proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (DIR/drafter, DIR/verifier)")
    ap.add_argument("--verifier-steps", type=int, default=VERIFIER_STEPS[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--verifier-lr", type=float, default=VERIFIER_LR[0])
    ap.add_argument("--verifier-mix", default=VERIFIER_MIX, help="families the verifier's problems cycle through ('all': each in turn) [default: %(default)s]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=768)
    ap.add_argument("--eval-every", type=int, default=250, help="steps between teacher-forced evaluations and checkpoints")
    ap.add_argument("--eval-n", type=int, default=90, help="greedy evaluation problems at the end (0: skip)")
    ap.add_argument("--log", default=None, help="log file (default: stdout only)")
    ap.add_argument("--verifier-phase2-steps", type=int, default=VERIFIER_STEPS[1], help="second verifier phase (fresh schedule, final token weighted)")
    ap.add_argument("--verifier-phase2-lr", type=float, default=VERIFIER_LR[1])
    ap.add_argument("--phase2-only", action="store_true", help="run only the verifier's second phase (its phase-1 checkpoint is in DIR/_work)")
    ap.add_argument("--drafter-phases", default=DRAFTER_PHASES,
                    help="the drafter's phases, 'steps:lr:families[:colour weight];...' (colour weight of the loss at the image "
                         f"positions, default {IMAGE_COLOUR_WEIGHT}; families 'all': the generator's rotation) [default: %(default)s]")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads in all: one for the verifier, the rest for the drafter [default: %(default)s]")
    ap.add_argument("--drafter-widen-at", type=int, default=DRAFTER_WIDEN_AT,
                    help="drafter step from which it waits for the verifier to finish and then takes all --threads (a fixed step, so "
                         "that runs are reproducible) [default: %(default)s]")
    ap.add_argument("--drafter-resume-from", type=int, default=0,
                    help="start the drafter from its checkpoint in DIR/_work trained this many steps, then run --drafter-phases")
    ap.add_argument("--only", choices=("drafter", "verifier"), default=None, help="train one model (the other's checkpoint must already be in DIR/_work)")
    ap.add_argument("--export-from", default=None, help="only export the latest checkpoints of a run's _work dir to --out")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.drafter_widen_at < 0:
        ap.error(f"--threads must be >= 1 and --drafter-widen-at >= 0 (got {args.threads}, {args.drafter_widen_at})")
    try:
        args.verifier_mix = parse_families(args.verifier_mix) or None
    except ValueError as e:
        ap.error(f"--verifier-mix: {e}")
    if args.export_from:
        export_pair(Path(args.export_from), Path(args.out))
        return 0

    import multiprocessing as mp

    out = Path(args.out)
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    log_path = args.log or str(work / "train.log")
    t0 = time.time()
    if (work / "tokenizer").is_dir() and (work / "processor").is_dir():  # resume: keep the run's vocabulary
        from transformers import AutoTokenizer, Qwen3VLProcessor

        tok = AutoTokenizer.from_pretrained(work / "tokenizer")
        proc = Qwen3VLProcessor.from_pretrained(work / "processor")
    else:
        tok, proc = build_tokenizer_and_processor(args.vocab_size)
        tok.save_pretrained(work / "tokenizer")
        proc.save_pretrained(work / "processor")
    d, v = build_models(tok, args.seed)
    sizes = {"vocab": len(tok), "drafter": n_params(d), "verifier": n_params(v)}
    with open(log_path, "a") as f:
        print(f"sizes {json.dumps(sizes)} args {vars(args)}", file=f)
    del d, v
    ctx = mp.get_context("spawn")
    verifier_done = ctx.Event()
    procs = []
    if args.only in (None, "verifier") or args.phase2_only:
        procs.append(ctx.Process(target=_verifier_phases, args=(str(work), args, log_path, verifier_done)))
    else:
        verifier_done.set()
    if args.only in (None, "drafter") and not args.phase2_only:
        try:
            later = parse_phases(args.drafter_phases)
        except ValueError as exc:
            ap.error(str(exc))
        widen = (args.drafter_widen_at, args.threads, verifier_done)
        procs.append(ctx.Process(target=_drafter_phases, args=(str(work), args, log_path, later, args.drafter_resume_from, widen)))
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):  # one failed worker stops the run (no waiting for the other's hours)
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.terminate()
        time.sleep(1)
    if any(p.exitcode != 0 for p in procs):
        print("a training worker failed; see", log_path, file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    drafter, verifier, tok, proc = export_pair(work, out)
    train_s = time.time() - t0
    report = {"sizes": sizes, "train_seconds": round(train_s), "args": vars(args)}
    if args.eval_n:
        probs = mv.generate(args.eval_n, mv.HELDOUT_SEED, start=EVAL_START)
        report["greedy"] = {
            "verifier (floor)": greedy_accuracy(verifier, probs, "ver", proc, tok),
            "drafter full": greedy_accuracy(drafter, probs, "full", proc, tok),
            "drafter comp": greedy_accuracy(drafter, probs, "comp", proc, tok),
        }
    (out / "train_report.json").write_text(json.dumps(report, indent=1))
    with open(log_path, "a") as f:
        print(f"REPORT {json.dumps(report)}", file=f)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
