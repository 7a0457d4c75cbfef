"""The decoding settings and the names they take: one vocabulary for the library, the CLI, eval and bench.

Torch-free on purpose, so that ``asymspec-mm --help`` and option parsing import no model code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from .checks import is_int, is_number
from .errors import UnknownOptionError
from .unicode_check import check_text_fields

METHODS = ("asymspec", "floor", "drafter", "sd")
GATES = ("cda", "fixed", "tuned", "tuned_kl", "kl")
DELTAS = ("contrast", "raw", "scd")
BONUS_RULES = ("verifier", "gated")
DRAFTER_VIEWS = ("image+text", "image")

#: The options of each enumerated :class:`AsymSpecConfig` field.
CHOICES: dict[str, tuple[str, ...]] = {"gate": GATES, "delta": DELTAS, "bonus": BONUS_RULES, "drafter_view": DRAFTER_VIEWS}


#: Temperatures below this decode greedily (vLLM's rule): logits divided by a smaller one overflow float32.
SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class Range:
    """The values a numeric :class:`AsymSpecConfig` field may take, both ends included (``high=None``: no upper end)."""

    low: float
    high: float | None
    integer: bool = False

    def bounds(self) -> tuple[float, float | None]:
        """``(low, high)``, e.g. a slider's minimum and maximum."""
        return self.low, self.high

    def holds(self, value: float) -> bool:
        """Whether ``value`` (a number) lies in the range."""
        return self.low <= value and (self.high is None or value <= self.high)

    def text(self) -> str:
        """``"1 to 16"`` (``"1 or more"`` without an upper end): the range as the help and the README show it."""
        return f"{self.low:g} or more" if self.high is None else f"{self.low:g} to {self.high:g}"

    def bound_text(self) -> str:
        """``">= 1 and <= 16"`` (``">= 1"``): the range as a refusal states it."""
        return f">= {self.low:g}" if self.high is None else f">= {self.low:g} and <= {self.high:g}"


#: The one range of each numeric field, read by the library, the command line (``--k`` ...), the server's request
#: fields and the demo's sliders. K: the demo's slider (16 drafts already cost more than a rejection saves);
#: beta and gamma: the demo's sliders (gamma is a threshold on p_v / p_base, the paper sweeps 0.4-0.7); lam:
#: the tuned gates' lambda (the paper's 0.1, a decade either way and more); max_new_tokens: no upper end here,
#: the verifier's context window bounds it per request (the pipeline says how many fit); trace_top: top tokens
#: kept per trace event.
RANGES: dict[str, Range] = {
    "k": Range(1, 16, integer=True),
    "beta": Range(0.0, 4.0),
    "gamma": Range(0.0, 1.0),
    "lam": Range(0.0, 10.0),
    "max_new_tokens": Range(1, None, integer=True),
    "trace_top": Range(0, 20, integer=True),
    "temperature": Range(0.0, 2.0),
    "top_p": Range(0.0, 1.0),
    "top_k": Range(0, None, integer=True),
}
#: Seeds lie in [0, SEED_LIMIT) (what torch's generators take).
SEED_LIMIT = 2**63


def range_error(name: str, value: Any, label: str | None = None) -> str | None:
    """The one-line refusal of ``value`` for the field ``name`` (``label`` names it, default ``name=value``), or
    ``None`` when :data:`RANGES` holds it: ``"k=100 must be an integer >= 1 and <= 16"``."""
    rng = RANGES[name]
    label = label if label is not None else f"{name}={value!r}"
    if rng.integer:
        if not (is_int(value) and rng.holds(value)):
            return f"{label} must be an integer {rng.bound_text()}"
        return None
    if not is_number(value) or not math.isfinite(value):
        return f"{label} must be a finite number {rng.bound_text()}"
    if not rng.holds(value):
        return f"{label} must be {rng.bound_text()}"
    return None


