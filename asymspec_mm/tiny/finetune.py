"""Teach the shipped tiny pair MiniVista's agent tasks: continue both models on a mixture of the four families and the
agent requests (CPU).

    python -m asymspec_mm.tiny.train --out PAIR && python -m asymspec_mm.tiny.finetune --from PAIR --out DIR

1. The four-family pair (``--from``: ``train.py``'s output, the shipped pair before this training) and its tokenizer, plus
   :data:`~.agent_data.TOOL_TOKENS` as added tokens; both models' tied embeddings grow by as many rows (the new
   rows start at the mean of the old ones, seeded).
2. Two worker processes, one CPU thread each, a fixed number of steps with fixed seeds (a rerun gives the same
   files): each step is a batch of the four families (fresh problems drawn as the first training drew them, so
   nothing already learned is lost) and a batch of agent requests (:class:`~.agent_data.AgentStream`: the OpenAI
   tools loop and smolagents' ``ToolCallingAgent``, rendered as ``pipe.chat`` renders them; in the later phases some
   of them smolagents' final answers of other tasks, :class:`~.agent_data.FinalStream`).
   - verifier (compressed view): both batches at the phase's learning rate, the final answer token weighted as in its last
     phase;
   - drafter: the families through the shared-vision step of ``train.py`` (descriptions and the colour loss, no
     probe), the agent requests in the full view with the call's two values weighted (the readings the verifier
     cannot make), and a half batch of them in the compressed view (so that ``b`` stays a blind guess there).
3. Teacher-forced accuracies on held-out requests every ``--eval-every`` steps (the log), then ``DIR/drafter`` and
   ``DIR/verifier`` and a greedy check of each model alone on the four families.
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
from ..eval.minivista_agent import make_agent_problem
from ..frontend.help import terminal_text
from .agent_data import AgentStream, FinalStream, add_tool_tokens, agent_requests
from .data import Stream, collate, encode, encode_caption, model_inputs
from .evaluate import fmt_tf, teacher_forced
from .log_data import TRAIN_COMPRESSIONS, LogStream, log_examples
from .losses import LayerTap, lm_loss
from .models import load_tokenizer_and_processor
from .runs import EVAL_START, export_and_report, run_workers, save_checkpoint
from .train import (
    DRAFTER_DECISIVE_WEIGHT,
    IMAGE_COLOUR_WEIGHT,
    PERCEPTION_BATCH,
    VERIFIER_FINAL_WEIGHT,
    VERIFIER_MIX,
    lr_at,
    parse_families,
    shared_vision_step,
)

# The recipe: phases of (steps, learning rate, copy weight, finals) for both models at once (each worker one thread;
# about the same wall time), each from the previous phase's checkpoints with a fresh schedule, optimizer and problems.
# The copy weight is that of the tokens a final answer copies from the tool's result (the number after "the answer
# is", the final_answer's argument); finals: how many of a step's AGENT_BATCH requests are smolagents' final_answer
# requests of other tasks (FinalStream, half of them two-digit results). In the first phase both models learn the
# calls (the drafter reads the values; by step 600 in the log); copying a result came slowly, drowned by the readings
# the blind verifier can only guess: in smolagents' final_answer the verifier computed it from the call's values
# instead (off by one), and a two-digit result, two tokens to copy, it hardly ever got.
PHASES: tuple[tuple[int, float, float, int], ...] = ((800, 6e-4, 1.0, 0), (600, 6e-4, 4.0, 4), (400, 4e-4, 6.0, 4))
AGENT_BATCH = 8
DRAFTER_MIX = "figure,visual,geometry,mixed"
REHEARSAL_START = 400_000  # past every index the first training drew (at most about 93,000)
FINALS_START = 1_000_000  # FinalStream's tasks: apart from AgentStream's
AGENT_EVAL_TASKS = 16  # held-out agent (and agent-log) tasks the EVAL lines score (--monitor-tasks)
MONITOR_PROBLEMS = 40  # held-out problems of the four families they score besides (--monitor-n)
WARMUP_START = 2_000_000  # the log warm-up's tasks: apart from the phases' LogStream


def add_tokens_and_resize(src: Path, work: Path, seed: int = 0) -> dict[str, int]:
    """Copy the pair in ``src`` (``drafter/``, ``verifier/``) to ``work`` with :data:`~.agent_data.TOOL_TOKENS` added to
    its tokenizer and processor and both models' embeddings resized; returns the vocabulary sizes."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    tok = AutoTokenizer.from_pretrained(src / "verifier")
    proc = Qwen3VLProcessor.from_pretrained(src / "drafter")
    before = len(tok)
    add_tool_tokens(tok)
    add_tool_tokens(proc.tokenizer)
    if len(tok) != len(proc.tokenizer):
        raise RuntimeError(f"the verifier's and the drafter's tokenizers differ after adding tokens ({len(tok)} vs {len(proc.tokenizer)})")
    tok.save_pretrained(work / "tokenizer")
    proc.save_pretrained(work / "processor")
    torch.manual_seed(seed)
    for role, cls in (("drafter", Qwen3VLForConditionalGeneration), ("verifier", Qwen3ForCausalLM)):
        model = cls.from_pretrained(src / role)
        model.resize_token_embeddings(len(tok), mean_resizing=True)
        save_checkpoint(model, work / role)
    return {"before": before, "after": len(tok)}


