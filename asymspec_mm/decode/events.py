"""What the loops emit: one :class:`TokenEvent` per committed token, saying why it was emitted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Token sources and what each means (the loops set nothing else).
SOURCES: dict[str, str] = {
    "accepted": "a draft that passed the gate (SD: that matched the verifier's argmax)",
    "fused": "emitted at a rejection: argmax(t + beta * delta), the drafter's steer of the verifier",
    "bonus": "the verifier's own token after K acceptances (or, with bonus='gated', the drafter's a_{K+1} "
    "through the gate, which is then 'accepted' or 'fused')",
    "corrected": "symmetric SD only: the verifier's own token where it rejected a draft (no fusion)",
    "greedy": "a baseline's token (Floor, the drafter alone)",
}


@dataclass
class TokenEvent:
    """Why one token was emitted.

    source: one of :data:`SOURCES`. step: the decoding step (1-based) and position: the draft position in it.
    p_verifier / p_base: softmax(t)[token] and softmax(b)[token] (None where that stream did not run).
    gamma_eff / jsd: the gate's threshold and JSD(a, b) at this position (None outside the gate).
    verifier_argmax: what the verifier alone would emit here; steered: the token differs from it.
    draft_token: the rejected draft where the token replaced one, and draft_p_verifier / draft_p_base its
    softmax(t) / softmax(b) probabilities (what the gate compared, Eq. 4). top_verifier / top_fused: the top
    ``trace_top`` (token, probability) pairs of softmax(t) and of softmax(t + beta * delta).
    Sampled rows (temperature > 0, :mod:`asymspec_mm.base.sampling`): accept_prob is the draft's acceptance probability
    alpha (1 inside the gate's set; at a rejection, the rejected draft's), residual says the token is a draw of the
    residual r at the first rejection, and gate_excess is E at this position (the emitted distribution's total
    variation distance from the fused target). All three stay None / False for greedy rows.
    p_fused: the token's probability under the fused target at temperature 1 without filtering,
    softmax(t + beta * delta) (where nothing was fused, the emitting model's own softmax: the verifier's at a bonus, SD
    and Floor position, the drafter's for the drafter alone): what the server reports as ``logprobs``.
    Cross-family pairs (docs/algorithm.md, "Two vocabularies"): ``token_id`` is the verifier's id and
    drafter_token_id the drafter's id of the same token (None for a pair of one vocabulary, and for Floor);
    verifier_alone says the verifier's best token lay outside the tokens both models have, so it decided alone here
    (no steering). Every probability is then over those tokens.
    """

    index: int
    token_id: int
    text: str
    source: str
    step: int
    position: int
    p_verifier: float | None = None
    p_base: float | None = None
    gamma_eff: float | None = None
    jsd: float | None = None
    verifier_argmax: int | None = None
    steered: bool = False
    draft_token: int | None = None
    draft_p_verifier: float | None = None
    draft_p_base: float | None = None
    top_verifier: list[tuple[int, float]] = field(default_factory=list)
    top_fused: list[tuple[int, float]] = field(default_factory=list)
    accept_prob: float | None = None
    residual: bool = False
    gate_excess: float | None = None
    p_fused: float | None = None
    drafter_token_id: int | None = None
    verifier_alone: bool = False

    def as_dict(self) -> dict:
        return asdict(self)
