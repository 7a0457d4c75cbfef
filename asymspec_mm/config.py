"""The decoding settings and the names they take: one vocabulary for the library, the CLI, eval and bench.

Torch-free on purpose, so that ``asymspec-mm --help`` and option parsing import no model code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .errors import UnknownOptionError

METHODS = ("asymspec", "floor", "drafter", "sd")
GATES = ("cda", "fixed", "tuned", "tuned_kl", "kl")
DELTAS = ("contrast", "raw", "scd")
BONUS_RULES = ("verifier", "gated")
DRAFTER_VIEWS = ("image+text", "image")

#: The options of each enumerated :class:`AsymSpecConfig` field.
CHOICES: dict[str, tuple[str, ...]] = {"gate": GATES, "delta": DELTAS, "bonus": BONUS_RULES, "drafter_view": DRAFTER_VIEWS}


@dataclass(frozen=True)
class AsymSpecConfig:
    """Decoding settings. Defaults are the paper's cross-modal setting (MathVista: K=4, beta=1, gamma=0.5, CDA).

    k: drafts per step. beta: fusion strength (0 disables fusion). gamma: acceptance threshold before the
    divergence discount. gate: how gamma is discounted (``cda``: gamma*exp(-JSD), the paper; ``fixed``: gamma;
    ``tuned``: gamma*exp(-lam*log-ratio at the draft), the paper text's Appendix B reading; ``tuned_kl``:
    gamma*exp(-lam*KL(p_a||p_b)), the released code's tuned gate; ``kl``: gamma*exp(-KL(p_a||p_b)), Table 14).
    lam: lambda of the tuned gates. delta: the steering signal (``contrast`` a-b, ``raw`` a, ``scd``
    t-b). drafter_view: what the drafter's full stream reads besides the image. bonus: the token after K
    acceptances (``verifier``: argmax t_{K+1}, the paper; ``gated``: the drafter's a_{K+1} through the gate).
    stop_strings: decoding stops once the text contains one. trace_top: top tokens kept per trace event.
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

    def validated(self) -> AsymSpecConfig:
        """Return self after checking every option; raises :class:`UnknownOptionError` naming the bad one."""
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise UnknownOptionError(f"{name}={value!r} is not valid; choose one of {', '.join(allowed)}")
        for name in ("beta", "gamma", "lam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UnknownOptionError(f"{name}={value!r} must be a finite number")
        for name, low in (("k", 1), ("max_new_tokens", 1), ("trace_top", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                what = "the speculation depth " if name == "k" else ""
                raise UnknownOptionError(f"{name}={value!r}: {what}must be an integer >= {low}")
        if self.gamma < 0:
            raise UnknownOptionError(f"gamma={self.gamma!r} must be >= 0")
        if not isinstance(self.stop_strings, tuple) or not all(isinstance(s, str) for s in self.stop_strings):
            raise UnknownOptionError(f"stop_strings={self.stop_strings!r} must be a tuple of strings")
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
