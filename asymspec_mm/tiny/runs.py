"""The training commands' shared ends: running the two worker processes, and exporting the pair with a report."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..eval import minivista as mv
from .evaluate import greedy_accuracy
from .models import load_tokenizer_and_processor

EVAL_START = 100_000  # monitoring slice of the held-out seed, far from the indices results.py uses
MONITOR_N = 120  # problems of that slice the EVAL lines score (--monitor-n)


def save_checkpoint(model: Any, folder: Path | str) -> None:
    """``model.save_pretrained(folder)``, raising when nothing was saved: transformers only logs an error when a file
    stands where the folder goes, and a training worker would then report success with no checkpoint."""
    model.save_pretrained(folder)
    if not (Path(folder) / "config.json").is_file():
        raise OSError(f"the checkpoint was not saved to {folder}: is a file in the way?")


def export_pair(work: Path, out: Path) -> tuple[Any, Any, Any, Any]:
    """Write ``out/drafter`` and ``out/verifier`` (save_pair) from the workers' latest checkpoints in ``work``;
    returns (drafter, verifier, tokenizer, processor)."""
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from ..checkpoints.build import save_pair

    tok, proc = load_tokenizer_and_processor(work)
    drafter = Qwen3VLForConditionalGeneration.from_pretrained(work / "drafter")
    verifier = Qwen3ForCausalLM.from_pretrained(work / "verifier")
    save_pair(drafter, verifier, tok, proc, out)
    return drafter, verifier, tok, proc


def run_workers(procs: list[Any], log_path: str) -> bool:
    """Start the worker processes and wait for them; one that fails stops the others (no waiting for the other's
    hours). True when every worker finished; else False, having said where the log is."""
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.terminate()
        time.sleep(1)
    if any(p.exitcode != 0 for p in procs):
        print("a training worker failed; see", log_path, file=sys.stderr)
        return False
    return True


_GREEDY_VIEWS = {"ver": "verifier (floor)", "full": "drafter full", "comp": "drafter comp"}


def export_and_report(
    work: Path,
    out: Path,
    report: dict[str, Any],
    eval_n: int,
    views: tuple[str, ...],
    report_file: Path,
    log_path: str,
    threads: int,
) -> None:
    """Export the pair (:func:`export_pair`), add the greedy accuracy of each of ``views`` on ``eval_n`` held-out
    problems (on ``threads`` CPU threads) to ``report``, and write it to ``report_file``, the log's REPORT line and
    stdout."""
    import torch

    drafter, verifier, tok, proc = export_pair(work, out)
    if eval_n:
        probs = mv.generate(eval_n, mv.HELDOUT_SEED, start=EVAL_START)
        caller_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            report["greedy"] = {_GREEDY_VIEWS[v]: greedy_accuracy(verifier if v == "ver" else drafter, probs, v, proc, tok) for v in views}
        finally:  # a caller in the same process (a test, a notebook) keeps its own thread count
            torch.set_num_threads(caller_threads)
    report_file.write_text(json.dumps(report, indent=1))
    with open(log_path, "a") as f:
        print(f"REPORT {json.dumps(report)}", file=f)
    print(json.dumps(report, indent=1))
