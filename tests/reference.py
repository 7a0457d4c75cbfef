"""An independent, slow reference of Algorithm 1 for the tests.

No KV cache, no cached vision features, no engine: every logit row comes from a full forward of
the whole sequence through the model's own code (``pixel_values`` + the model's own M-RoPE), and the
gate math is written out per position in float64. The fast loop must agree with it token for token.
"""

from __future__ import annotations

import math

import torch


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), dim=-1)


def _jsd(p: torch.Tensor, q: torch.Tensor) -> float:
    m = 0.5 * (p + q)

    def kl(x):
        mask = x > 0
        return float((x[mask] * (x[mask].log() - m[mask].log())).sum())

    return 0.5 * kl(p) + 0.5 * kl(q)


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) of two float64 distributions over the whole vocabulary: terms with p = 0 are 0, a token
    with p > 0 and q = 0 makes it infinite."""
    total = 0.0
    for x, y in zip(p.tolist(), q.tolist()):
        if x > 0:
            total += math.inf if y == 0 else x * (math.log(x) - math.log(y))
    return total


class Reference:
    def __init__(self, pipe, prompts):
        self.pipe = pipe
        self.p = prompts

    @torch.no_grad()
    def drafter_full(self, tokens: list[int]) -> torch.Tensor:
        """Logits ``[L, V]`` of the drafter over the full prompt + tokens (image through the tower; a text drafter's
        full view is text alone)."""
        ids = torch.cat([self.p.drafter_full_ids[0], torch.tensor(tokens, dtype=torch.long)])
        if not hasattr(self.pipe.drafter.config, "vision_config"):
            return self.pipe.drafter(input_ids=ids[None]).logits[0]
        types = torch.cat([self.p.mm_token_type_ids[0], torch.zeros(len(tokens), dtype=torch.long)])
        self.pipe.drafter.model.rope_deltas = None  # make the model recompute its positions from scratch
        return self.pipe.drafter(
            input_ids=ids[None], pixel_values=self.p.pixel_values, image_grid_thw=self.p.image_grid_thw, mm_token_type_ids=types[None]
        ).logits[0]

    @torch.no_grad()
    def drafter_comp(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.cat([self.p.drafter_comp_ids[0], torch.tensor(tokens, dtype=torch.long)])
        if hasattr(self.pipe.drafter.config, "vision_config"):
            self.pipe.drafter.model.rope_deltas = None
        return self.pipe.drafter(input_ids=ids[None]).logits[0]

    @torch.no_grad()
    def verifier(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.cat([self.p.verifier_ids[0], torch.tensor(tokens, dtype=torch.long)])
        return self.pipe.verifier(input_ids=ids[None]).logits[0]

    def threshold(self, cfg, a_row, b_row, d) -> tuple[float, float]:
        pa, pb = _probs(a_row), _probs(b_row)
        div = _jsd(pa, pb)
        if cfg.gate == "cda":
            return cfg.gamma * math.exp(-div), div
        if cfg.gate == "fixed":
            return cfg.gamma, div
        if cfg.gate == "kl":
            return cfg.gamma * math.exp(-_kl(pa, pb)), div
        if cfg.gate == "tuned_kl":
            return cfg.gamma * math.exp(-cfg.lam * _kl(pa, pb)), div
        return cfg.gamma * math.exp(-cfg.lam * (math.log(pa[d]) - math.log(pb[d]))), div

    def fused(self, cfg, a_row, b_row, t_row) -> int:
        delta = {"contrast": a_row - b_row, "raw": a_row, "scd": t_row - b_row}[cfg.delta]
        return int((t_row.double() + cfg.beta * delta.double()).argmax())

    @staticmethod
    def _gap(row: torch.Tensor) -> float:
        """Top-1 minus top-2 of a logit row: how far an argmax is from a tie."""
        top = row.double().topk(2).values
        return float(top[0] - top[1])

    def run(self, cfg, eos_ids: set[int]) -> list[tuple[int, str]]:
        """(token, source) per emitted token. ``self.margins[i]`` is how far the decisions behind token i
        (every argmax and gate comparison that led to it) were from a tie."""
        out: list[tuple[int, str]] = []
        self.margins: list[float] = []
        k = cfg.k
        while True:
            drafts, a_rows = [], []
            for _ in range(k):
                a = self.drafter_full([x for x, _ in out] + drafts)[-1]
                a_rows.append(a)
                drafts.append(int(a.argmax()))
            y = [x for x, _ in out]
            b = self.drafter_comp(y + drafts)[-(k + 1) :]
            t = self.verifier(y + drafts)[-(k + 1) :]
            step: list[tuple[int, str]] = []
            margins: list[float] = []
            margin = min(self._gap(r) for r in a_rows)  # every draft is an argmax
            for i in range(k):
                ge, _ = self.threshold(cfg, a_rows[i], b[i], drafts[i])
                lhs, rhs = float(_probs(t[i])[drafts[i]]), ge * float(_probs(b[i])[drafts[i]])
                margin = min(margin, abs(lhs - rhs) / max(lhs, rhs, 1e-30))
                if lhs > rhs:
                    step.append((drafts[i], "accepted"))
                else:
                    fused_row = (
                        t[i].double() + cfg.beta * {"contrast": a_rows[i] - b[i], "raw": a_rows[i], "scd": t[i] - b[i]}[cfg.delta].double()
                    )
                    margin = min(margin, self._gap(fused_row))
                    step.append((self.fused(cfg, a_rows[i], b[i], t[i]), "fused"))
                margins.append(margin)
                if step[-1][1] == "fused":
                    break
            else:
                if cfg.bonus == "verifier":
                    margins.append(min(margin, self._gap(t[k])))
                    step.append((int(t[k].argmax()), "bonus"))
                else:
                    a = self.drafter_full(y + drafts)[-1]
                    g = int(a.argmax())
                    ge, _ = self.threshold(cfg, a, b[k], g)
                    lhs, rhs = float(_probs(t[k])[g]), ge * float(_probs(b[k])[g])
                    margins.append(min(margin, self._gap(a), abs(lhs - rhs) / max(lhs, rhs, 1e-30)))
                    if lhs > rhs:
                        step.append((g, "accepted"))
                    else:
                        step.append((self.fused(cfg, a, b[k], t[k]), "fused"))
            for (tok, src), m in zip(step, margins):
                if len(out) >= cfg.max_new_tokens:
                    return out
                out.append((tok, src))
                self.margins.append(m)
                if tok in eos_ids:
                    return out
            if len(out) >= cfg.max_new_tokens:
                return out

    def greedy(self, stream: str, max_new: int, eos_ids: set[int]) -> list[int]:
        fn = {"verifier": self.verifier, "drafter_full": self.drafter_full}[stream]
        out: list[int] = []
        while len(out) < max_new:
            tok = int(fn(out)[-1].argmax())
            out.append(tok)
            if tok in eos_ids:
                break
        return out
