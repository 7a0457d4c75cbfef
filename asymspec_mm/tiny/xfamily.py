"""Train the ``tiny-xfamily`` verifier: the tiny verifier's recipe with a tokenizer of another family (issue #44).

    python -m asymspec_mm.tiny.xfamily --out DIR      # DIR/verifier; about 20 minutes on one CPU thread

The ``tiny-xfamily`` pair is the ``tiny`` preset's drafter as it ships (byte-level BPE, Qwen's special tokens and
templates) and this verifier, whose tokenizer is :func:`asymspec_mm.checkpoints.xfamily.build_tokenizer_xfamily`
(SentencePiece-style BPE with byte fallback, Llama-3's special tokens and chat template, 1,573 tokens against the
drafter's 755) trained on the same MiniVista corpus. The two vocabularies meet only through the map of identical bytes
(:mod:`asymspec_mm.base.vocab_map`); the tokenizer is built so that every answer tokenizes to the same bytes in both
(checked when it is built, :func:`check_answers_aligned`).

The recipe is ``train.py``'s verifier, unchanged but for the tokenizer: the same sizes (``models.VERIFIER_KW``), the
same problems (seed ``TRAIN_SEED``, the odd indices, families cycling through ``VERIFIER_MIX``), 1,300 steps at lr
1.2e-3 then 600 at 1.0e-3 with the final answer token weighted x4, batch 16, AdamW, the same schedule and init seed.
Its prompt is the compressed view through its own chat template (``build_prompts``' verifier prompt), its target the
reference answer and ``<|eot_id|>``. Only the verifier's prompt is encoded (no image is processed), so a step costs
less than in ``train.py``. Every ``--eval-every`` steps the log gets the teacher-forced accuracies of the held-out
monitoring slice (``ex`` / ``dec`` / ``fin`` as in ``train_log.txt``) and the checkpoint is saved to ``DIR/_work``; at
the end ``DIR/verifier`` is exported and the verifier's greedy accuracy alone (Floor) on ``--eval-n`` held-out
problems is logged.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..eval import minivista as mv
from ..frontend.help import terminal_text
from . import PRESET_DIR
from .data import collate, model_inputs
from .evaluate import fmt_tf, greedy, teacher_forced
from .losses import lm_loss
from .models import VERIFIER_KW, check_single_tokens
from .runs import EVAL_START, MONITOR_N, save_checkpoint
from .train import VERIFIER_FINAL_WEIGHT, VERIFIER_LR, VERIFIER_MIX, VERIFIER_STEPS, lr_at, parse_families

XFAMILY_DIR = PRESET_DIR.parent / "tiny-xfamily"
XFAMILY_VERIFIER_DIR = XFAMILY_DIR / "verifier"
VERIFIER_SEED = 1  # train.build_models seeds the verifier with seed + 1 (seed 0)


# ---------------------------------------------------------------------------------------------
# The tokenizer and the examples
# ---------------------------------------------------------------------------------------------


def build_verifier_tokenizer(drafter_tokenizer: Any = None) -> Any:
    """The second family's tokenizer on the MiniVista training corpus (3,000 problems, as the drafter's). Raises
    RuntimeError when a decisive word is not one token (``models.check_single_tokens``) or, given the drafter's
    tokenizer, when an answer does not tokenize to the same bytes in both (:func:`check_answers_aligned`)."""
    from ..checkpoints.xfamily import build_tokenizer_xfamily

    tok = build_tokenizer_xfamily(mv.corpus(3000, mv.TRAIN_SEED))
    check_single_tokens(tok)
    if drafter_tokenizer is not None:
        check_answers_aligned(drafter_tokenizer, tok, mv.generate(200, mv.TRAIN_SEED))
    return tok


def mapped_ids(drafter_tokenizer: Any, verifier_tokenizer: Any, text: str) -> list[int]:
    """``text``'s drafter ids carried through the vocabulary map to verifier ids (-1 where a token is outside the
    map's set)."""
    from ..base.vocab_map import vocab_map

    m = vocab_map(drafter_tokenizer, verifier_tokenizer)
    return [m.to_verifier[i] for i in drafter_tokenizer(text, add_special_tokens=False)["input_ids"]]


