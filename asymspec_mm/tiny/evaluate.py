"""Evaluation of one tiny model alone during and after training: teacher-forced accuracies on encoded
examples (the training log's EVAL lines) and greedy accuracy on problems."""

from __future__ import annotations

from typing import Any

import torch

from ..eval import minivista as mv
from .data import collate, model_inputs


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
    """:func:`teacher_forced`'s result on one log line (``fig:ex0.94/dec0.97/fin1.00 ...``)."""
    return " ".join(f"{f[:3] if f in mv.FAMILIES else f}:ex{r['exact']:.2f}/dec{r['dec']:.2f}/fin{r['final']:.2f}" for f, r in res.items())


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
    from ..request.prompts import build_prompts

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.eval()
    hits: dict[str, list[float]] = {}
    for p in problems:
        pr = build_prompts(proc, tok, p["decoded_image"], mv.view_text(p), p["query"], "image+text")
        if view == "full":
            inp = dict(
                input_ids=pr.drafter_full_ids,
                pixel_values=pr.pixel_values,
                image_grid_thw=pr.image_grid_thw,
                mm_token_type_ids=pr.mm_token_type_ids,
            )
        else:
            inp = dict(input_ids=pr.drafter_comp_ids if view == "comp" else pr.verifier_ids)
        text = tok.decode(greedy(model, inp, eos), skip_special_tokens=True)
        hits.setdefault(mv.family_of(p), []).append(float(mv.is_correct(text, p)))
    return {f: sum(v) / len(v) for f, v in sorted(hits.items())}
