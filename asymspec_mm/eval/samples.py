"""Accuracy under sampling (``eval --temperature T --samples N``): N seeded samples per problem and variant, and
their mean with a confidence interval.

Each variant is run N times as the variants ``NAME#s0`` .. ``NAME#s{N-1}`` (config seed 0 .. N-1), so every
sample is its own durable, resumable set of records; a problem's request seed is a digest of the sample's seed and
the problem's pid (:func:`problem_seed`), so the samples of one problem are independent and a rerun draws the same
tokens. The report's sampled section gives, per variant, the mean accuracy over samples with a percentile bootstrap
interval over problems (a problem's score is its mean correctness over the samples), and the range of the N
per-sample accuracies.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..base.config import SEED_LIMIT
from ..frontend.variants import Variant

SAMPLE_MARK = "#s"
_SAMPLE_NAME = re.compile(r"^(?P<base>.+)#s(?P<index>\d+)$")


def sample_variants(variants: Sequence[Variant], samples: int, sampling: bool) -> list[Variant]:
    """Each variant as ``samples`` variants ``NAME#s{i}`` with config seed i; unchanged for one greedy sample, and
    one sampled run keeps its name with seed 0 (a sampled run always records its seed)."""
    if samples < 1:
        raise ValueError(f"samples={samples!r} must be >= 1")
    if samples == 1:
        return [Variant(v.name, v.method, {**v.config, "seed": 0}) for v in variants] if sampling else list(variants)
    return [Variant(f"{v.name}{SAMPLE_MARK}{i}", v.method, {**v.config, "seed": i}) for v in variants for i in range(samples)]


def problem_seed(seed: int, pid: str) -> int:
    """The request seed of problem ``pid`` in the sample seeded ``seed`` (a digest: independent across problems and
    samples, the same on every run)."""
    digest = hashlib.sha256(f"asymspec-eval:{seed}:{pid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_LIMIT


def request_config(make_config: Callable[..., Any], variant: Variant, pid: str) -> Any:
    """The config of one (variant, problem) request: a sampled variant's seed becomes the problem's own."""
    cfg = make_config(**dict(variant.config))
    if getattr(cfg, "sampling", False):
        cfg = cfg.with_(seed=problem_seed(cfg.seed or 0, pid))
    return cfg


def base_name(variant: str) -> tuple[str, int | None]:
    """``("asymspec", 3)`` for ``asymspec#s3``; ``(name, None)`` for a variant that is not a sample."""
    m = _SAMPLE_NAME.match(variant)
    return (m.group("base"), int(m.group("index"))) if m else (variant, None)


def sampled_summary(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per sampled variant (the base name): ``samples``, ``problems`` (those every sample answered), ``accuracy`` (in
    %, the mean over samples), ``ci95`` (bootstrap over problems) and ``per_sample`` accuracies; {} without samples."""
    import numpy as np

    from .report import CI_LEVEL, CI_RESAMPLES, CI_SEED

    by_base: dict[str, dict[int, dict[str, bool]]] = {}
    for name, records in groups.items():
        base, index = base_name(name)
        if index is not None:
            by_base.setdefault(base, {})[index] = {str(r["pid"]): bool(r.get("true_false")) for r in records}
    out: dict[str, dict[str, Any]] = {}
    for base, samples in by_base.items():
        common = sorted(set.intersection(*(set(s) for s in samples.values())))
        if not common:
            continue
        scores = np.asarray([[samples[i][pid] for i in sorted(samples)] for pid in common], dtype=np.float64)  # [problems, N]
        per_problem = scores.mean(axis=1)
        rng = np.random.default_rng(CI_SEED)
        means = per_problem[rng.integers(0, len(common), size=(CI_RESAMPLES, len(common)))].mean(axis=1) * 100.0
        lo, hi = np.quantile(means, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2])
        out[base] = {
            "samples": len(samples),
            "problems": len(common),
            "accuracy": float(per_problem.mean() * 100.0),
            "ci95": (float(lo), float(hi)),
            "per_sample": [float(x) for x in scores.mean(axis=0) * 100.0],
        }
    return out


def sampled_section(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The report's Markdown section for :func:`sampled_summary` ("" when nothing was sampled)."""
    from .report import CI_RESAMPLES, CI_SEED

    if not summary:
        return ""
    lines = [
        "## Accuracy under sampling",
        "",
        "| Method | samples | problems | mean accuracy [95% CI] | per-sample accuracy (min-max) |",
        "|:---|---:|---:|---:|---:|",
    ]
    for base, s in summary.items():
        lo, hi = s["ci95"]
        lines.append(
            f"| {base} | {s['samples']} | {s['problems']} | {s['accuracy']:.1f} [{lo:.1f}, {hi:.1f}] "
            f"| {min(s['per_sample']):.1f}-{max(s['per_sample']):.1f} |"
        )
    lines += [
        "",
        f"- A problem's score is its mean correctness over the samples; the interval is a percentile bootstrap over "
        f"problems ({CI_RESAMPLES} resamples, seed {CI_SEED}). Each sample's own row is in the table above.",
    ]
    return "\n".join(lines) + "\n"
