"""A 10-turn agent conversation with long tool outputs, with and without per-turn compression, side by side.

The history is an agent's: a system prompt, the task, then one (tool call, long tool output) pair per turn, the
output a log of ``rows`` lines (the same history for every arm: the calls are scripted, so the arms differ only in
how the verifier reads it). At each turn the whole history is sent (``pipe.chat_stream``, as an agent framework does
through the server) once per arm: each compression (``none``, ``truncate``, ``llmlingua2``, ... with the last two
messages verbatim) under AsymSpec and under Floor. An arm runs its whole conversation with the pipeline's prefix KV
store emptied first, so what it reuses is its own earlier turns.

Per turn and arm it reports the verifier's prompt tokens, the tokens of it reused from the prefix store
(``cached_tokens``), the time to the first committed step (compression, set-up, prefill and one decoding step), the
compression ratio |x_full| / |x_comp| and the decoding steps (every answer ``max_new_tokens`` long: end-of-text
is ignored, so the steps compare across arms).

``python -m asymspec_mm.bench.agent_turns`` runs it on the shipped tiny pair (``--reps`` repetitions, arm order
alternating, medians of the times); ``--compressions "none;truncate,limit=40"`` names the arms (``;`` between them);
``--json`` writes every figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from .script import add_repetition_options, script_parser, write_json

TURNS = 10
ROWS = 9  # each tool output about 250 verifier tokens of the tiny pair: ten turns fit its 4,096-token window
DEFAULT_COMPRESSIONS = ("none", "truncate,limit=40,keep_last_turns=2")
METHODS = ("asymspec", "floor")


def tool_output(turn: int, rows: int = ROWS) -> str:
    """The log the agent's ``turn``-th call returns: ``rows`` lines of readings and a line naming the page."""
    lines = [f"row {i}: sensor {(i + turn) % 7} reading {(i * 13 + turn * 5) % 97} units status ok" for i in range(rows)]
    return "\n".join([*lines, f"page {turn} of the station log"])


def agent_history(turns: int, rows: int = ROWS) -> list[dict[str, Any]]:
    """A system prompt, the task, then ``turns`` (tool call, tool output) pairs: what the agent sends at turn
    ``turns`` (turn 0: the task alone)."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. Read the station log with read_log, then answer."},
        {"role": "user", "content": "Which sensor read 42 units, and on which page?"},
    ]
    for t in range(turns):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "read_log", "arguments": {"page": t}}}
        msgs += [{"role": "assistant", "content": f"Reading page {t}.", "tool_calls": [call]}]
        msgs += [{"role": "tool", "tool_call_id": f"c{t}", "content": tool_output(t, rows)}]
    return msgs


def run_arm(pipe: Any, method: str, compression: Any, *, turns: int = TURNS, rows: int = ROWS, max_new_tokens: int = 16) -> list[dict]:
    """One arm's conversation from an empty prefix store: per turn (1..``turns``), its figures."""
    from ..base.config import AsymSpecConfig

    cfg = AsymSpecConfig(max_new_tokens=max_new_tokens)
    pipe.prefix_kv.clear()
    out = []
    for turn in range(1, turns + 1):
        t0 = time.perf_counter()
        # ignore_eos: every answer is max_new_tokens long, so the arms' decoding steps compare
        stream = pipe.chat_stream(agent_history(turn, rows), method=method, config=cfg, compression=compression, ignore_eos=True)
        first = None
        for _ in stream:
            first = first if first is not None else time.perf_counter() - t0
        res = stream.result
        st = res.stats
        prompt = int(res.prompts.verifier_ids.shape[-1])
        out.append(
            {
                "turn": turn,
                "prompt_tokens": prompt,
                "prompt_tokens_full": int(st.get("prompt_tokens_full", prompt)),
                "cached_tokens": int(st.get("cached_tokens", {}).get("verifier", 0)),
                "ttft_s": first if first is not None else time.perf_counter() - t0,
                "wall_s": time.perf_counter() - t0,
                "compression_ratio": float(st.get("compression_ratio", 1.0)),
                "compression_s": float(st.get("compression_s", 0.0)),
                "steps": int(st.get("steps", 0)),
                "new_tokens": len(res.token_ids),
            }
        )
    return out


