"""The page's sampling settings: temperature (0: greedy, the paper's rule), top-p and a seed, checked into the config
fields every row of a run decodes with (:mod:`asymspec_mm.base.sampling` states the rule). Gradio is imported only to
build the inputs.
"""

from __future__ import annotations

import math
from typing import Any

from asymspec_mm.base.config import RANGES, SEED_LIMIT, range_error

from .errors import DemoInputError

__all__ = ["build_sampling_inputs", "check_sampling_inputs", "sampling_note"]


def check_sampling_inputs(temperature: Any = 0.0, top_p: Any = 1.0, seed: Any = None) -> dict[str, Any]:
    """The config fields of the page's sampling inputs; a :class:`DemoInputError` naming the first bad one. An empty
    seed (None, "", blanks or NaN) lets each run draw a fresh one (the status then names it)."""
    try:
        t = 0.0 if temperature in (None, "") else float(temperature)
        p = 1.0 if top_p in (None, "") else float(top_p)
    except (TypeError, ValueError):
        raise DemoInputError(f"temperature and top-p must be numbers, got {temperature!r} and {top_p!r}") from None
    if (problem := range_error("temperature", t)) is not None:
        raise DemoInputError(f"{problem} (0 decodes greedily)")
    if not (math.isfinite(p) and 0 < p <= 1):
        raise DemoInputError(f"top_p={p!r} must be > 0 and <= 1 (1 keeps every token)")
    out: dict[str, Any] = {"temperature": t, "top_p": p}
    if isinstance(seed, str):  # the page's field: "", or digits typed with a stray space
        seed = seed.strip()
    if seed is not None and seed != "" and not (isinstance(seed, float) and math.isnan(seed)):
        if isinstance(seed, bool):
            seed = str(seed)
        try:  # a whole number exactly: int("12"), int(12), and a float only where it holds an integer
            s = seed if isinstance(seed, int) else int(seed) if isinstance(seed, str) else int(seed) if float(seed).is_integer() else None
        except (TypeError, ValueError, OverflowError):
            s = None
        if s is None or not 0 <= s < SEED_LIMIT:
            raise DemoInputError(f"seed={seed!r} must be a whole number >= 0 and < 2**63 (empty: a fresh seed each run)")
        out["seed"] = s
    return out


def sampling_note(result: Any) -> str | None:
    """The status's note on a sampled answer (its temperature and the seed that repeats it), or None when greedy."""
    cfg = getattr(result, "config", None)
    if cfg is None or not cfg.sampling:
        return None
    return f"sampled at temperature {cfg.temperature:g}, seed {result.stats.get('seed')}"


def build_sampling_inputs() -> tuple[Any, Any, Any]:
    """The "Sampling" accordion's temperature and top-p sliders and seed field, inside the Blocks being built."""
    import gradio as gr

    with gr.Accordion("Sampling (temperature > 0)", open=False):
        temperature = gr.Slider(
            *RANGES["temperature"].bounds(),
            value=0.0,
            step=0.05,
            label="Temperature (0: greedy, the paper's rule; above: the sampled AsymSpec rule)",
            elem_id="asym-temperature",
        )
        top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p (1: off)", elem_id="asym-top-p")
        # A text field: Gradio's Number shows (and sends) 0 for an empty value, so every sampled run used seed 0 until
        # the user cleared it (#41). check_sampling_inputs reads the whole number.
        seed = gr.Textbox(
            "",
            lines=1,
            max_lines=1,
            max_length=24,
            placeholder="empty: a fresh seed each run",
            label="Seed (empty: a fresh one each run, named in the status)",
            elem_id="asym-seed",
        )
    return temperature, top_p, seed
