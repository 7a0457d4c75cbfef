"""KV reuse across turns, measured: a six-turn conversation with two images and one long text message, each turn
decoded twice side by side, once with the pipeline's KV reuse and once from scratch (``pipe.prefix_kv.paused()``).

Per turn and stream it reports the prompt's length, the tokens prefilled and reused, and the wall time of the whole
``pipe.chat`` call (set-up, prefill, decoding) with and without reuse. Both runs must give the same answer (the
bench stops otherwise: reuse is exact or it is wrong). The bound checked from the second turn on is the issue's:
a stream prefills at most the tokens of its prompt that the previous turn's prompt did not have (the previous
answer as the template renders it, the new message and the generation prompt).

``python -m asymspec_mm.bench.conversation`` runs it on the shipped tiny pair (``--preset``), ``--reps`` times
(the cache emptied before each), and prints per-turn medians; ``--json`` writes every figure.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from ..engines.prefix_kv import common_prefix
from ..request.conversation import truncate
from .script import add_repetition_options, script_parser, write_json

#: The conversation's user turns: (text parts, which of the two images they show).
TURNS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("What is the value of the largest bar?", (0,)),
    ("How many bars does the chart have?", ()),
    ("Here is a second chart. Which of the two has more bars?", (1,)),
    ("{document}\n\nThe notes above come from the report. Summarize them in one line.", ()),
    ("What was the smallest value in the first chart?", ()),
    ("Which chart shows the larger total?", ()),
)
#: The long text message's length in characters (compressed to 1,000 + 500 in the verifier's view).
DOCUMENT_CHARS = 6000


def _document(chars: int) -> str:
    words = "the quarterly figures rose in the north region while the south held steady and costs fell".split()
    out = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(words[len(out) % len(words)])
    return " ".join(out)[:chars]


def _ids(res: Any) -> dict[str, list[int]]:
    p = res.prompts
    return {
        "drafter_full": p.drafter_full_ids[0].tolist(),
        "drafter_comp": p.drafter_comp_ids[0].tolist(),
        "verifier": p.verifier_ids[0].tolist(),
    }


def run_conversation(
    pipe: Any,
    images: list,
    captions: list[str],
    ocrs: list[Any],
    *,
    max_new_tokens: int = 16,
    document_chars: int = DOCUMENT_CHARS,
    scratch_first: bool = False,
) -> list[dict]:
    """One pass over the conversation (``images[i]`` with its ``captions[i]`` and ``ocrs[i]``), each turn decoded
    with reuse and from scratch (``scratch_first``: in that order); returns one record per turn."""
    from ..base.config import AsymSpecConfig

    cfg = AsymSpecConfig(max_new_tokens=max_new_tokens)
    compressor = truncate()
    messages: list[dict] = [{"role": "system", "content": "You answer questions about charts and documents."}]
    shown: list = []
    records, previous = [], None
    for turn, (text, which) in enumerate(TURNS, start=1):
        parts: list[Any] = [{"type": "image", "image": images[i]} for i in which]
        parts.append(text.format(document=_document(document_chars)))
        messages.append({"role": "user", "content": parts})
        shown += [images[i] for i in which]
        kwargs = dict(config=cfg, caption=captions[: len(shown)], ocr=ocrs[: len(shown)], text_compressor=compressor)
        timed = {}
        for mode in ("scratch", "reuse") if scratch_first else ("reuse", "scratch"):
            t0 = time.perf_counter()
            with pipe.prefix_kv.paused() if mode == "scratch" else contextlib.nullcontext():
                res = pipe.chat(messages, **kwargs)
            timed[mode] = (res, time.perf_counter() - t0)
        (reused, wall), (scratch, wall_scratch) = timed["reuse"], timed["scratch"]
        if reused.token_ids != scratch.token_ids:
            raise AssertionError(f"turn {turn}: the answer with KV reuse differs from the answer without it")
        ids = _ids(reused)
        record = {
            "turn": turn,
            "images": len(shown),
            "prompt_tokens": {n: len(v) for n, v in ids.items()},
            "prefill_tokens": dict(reused.stats["prefill_tokens"]),
            "prefill_tokens_scratch": dict(scratch.stats["prefill_tokens"]),
            "cached_tokens": dict(reused.stats["cached_tokens"]),
            "wall_s": wall,
            "wall_s_scratch": wall_scratch,
            "prefill_s": reused.stats["prefill_s"],
            "prefill_s_scratch": scratch.stats["prefill_s"],
        }
        if previous is not None:
            import torch

            new = {n: len(v) - common_prefix(torch.tensor(v), torch.tensor(previous[n])) for n, v in ids.items()}
            record["new_tokens"] = new
            record["bound_ok"] = all(record["prefill_tokens"][n] <= new[n] for n in new)
        records.append(record)
        previous = ids
        messages.append({"role": "assistant", "content": reused.text})
    return records


def summarize(reps: list[list[dict]]) -> list[dict]:
    """Per turn: the prefill tokens (the same in every repetition) and the median wall and prefill seconds."""
    out = []
    for turn in zip(*reps):
        first = turn[0]
        row = {k: first[k] for k in ("turn", "images", "prompt_tokens", "prefill_tokens", "prefill_tokens_scratch", "cached_tokens")}
        for key in ("wall_s", "wall_s_scratch", "prefill_s", "prefill_s_scratch"):
            row[key] = statistics.median(r[key] for r in turn)
        row["speedup"] = row["wall_s_scratch"] / row["wall_s"] if row["wall_s"] else None
        row["bound_ok"] = all(r.get("bound_ok", True) for r in turn)
        out.append(row)
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of :func:`summarize`'s rows."""
    head = (
        "| turn | images | prompt tokens (full / comp / verifier) | prefilled with reuse | prefilled from scratch "
        "| prefill with reuse | prefill from scratch | whole call with reuse | whole call from scratch | ratio (whole call) | bound |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        trio = lambda d: " / ".join(str(d.get(n, 0)) for n in ("drafter_full", "drafter_comp", "verifier"))  # noqa: E731
        lines.append(
            f"| {r['turn']} | {r['images']} | {trio(r['prompt_tokens'])} | {trio(r['prefill_tokens'])} | {trio(r['prefill_tokens_scratch'])} "
            f"| {r['prefill_s'] * 1000:.1f} ms | {r['prefill_s_scratch'] * 1000:.1f} ms "
            f"| {r['wall_s'] * 1000:.0f} ms | {r['wall_s_scratch'] * 1000:.0f} ms | {r['speedup']:.2f}x | {'ok' if r['bound_ok'] else 'OVER'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = script_parser("asymspec_mm.bench.conversation", __doc__)
    add_repetition_options(ap)
    args = ap.parse_args(argv)
    from ..eval.minivista import make_problem
    from ..pipeline.facade import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
    problems = [make_problem(7, i, "figure") for i in range(2)]
    views = ([p["decoded_image"] for p in problems], [p["caption"] for p in problems], [p["ocr"] for p in problems])
    run_conversation(pipe, *views, max_new_tokens=args.max_new_tokens)  # warm-up: first-use costs
    reps = []
    for rep in range(args.reps):  # which of the pair runs first alternates, so neither always finds the caches warm
        pipe.prefix_kv.clear()
        reps.append(run_conversation(pipe, *views, max_new_tokens=args.max_new_tokens, scratch_first=bool(rep % 2)))
    rows = summarize(reps)
    print(format_table(rows))
    write_json(args.json, {"reps": reps, "summary": rows})
    return 0 if all(r["bound_ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