def check_answers_aligned(drafter_tokenizer: Any, verifier_tokenizer: Any, problems: list[dict[str, Any]]) -> None:
    """Raise RuntimeError unless each problem's reference answer tokenizes, in the verifier's vocabulary, to exactly
    the drafter's tokens carried through the map: the loop on the map's set can then write every answer with the
    tokens each model would pick itself."""
    bad = [
        p["response"]
        for p in problems
        if mapped_ids(drafter_tokenizer, verifier_tokenizer, p["response"])
        != verifier_tokenizer(p["response"], add_special_tokens=False)["input_ids"]
    ]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(problems)} answers tokenize differently through the map (first: {bad[0]!r})")


def verifier_prompt_ids(problem: dict[str, Any], tok) -> torch.Tensor:
    """``[L]`` ids of the verifier's prompt: the compressed view and the question through ``tok``'s chat template,
    tokenized as ``request.prompts.build_prompts`` does (its ``verifier_ids[0]``, without processing the image)."""
    from ..request.prompts import compressed_user_text, verifier_chat_text

    text = verifier_chat_text(tok, compressed_user_text(mv.view_text(problem), problem["query"]))
    return torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def encode_verifier(problem: dict[str, Any], tok) -> dict[str, Any]:
    """One verifier example: ``ver`` ``[L]`` prompt ids, ``ans`` ``[n]`` the answer's ids then the end of turn, the
    decisive and final token positions in ``ans``, the family (what ``data.collate`` and ``teacher_forced`` read) and
    the problem."""
    ans = tok(problem["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return {
        "ver": verifier_prompt_ids(problem, tok),
        "ans": torch.tensor(ans, dtype=torch.long),
        "dec_idx": mv.decisive_token_index(problem, tok),
        "final_idx": len(ans) - 3,
        "family": mv.family_of(problem),
        "problem": problem,
    }


class VerifierStream:
    """The tiny verifier's training problems (seed ``TRAIN_SEED``, indices ``start, start + 2, ...``, the n-th of
    family ``mix[n % len(mix)]``), encoded for this tokenizer: ``train.py``'s verifier stream, problem for problem."""

    def __init__(self, tok, start: int, mix: tuple[str, ...]):
        self.tok, self.i, self.n, self.mix = tok, start, 0, mix

    def take(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` problems, encoded (:func:`encode_verifier`)."""
        out = []
        for _ in range(n):
            out.append(encode_verifier(mv.make_problem(mv.TRAIN_SEED, self.i, self.mix[self.n % len(self.mix)]), self.tok))
            self.i += 2
            self.n += 1
        return out


# ---------------------------------------------------------------------------------------------
# Training and export
# ---------------------------------------------------------------------------------------------


def build_verifier(tok, seed: int = VERIFIER_SEED):
    """A freshly initialised ``Qwen3ForCausalLM`` of the tiny verifier's sizes over ``tok``'s vocabulary."""
    from transformers import Qwen3ForCausalLM

    from ..checkpoints.xfamily import xfamily_verifier_config

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(xfamily_verifier_config(tok, **VERIFIER_KW))


def train_phase(work: Path, tok, steps: int, lr: float, resume_from: int, final_weight: float, args: argparse.Namespace, log) -> None:
    """One phase of the recipe: from scratch (``resume_from`` 0) or from ``work/verifier``, ``steps`` steps at ``lr``
    (warmup, cosine), saved to ``work/verifier`` at every evaluation and at the end."""
    from transformers import Qwen3ForCausalLM

    model = build_verifier(tok, args.seed + 1) if not resume_from else Qwen3ForCausalLM.from_pretrained(work / "verifier")
    torch.manual_seed(args.seed + resume_from)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    stream = VerifierStream(tok, 1 + 2 * args.batch * resume_from, args.verifier_mix)
    evals = [encode_verifier(p, tok) for p in mv.generate(args.monitor_n, mv.HELDOUT_SEED, start=EVAL_START)]
    pad = tok.pad_token_id
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr)
        b = collate(stream.take(args.batch), "ver", pad, final_weight=final_weight)
        loss = lm_loss(model(**model_inputs(b), use_cache=False).logits, b["labels"], b["weights"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(f"[verifier] step {resume_from + step} t={time.time() - t0:.0f}s ver={loss.item():.3f}", file=log)
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            res = fmt_tf(teacher_forced(model, evals, "ver", pad))
            print(f"[verifier] EVAL step {resume_from + step + 1} t={time.time() - t0:.0f}s ver: {res}", file=log)
            save_checkpoint(model, work / "verifier")
    print(f"[verifier] phase done in {time.time() - t0:.0f}s", file=log)


def export_verifier(work: Path, out: Path) -> tuple[Any, Any]:
    """Write ``out`` (a ``from_pretrained`` folder: fp32 safetensors, config, generation config, tokenizer and chat
    template) from ``work``'s latest checkpoint and tokenizer; returns (model, tokenizer)."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from ..checkpoints.xfamily import generation_config_json

    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    model = Qwen3ForCausalLM.from_pretrained(work / "verifier")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(generation_config_json(tok))
    return model, tok


def floor_accuracy(model, tok, problems: list[dict[str, Any]], max_new: int = 40) -> dict[str, float]:
    """The verifier alone (greedy, its own prompt and tokenizer, stop at its end of turn), accuracy per family."""
    model.eval()
    hits: dict[str, list[float]] = {}
    for p in problems:
        ids = greedy(model, {"input_ids": verifier_prompt_ids(p, tok)[None]}, tok.eos_token_id, max_new)
        hits.setdefault(mv.family_of(p), []).append(float(mv.is_correct(tok.decode(ids, skip_special_tokens=True), p)))
    return {f: sum(v) / len(v) for f, v in sorted(hits.items())}


def main(argv: list[str] | None = None) -> int:
    """The command (options: ``--help``); 0 when the verifier is exported."""
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (DIR/verifier; the run's checkpoints in DIR/_work)")
    ap.add_argument("--steps", type=int, default=VERIFIER_STEPS[0], help="phase 1 steps [default: %(default)s]")
    ap.add_argument("--lr", type=float, default=VERIFIER_LR[0], help="phase 1 learning rate [default: %(default)s]")
    ap.add_argument(
        "--phase2-steps", type=int, default=VERIFIER_STEPS[1], help="phase 2 steps, final token weighted [default: %(default)s]"
    )
    ap.add_argument("--phase2-lr", type=float, default=VERIFIER_LR[1], help="phase 2 learning rate [default: %(default)s]")
    ap.add_argument("--phase2-only", action="store_true", help="run only phase 2, from the phase-1 checkpoint in DIR/_work")
    ap.add_argument("--verifier-mix", default=VERIFIER_MIX, help="families the problems cycle through [default: %(default)s]")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="the verifier is initialised with seed + 1, as in train.py")
    ap.add_argument("--eval-every", type=int, default=250, help="steps between teacher-forced evaluations and checkpoints")
    ap.add_argument("--eval-n", type=int, default=90, help="held-out problems of the final greedy check (0: skip)")
    ap.add_argument(
        "--monitor-n", type=int, default=MONITOR_N, help="held-out problems the teacher-forced EVAL lines score [default: %(default)s]"
    )
    ap.add_argument("--threads", type=int, default=1, help="CPU threads [default: %(default)s]")
    ap.add_argument("--log", default=None, help="log file (default: DIR/_work/train.log)")
    args = ap.parse_args(argv)
    if min(args.steps, args.batch, args.eval_every, args.threads, args.monitor_n) < 1 or args.phase2_steps < 0:
        ap.error("--steps, --batch, --eval-every, --threads and --monitor-n must be >= 1 and --phase2-steps >= 0")
    try:
        args.verifier_mix = parse_families(args.verifier_mix) or mv.FAMILIES
    except ValueError as e:
        ap.error(f"--verifier-mix: {e}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    log = open(args.log or work / "train.log", "a", buffering=1)
    t0 = time.time()
    if (work / "tokenizer").is_dir():  # resume: keep the run's vocabulary
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    else:
        from transformers import AutoTokenizer

        from . import DRAFTER_DIR

        tok = build_verifier_tokenizer(AutoTokenizer.from_pretrained(DRAFTER_DIR))
        tok.save_pretrained(work / "tokenizer")
    n_params = sum(p.numel() for p in build_verifier(tok).parameters())
    print(f"sizes {json.dumps({'vocab': len(tok), 'verifier': n_params})} args {vars(args)}", file=log)
    if not args.phase2_only:
        train_phase(work, tok, args.steps, args.lr, 0, 1.0, args, log)
    if args.phase2_steps:
        train_phase(work, tok, args.phase2_steps, args.phase2_lr, args.steps, VERIFIER_FINAL_WEIGHT, args, log)
    model, tok = export_verifier(work, out / "verifier")
    report: dict[str, Any] = {"vocab": len(tok), "params": n_params, "train_seconds": round(time.time() - t0)}
    if args.eval_n:
        report["greedy"] = {"verifier (floor)": floor_accuracy(model, tok, mv.generate(args.eval_n, mv.HELDOUT_SEED, start=EVAL_START))}
    print(f"REPORT {json.dumps(report)}", file=log)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
