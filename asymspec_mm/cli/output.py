"""What ``asymspec-mm generate`` prints: the answer, where each token came from, which tokens the image
steered away from the verifier's own choice, the effective settings and where the time went."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from ..base.config import AsymSpecConfig
from ..frontend.explain import gate_decision
from .trace_json import TokenTexts, result_json

SOURCE_MARK = {"accepted": "", "fused": "*", "bonus": "+", "corrected": "!", "greedy": ""}
MARK_LEGEND = "plain = drafter token accepted by the gate, [*x] = delta-fused at a rejection, [+x] = verifier bonus"


def format_provenance(res, special_ids: frozenset[int] = frozenset()) -> str:
    """The answer with each token tagged: plain = accepted draft, [*x] = fused at a rejection, [+x] = verifier bonus.

    Tokens in ``special_ids`` (the end-of-turn token the answer stopped at) are left out, as in ``res.text``."""
    parts = []
    for ev in res.trace:
        if ev.token_id in special_ids:
            continue
        if ev.source in ("fused", "bonus"):
            parts.append(f"[{SOURCE_MARK[ev.source]}{ev.text}]")
        else:
            parts.append(ev.text)
    return "".join(parts)


def steered_lines(res, text_of: TokenTexts) -> list[str]:
    """One line per token that differs from what the verifier alone would have emitted at that point."""
    lines = []
    for ev in res.trace:
        if not ev.steered:
            continue
        alone = text_of(ev.verifier_argmax)
        if ev.residual:
            how = f"drawn from the residual at a rejection (draft {text_of(ev.draft_token)!r} rejected)"
        elif ev.source == "fused":
            how = f"fused at a rejection (draft {text_of(ev.draft_token)!r} rejected)" if ev.draft_token is not None else "fused"
        elif ev.source == "accepted":
            how = "drafter's token, accepted by the gate"
        else:
            how = ev.source
        decision = gate_decision(ev, text_of(ev.draft_token) or "")
        lines.append(f"  #{ev.index} {ev.text!r}: {how}; verifier alone: {alone!r}" + (f" [{decision}]" if decision else ""))
    return lines


def config_line(method: str, cfg: AsymSpecConfig) -> str:
    """The effective settings of a run, as the options that reproduce it (the sampling ones only when it sampled)."""
    fields = cfg.as_dict()
    quiet = {"trace_top"} | (set() if cfg.sampling else {"temperature", "top_p", "top_k", "seed"})
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if k not in quiet and (k != "stop_strings" or v))
    return f"method={method} {shown}"


def sampling_line(res) -> str | None:
    """How a sampled run drew its tokens (the seed that repeats it, the mean gate excess), or None when greedy."""
    if not res.config.sampling:
        return None
    s = res.stats
    line = f"sampled at temperature {res.config.temperature:g} with seed {s.get('seed')} (repeat with --seed {s.get('seed')})"
    if s.get("mean_gate_excess") is not None:
        line += f"; mean gate excess {s['mean_gate_excess']:.4f} (0: exactly the fused target's distribution)"
    return line


def print_result(res, tokenizer: Any = None, as_json: bool = False, out: TextIO | None = None) -> None:
    """The answer with its provenance (or, with ``as_json``, the whole result with token texts)."""
    out = out if out is not None else sys.stdout  # resolved per call: sys.stdout may be swapped
    if as_json:
        json.dump(result_json(res, tokenizer) if tokenizer is not None else res.as_dict(), out, indent=1)
        out.write("\n")
        return
    s = res.stats
    print(f"answer: {res.text}", file=out)
    if res.method == "asymspec":
        special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        print(f"provenance: {format_provenance(res, special)}", file=out)
        print(f"  ({MARK_LEGEND})", file=out)
        counts = {src: sum(ev.source == src for ev in res.trace) for src in ("accepted", "fused", "bonus")}
        same = sum(ev.source == "fused" and not ev.steered for ev in res.trace)
        print(
            f"tokens: {len(res.trace)} ({counts['accepted']} accepted, {counts['fused']} fused, {counts['bonus']} bonus); "
            f"{s.get('steered', 0)} differ from the verifier alone" + (f", {same} fused to the verifier's own token" if same else ""),
            file=out,
        )
        if tokenizer is not None:
            for line in steered_lines(res, TokenTexts(tokenizer)):
                print(line, file=out)
        print(
            f"acceptance rate {s['acceptance_rate']:.2f}, mean accepted length {s['mean_accepted_length']:.2f}, "
            f"accepted per position {s['accepted_per_position']}",
            file=out,
        )
    print(
        f"steps {s['steps']}, new tokens {s['new_tokens']}, {s['tokens_per_s']:.1f} tok/s, wall {s['wall_s']:.2f}s, "
        f"vision calls {s['vision_calls']} (cache hits {s['vision_cache_hits']}), tokens forwarded {s['tokens_forwarded']}",
        file=out,
    )
    print(view_line(res), file=out)
    for line in compression_lines(res):
        print(line, file=out)
    if getattr(res, "tool_calls", None):
        print(f"tool calls: {json.dumps(res.tool_calls, ensure_ascii=False)}", file=out)
    if (line := sampling_line(res)) is not None:
        print(line, file=out)
    cfg = res.config.with_(seed=s.get("seed")) if res.config.sampling else res.config  # the seed the run drew
    print(f"settings: {config_line(res.method, cfg)}", file=out)


def view_line(res) -> str:
    """What the verifier read and what producing it cost."""
    s = res.stats
    caption = f"caption {len(res.view.caption)} chars"
    if s.get("caption_s"):
        caption += f" (drafter, {s['caption_s']:.2f} s)"
    engine = s.get("ocr_engine")
    ocr = f"OCR {len(res.view.ocr_text)} chars"
    if engine in ("given", "off"):
        ocr += " (given)" if engine == "given" else " (off)"
    elif engine:
        ocr += f" ({engine}, {s.get('ocr_s', 0.0):.2f} s)"
    return f"compressed view: {caption}, {ocr}"


def compression_lines(res, width: int = 160) -> list[str]:
    """What per-turn compression did (none without it): the ratio, the compressor's time, and each compressed
    message as the verifier read it (``[index] role: text``, cut at ``width`` characters)."""
    s = res.stats
    if "compression_ratio" not in s:
        return []
    lines = [
        f"compressed text: ratio {s['compression_ratio']:.2f} ({s.get('prompt_tokens_full')} -> "
        f"{res.prompts.verifier_ids.shape[-1]} verifier tokens), compressor {s.get('compression_s', 0.0):.2f} s"
    ]
    for m in s.get("compressed_view") or []:
        text = " ".join(str(m.get("text", "")).split())
        lines.append(f"  [{m.get('index')}] {m.get('role')}: {text if len(text) <= width else text[: width - 3] + '...'}")
    return lines


class Progress:
    """``[  3.1s] captioning with the drafter`` lines on stderr as each long phase starts."""

    PHASES = {
        "ocr_engine": "starting the OCR engine",
        "caption": "captioning the image with the drafter",
        "ocr": "reading text in the image (OCR)",
        "prefill": "prefilling the prompts",
    }

    def __init__(self, enabled: bool = True, out: TextIO | None = None) -> None:
        self.enabled, self.out, self.t0 = enabled, out, time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.enabled:
            text = self.PHASES.get(phase, phase)
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {text}", file=self.out if self.out is not None else sys.stderr, flush=True)
