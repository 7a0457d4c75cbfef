"""The benchmark's outputs: Markdown tables, a PNG chart (:mod:`.chart`), the JSON of everything, and a section of a
Markdown file (``BENCHMARKS.md``) rewritten in place."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .aggregate import TARGETS, target_verdict
from .chart import render_chart
from .settings import SPLIT_KEYS, SPLIT_LABELS, STREAMS
from .spread import format_spread, spread


def _f(x: Any, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """``x * scale`` formatted, or a dash for a missing or NaN value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return fmt.format(x * scale)


def _med(s: dict[str, Any], key: str, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """A summary's median ``key`` with its spread over repetitions (``key + "_reps"``) when those were recorded."""
    reps = s.get(key + "_reps")
    return format_spread(reps, fmt, scale) if reps else _f(s.get(key), fmt, scale)


def _ratio(name: str, s: dict[str, Any]) -> str:
    """Ratio to Floor with its spread; Floor's own is 1 by definition (no spread to show)."""
    return "1.00x" if name == "floor" else _med(s, "ratio_to_floor", "{:.2f}x")


def render_markdown(res: dict[str, Any], title: str | None = None) -> str:
    """The benchmark's tables as Markdown (no absolute time is presented without its ratio context)."""
    m = res["meta"]
    trained = m["trained"]
    lines = [f"## {title or 'Benchmark: ' + m['pair']}", ""]
    lines += [
        f"- pair: **{m['pair']}**: {m['pair_description']}",
        f"- device: {m['device']} ({m['device_name']}), dtype {m['dtype']}, {m['threads']} torch threads, "
        f"torch {m['torch']}, transformers {m['transformers']}",
        f"- settings: K={m['k']}, max_new_tokens={m['max_new_tokens']}, {m['reps']} interleaved repetitions "
        f"(+{m['warmup']} warm-up), {m['cases']} request(s) per cell ({'/'.join(m.get('case_families', []))}), prefill={m['prefill']}, trace_top={m['config']['trace_top']}",
        f"- {m['date']}, bench wall {m.get('bench_wall_s', 0):.0f}s",
        "- every number is a median over repetitions, shown as `median (min-max, n=repetitions)` where the spread was "
        "recorded; a ratio is the median of per-repetition ratios of runs made side by side (variant vs Floor in the "
        "same repetition).",
    ]
    for n in res.get("notes", []):
        lines.append(f"- **note:** {n}")
    lines.append("")
    main = res.get("main", {}).get("variants", {})
    if main:
        lines += ["### Throughput and acceptance", ""]
        lines.append(
            "| variant | tokens/s (median) | ratio to Floor | MAL (tok/step) | accept rate | accepted per position | "
            "fwd tokens / emitted token (full, comp, ver) | vision tower calls |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for name, s in main.items():
            meaningless = (not trained) and s["method"] in ("asymspec", "sd")
            tps = _med(s, "tokens_per_s") + (" (random weights: not a result)" if meaningless else "")
            ratio = _ratio(name, s) + (" *" if meaningless else "")
            fwd = s["forwarded_per_token"]
            fwd_s = ", ".join(_f(fwd.get(st), "{:.2f}") for st in STREAMS)
            app = "/".join(_f(x, "{:.2f}") for x in s["accepted_per_position_rate"]) or "–"
            lines.append(
                f"| {name} | {tps} | {ratio} | {_f(s['mean_accepted_length'])} | {_f(s['acceptance_rate'])} | {app} | {fwd_s} | "
                f"{s['vision_calls']} tower / {s['vision_cache_hits']} cached / {s['requests']} req |"
            )
        if not trained:
            lines.append("\n\\* random weights: acceptance (hence AsymSpec/SD tokens/s) is not meaningful; see the projection.")
        lines.append("")
        lines += ["### Per-step time split (instrumented runs)", ""]
        lines.append(
            "| variant | step (ms, median) | "
            + " | ".join(SPLIT_LABELS[k2] + " (median)" for k2 in SPLIT_KEYS)
            + " | host overhead (gate+trace+rest) |"
        )
        lines.append("|---|---|" + "---|" * (len(SPLIT_KEYS) + 1))
        for name, s in main.items():
            if "split_frac" not in s:
                continue
            cells = [f"{_f(s['split_step_s'][k2], '{:.1f}', 1e3)} ({_f(s['split_frac'][k2], '{:.1f}%', 100)})" for k2 in SPLIT_KEYS]
            lines.append(
                f"| {name} | {_med(s, 'loop_step_s', '{:.1f}', 1e3)} | "
                + " | ".join(cells)
                + f" | {_med(s, 'host_overhead_frac', '{:.1f}%', 100)} |"
            )
        lines.append("")
    costs = res.get("call_costs", {})
    if costs:
        lines += [
            "### Per-call forward costs (decode phase, AsymSpec and SD runs)",
            "",
            "| stream | tokens per call | median ms | calls |",
            "|---|---|---|---|",
        ]
        for st, d in costs.items():
            for n, c in d.items():
                lines.append(f"| {st} | {n} | {_f(c['median_s'], '{:.1f}', 1e3)} | {c['calls']} |")
        lines.append("")
    proj = res.get("projection", {})
    if proj.get("scenarios"):
        lines += [
            f"### {proj['label']}",
            "",
            "AsymSpec step = (K - AR^K) x c(full, 1 tok) + AR^K x c(full, 2 tok) (d_K carried) + c(comp, K+1) + c(verifier, K+1) "
            "+ measured host overhead per step; "
            "tokens/s = MAL / step. Floor measured.",
            "",
            "| AR | MAL | P(all K accepted) | Floor tok/s (measured) | AsymSpec tok/s (projected) | ratio | SD tok/s (projected) | ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in proj["scenarios"]:
            lines.append(
                f"| {r['acceptance_rate']:.2f} | {r['mean_accepted_length']:.1f} | {r['full_accept_fraction']:.2f} | "
                f"{_f(r['floor_tokens_per_s'])} | {_f(r.get('asymspec_tokens_per_s'))} | {_f(r.get('asymspec_ratio_to_floor'), '{:.2f}x')} | "
                f"{_f(r.get('sd_tokens_per_s'))} | {_f(r.get('sd_ratio_to_floor'), '{:.2f}x')} |"
            )
        if proj.get("model_check"):
            mc = proj["model_check"]
            lines.append(
                f"\nModel check on this trained pair: measured AsymSpec {_f(mc['measured_tokens_per_s'])} tok/s, projected from "
                f"its own acceptance {_f(mc['projected_tokens_per_s'])} tok/s."
            )
        lines.append("")
    sl = res.get("scaling_length", {})
    if sl.get("by_length"):
        lines += [
            "### Scaling with the compressed-view length",
            "",
            "| view tokens (target) | contexts (full/comp/ver) | "
            + " | ".join(f"{n} ms/token" for n in next(iter(sl["by_length"].values())))
            + " | asymspec ms/step | asymspec ratio to Floor |",
            "|---|---|" + "---|" * (len(next(iter(sl["by_length"].values()))) + 2),
        ]
        for L, row in sl["by_length"].items():
            ctx = row.get("asymspec", row.get("floor", {})).get("context", {})
            ctx_s = "/".join(str(ctx.get(s, "–")) for s in STREAMS)
            cells = " | ".join(_med(s, "token_s", "{:.1f}", 1e3) for s in row.values())
            a = row.get("asymspec", {})
            lines.append(f"| {L} | {ctx_s} | {cells} | {_med(a, 'step_s', '{:.1f}', 1e3)} | {_med(a, 'ratio_to_floor', '{:.2f}x')} |")
        if sl.get("growth"):
            g = sl["growth"]
            lines.append(
                "\nGrowth from the shortest to the longest view (per-token time): "
                + ", ".join(f"{n} {_f(v['token_s'], '{:.2f}x')}" for n, v in g.items())
                + f"; AsymSpec growth / Floor growth = **{_f(sl.get('growth_ratio_asymspec_vs_floor'), '{:.2f}')}**"
                f" (per-step: {_f(sl.get('growth_ratio_asymspec_step_vs_floor'), '{:.2f}')})."
            )
        if sl.get("skipped"):
            lines.append(f"\nSkipped lengths {sl['skipped']}: beyond the models' context window ({sl['context_limit']}).")
        lines.append("")
    sk = res.get("scaling_k", {})
    if sk.get("by_k"):
        lines += [
            "### Scaling with K",
            "",
            "| variant | tokens/s | ratio to Floor | MAL | accept rate | step ms |",
            "|---|---|---|---|---|---|",
        ]
        for label, s in sk["by_k"].items():
            lines.append(
                f"| {label} | {_med(s, 'tokens_per_s')} | {_ratio(label, s)} | {_f(s['mean_accepted_length'])} | "
                f"{_f(s['acceptance_rate'])} | {_med(s, 'step_s', '{:.1f}', 1e3)} |"
            )
        lines.append("")
    pb = res.get("probes", {}).get("batching")
    if pb:
        lines += [
            "### Probe: batching the drafter's two streams in one forward",
            "",
            f"{pb['label']}, context {pb['context']}: separate {_f(pb['separate_s'], '{:.1f}', 1e3)} ms, one forward "
            f"{_f(pb['batched_s'], '{:.1f}', 1e3)} ms, saving **{_f(pb['saving_frac'], '{:.0f}%', 100)}** of those two forwards.",
            "",
        ]
    probes_loop = res.get("probes", {}).get("loop") or []
    if probes_loop:
        lines += [
            "### Probe: the loop alone (models replaced by zero-cost fakes)",
            "",
            f"{probes_loop[0]['label']}; K={probes_loop[0]['k']}, trace_top={probes_loop[0]['trace_top']}; medians over reps.",
            "",
            "| vocab | dtype | ms/step |",
            "|---|---|---|",
        ]
        for pl in probes_loop:
            lines.append(f"| {pl['vocab']} | {pl['dtype']} | {_f(pl['step_s'], '{:.2f}', 1e3)} |")
        lines.append("")
    lines += batch_markdown(res.get("batching"), m["dtype"])
    tg = res.get("targets", [])
    if tg:
        lines += ["### Targets", "", "| target | measured: median (min-max, n=repetitions) | verdict (all of n >= 3) |", "|---|---|---|"]
        for t in tg:
            meas = target_measured(t)
            crosses = "the range over repetitions crosses the target" if range_crosses_target(t) else None
            extra = [x for x in (crosses, t.get("note"), ("measured cause: " + t["cause"]) if t.get("cause") else None) if x]
            v = target_verdict(t)
            lines.append(f"| {t['text']} | {meas} | {v if v == 'met' else f'**{v}**'}{(' (' + '; '.join(extra) + ')') if extra else ''} |")
        lines.append("")
    ch = res.get("checks")
    if ch and ch["runs"]:
        lines.append(
            f"Bookkeeping checks over {ch['runs']} runs: forwarded counts {'ok' if ch['forwarded_ok'] else 'MISMATCH'}, "
            f"token bounds {'ok' if ch['tokens_ok'] else 'MISMATCH'}, split sums to the step time within "
            f"{ch['split_sum_max_rel_err'] * 100:.2f}%."
        )
        lines.append("")
    return "\n".join(lines)


def target_measured(t: dict[str, Any]) -> str:
    """A target row's measured median in its unit, with its spread over repetitions when the row carries them."""
    fmt, scale = {"tiny_speedup": ("{:.2f}x", 1.0), "batch_speedup": ("{:.2f}x", 1.0), "batch_step": ("{:.2f}x", 1.0)}.get(
        t["target"], ("{:.2f}", 1.0) if t["target"] == "length_growth" else ("{:.2f}%", 100.0)
    )
    reps = t.get("reps")
    return format_spread(reps, fmt, scale) if reps else _f(t["measured"], fmt, scale)


def range_crosses_target(t: dict[str, Any]) -> bool:
    """Whether a target row's repetitions fall on both sides of its threshold (the verdict then rests on the median)."""
    reps = spread(t.get("reps") or [])
    threshold = TARGETS.get(t["target"], (None, None))[1]
    return bool(reps["n"] >= 2 and threshold is not None and reps["min"] < threshold < reps["max"])


def _bytes(n: float | None) -> str:
    """A byte count in KiB / MiB."""
    if n is None:
        return "–"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def batch_markdown(bt: dict[str, Any] | None, dtype: str = "float32") -> list[str]:
    """The batch sweep's tables: tokens/s per batch size and ratio to the sequential loop, step times, KV per row."""
    if not bt:
        return []
    synthetic = bt["mode"] == "synthetic"
    lines = ["### Batched decoding: generate_batch vs the sequential loop", ""]
    lines.append(
        f"{bt['cases']} requests per cell (the same ones at every B), {bt['max_new_tokens']} new tokens at most, K={bt['k']}, "
        f"{bt['reps']} interleaved repetition(s) (+{bt['warmup']} warm-up). B=1 is the SEQUENTIAL loop (pipe.generate one "
        "request after another); B>1 is generate_batch(batch_size=B), continuously refilled. Ratios to B=1 are medians of "
        "per-repetition ratios; each median is shown with its spread, median (min-max, n=repetitions)."
    )
    if bt.get("batch_engine", "dynamic") != "dynamic":
        lines.append(
            f"\n**Row storage: {bt['batch_engine']}** at B>1 (StaticBatchEngine: preallocated slots, max_rows = B"
            f"{', compiled fixed-shape forwards' if 'compile' in bt['batch_engine'] else ''}), for generate_batch and "
            "the stepped engine core alike."
        )
        for name, per in bt["by_variant"].items():
            one = per.get("1", {}).get("storage_b1")
            if one:
                ratio = one["ratio_to_sequential_decode"]
                ratio_text = f"{ratio:.2f}x" if ratio is not None else "-"
                lines.append(
                    f"- {name} at B=1 on {bt['batch_engine']} rows (one slot): decode {one['decode_tokens_per_s']:.2f} tokens/s, "
                    f"{ratio_text} the sequential loop's decode tokens/s, step "
                    f"{one['step_s'] * 1e3:.1f} ms; tokens {'equal' if one['same_tokens'] else 'DIFFER from'} the sequential loop's."
                )
    if bt.get("route_note"):  # where the requests decode (a sweep written before it had none)
        lines.append(f"\n{bt['route_note']}")
    if synthetic:
        sc = bt["synthetic_context"]
        lines.append(
            f"\n**Synthetic caches** (the request path's prefill is minutes per request here): row i holds {sc['base']} + "
            f"{sc['stagger']}*i positions (+{sc['image_tokens']} image positions on the full stream), EOS ignored; generate_batch "
            "cannot run on them (it prefills), so both loops decode the same prefilled sessions (pipe.run one after another; an "
            "engine core stepped as generate_batch steps it) and tokens/s is decode-only."
        )
    else:
        lines.append(
            "\ntokens/s: the whole call (set-up + decoding) of generate_batch, or of the sequential loop; decode tokens/s leaves "
            "out the set-up (view, prompts, vision) and the turns that only prefilled (a request alone's first turn, a batch's "
            "first rows), from an engine core stepped as generate_batch steps it (each turn timed; its tokens are checked "
            "equal to generate_batch's); a row arriving while others decode has its prompt ride in their step, whose time "
            "holds it. EOS ends a request, as in pipe.generate and generate_batch."
        )
    lines.append(
        "Step: median wall time of a decode step with the batch full (B rows, or all the requests when fewer; the core's "
        "own measure, without the rest of its turn); KV/row: the "
        "row's context at its join (end of prefill) times its row storages' bytes per token, summed over its streams; "
        "batch cache/row: the row storages' peak bytes (free blocks and holes included) over the rows then live."
    )
    lines += [
        "",
        "| variant | B | tokens/s | ratio to B=1 | decode tokens/s | decode ratio | step ms | step ratio to B=1 | rows/step | "
        "KV/row | batch cache/row (peak) | tokens = sequential |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per in bt["by_variant"].items():
        for b, s in per.items():
            tps = "–" if s["tokens_per_s"] is None else _med(s, "tokens_per_s")
            dtps = _med(s, "decode_tokens_per_s")

            def rr(key: str, s: dict = s) -> str:
                return "1.00x" if s["sequential"] else _med(s, key, "{:.2f}x")

            label = "1 (sequential)" if s["sequential"] else b
            lines.append(
                f"| {name} | {label} | {tps} | {rr('ratio_to_seq') if s['tokens_per_s'] is not None else '–'} | {dtps} | "
                f"{rr('decode_ratio_to_seq')} | {_med(s, 'step_s', '{:.1f}', 1e3)} | {rr('step_ratio')} | {_f(s['rows_per_step'], '{:.1f}')} | "
                f"{_bytes(s['kv_bytes_per_row'])} | {_bytes(s.get('cache_bytes_per_row_peak'))} | "
                f"{'yes' if s['same_tokens_as_sequential'] else '**no**'} |"
            )
    split_rows = [(n, b, s) for n, per in bt["by_variant"].items() for b, s in per.items() if s.get("split_step_s")]
    if split_rows:
        lines += [
            "",
            "Per-step split (ms per step, mean over the steps with the batch full, as the step column; forwards timed around "
            "each batched forward):",
            "",
            "| variant | B | step (mean) | "
            + " | ".join(SPLIT_LABELS[k] for k in SPLIT_KEYS)
            + " | forwards / single-row step's | host / single-row step's |",
            "|---|---|---|" + "---|" * (len(SPLIT_KEYS) + 2),
        ]
        for name, b, s in split_rows:
            sp = s["split_step_s"]
            seq = bt["by_variant"][name]["1"].get("split_step_s")
            fwd = sum(sp[k] for k in STREAMS)
            host = sp["gate"] + sp["trace"] + sp["other"]
            f_ratio = fwd / sum(seq[k] for k in STREAMS) if seq and sum(seq[k] for k in STREAMS) else None
            h_seq = (seq["gate"] + seq["trace"] + seq["other"]) if seq else None
            lines.append(
                f"| {name} | {b} | {_f(sum(sp.values()), '{:.1f}', 1e3)} | "
                + " | ".join(_f(sp[k], "{:.2f}", 1e3) for k in SPLIT_KEYS)
                + f" | {_f(f_ratio, '{:.2f}x')} | {_f(host / h_seq if h_seq else None, '{:.2f}x')} |"
            )
    ch = bt["checks"]
    if not ch["same_tokens_as_sequential"] and dtype != "float32":
        lines.append(
            f"\nTokens not identical to the sequential loop's in {dtype}: a batched forward's reductions have other shapes "
            "than a single row's, so rounding differs and near-tied greedy choices can flip (random weights make ties "
            "common); in float32 every row equals its request alone (tests/test_batch.py). Different tokens also mean "
            "different acceptance, so compare step times, not step counts."
        )
    lines.append(
        f"\nChecks: every B's tokens equal the sequential loop's: {'yes' if ch['same_tokens_as_sequential'] else '**no**'}"
        + (
            ""
            if synthetic
            else f"; the stepped decoder's tokens equal generate_batch's: {'yes' if ch['stepped_same_as_generate_batch'] else '**no**'}"
        )
        + "."
    )
    lines.append("")
    return lines


def _jsonable(x: Any) -> Any:
    """``x`` with NaN/inf as None and keys as strings (strict JSON)."""
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_outputs(res: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(_jsonable(res), indent=1))
    paths["markdown"].write_text(render_markdown(res) + "\n")
    render_chart(res, paths["png"])
    return paths


def update_section(path: str | Path, key: str, markdown: str, header: str = "# Benchmarks\n") -> Path:
    """Replace (or append) the section between ``<!-- bench:KEY -->`` markers of a Markdown file."""
    path = Path(path)
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.exists() else header
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path