def run_bench(pipe: Any, compressions: Sequence[str], *, reps: int = 1, **kwargs: Any) -> dict[str, list[list[dict]]]:
    """Every arm (``compression|method``) ``reps`` times, the arms' order reversed every other repetition so that
    neither always runs first on a warm machine: ``{arm: [repetition: per-turn records]}``."""
    from ..request.compression import Compression

    arms = [(c, m) for c in compressions for m in METHODS]
    settings = {c: None if c == "none" else Compression.of(c, "compressions") for c in compressions}
    out: dict[str, list[list[dict]]] = {f"{c}|{m}": [] for c, m in arms}
    for rep in range(reps):
        for c, m in arms if rep % 2 == 0 else arms[::-1]:
            out[f"{c}|{m}"].append(run_arm(pipe, m, settings[c], **kwargs))
    return out


def summarize(runs: dict[str, list[list[dict]]]) -> dict[str, list[dict]]:
    """Per arm and turn: the token counts (the same in every repetition) and the median times."""
    out = {}
    for arm, reps in runs.items():
        rows = []
        for turn in zip(*reps):
            row = dict(turn[0])
            for key in ("ttft_s", "wall_s", "compression_s"):
                row[key] = statistics.median(r[key] for r in turn)
            rows.append(row)
        out[arm] = rows
    return out


def format_table(summary: dict[str, list[dict]], compressions: Sequence[str]) -> str:
    """One Markdown row per turn; each cell the compressions' figures side by side (``none / truncate ...``):
    the verifier's prompt tokens and cached tokens and AsymSpec's time to first token, the compression ratio, then
    AsymSpec's and Floor's decoding steps."""
    names = [c.split(",")[0] for c in compressions]
    both = " / ".join(names)
    head = (
        f"| turn | verifier prompt tokens ({both}) | cached tokens ({both}) | TTFT AsymSpec, ms ({both}) "
        f"| compression ratio ({both}) | AsymSpec steps ({both}) | Floor steps ({both}) |"
    )
    lines = [head, "|" + "---|" * 7]
    turns = len(summary[f"{compressions[0]}|asymspec"])
    for i in range(turns):
        a = [summary[f"{c}|asymspec"][i] for c in compressions]
        f = [summary[f"{c}|floor"][i] for c in compressions]
        cell = lambda rows, key, fmt="{}", scale=1: " / ".join(fmt.format(r[key] * scale) for r in rows)  # noqa: E731
        lines.append(
            f"| {i + 1} | {cell(a, 'prompt_tokens')} | {cell(a, 'cached_tokens')} | {cell(a, 'ttft_s', '{:.0f}', 1000)} "
            f"| {cell(a, 'compression_ratio', '{:.2f}')} | {cell(a, 'steps')} | {cell(f, 'steps')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = script_parser("asymspec_mm.bench.agent_turns", __doc__)
    ap.add_argument("--compressions", default=";".join(DEFAULT_COMPRESSIONS), help="arms, ';' between them [default: %(default)s]")
    ap.add_argument("--turns", type=int, default=TURNS)
    ap.add_argument("--rows", type=int, default=ROWS, help="lines of each tool output [default: %(default)s]")
    add_repetition_options(ap)
    args = ap.parse_args(argv)
    from ..pipeline.facade import AsymSpecPipeline

    compressions = [c.strip() for c in args.compressions.split(";") if c.strip()]
    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
    kwargs = dict(turns=args.turns, rows=args.rows, max_new_tokens=args.max_new_tokens)
    run_bench(pipe, compressions, reps=1, **{**kwargs, "turns": 2})  # warm-up: first-use costs
    runs = run_bench(pipe, compressions, reps=args.reps, **kwargs)
    summary = summarize(runs)
    print(format_table(summary, compressions))
    write_json(args.json, {"runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
