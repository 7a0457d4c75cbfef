"""Batched decoding in the benchmark: ``pipe.generate_batch(batch_size=B)`` against the sequential loop, side by side.

Every cell decodes the same N requests (held-out MiniVista problems) with one variant, on the engine core's route,
the one every request of the library takes (set up with ``prefill=False``, prompts prefilled in the paged row
storages' own forwards; the cells are :mod:`.batch_cells`'):

* **B = 1 is the sequential loop**: one request after another, each decoded alone as ``pipe.generate`` decodes it
  (an engine core of its own), every step timed, not ``generate_batch(batch_size=1)``.
* **B > 1** is ``pipe.generate_batch(requests, batch_size=B)``, timed as one call (the tokens/s a caller gets),
  then the same requests through an engine core built as ``generate_batch``'s and stepped here as its decode thread
  steps it (set up, admit, prompt pieces riding in the steps' forwards, join in place, refill): each step is timed,
  and its tokens are checked equal to ``generate_batch``'s.

Instrumented (CPU), each row storage's forwards are timed (:class:`~asymspec_mm.base.timing.TimedStorage`) and so are
the gate and the trace; a turn of prompt pieces alone is prefill, kept out of the steps (``prefill_s``). Each row's
KV bytes at its join are its context then times its row storages' bytes per token.

Repetitions are interleaved (each one runs every (variant, B) cell, the order rotating), and ratios to B = 1 are
medians of per-repetition ratios. On synthetic caches (real shapes on a CPU, where a 2B prefill takes minutes)
``generate_batch`` cannot run (it prefills): rows are sessions over random keys/values of ragged lengths poured into
single-row caches (the core's storages fill only through forwards), decoded by ``pipe.run`` on them one after another
at B = 1 (``route: "single-row"``) and by the engine core at B > 1, each row's caches copied into its row storages at
join (``route: "copy-at-join"``); tokens/s is decode-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..base.checks import is_int
from ..base.timing import Clock, median
from .batch_cells import ROUTE_CORE, ROUTE_SINGLE_ROW, SYNTHETIC_STAGGER, BatchSweep
from .pairs import BenchPair
from .runner import rotate

if TYPE_CHECKING:
    from ..base.config import AsymSpecConfig
    from ..frontend.variants import Variant

LABEL = "generate_batch(batch_size=B) vs the sequential loop (B=1: pipe.generate one request after another)"
#: The row storages of the stepped decoder: the default (dynamic) one, or static slots (optionally compiled).
BATCH_ENGINES = ("dynamic", "static", "static-compile")

Say = Callable[[str], None]


def parse_sizes(sizes: Sequence[int]) -> list[int]:
    """The batch sizes to run: unique, ascending, each >= 1, with the sequential reference B = 1 first."""
    from ..base.errors import UnknownOptionError

    bad = [b for b in sizes if not is_int(b, minimum=1)]
    if bad:
        raise UnknownOptionError(f"batch size {bad[0]!r} must be an integer >= 1")
    return sorted({1, *sizes})


def batch_sweep(
    bp: BenchPair,
    inputs: list[dict[str, Any]],
    *,
    sizes: Sequence[int],
    variants: list[Variant],
    base_cfg: AsymSpecConfig,
    reps: int,
    warmup: int,
    synthetic: bool,
    base_len: int,
    image_tokens: int,
    clock: Clock,
    instrument: bool,
    say: Say,
    batch_engine: str = "dynamic",
    batch_max_len: int = 2048,
) -> dict[str, Any]:
    """Every (variant, B) cell over the same ``inputs``, ``reps`` interleaved repetitions: the ``batching`` section.
    ``batch_engine``: the stepped decoder's row storage (:data:`BATCH_ENGINES`; static slots of ``batch_max_len``
    columns, ``max_rows`` = B); B = 1 stays the sequential loop, each request alone on the engine core's own storages
    (as ``pipe.generate`` decodes it)."""
    sizes = parse_sizes(sizes)
    sweep = BatchSweep(
        bp,
        inputs,
        synthetic=synthetic,
        base_len=base_len,
        image_tokens=image_tokens,
        clock=clock,
        instrument=instrument,
        batch_engine=batch_engine,
        batch_max_len=batch_max_len,
    )
    idx = list(range(len(inputs)))
    cells = [(v, b) for v in variants for b in sizes]
    for w in range(warmup):
        say(f"batch sweep warm-up {w + 1}/{warmup}")
        short = base_cfg.with_(max_new_tokens=min(2, base_cfg.max_new_tokens))
        for v, b in cells:
            # the sequential warm-up goes over every request on the request path (vision and prefix caches warm)
            rows = idx if (b == 1 and not synthetic) else idx[: min(b, len(idx))]
            sweep.cell(v, v.apply(short), rows, b)
    per_rep: dict[str, dict[str, list[dict]]] = {v.name: {str(b): [] for b in sizes} for v in variants}
    same_tokens = True
    for r in range(reps):
        got: dict[tuple[str, int], dict] = {}
        for v, b in rotate(cells, r):
            t0 = time.perf_counter()
            c = sweep.cell(v, v.apply(base_cfg), idx, b)
            got[(v.name, b)] = c
            rate = c["tokens_per_s"] if c["tokens_per_s"] is not None else c["decode_tokens_per_s"]
            say(
                f"batch rep {r + 1}/{reps} {v.name} B={b}: {rate:.2f} tok/s, step {c['step_s'] * 1e3:.1f} ms ({time.perf_counter() - t0:.1f}s)"
            )
        for v in variants:
            ref = got[(v.name, 1)]["token_ids"]
            for b in sizes:
                c = got[(v.name, b)]
                c["same_tokens_as_sequential"] = c.pop("token_ids") == ref
                same_tokens &= c["same_tokens_as_sequential"]
                per_rep[v.name][str(b)].append(c)
    by_variant = {v.name: _summarize_variant(per_rep[v.name], sizes) for v in variants}
    return {
        "label": LABEL,
        "mode": "synthetic" if synthetic else "pipeline",
        "batch_engine": batch_engine,
        "route": ROUTE_SINGLE_ROW if synthetic else ROUTE_CORE,  # each cell's own: its "route"
        "route_note": route_note(synthetic, batch_engine),
        "sizes": sizes,
        "variants": [v.name for v in variants],
        "methods": {v.name: v.method for v in variants},
        "cases": len(inputs),
        "case_ids": [c.get("id") for c in inputs],
        "reps": reps,
        "warmup": warmup,
        "max_new_tokens": base_cfg.max_new_tokens,
        "k": base_cfg.k,
        "instrumented": instrument,
        "synthetic_context": {"base": base_len, "stagger": SYNTHETIC_STAGGER, "image_tokens": image_tokens} if synthetic else None,
        "per_rep": per_rep,
        "by_variant": by_variant,
        "checks": {
            "same_tokens_as_sequential": same_tokens,
            "stepped_same_as_generate_batch": all(
                c.get("stepped_same_as_generate_batch", True) for reps_ in per_rep.values() for cs in reps_.values() for c in cs
            ),
            "sequential_steps_ok": all(c.get("steps_ok", True) for reps_ in per_rep.values() for cs in reps_.values() for c in cs),
        },
    }


def route_note(synthetic: bool, batch_engine: str = "dynamic") -> str:
    """Where the sweep's requests decode, for the report (:mod:`.batch_cells`)."""
    if synthetic:
        return (
            "route: synthetic caches are single-row engines (random KV poured into them; the engine core's storages fill "
            "only through forwards, a prefill): B=1 decodes them there (pipe.run), B>1 on the engine core, each row's "
            "caches copied into its row storages at join."
        )
    static = (
        ""
        if batch_engine == "dynamic"
        else f" At B>1 the {batch_engine} slots take no prompt pieces: rows are prefilled on staging storages and copied in at join."
    )
    return (
        "route: engine core at every B: each request set up without prefill, its prompts prefilled in the paged row "
        "storages' own forwards (B=1: each request alone, as pipe.generate decodes it; B>1: the engine core "
        "generate_batch steps, a new row's prompt riding in the step's forwards); no single-row engine is built." + static
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _storage_b1(reps: list[dict]) -> dict[str, Any] | None:
    """The chosen row storage at one row (static slots) beside the sequential loop: medians and the paired ratio of
    decode tokens/s."""
    if "storage_b1" not in reps[0]:
        return None
    got = [c["storage_b1"] for c in reps]
    ratios = [g["decode_tokens_per_s"] / c["decode_tokens_per_s"] for g, c in zip(got, reps) if c["decode_tokens_per_s"]]
    return {
        "decode_tokens_per_s": median([g["decode_tokens_per_s"] for g in got]),
        "ratio_to_sequential_decode": median(ratios) if ratios else None,
        "ratio_reps": ratios,
        "step_s": median([g["step_s"] for g in got]),
        "same_tokens": all(g["same_tokens"] for g in got),
    }


def _summarize_variant(per_size: dict[str, list[dict]], sizes: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Medians over repetitions per batch size, ratios to B = 1 paired within each repetition."""
    seq = per_size["1"]
    out: dict[str, dict[str, Any]] = {}
    for b in sizes:
        reps = per_size[str(b)]
        tps = [c["tokens_per_s"] for c in reps if c["tokens_per_s"] is not None]
        dtps = [c["decode_tokens_per_s"] for c in reps]
        ratio = [_ratio(c["tokens_per_s"], s["tokens_per_s"]) for c, s in zip(reps, seq)]
        ratio = [x for x in ratio if x is not None]
        dratio = [c["decode_tokens_per_s"] / s["decode_tokens_per_s"] for c, s in zip(reps, seq) if s["decode_tokens_per_s"]]
        sratio = [c["step_s"] / s["step_s"] for c, s in zip(reps, seq) if s["step_s"] and s["step_s"] == s["step_s"]]
        row: dict[str, Any] = {
            "batch_size": b,
            "sequential": b == 1,
            "tokens_per_s": median(tps) if tps else None,
            "tokens_per_s_min": min(tps) if tps else None,
            "tokens_per_s_max": max(tps) if tps else None,
            "tokens_per_s_reps": tps,
            "ratio_to_seq": median(ratio) if ratio else None,
            "ratio_to_seq_reps": ratio,
            "decode_tokens_per_s": median(dtps),
            "decode_tokens_per_s_min": min(dtps),
            "decode_tokens_per_s_max": max(dtps),
            "decode_tokens_per_s_reps": dtps,
            "decode_ratio_to_seq": median(dratio) if dratio else None,
            "decode_ratio_to_seq_reps": dratio,
            "step_s": median([c["step_s"] for c in reps]),
            "step_s_reps": [c["step_s"] for c in reps],
            "step_s_mean": median([c["step_s_mean"] for c in reps]),
            "step_ratio": median(sratio) if sratio else None,
            "step_ratio_reps": sratio,
            "full_rows": reps[0]["full_rows"],
            "rows_per_step": median([c["rows_per_step"] for c in reps]),
            "steps": median([c["steps"] for c in reps]),
            "setup_frac": median([c["setup_frac"] for c in reps if c["setup_frac"] is not None]),
            "new_tokens": reps[0]["new_tokens"],
            "tokens_per_case": reps[0]["tokens_per_case"],
            "same_tokens_as_sequential": all(c["same_tokens_as_sequential"] for c in reps),
            "kv_bytes_per_row": reps[0]["kv_bytes_per_row"],
            "kv_rows": reps[0]["kv_rows"],
            "cache_bytes_per_row_peak": reps[0].get("cache_bytes_per_row_peak"),
            "max_batch_stat": reps[0].get("max_batch_stat"),
            "prefill_s": median([c["prefill_s"] for c in reps]),
            "route": reps[0]["route"],
            "storage_b1": _storage_b1(reps),
        }
        if all("split_step_s" in c for c in reps):
            keys = reps[0]["split_step_s"]
            row["split_step_s"] = {k: median([c["split_step_s"][k] for c in reps]) for k in keys}
        out[str(b)] = row
    return out
