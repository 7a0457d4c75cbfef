"""Train the bundled ``tiny`` pair from scratch on MiniVista (CPU).

    python -m asymspec_mm.tiny.train --out DIR

1. A byte-level BPE tokenizer (``checkpoints.build_tokenizer``) on the MiniVista training corpus;
   every colour, shape, option letter and number 0..180 is a single token (checked).
2. A Qwen3-VL drafter and a Qwen3 verifier (several times the drafter's text parameters) built
   by ``checkpoints.drafter_config`` / ``verifier_config`` from that tokenizer.
3. Training data from the MiniVista generator (seed ``TRAIN_SEED``, a fresh problem each time),
   tokenized with :func:`asymspec_mm.request.prompts.build_prompts` -- exactly what the pipeline feeds the
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

This module holds the recipe (phases, weights, seeds), the drafter's shared-vision step, the workers
and the command; the tokenizer and models are built in ``models.py``, the examples and batches in
``data.py``, the losses in ``losses.py`` and the accuracies in ``evaluate.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..eval import minivista as mv
from ..frontend.help import terminal_text
from .data import N_PROBE_CLASSES, Stream, collate, encode, encode_caption, encode_perception_of, model_inputs
from .evaluate import fmt_tf, teacher_forced
from .losses import LayerTap, flat_loss, image_position_loss, lm_loss, probe_loss
from .models import build_models, build_tokenizer_and_processor, load_tokenizer_and_processor, n_params
from .runs import EVAL_START, MONITOR_N, export_and_report, export_pair, run_workers, save_checkpoint

# ---------------------------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------------------------

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


def parse_families(spec: str) -> tuple[str, ...]:
    """``"figure,mixed,mixed"`` -> ``("figure", "mixed", "mixed")``; ``"all"`` -> ``()`` (every family in turn)."""
    if spec.strip() == "all":
        return ()
    fams = tuple(f.strip() for f in spec.split(","))
    bad = [f for f in fams if f not in mv.FAMILIES]
    if bad:
        raise ValueError(
            f"unknown famil{'ies' if len(bad) > 1 else 'y'} {', '.join(map(repr, bad))}; choose among {', '.join(mv.FAMILIES)} or 'all'"
        )
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


# ---------------------------------------------------------------------------------------------
# The drafter's step
# ---------------------------------------------------------------------------------------------


def _image_subset(feats, n: int):
    """The first ``n`` images' entries of ``get_image_features``' output (per-image tuples)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

    sub = BaseModelOutputWithDeepstackFeatures(pooler_output=feats.pooler_output[:n])
    sub.deepstack_features = [layer[:n] for layer in feats.deepstack_features]
    return sub