@dataclass(frozen=True)
class AsymSpecConfig:
    """Decoding settings. Defaults are the paper's cross-modal setting (MathVista: K=4, beta=1, gamma=0.5, CDA).

    The numeric fields' ranges are :data:`RANGES`. k: drafts per step. beta: fusion strength (0 disables fusion). gamma: acceptance threshold before the
    divergence discount. gate: how gamma is discounted (``cda``: gamma*exp(-JSD), the paper; ``fixed``: gamma;
    ``tuned``: gamma*exp(-lam*log-ratio at the draft), the paper text's Appendix B reading; ``tuned_kl``:
    gamma*exp(-lam*KL(p_a||p_b)), the released code's tuned gate; ``kl``: gamma*exp(-KL(p_a||p_b)), Table 14).
    lam: lambda of the tuned gates. delta: the steering signal (``contrast`` a-b, ``raw`` a, ``scd``
    t-b). drafter_view: what the drafter's full stream reads besides the image. bonus: the token after K
    acceptances (``verifier``: argmax t_{K+1}, the paper; ``gated``: the drafter's a_{K+1} through the gate).
    stop_strings: decoding stops once the text contains one (any number of non-empty strings; the server takes at
    most 4, as OpenAI's ``stop``). trace_top: top tokens kept per trace event.
    temperature: 0 (or any value under :data:`SAMPLING_EPS`) decodes greedily (the paper's rule); above it every method samples (AsymSpec by the sampled rule of
    :mod:`asymspec_mm.base.sampling`), after top_k (0: off) then top_p (1: off) filtering. seed: the row's random
    generator (None: a fresh seed, reported in the result's stats), so a seeded request repeats its tokens.
    """

    k: int = 4
    beta: float = 1.0
    gamma: float = 0.5
    gate: str = "cda"
    lam: float = 0.1
    delta: str = "contrast"
    drafter_view: str = "image+text"
    bonus: str = "verifier"
    max_new_tokens: int = 512
    stop_strings: tuple[str, ...] = ()
    trace_top: int = 3
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def sampling(self) -> bool:
        """Whether tokens are sampled rather than chosen greedily: a temperature under :data:`SAMPLING_EPS` decodes
        greedily, as vLLM does (dividing logits by it would overflow float32 into NaN probabilities)."""
        return self.temperature >= SAMPLING_EPS

    def validated(self) -> AsymSpecConfig:
        """Return self after checking every option; raises :class:`UnknownOptionError` naming the bad one."""
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise UnknownOptionError(f"{name}={value!r} is not valid; choose one of {', '.join(allowed)}")
        for name in RANGES:
            if (problem := range_error(name, getattr(self, name))) is not None:
                raise UnknownOptionError(problem)
        if self.top_p <= 0:
            raise UnknownOptionError(f"top_p={self.top_p!r} must be > 0 and <= 1 (1 keeps every token)")
        seed = self.seed
        if seed is not None and not is_int(seed, 0, SEED_LIMIT - 1):
            raise UnknownOptionError(f"seed={seed!r} must be None or an integer >= 0 and < 2**63")
        if not isinstance(self.stop_strings, tuple) or not all(isinstance(s, str) for s in self.stop_strings):
            raise UnknownOptionError(f"stop_strings={self.stop_strings!r} must be a tuple of strings")
        if any(not s for s in self.stop_strings):  # "" is in every text: the answer would stop after one step
            raise UnknownOptionError("stop_strings must not hold an empty string")
        check_text_fields({"stop_strings": self.stop_strings})
        return self

    def with_(self, **changes) -> AsymSpecConfig:
        """A copy with ``changes``; an unknown field name is an :class:`UnknownOptionError`."""
        unknown = sorted(set(changes) - set(self.__dataclass_fields__))
        if unknown:
            raise UnknownOptionError(f"unknown option(s) {', '.join(unknown)}; AsymSpecConfig has {', '.join(self.__dataclass_fields__)}")
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def resolve_config(config: AsymSpecConfig | None, overrides: dict) -> AsymSpecConfig:
    """``config`` (default: the library's defaults) with ``overrides`` applied, validated."""
    cfg = config or AsymSpecConfig()
    return (cfg.with_(**overrides) if overrides else cfg).validated()


def check_method(method: str) -> str:
    """``method`` itself if it is one of :data:`METHODS`, else an :class:`UnknownOptionError`."""
    if method not in METHODS:
        raise UnknownOptionError(f"method={method!r} is not valid; choose one of {', '.join(METHODS)}")
    return method
