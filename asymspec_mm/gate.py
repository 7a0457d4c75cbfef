"""The public path of the gate's math named in the design card (``asymspec_mm.gate``); it lives in
:mod:`asymspec_mm.base.gate`, the bottom layer."""

from .base.gate import (
    GateOutput,
    accept,
    context_gain,
    effective_threshold,
    first_rejection,
    fuse,
    fusion_logits,
    gate_step,
    jsd,
    kl,
    per_position,
)

__all__ = [
    "GateOutput",
    "accept",
    "context_gain",
    "effective_threshold",
    "first_rejection",
    "fuse",
    "fusion_logits",
    "gate_step",
    "jsd",
    "kl",
    "per_position",
]
