"""One grammar for "a method with some settings", shared by ``eval`` and ``bench``.

A variant is written ``NAME[@field=value,...]``. ``NAME`` is a method (:data:`~asymspec_mm.base.config.METHODS`)
or an ablation alias (:data:`ALIASES`: AsymSpec with one knob changed); the fields are
:class:`~asymspec_mm.base.config.AsymSpecConfig` fields. A list of variants is separated by ``;`` or ``,``:
an item holding ``=`` but no ``@`` continues the previous variant's settings, so
``floor,asymspec@gate=fixed,beta=0,sd`` is three variants. ``method:field=value`` (bench's old form)
reads as ``method@field=value``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..base.checks import is_int
from ..base.config import METHODS, AsymSpecConfig
from ..base.errors import UnknownOptionError

#: Ablation names -> (method, the config fields they set). The gates: ``fixed`` (no divergence discount,
#: Tables 12/15/18), ``tuned`` (the tuned lambda gate as the paper's Appendix B text reads it: the log-ratio at
#: the draft), ``tuned_kl`` (the tuned gate as the released code computes it: lambda * KL over the whole
#: distribution, the "tuned lambda" rows of Tables 11-12 and 18-21), ``kl`` (CDA with KL in place of JSD, Table 14).
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fixed": ("asymspec", {"gate": "fixed"}),
    "tuned": ("asymspec", {"gate": "tuned"}),
    "tuned_kl": ("asymspec", {"gate": "tuned_kl"}),
    "kl": ("asymspec", {"gate": "kl"}),
    "raw": ("asymspec", {"delta": "raw"}),
    "scd": ("asymspec", {"delta": "scd"}),
    "beta0": ("asymspec", {"beta": 0.0}),
}
NAMES = METHODS + tuple(ALIASES)
SWEEPABLE = ("k", "beta", "gamma", "lam")
#: The gates that read ``lam``.
LAMBDA_GATES = ("tuned", "tuned_kl")


@dataclass(frozen=True)
class Variant:
    """A named method setting: ``method`` for ``pipe.generate`` and the ``AsymSpecConfig`` fields it sets."""

    name: str
    method: str
    config: Mapping[str, Any]

    @property
    def overrides(self) -> tuple[tuple[str, Any], ...]:
        """The config fields as ``(field, value)`` pairs."""
        return tuple(self.config.items())

    def apply(self, base: AsymSpecConfig | None = None) -> AsymSpecConfig:
        """``base`` (default: the library's defaults) with this variant's fields set, validated."""
        return (base or AsymSpecConfig()).with_(**dict(self.config)).validated()

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """``NAME[@field=value,...]`` -> a variant named by its canonical spelling."""
        return parse_variant(spec)


def parse_value(text: str) -> Any:
    """A field value as written: an int, else a float, else the string itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def format_value(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def _typed(field: str, value: Any) -> Any:
    """An int written for a float field becomes that float (``beta=0`` sets 0.0, as ``beta0`` does)."""
    default = AsymSpecConfig.__dataclass_fields__.get(field)
    if default is not None and isinstance(default.default, float) and is_int(value):
        return float(value)
    return value


def variant_name(base: str, fields: Mapping[str, Any]) -> str:
    """``base@f=v,...`` (``base`` alone without fields): the canonical name of a variant."""
    suffix = ",".join(f"{k}={format_value(v)}" for k, v in fields.items())
    return f"{base}@{suffix}" if suffix else base


def _base(name: str, spec: str) -> tuple[str, dict[str, Any]]:
    if name in METHODS:
        return name, {}
    if name in ALIASES:
        method, fields = ALIASES[name]
        return method, dict(fields)
    raise UnknownOptionError(f"variant {spec!r}: {name!r} is not a method or ablation; use one of {', '.join(NAMES)}")


def parse_variant(spec: str) -> Variant:
    """Parse one variant; raises :class:`UnknownOptionError` for an unknown name, field or value."""
    text = spec.strip()
    head, sep, rest = text.partition("@")
    if not sep and ":" in text:
        head, _, rest = text.partition(":")
    name = head.strip()
    method, fields = _base(name, spec)
    own: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UnknownOptionError(f"variant {spec!r}: expected field=value, got {item!r}")
        own[key.strip()] = _typed(key.strip(), parse_value(value.strip()))
    variant = Variant(variant_name(name, own), method, {**fields, **own})
    variant.apply()  # unknown fields and bad values fail here, with the field named
    return variant


def split_variants(spec: str | Sequence[str]) -> list[str]:
    """The variant specs in a ``;``/``,`` list (see the module docstring for the continuation rule)."""
    items = spec if not isinstance(spec, str) else re.split(r"[;,]", spec)
    specs: list[str] = []
    for item in (s.strip() for s in items):
        if not item:
            continue
        if "=" in item and "@" not in item and ":" not in item and specs:
            specs[-1] += ("," if "@" in specs[-1] or ":" in specs[-1] else "@") + item
        else:
            specs.append(item)
    return specs


def parse_variants(spec: str | Sequence[str]) -> list[Variant]:
    """Parse a variant list; duplicates (same canonical name) are kept once, in first-seen order."""
    variants = [parse_variant(s) for s in split_variants(spec)]
    if not variants:
        raise UnknownOptionError("no methods given")
    return list({v.name: v for v in reversed(variants)}.values())[::-1]


def _extend_name(name: str, fields: Mapping[str, Any]) -> str:
    """``name`` with ``fields`` appended to its settings."""
    if not fields:
        return name
    return f"{name},{variant_name('', fields)[1:]}" if "@" in name else variant_name(name, fields)


def _sweep_applies(param: str, variant: Variant) -> bool:
    """Whether a sweep of ``param`` multiplies ``variant``: the param must matter to its method and not be
    fixed by the variant itself (``beta0`` keeps beta=0; ``lam`` only matters to the tuned gates)."""
    if param in variant.config:
        return False
    if param == "k":
        return variant.method in ("asymspec", "sd")
    if param in ("beta", "gamma"):
        return variant.method == "asymspec"
    return variant.method == "asymspec" and variant.config.get("gate") in LAMBDA_GATES


def build_variants(
    methods: str | Sequence[str],
    *,
    k: Sequence[int] | None = None,
    beta: Sequence[float] | None = None,
    gamma: Sequence[float] | None = None,
    lam: Sequence[float] | None = None,
    common: Mapping[str, Any] | None = None,
) -> list[Variant]:
    """Expand a variant list by sweeps: each sweep list given multiplies the variants it applies to and its
    value enters the name (``asymspec@k=4,beta=0.5``). Parameters not swept keep the defaults and stay out
    of the name, so names are stable across resumes. ``common`` fields go into every config."""
    sweeps = {"k": k, "beta": beta, "gamma": gamma, "lam": lam}
    out: list[Variant] = []
    for v in parse_variants(methods):
        combos: list[dict[str, Any]] = [{}]
        for param, values in sweeps.items():
            if values is not None and _sweep_applies(param, v):
                combos = [dict(c, **{param: x}) for c in combos for x in values]
        for combo in combos:
            variant = Variant(_extend_name(v.name, combo), v.method, {**dict(common or {}), **v.config, **combo})
            variant.apply()
            out.append(variant)
    return out


def parse_list(spec: str | Sequence[Any] | None, cast: Any) -> list[Any] | None:
    """``"2,4,8"`` -> ``[2, 4, 8]`` (``None`` stays ``None``); a bad item is an :class:`UnknownOptionError`."""
    if spec is None:
        return None
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        if not items:
            return None
        try:
            return [cast(s) for s in items]
        except ValueError as exc:
            raise UnknownOptionError(f"bad list {spec!r}: {exc}") from exc
    return [cast(s) if isinstance(s, str) else s for s in spec]
