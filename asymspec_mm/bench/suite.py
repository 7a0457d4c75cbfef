"""The benchmark as a whole: the main comparison, the projection, the length and K sweeps and the probes,
every part interleaved (each repetition runs every variant, the order rotating)."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..frontend.variants import Variant, parse_variant, parse_variants, split_variants
from .aggregate import call_costs, collect_checks, evaluate_targets, projection, rep_summary, summarize
from .batch_targets import batch_targets
from .batching import batch_sweep, parse_sizes
from .pairs import BenchPair, bench_cases, context_limit, fits_context, load_pair, pad_caption
from .probes import probe_drafter_batching, probe_loop
from .runner import Runner, engine_factory, rotate
from .settings import DEFAULT_VARIANTS, PAPER_SCENARIOS, REAL_IMAGE_SIDE, TIMER_BUCKETS, log

if TYPE_CHECKING:
    import torch

    from ..base.config import AsymSpecConfig

Say = Callable[[str], None]


def run_bench(
    pair: str = "tiny",
    *,
    pipeline: Any = None,
    drafter: str | None = None,
    verifier: str | None = None,
    sd_drafter: str | None = None,
    variants: str | Sequence[str] = DEFAULT_VARIANTS,
    reps: int = 3,
    warmup: int = 1,
    cases: int = 2,
    case_families: Sequence[str] | None = None,
    max_new_tokens: int = 32,
    k: int = 4,
    trace_top: int | None = None,
    prompt_lengths: Sequence[int] = (256, 1024, 4096),
    length_variants: str | Sequence[str] = ("floor", "asymspec"),
    k_values: Sequence[int] = (1, 2, 4, 8),
    k_variants: str | Sequence[str] = ("asymspec",),
    scenarios: Sequence[tuple[float, float]] = PAPER_SCENARIOS,
    prefill: str = "auto",
    image_tokens: int | None = None,
    ignore_eos: bool | None = None,
    device: str | None = None,
    dtype: str | None = None,
    plain_runs: bool | None = None,
    probe_batching: bool = True,
    probe_reps: int = 3,
    workdir: str | Path | None = None,
    threads: int | None = None,
    engine: str = "dynamic",
    loop_vocabs: Sequence[int] = (),
    batch_sizes: Sequence[int] = (),
    batch_cases: int = 16,
    batch_variants: str | Sequence[str] = ("floor", "asymspec"),
    batch_engine: str = "dynamic",
    batch_max_len: int = 2048,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the benchmark and return its results (JSON-ready). See the package docstring.

    ``variants`` / ``length_variants`` / ``k_variants``: variant lists in :mod:`asymspec_mm.frontend.variants`' grammar
    (``method@field=value,...``; a string or a sequence of specs); Floor is added where missing, since every
    ratio is paired against it; an empty ``variants`` skips the main comparison (and the projection).
    ``pipeline``: reuse a loaded :class:`AsymSpecPipeline` (``pair`` is then only its label).
    ``sd_drafter``: SD's own text drafter (``--sd-drafter``; default the VL drafter on the compressed view).
    ``prefill``: ``pipeline`` | ``synthetic`` | ``auto`` (synthetic for real-shape pairs on CPU).
    ``plain_runs``: time throughput in separate un-instrumented runs (default: on CUDA only).
    Empty ``prompt_lengths`` / ``k_values`` skip those sweeps. ``threads``: torch CPU threads for the run
    (restored after); on a loaded machine 1 thread is often faster for tiny models (no OpenMP barrier waits).
    ``engine``: ``dynamic`` (the engines the pipeline uses), ``static`` / ``static-compile`` (the opt-in
    static-KV-cache engines, the latter with a compiled one-token decode; untested on GPU).
    ``batch_sizes``: the batch sweep (:mod:`asymspec_mm.bench.batching`; empty: skipped): ``generate_batch`` at each
    size against the sequential loop over ``batch_cases`` requests for each of ``batch_variants``; ``batch_engine``
    the stepped decoder's row storage (``dynamic`` | ``static`` | ``static-compile``: static slots of
    ``batch_max_len`` columns).
    """
    from ..base.config import AsymSpecConfig

    say = log if progress else (lambda _msg: None)
    t_start = time.perf_counter()
    # the batch sweep's options are checked before anything runs
    b_sizes = parse_sizes(batch_sizes) if batch_sizes else []
    b_variants = parse_variants(batch_variants) if b_sizes else []
    if batch_engine not in ("dynamic", "static", "static-compile"):
        from ..base.errors import UnknownOptionError

        raise UnknownOptionError(f"batch_engine={batch_engine!r}: use dynamic, static or static-compile")
    if b_sizes and batch_cases < 1:
        from ..base.errors import UnknownOptionError

        raise UnknownOptionError(f"batch_cases={batch_cases} must be >= 1")
    with _torch_threads(threads), contextlib.ExitStack() as scratch:
        if pipeline is not None:
            bp = BenchPair(pipeline, pair, getattr(pipeline, "name", pair), trained=pair not in ("random-tiny",) and "random" not in pair)
        else:
            bp = load_pair(pair, drafter=drafter, verifier=verifier, device=device, dtype=dtype, workdir=workdir, sd_drafter=sd_drafter)
        scratch.enter_context(bp.pipe.prefix_kv.paused())  # every repetition prefills from scratch: KV reuse has its own bench
        dev = bp.device
        real = pair.startswith("real-shapes")
        if prefill == "auto":
            prefill = "synthetic" if real and dev.type == "cpu" else "pipeline"
        synthetic = prefill == "synthetic"
        ignore_eos = (not bp.trained) if ignore_eos is None else ignore_eos
        plain_runs = (dev.type == "cuda") if plain_runs is None else plain_runs
        image_tokens = image_tokens if image_tokens is not None else ((REAL_IMAGE_SIDE // 32) ** 2 if real else 16)
        base_cfg = AsymSpecConfig(k=k, max_new_tokens=max_new_tokens)
        if trace_top is not None:
            base_cfg = base_cfg.with_(trace_top=trace_top)
        vs = with_floor(parse_variants(variants)) if split_variants(variants) else []
        engines = engine_factory(engine, headroom=max_new_tokens + 2 * max(k, *(k_values or [k])) + 8, device=dev)
        runner = Runner(bp, ignore_eos=ignore_eos, image_tokens=image_tokens, sync=dev.type == "cuda", engines=engines)
        base_len = prompt_lengths[0] if prompt_lengths else 256
        cells = Cells(runner, bench_cases(cases, bp.image_side, case_families), synthetic, plain_runs, base_len)
        notes = _notes(
            bp,
            synthetic=synthetic,
            base_len=base_len,
            image_tokens=image_tokens,
            ignore_eos=ignore_eos,
            engine=engine,
            plain_runs=plain_runs,
            route=runner.route(synthetic),
        )
        result: dict[str, Any] = {
            "meta": _meta(
                bp,
                dev,
                prefill,
                reps,
                warmup,
                cases if not synthetic else 1,
                max_new_tokens,
                k,
                base_cfg,
                ignore_eos,
                plain_runs,
                image_tokens,
                None if synthetic else case_families,
            ),
            "notes": notes,
        }
        result["meta"]["engine"] = engine
        result["meta"]["route"] = runner.route(synthetic)
        if not vs:
            notes.append("main comparison skipped (no --variants): its settings above do not apply; see the sections below")
        if vs:
            result.update(_main_comparison(cells, vs, base_cfg, reps, warmup, say))
            result["projection"] = projection(result["main"]["variants"], result["call_costs"], k, scenarios, trained=bp.trained)
        else:
            say("main comparison skipped (no variants)")
        result["scaling_length"] = _length_sweep(bp, cells, base_cfg, prompt_lengths, length_variants, reps, image_tokens, say)
        result["scaling_k"] = _k_sweep(cells, base_cfg, k_values, k_variants, reps, say)
        if probe_batching:
            result["probes"] = _probes(bp, runner, k, base_len + image_tokens, probe_reps, trace_top, loop_vocabs, say)
        if b_sizes:
            result["batching"] = batch_sweep(
                bp,
                bench_cases(batch_cases, bp.image_side, case_families),
                sizes=b_sizes,
                variants=b_variants,
                base_cfg=base_cfg,
                reps=reps,
                warmup=warmup,
                synthetic=synthetic,
                base_len=base_len,
                image_tokens=image_tokens,
                clock=runner.clock,
                instrument=not plain_runs,
                say=say,
                batch_engine=batch_engine,
                batch_max_len=batch_max_len,
            )
    result["targets"] = evaluate_targets(result, bp) + batch_targets(result.get("batching", {}), bp)
    result["meta"]["bench_wall_s"] = time.perf_counter() - t_start
    return result


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to ``threads`` (when given) inside the block, restored after."""
    import torch

    prev = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def with_floor(variants: list[Variant]) -> list[Variant]:
    """``variants`` with Floor first when it is missing: every ratio is paired against it."""
    if any(v.name == "floor" for v in variants):
        return variants
    return [parse_variant("floor"), *variants]


@dataclass
class Cells:
    """Runs the cells of the benchmark: every case of one variant in one repetition, on the request path or on
    synthetic caches of the cell's context length, plain and instrumented when throughput is taken plain."""

    runner: Runner
    inputs: list[dict[str, Any]]
    synthetic: bool
    plain_runs: bool
    base_len: int

    def one(
        self,
        v: Variant,
        cfg: AsymSpecConfig,
        *,
        case: dict | None = None,
        caption: str | None = None,
        length: int | None = None,
        instrument: bool = True,
    ) -> dict[str, Any]:
        """One request: ``case`` (with ``caption`` in place of its own) or, synthetic, a context of ``length``."""
        if self.synthetic:
            return self.runner.run(v, cfg, length=length or self.base_len, instrument=instrument, synthetic=True)
        return self.runner.run(v, cfg, case=case, caption=caption, instrument=instrument)

    def cell(self, v: Variant, cfg: AsymSpecConfig, *, length: int | None = None, padded: bool = False) -> list[dict[str, Any]]:
        """All cases of one variant in one repetition; ``padded``: captions padded to a view of ``length`` tokens."""
        out = []
        for case in self.inputs if not self.synthetic else self.inputs[:1]:
            caption = pad_caption(self.runner.pipe, case, length) if (padded and length and not self.synthetic) else None
            if self.plain_runs:
                plain = self.one(v, cfg, case=case, caption=caption, length=length, instrument=False)
                inst = self.one(v, cfg, case=case, caption=caption, length=length, instrument=True)
                inst["instrumented_decode_s"] = inst["decode_s"]  # its checks were made against this one
                inst.update({key: plain[key] for key in ("decode_s", "tokens_per_s")})
                inst["plain_new_tokens"] = plain["new_tokens"]
                out.append(inst)
            else:
                out.append(self.one(v, cfg, case=case, caption=caption, length=length, instrument=True))
        return out


def _notes(
    bp: BenchPair,
    *,
    synthetic: bool,
    base_len: int,
    image_tokens: int,
    ignore_eos: bool,
    engine: str,
    plain_runs: bool,
    route: str,
) -> list[str]:
    """What a reader must know to read the numbers (random weights, synthetic prefill, EOS, engines, route, timing)."""
    notes = list(bp.notes)
    if not bp.trained:
        notes.append(
            "RANDOM weights: acceptance rate, mean accepted length and the measured AsymSpec/SD tokens/s mean nothing; "
            "read the per-step costs and the PROJECTION (labelled) instead. Floor and drafter-alone tokens/s do not "
            "depend on acceptance and are measured."
        )
    if synthetic:
        notes.append(
            f"SYNTHETIC prefill: caches filled with random keys/values ({base_len} tokens of compressed view, "
            f"+{image_tokens} image positions on the drafter's full stream); no prompt is forwarded, the vision "
            "tower is not run (vision calls 0). Decode costs at that context length are real."
        )
    if ignore_eos:
        notes.append("EOS ignored: every request decodes exactly max_new_tokens tokens.")
    if engine != "dynamic":
        notes.append(
            f"engines: {engine} (opt-in static KV caches{' + compiled one-token decode' if 'compile' in engine else ''}; "
            "UNTESTED ON GPU unless this run is on one)."
        )
    notes.append(_route_note(route, engine, synthetic))
    if plain_runs:
        notes.append("tokens/s from un-instrumented runs; the split from separate instrumented runs (synchronizing clocks).")
    else:
        notes.append("tokens/s and split from the same runs (CPU: the timing proxies add two clock reads per call).")
    return notes


def _route_note(route: str, engine: str, synthetic: bool) -> str:
    """Where the runs decode (:meth:`Runner.route`), and why single-row engines where they are."""
    if route == "core":
        return (
            "route: engine core: each request decodes as pipe.generate decodes a request alone (its prompts prefilled in "
            "the paged row storages' forwards, outside the split; each storage's forwards timed under its stream)."
        )
    why = (
        "random KV poured into single-row caches (the core's storages fill only through a prefill)"
        if synthetic
        else f"--engine {engine}'s fixed-shape static-KV slots (for CUDA graphs) exist as single-row engines only"
    )
    return f"route: single-row engines: {why}."


def _main_comparison(cells: Cells, vs: list[Variant], base_cfg: AsymSpecConfig, reps: int, warmup: int, say: Say) -> dict[str, Any]:
    """Every variant at the base context, interleaved: the ``main`` section, per-call costs and the checks."""
    for w in range(warmup):
        say(f"warm-up {w + 1}/{warmup}")
        for v in vs:
            cfg = v.apply(base_cfg.with_(max_new_tokens=min(2, base_cfg.max_new_tokens)))
            cells.one(v, cfg, case=cells.inputs[0], length=cells.base_len, instrument=True)
    per_rep: dict[str, list[dict]] = {v.name: [] for v in vs}
    runs_by: dict[str, list[dict]] = {v.name: [] for v in vs}
    for r in range(reps):
        for v in rotate(vs, r):
            t0 = time.perf_counter()
            runs = cells.cell(v, v.apply(base_cfg), length=cells.base_len)
            for run in runs:
                run["rep"] = r
            runs_by[v.name].extend(runs)
            per_rep[v.name].append(rep_summary(runs))
            say(f"rep {r + 1}/{reps} {v.name}: {per_rep[v.name][-1]['tokens_per_s']:.2f} tok/s ({time.perf_counter() - t0:.1f}s)")
    all_runs = [run for runs in runs_by.values() for run in runs]
    return {
        "main": {
            "variants": summarize(per_rep, runs_by),
            "per_rep": per_rep,
            "runs": all_runs,
            "context": cells.base_len if cells.synthetic else "natural",
        },
        "call_costs": call_costs([run for run in all_runs if run["method"] in ("asymspec", "sd")]),
        "checks": collect_checks(all_runs),
    }


def _length_sweep(
    bp: BenchPair,
    cells: Cells,
    base_cfg: AsymSpecConfig,
    lengths: Sequence[int],
    names: str | Sequence[str],
    reps: int,
    image_tokens: int,
    say: Say,
) -> dict[str, Any]:
    """Per-token time against the compressed view's length (captions padded; synthetic: caches of that length)."""
    if not lengths or not names:
        return {}
    vs = with_floor(parse_variants(names))
    limit = context_limit(bp.pipe)
    usable = [L for L in lengths if fits_context(bp, L, base_cfg, cells.synthetic, image_tokens)]
    skipped = [L for L in lengths if L not in usable]
    rows: dict[int, dict[str, list[dict]]] = {L: {v.name: [] for v in vs} for L in usable}
    runs_at: dict[int, dict[str, list[dict]]] = {L: {v.name: [] for v in vs} for L in usable}
    for r in range(reps):
        for L in rotate(usable, r):
            for v in rotate(vs, r):
                runs = cells.cell(v, v.apply(base_cfg), length=L, padded=True)
                runs_at[L][v.name].extend(runs)
                rows[L][v.name].append(rep_summary(runs))
            say(
                f"length sweep rep {r + 1}/{reps} L={L}: " + ", ".join(f"{n} {rows[L][n][-1]['token_s'] * 1e3:.1f} ms/tok" for n in rows[L])
            )
    out: dict[str, Any] = {"lengths": usable, "skipped": skipped, "context_limit": limit, "by_length": {}}
    for L in usable:
        out["by_length"][str(L)] = summarize(rows[L], runs_at[L])
    if len(usable) >= 2:
        lo, hi = str(usable[0]), str(usable[-1])
        growth = {}
        for n in rows[usable[0]]:
            a, b = out["by_length"][lo][n], out["by_length"][hi][n]
            growth[n] = {
                "token_s": b["token_s"] / a["token_s"] if a["token_s"] else None,
                "step_s": b["step_s"] / a["step_s"] if a["step_s"] else None,
            }
        out["growth"] = growth
        if "floor" in growth and "asymspec" in growth and growth["floor"]["token_s"]:
            out["growth_ratio_asymspec_vs_floor"] = growth["asymspec"]["token_s"] / growth["floor"]["token_s"]
            out["growth_ratio_asymspec_step_vs_floor"] = growth["asymspec"]["step_s"] / growth["floor"]["token_s"]
            for name, key in (("growth_ratio_asymspec_vs_floor", "token_s"), ("growth_ratio_asymspec_step_vs_floor", "step_s")):
                out[name + "_reps"] = growth_ratio_reps(rows[usable[0]], rows[usable[-1]], key)
    return out


def growth_ratio_reps(short: dict[str, list[dict]], long: dict[str, list[dict]], key: str) -> list[float | None]:
    """Per repetition: AsymSpec's ``key`` growth from the shortest to the longest prompt over Floor's per-token
    growth (``None`` where a time is missing), so the growth target is judged by its spread like the others."""
    out: list[float | None] = []
    for a_lo, a_hi, f_lo, f_hi in zip(short["asymspec"], long["asymspec"], short["floor"], long["floor"]):
        ok = a_lo[key] and f_lo["token_s"] and f_hi["token_s"] / f_lo["token_s"]
        out.append(a_hi[key] / a_lo[key] / (f_hi["token_s"] / f_lo["token_s"]) if ok else None)
    return out


def k_label(name: str, k: int) -> str:
    """The K sweep's name for variant ``name`` at ``k``, in the variant grammar (``asymspec@gate=fixed,k=2``)."""
    return f"{name},k={k}" if "@" in name else f"{name}@k={k}"


def _k_sweep(
    cells: Cells, base_cfg: AsymSpecConfig, k_values: Sequence[int], names: str | Sequence[str], reps: int, say: Say
) -> dict[str, Any]:
    """Tokens/s against K, each variant at each K paired against Floor in the same repetition."""
    if not k_values or not names:
        return {}
    floor = parse_variant("floor")
    vs = parse_variants(names)
    labels = [(k_label(v.name, kk), v, kk) for kk in k_values for v in vs]
    per: dict[str, list[dict]] = {"floor": [], **{label: [] for label, _, _ in labels}}
    runs_by: dict[str, list[dict]] = {"floor": [], **{label: [] for label, _, _ in labels}}
    for r in range(reps):
        runs = cells.cell(floor, floor.apply(base_cfg), length=cells.base_len)
        runs_by["floor"].extend(runs)
        per["floor"].append(rep_summary(runs))
        for label, v, kk in rotate(labels, r):
            runs = cells.cell(v, v.apply(base_cfg.with_(k=kk)), length=cells.base_len)
            runs_by[label].extend(runs)
            per[label].append(rep_summary(runs))
        say(f"K sweep rep {r + 1}/{reps} done")
    return {"k_values": list(k_values), "by_k": summarize(per, runs_by)}


def _probes(
    bp: BenchPair, runner: Runner, k: int, context: int, reps: int, trace_top: int | None, loop_vocabs: Sequence[int], say: Say
) -> dict[str, Any]:
    """The batching probe at ``context`` and the loop-alone probe at the pair's vocabulary (and ``loop_vocabs``, bf16)."""
    import torch

    say("probe: batching the drafter's two streams")
    out: dict[str, Any] = {"batching": probe_drafter_batching(bp, k, context, reps, runner.clock)}
    say("probe: loop host cost with the models removed")
    vocab = bp.pipe.verifier.get_output_embeddings().weight.shape[0]
    out["loop"] = [probe_loop(vocab, k, 20, max(3, reps), bp.dtype, bp.device, runner.clock, trace_top)]
    for extra_vocab in loop_vocabs:
        out["loop"].append(probe_loop(extra_vocab, k, 10, max(3, reps), torch.bfloat16, bp.device, runner.clock, trace_top))
    return out


def _meta(
    bp: BenchPair,
    dev: torch.device,
    prefill: str,
    reps: int,
    warmup: int,
    cases: int,
    max_new: int,
    k: int,
    cfg: AsymSpecConfig,
    ignore_eos: bool,
    plain_runs: bool,
    image_tokens: int,
    case_families: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The run's settings and environment, as the report's header shows them."""
    import torch
    import transformers

    from ..eval.minivista import FAMILIES

    return {
        "pair": bp.name,
        "pair_description": bp.description,
        "trained": bp.trained,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(bp.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prefill": prefill,
        "reps": reps,
        "warmup": warmup,
        "cases": cases,
        "case_families": list(case_families or FAMILIES),
        "max_new_tokens": max_new,
        "k": k,
        "config": cfg.as_dict(),
        "ignore_eos": ignore_eos,
        "plain_runs": plain_runs,
        "image_tokens_synthetic": image_tokens if prefill == "synthetic" else None,
        "sd_drafter": getattr(bp.pipe, "sd_drafter_name", None),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "timed_blocks": list(TIMER_BUCKETS),
    }