def shared_vision_step(
    model,
    probe: torch.nn.Linear | None,
    tap: LayerTap | None,
    ex: list[dict[str, Any]],
    caps: list[dict[str, Any]],
    proc,
    tok,
    pad_id: int,
    colour_weight: float,
    n_perception: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The drafter's losses with one vision-tower pass: the full-view batch (``ex`` + ``caps``), the dense
    descriptions of the first ``n_perception`` of the same images, and the token probe all read the same
    merged tokens (gradients from all three meet in the tower; ``probe=None``: no probe). Returns (loss, parts); the
    caller steps.
    Replaces two extra tower passes a step (a separate description batch and a separate probe batch),
    which were about half of the step's cost."""
    bf = collate(ex + caps, "full", pad_id, dec_weight=DRAFTER_DECISIVE_WEIGHT)
    feats = model.model.get_image_features(bf["pixel_values"], bf["image_grid_thw"], return_dict=True)
    if tap is not None:
        tap.clear()
    logits = model(**model_inputs(bf, with_pixels=False), mm_encoder_outputs={"image": feats}, use_cache=False).logits
    lf = lm_loss(logits, bf["labels"], bf["weights"])
    li = image_position_loss(logits, bf, tap)
    lt = (
        probe_loss(probe, torch.cat(feats.pooler_output), torch.cat([e["tok_targets"] for e in ex + caps]))
        if probe is not None
        else torch.zeros(())
    )
    lflat = flat_loss(logits, bf["flat"])
    loss = 0.6 * (lf + lflat) + colour_weight * li + lt
    parts = {"full": lf.item(), "imgcol": li.item(), "tok": lt.item(), "flat": lflat.item()}
    if n_perception:
        bp = collate([encode_perception_of(e, proc, tok) for e in ex[:n_perception]], "full", pad_id)
        if tap is not None:
            tap.clear()
        logits = model(
            **model_inputs(bp, with_pixels=False), mm_encoder_outputs={"image": _image_subset(feats, n_perception)}, use_cache=False
        ).logits
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
    """The learning rate at ``step`` of a phase of ``steps``: linear warmup, then cosine down to 10 % of ``lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _widen(widen: tuple[int, int, Any]) -> None:
    """Wait for the other worker to finish (``widen[2]``, an event), then take ``widen[1]`` threads."""
    widen[2].wait()
    torch.set_num_threads(widen[1])


def train_worker(
    role: str,
    workdir: str,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    eval_every: int,
    threads: int,
    log_path: str,
    resume_from: int = 0,
    mix: tuple[str, ...] | None = None,
    image_colour_weight: float = 0.0,
    widen: tuple[int, int, Any] | None = None,
    monitor_n: int = MONITOR_N,
) -> None:
    """Train one model (``role`` in {"drafter", "verifier"}) and save it to ``workdir/role``.

    ``resume_from`` > 0 continues from the saved checkpoint (a later phase: fresh problems, schedule and
    optimizer). ``widen = (at_step, threads, event)``: at global step ``at_step`` wait for ``event`` (the
    other worker has finished) and go on with ``threads`` threads. The step is fixed rather than "as soon
    as the core is free" because the thread count changes float rounding: a fixed step keeps runs
    reproducible on any machine. ``monitor_n``: held-out problems of the EVAL lines."""
    torch.set_num_threads(threads)
    log = open(log_path, "a", buffering=1)
    if widen is not None and resume_from >= widen[0]:  # a later phase past the widening step: widened from its start
        _widen(widen)
        print(f"[{role}] step {resume_from}: {widen[1]} threads from here", file=log)
    torch.manual_seed(seed)
    tok, proc = load_tokenizer_and_processor(Path(workdir))
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
    evals = [encode(p, proc, tok) for p in mv.generate(monitor_n, mv.HELDOUT_SEED, start=EVAL_START)]
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
            loss, parts = shared_vision_step(
                model, probe, tap, ex, caps, proc, tok, pad_id, image_colour_weight, min(PERCEPTION_BATCH, len(ex))
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(
                f"[{role}] step {resume_from + step} t={time.time() - t0:.0f}s " + " ".join(f"{k}={v:.3f}" for k, v in parts.items()),
                file=log,
            )
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            views = ["ver"] if role == "verifier" else ["full", "comp"]
            for v in views:
                print(
                    f"[{role}] EVAL step {resume_from + step + 1} t={time.time() - t0:.0f}s {v}: {fmt_tf(teacher_forced(model, evals, v, pad_id))}",
                    file=log,
                )
            save_checkpoint(model, Path(workdir) / role)
    save_checkpoint(model, Path(workdir) / role)
    print(f"[{role}] done in {time.time() - t0:.0f}s", file=log)


def _drafter_phases(
    work: str, args, log_path: str, phases: list[tuple[int, float, tuple[str, ...], float]], start: int, widen=None
) -> None:
    """Each phase in turn, the first from scratch (or, ``start`` > 0, from the checkpoint trained that many
    steps), the others from the previous phase's checkpoint."""
    for steps, lr, mix, colour in phases:
        train_worker(
            "drafter",
            work,
            steps,
            args.batch,
            lr,
            args.seed,
            args.eval_every,
            1,
            log_path,
            resume_from=start,
            mix=mix or None,
            image_colour_weight=colour,
            widen=widen,
            monitor_n=args.monitor_n,
        )
        start += steps


def _verifier_phases(work: str, args, log_path: str, done=None) -> None:
    """The verifier's phase 1 (unless ``--phase2-only``) and phase 2; sets ``done`` at the end (the drafter
    then takes the freed core)."""
    try:
        if not args.phase2_only:
            train_worker(
                "verifier",
                work,
                args.verifier_steps,
                args.batch,
                args.verifier_lr,
                args.seed,
                args.eval_every,
                1,
                log_path,
                mix=args.verifier_mix,
                monitor_n=args.monitor_n,
            )
        if args.verifier_phase2_steps:
            train_worker(
                "verifier",
                work,
                args.verifier_phase2_steps,
                args.batch,
                args.verifier_phase2_lr,
                args.seed,
                args.eval_every,
                1,
                log_path,
                resume_from=args.verifier_steps,
                mix=args.verifier_mix,
                monitor_n=args.monitor_n,
            )
    finally:  # also on failure: the drafter must not wait for ever (main stops it)
        if done is not None:
            done.set()


def main(argv: list[str] | None = None) -> int:
    """The command (options: ``--help``); 0 when the pair is exported, 1 when a training worker failed."""
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (DIR/drafter, DIR/verifier)")
    ap.add_argument("--verifier-steps", type=int, default=VERIFIER_STEPS[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--verifier-lr", type=float, default=VERIFIER_LR[0])
    ap.add_argument(
        "--verifier-mix",
        default=VERIFIER_MIX,
        help="families the verifier's problems cycle through ('all': each in turn) [default: %(default)s]",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=768)
    ap.add_argument("--eval-every", type=int, default=250, help="steps between teacher-forced evaluations and checkpoints")
    ap.add_argument("--eval-n", type=int, default=90, help="greedy evaluation problems at the end (0: skip)")
    ap.add_argument(
        "--monitor-n",
        type=int,
        default=MONITOR_N,
        help="held-out problems the teacher-forced EVAL lines score at each checkpoint [default: %(default)s]",
    )
    ap.add_argument("--log", default=None, help="log file (default: stdout only)")
    ap.add_argument(
        "--verifier-phase2-steps", type=int, default=VERIFIER_STEPS[1], help="second verifier phase (fresh schedule, final token weighted)"
    )
    ap.add_argument("--verifier-phase2-lr", type=float, default=VERIFIER_LR[1])
    ap.add_argument(
        "--phase2-only", action="store_true", help="run only the verifier's second phase (its phase-1 checkpoint is in DIR/_work)"
    )
    ap.add_argument(
        "--drafter-phases",
        default=DRAFTER_PHASES,
        help="the drafter's phases, 'steps:lr:families[:colour weight];...' (colour weight of the loss at the image "
        f"positions, default {IMAGE_COLOUR_WEIGHT}; families 'all': the generator's rotation) [default: %(default)s]",
    )
    ap.add_argument(
        "--threads", type=int, default=2, help="CPU threads in all: one for the verifier, the rest for the drafter [default: %(default)s]"
    )
    ap.add_argument(
        "--drafter-widen-at",
        type=int,
        default=DRAFTER_WIDEN_AT,
        help="drafter step from which it waits for the verifier to finish and then takes all --threads (a fixed step, so "
        "that runs are reproducible) [default: %(default)s]",
    )
    ap.add_argument(
        "--drafter-resume-from",
        type=int,
        default=0,
        help="start the drafter from its checkpoint in DIR/_work trained this many steps, then run --drafter-phases",
    )
    ap.add_argument(
        "--only",
        choices=("drafter", "verifier"),
        default=None,
        help="train one model (the other's checkpoint must already be in DIR/_work)",
    )
    ap.add_argument("--export-from", default=None, help="only export the latest checkpoints of a run's _work dir to --out")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.drafter_widen_at < 0 or args.monitor_n < 1:
        ap.error(
            f"--threads and --monitor-n must be >= 1 and --drafter-widen-at >= 0 "
            f"(got {args.threads}, {args.monitor_n}, {args.drafter_widen_at})"
        )
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
        tok, proc = load_tokenizer_and_processor(work)
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
    if not run_workers(procs, log_path):
        return 1
    report = {"sizes": sizes, "train_seconds": round(time.time() - t0), "args": vars(args)}
    export_and_report(work, out, report, args.eval_n, ("ver", "full", "comp"), out / "train_report.json", log_path, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
