"""An independent, slow reference of Algorithm 1 on two vocabularies (docs/algorithm.md, "Two vocabularies").

Every logit row comes from a full forward of the whole sequence (:class:`reference.Reference`'s no-cache forwards), the
map is applied by hand with Python dicts (verifier id -> drafter id), the shared set is a plain list of verifier ids,
and the gate is written out per position in float64 over that list: the distributions are renormalised over it, the
drafter drafts its best token in it, and where the verifier's best token over its whole vocabulary is not in it the
verifier decides alone (its best token in the list, no steering; a draft kept only if it is that token).
"""

from __future__ import annotations

import math

import torch
from reference import Reference, _jsd


class TwoVocabReference(Reference):
    """The loop's tokens (verifier ids) and sources for one request of a cross-family ``pipe``."""

    def __init__(self, pipe, prompts):
        super().__init__(pipe, prompts)
        vmap = pipe.vocab_map
        d_width = pipe.drafter.get_output_embeddings().weight.shape[0]
        v_width = pipe.verifier.get_output_embeddings().weight.shape[0]
        self.v2d = {v: d for v, d in enumerate(vmap.to_drafter) if d >= 0 and v < v_width and d < d_width}
        self.inside = sorted(self.v2d)  # the shared set, verifier ids in their order (the loop breaks ties alike)
        self.cols = [self.v2d[v] for v in self.inside]

    def _d(self, tokens: list[int]) -> list[int]:
        return [self.v2d[x] for x in tokens]

    def _on_set(self, row: torch.Tensor, cols: list[int]) -> torch.Tensor:
        return row.double()[torch.tensor(cols)]

    def _best(self, row: torch.Tensor) -> tuple[int, float]:
        """(verifier id of the best entry of a row over the shared set, its margin to the second)."""
        top = row.topk(2)
        return self.inside[int(top.indices[0])], float(top.values[0] - top.values[1])

    def run(self, cfg, eos_ids: set[int]) -> list[tuple[int, str, bool]]:
        """(verifier id, source, whether the verifier decided alone) per emitted token (cda gate, contrast delta,
        the verifier's bonus); ``self.margins[i]``: how far the decisions behind token i were from a tie."""
        assert cfg.gate == "cda" and cfg.delta == "contrast" and cfg.bonus == "verifier"
        out: list[tuple[int, str, bool]] = []
        self.margins: list[float] = []
        k = cfg.k
        while True:
            y = [x for x, _, _ in out]
            drafts, a_rows, margin = [], [], math.inf
            for _ in range(k):
                a = self._on_set(self.drafter_full(self._d(y + drafts))[-1], self.cols)
                d, gap = self._best(a)
                a_rows.append(a)
                drafts.append(d)
                margin = min(margin, gap)
            b_all = self.drafter_comp(self._d(y + drafts))[-(k + 1) :]
            t_all = self.verifier(y + drafts)[-(k + 1) :]
            step, margins = [], []
            for i in range(k + 1):
                t_full = t_all[i].double()
                alone = int(t_full.argmax()) not in self.v2d
                t = t_full[torch.tensor(self.inside)]
                top2 = t_full.topk(2).values
                margin = min(margin, float(top2[0] - top2[1]))  # which side of the set the verifier's best lies
                best, gap = self._best(t)
                if i == k:  # K acceptances: the verifier's own best token in the set
                    step.append((best, "bonus", alone))
                    margins.append(min(margin, gap))
                    break
                b = self._on_set(b_all[i], self.cols)
                p_t, p_b = torch.softmax(t, -1), torch.softmax(b, -1)
                j = self.inside.index(drafts[i])
                if alone:
                    accepted = drafts[i] == best
                    margin = min(margin, gap)
                    emit = best
                else:
                    ge = cfg.gamma * math.exp(-_jsd(torch.softmax(a_rows[i], -1), p_b))
                    lhs, rhs = float(p_t[j]), ge * float(p_b[j])
                    margin = min(margin, abs(lhs - rhs) / max(lhs, rhs, 1e-30))
                    accepted = lhs > rhs
                    emit, gap = self._best(t + cfg.beta * (a_rows[i] - b))
                    if not accepted:
                        margin = min(margin, gap)
                margins.append(margin)
                if accepted:
                    step.append((drafts[i], "accepted", alone))
                else:
                    step.append((emit, "fused", alone))
                    break
            for (tok, src, alone), m in zip(step, margins):
                if len(out) >= cfg.max_new_tokens:
                    return out
                out.append((tok, src, alone))
                self.margins.append(m)
                if tok in eos_ids:
                    return out
            if len(out) >= cfg.max_new_tokens:
                return out

    def greedy_verifier(self, max_new: int, eos_ids: set[int]) -> list[int]:
        """Floor: the verifier alone over its whole vocabulary, no map."""
        return self.greedy("verifier", max_new, eos_ids)