def agent_evals(proc, tok, n_tasks: int = AGENT_EVAL_TASKS) -> list[dict[str, Any]]:
    """The held-out requests of ``n_tasks`` tasks the log's EVAL lines score (seed 1, far from the tasks results use)."""
    out = []
    for i in range(n_tasks):
        out += agent_requests(make_agent_problem(mv.HELDOUT_SEED, EVAL_START + i), proc, tok)
    return out


def worker(
    role: str,
    work: str,
    steps: int,
    lr: float,
    seed: int,
    batch: int,
    eval_every: int,
    log_path: str,
    done: int = 0,
    copy_weight: float = 1.0,
    finals: int = 0,
    log_batch: int = 0,
    agent_batch: int = AGENT_BATCH,
    freeze_vision: bool = False,
    monitor: tuple[int, int] = (MONITOR_PROBLEMS, AGENT_EVAL_TASKS),
) -> None:
    """Continue ``role`` from ``work/role`` for ``steps`` steps and save it there (see the module docstring); ``done``:
    the steps of earlier phases (fresh problems from there on), ``copy_weight``: of the tokens a final answer copies,
    ``finals``: smolagents' final requests in a step's agent batch (see :data:`PHASES`), ``log_batch``: ``agent-log``
    requests a step besides (:class:`~.log_data.LogStream`; their compressed views are the family's compressors'),
    ``agent_batch``: agent requests a step, ``freeze_vision``: the drafter's vision tower is left as it is (its text
    model learns; no captions or descriptions: a cheaper step for a text-only family), ``monitor``: held-out problems
    and tasks the EVAL lines score."""
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    torch.set_num_threads(1)
    seed += done
    torch.manual_seed(seed)
    log = open(log_path, "a", buffering=1)
    tok, proc = load_tokenizer_and_processor(Path(work))
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    cls = Qwen3VLForConditionalGeneration if role == "drafter" else Qwen3ForCausalLM
    model = cls.from_pretrained(Path(work) / role)
    model.train()
    if freeze_vision and role == "drafter":
        model.model.visual.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    tap = LayerTap(model) if role == "drafter" else None
    offset = 0 if role == "drafter" else 1
    mix = parse_families(DRAFTER_MIX if role == "drafter" else VERIFIER_MIX) or None
    families = Stream(proc, tok, start=REHEARSAL_START + offset + 2 * batch * done, stride=2, mix=mix)
    agents = AgentStream(proc, tok, start=offset + 2 * AGENT_BATCH * done, stride=2)
    final_answers = FinalStream(proc, tok, start=FINALS_START + offset + 2 * 64 * done, stride=2)
    logs = LogStream(proc, tok, start=offset + 2 * log_batch * done, stride=2)
    problems = mv.generate(monitor[0], mv.HELDOUT_SEED, start=EVAL_START)
    evals = [encode(p, proc, tok) for p in problems] + agent_evals(proc, tok, monitor[1])
    if log_batch:  # a shorter check of the rest (a quarter), so that frequent checkpoints stay cheap
        evals = evals[::4] + log_evals(proc, tok, monitor[1])
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=50)
        reg, ag = families.take(batch), agents.take(agent_batch - finals) + final_answers.take(finals)
        lg = logs.take(log_batch)
        ag, ag_comp = ag + lg, ag[: len(ag) // 2] + lg[: len(lg) // 2]
        if role == "verifier":
            b = collate(reg, "ver", pad_id, final_weight=VERIFIER_FINAL_WEIGHT)
            a = weight_copies(collate(ag, "ver", pad_id), ag, copy_weight)
            lr_ = lm_loss(model(**model_inputs(b), use_cache=False).logits, b["labels"], b["weights"])
            la = lm_loss(model(**model_inputs(a), use_cache=False).logits, a["labels"], a["weights"] if copy_weight != 1.0 else None)
            loss, parts = lr_ + la, {"ver": lr_.item(), "agent": la.item()}
        else:
            caps = (
                []
                if freeze_vision
                else [encode_caption(mv.make_problem(mv.TRAIN_SEED, 20_000_000 + step * 2 + j), proc, tok) for j in range(2)]
            )
            n_perception = 0 if freeze_vision else min(PERCEPTION_BATCH, len(reg))
            loss, parts = shared_vision_step(model, None, tap, reg, caps, proc, tok, pad_id, IMAGE_COLOUR_WEIGHT, n_perception)
            bf = weight_copies(collate(ag, "full", pad_id, dec_weight=DRAFTER_DECISIVE_WEIGHT), ag, copy_weight)
            lf = lm_loss(model(**model_inputs(bf), use_cache=False).logits, bf["labels"], bf["weights"])
            bc = weight_copies(collate(ag_comp, "comp", pad_id), ag_comp, copy_weight)
            lc = lm_loss(model(**model_inputs(bc), use_cache=False).logits, bc["labels"], bc["weights"] if copy_weight != 1.0 else None)
            loss = loss + 0.6 * lf + 0.4 * lc
            parts.update(agent_full=lf.item(), agent_comp=lc.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(f"[{role}] step {done + step} t={time.time() - t0:.0f}s " + " ".join(f"{k}={v:.3f}" for k, v in parts.items()), file=log)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            for v in ["ver"] if role == "verifier" else ["full", "comp"]:
                res = teacher_forced(model, evals, v, pad_id)
                print(f"[{role}] EVAL step {done + step + 1} t={time.time() - t0:.0f}s {v}: {fmt_tf(res)}", file=log)
            save_checkpoint(model, Path(work) / role)
    print(f"[{role}] done in {time.time() - t0:.0f}s", file=log)


def log_warmup(
    work: str, steps: tuple[int, int], lr: float, seed: int, batch: int, eval_every: int, log_path: str, n_tasks: int = AGENT_EVAL_TASKS
) -> None:
    """The drafter alone on ``agent-log`` requests, before the phases (``--log-warmup SHORT,FULL``): SHORT steps on
    one-line tables, then FULL steps on the family's 20-30 lines; ``batch`` of them a step
    (:class:`~.log_data.LogStream`, the compressed views rotating through the family's compressors) in the full view
    with the value weighted, and half of them in the compressed view (so that ``b`` stays a guess there); the vision
    tower is left as it is. Copying the log's last line from 150 tokens back is a rule the drafter's text model has
    no part of. Mixed into the phases' rehearsal at 8 a step it had not started to form after 1,000 steps; on the
    family's tables alone, 1,800 steps at 16 a step copied the key always but the value only half the time (the other
    half one fixed guess); on one-line tables the copy of every value forms in about 1,000 steps, and then carries to
    long tables within a few hundred. The phases then rehearse the families beside it. ``n_tasks``: held-out tasks the
    EVAL lines score."""
    from transformers import Qwen3VLForConditionalGeneration

    torch.set_num_threads(1)  # one thread, as the workers: two spin-waited on each other on a shared host
    torch.manual_seed(seed)
    log = open(log_path, "a", buffering=1)
    tok, proc = load_tokenizer_and_processor(Path(work))
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model = Qwen3VLForConditionalGeneration.from_pretrained(Path(work) / "drafter")
    model.train()
    model.model.visual.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    short = LogStream(proc, tok, start=WARMUP_START, stride=1, rows=(1, 1))
    logs = LogStream(proc, tok, start=WARMUP_START + 1_000_000, stride=1)
    evals = log_evals(proc, tok, n_tasks)
    t0 = time.time()
    total = sum(steps)
    for step in range(total):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, lr, warmup=50)
        lg = (short if step < steps[0] else logs).take(batch)
        bf = collate(lg, "full", pad_id, dec_weight=DRAFTER_DECISIVE_WEIGHT)
        bc = collate(lg[: batch // 2], "comp", pad_id)
        lf = lm_loss(model(**model_inputs(bf), use_cache=False).logits, bf["labels"], bf["weights"])
        lc = lm_loss(model(**model_inputs(bc), use_cache=False).logits, bc["labels"], bc["weights"])
        (0.6 * lf + 0.4 * lc).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(f"[warmup] step {step} t={time.time() - t0:.0f}s log_full={lf.item():.3f} log_comp={lc.item():.3f}", file=log)
        if (step + 1) % eval_every == 0 or step + 1 == total:
            for v in ("full", "comp"):
                print(
                    f"[warmup] EVAL step {step + 1} t={time.time() - t0:.0f}s {v}: {fmt_tf(teacher_forced(model, evals, v, pad_id))}",
                    file=log,
                )
            model.train()
            save_checkpoint(model, Path(work) / "drafter")
    print(f"[warmup] done in {time.time() - t0:.0f}s", file=log)


def log_evals(proc, tok, n_tasks: int = AGENT_EVAL_TASKS) -> list[dict[str, Any]]:
    """Held-out ``agent-log`` answers of ``n_tasks`` tasks the log's EVAL lines score (seed 1), each compressor's view in
    turn."""
    from ..eval.minivista_log import make_log_problem

    return [
        log_examples(make_log_problem(mv.HELDOUT_SEED, EVAL_START + i), proc, tok, TRAIN_COMPRESSIONS[i % 3], answers_only=True)[0]
        for i in range(n_tasks)
    ]


def weight_copies(batch: dict[str, Any], examples: list[dict[str, Any]], weight: float) -> dict[str, Any]:
    """``batch`` (of ``examples``, in order) with the tokens each final answer copies from the tool's result
    (``copy_idx``) weighted by ``weight``."""
    if weight != 1.0:
        for i, start in enumerate(batch["ans_start"]):
            for j in examples[i].get("copy_idx", ()):
                batch["weights"][i, start + j] = weight
    return batch


def parse_phase(text: str) -> tuple[int, float, float, int]:
    """``steps:lr:copy weight[:finals]`` -> the phase (``ValueError`` when malformed)."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4):
        raise ValueError(text)
    steps, lr, weight, finals = int(parts[0]), float(parts[1]), float(parts[2]), int(parts[3]) if len(parts) == 4 else 0
    if steps < 1 or not 0 <= finals <= AGENT_BATCH:
        raise ValueError(text)
    return steps, lr, weight, finals


def main(argv: list[str] | None = None) -> int:
    """The command (``--help``); 0 when the pair is exported, 1 when a worker failed."""
    import multiprocessing as mp

    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (DIR/drafter, DIR/verifier; the run's files in DIR/_work)")
    ap.add_argument(
        "--from",
        dest="src",
        required=True,
        help="the pair to continue (drafter/ and verifier/): the four-family pair of `python -m asymspec_mm.tiny.train "
        "--out DIR`, which the shipped pair was before this training",
    )
    ap.add_argument(
        "--phases",
        default=";".join(":".join(f"{v:g}" for v in phase) for phase in PHASES),
        help="'steps:lr:copy weight:finals;...', both models in each phase (finals may be left out: 0) [default: %(default)s]",
    )
    ap.add_argument("--start-phase", type=int, default=1, help="continue a run from its checkpoints in DIR/_work at this phase")
    ap.add_argument("--batch", type=int, default=16, help="problems of the four families a step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--agent-batch", type=int, default=AGENT_BATCH, help="agent requests a step [default: %(default)s]")
    ap.add_argument(
        "--freeze-vision",
        action="store_true",
        help="leave the drafter's vision tower as it is and rehearse no captions (a cheaper step; its captions drift, "
        "see the tiny README's agent-log section)",
    )
    ap.add_argument(
        "--roles",
        default="verifier,drafter",
        help="which models the phases train (the other is carried over as it is) [default: %(default)s]",
    )
    ap.add_argument(
        "--log-batch", type=int, default=0, help="agent-log requests a step besides (the long tool output the compressor drops)"
    )
    ap.add_argument(
        "--log-warmup",
        default="0,0",
        metavar="SHORT,FULL",
        help="the drafter alone on agent-log requests before the phases: SHORT steps on one-line tables, then FULL on "
        "the family's (see log_warmup) [default: %(default)s]",
    )
    ap.add_argument("--log-warmup-lr", type=float, default=1e-3, help="its learning rate [default: %(default)s]")
    ap.add_argument("--eval-n", type=int, default=60, help="greedy check of each model alone at the end (0: skip)")
    ap.add_argument(
        "--monitor-n",
        type=int,
        default=MONITOR_PROBLEMS,
        help="held-out problems of the four families the teacher-forced EVAL lines score [default: %(default)s]",
    )
    ap.add_argument(
        "--monitor-tasks",
        type=int,
        default=AGENT_EVAL_TASKS,
        help="held-out agent (and agent-log) tasks the EVAL lines score besides [default: %(default)s]",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=2,
        help="CPU threads of the export and its greedy check (each training worker uses one) [default: %(default)s]",
    )
    args = ap.parse_args(argv)
    if min(args.monitor_n, args.monitor_tasks, args.threads) < 1:
        ap.error(f"--monitor-n, --monitor-tasks and --threads must be >= 1 (got {args.monitor_n}, {args.monitor_tasks}, {args.threads})")
    try:
        warmup = tuple(int(v) for v in args.log_warmup.split(","))
        if len(warmup) != 2 or min(warmup) < 0:
            raise ValueError
    except ValueError:
        ap.error(f"--log-warmup {args.log_warmup!r}: expected SHORT,FULL (two step counts, 0 or more)")
    out = Path(args.out)
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    log_path = str(work / "finetune.log")
    t0 = time.time()
    try:
        phases = [parse_phase(p) for p in args.phases.split(";") if p.strip()]
    except ValueError:
        ap.error(f"--phases {args.phases!r}: expected steps:lr:copy weight:finals;... (finals from 0 to {AGENT_BATCH})")
    sizes = add_tokens_and_resize(Path(args.src), work, args.seed) if args.start_phase == 1 else {}
    with open(log_path, "a") as f:
        print(f"vocab {json.dumps(sizes)} args {vars(args)}", file=f)
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if not roles or set(roles) - {"verifier", "drafter"}:
        ap.error(f"--roles {args.roles!r}: expected verifier, drafter or both (comma-separated)")
    ctx = mp.get_context("spawn")
    if sum(warmup) and args.start_phase == 1 and "drafter" in roles:
        warm_args = (str(work), warmup, args.log_warmup_lr, args.seed, 16, args.eval_every, log_path, args.monitor_tasks)
        warm = ctx.Process(target=log_warmup, args=warm_args)
        if not run_workers([warm], log_path):
            return 1
    done = 0
    for number, (steps, lr, copy_weight, finals) in enumerate(phases, 1):
        if number >= args.start_phase:
            procs = [
                ctx.Process(
                    target=worker,
                    args=(
                        role,
                        str(work),
                        steps,
                        lr,
                        seed,
                        args.batch,
                        args.eval_every,
                        log_path,
                        done,
                        copy_weight,
                        finals,
                        args.log_batch,
                        args.agent_batch,
                        args.freeze_vision,
                        (args.monitor_n, args.monitor_tasks),
                    ),
                )
                for role, seed in (("verifier", args.seed + 1), ("drafter", args.seed))
                if role in roles
            ]
            if not run_workers(procs, log_path):
                return 1
        done += steps
    report: dict[str, Any] = {"vocab": sizes, "train_seconds": round(time.time() - t0), "args": vars(args)}
    export_and_report(work, out, report, args.eval_n, ("ver", "full"), out / "finetune_report.json", log_path, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
