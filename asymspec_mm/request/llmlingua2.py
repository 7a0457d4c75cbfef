"""LLMLingua-2 (Pan et al., 2024) on transformers: a token classifier scores each word's chance of being kept, and
the compressed text keeps the top ``rate`` of the words in their order (line breaks kept).

Why not the ``llmlingua`` package itself (0.2.2): its ``PromptCompressor`` fetches tiktoken's ``cl100k_base``
from the network in its constructor (offline it cannot start, even for LLMLingua-2, which never uses it), loads
models with ``trust_remote_code=True`` unless told otherwise, and needs ``nltk`` and ``accelerate``, which this
project does not. The algorithm it runs for LLMLingua-2 is small: the classifier's probability of the "keep" label
(label 1) per token, averaged over each word's tokens, the words above the ``1 - rate`` quantile kept, chunks of at
most 512 tokens. This module does that with the same released checkpoints
(``microsoft/llmlingua-2-xlm-roberta-large-meetingbank`` by default), read from the local Hugging Face cache only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from ..base.errors import UnknownOptionError

DEFAULT_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
#: the paper's per-turn target ratio (GAIA, SimpleQA: Appendix B)
DEFAULT_RATE = 0.3
#: tokens one forward reads, special tokens included (the released classifiers' window)
MAX_TOKENS = 512


def model_is_local(name: str) -> bool:
    """Whether the classifier ``name`` (a hub id or a directory) can be loaded without the network."""
    if os.path.isdir(name):
        return os.path.isfile(os.path.join(name, "config.json"))
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def missing_model_message(name: str, field: str = "compression.model") -> str:
    return (
        f"{field}: the LLMLingua-2 classifier {name} is not in the local Hugging Face cache; "
        f"download it once with `huggingface-cli download {name}`, or name a local directory"
    )


class TokenClassifier:
    """A loaded LLMLingua-2 classifier (a ``*ForTokenClassification`` model, label 1 = keep) and its tokenizer."""

    def __init__(self, name: str):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.name = name
        self.tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=False)
        import torch

        self.model = AutoModelForTokenClassification.from_pretrained(name, local_files_only=True, trust_remote_code=False).eval()
        self.device = "cuda" if torch.cuda.is_available() else "cpu"  # beside the pair: the classifier is small
        self.model.to(self.device)
        self._lock = threading.Lock()  # one forward (and tokenizer call) at a time: the set-up threads share it

    def _chunks(self, words: Sequence[str]) -> list[list[str]]:
        """``words`` in runs of at most :data:`MAX_TOKENS` tokens with the special tokens (a word is never split)."""
        room = MAX_TOKENS - self.tokenizer.num_special_tokens_to_add()
        counts = [max(1, len(self.tokenizer(w, add_special_tokens=False)["input_ids"])) for w in words]
        chunks: list[list[str]] = [[]]
        used = 0
        for word, n in zip(words, counts):
            if chunks[-1] and used + n > room:
                chunks.append([])
                used = 0
            chunks[-1].append(word)
            used += n
        return [c for c in chunks if c]

    def word_probs(self, words: Sequence[str]) -> list[float]:
        """Each word's probability of being kept: label 1's softmax, averaged over the word's tokens."""
        import torch

        probs: list[float] = []
        # its tokenizer too under the lock: these calls switch truncation on and off, and a fast tokenizer changing its
        # settings while another thread encodes with it raises "Already borrowed" (huggingface/tokenizers#537)
        with self._lock:
            chunks = self._chunks(words)
        for chunk in chunks:
            with self._lock, torch.no_grad():
                enc = self.tokenizer(list(chunk), is_split_into_words=True, return_tensors="pt", truncation=True, max_length=MAX_TOKENS)
                ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
                logits = self.model(input_ids=ids, attention_mask=mask).logits[0].cpu()  # [L, labels]
            keep = torch.softmax(logits.float(), dim=-1)[:, 1]
            sums, ns = [0.0] * len(chunk), [0] * len(chunk)
            for pos, w in enumerate(enc.word_ids()):
                if w is not None:
                    sums[w] += float(keep[pos])
                    ns[w] += 1
            probs += [s / n if n else 0.0 for s, n in zip(sums, ns)]
        return probs

    def compress(self, text: str, rate: float, force: Sequence[str] = ()) -> str:
        """``text`` with the top ``rate`` of its words by keep probability (at least one), in order; words in
        ``force`` always kept; line breaks kept, lines left empty dropped."""
        lines = [line.split() for line in text.split("\n")]
        words = [w for line in lines for w in line]
        if not words:
            return ""
        probs = self.word_probs(words)
        n_keep = max(1, round(rate * len(words)))
        ranked = sorted(range(len(words)), key=lambda i: (-probs[i], i))
        kept = set(ranked[:n_keep]) | {i for i, w in enumerate(words) if w in force}
        out, i = [], 0
        for line in lines:
            chosen = [w for j, w in enumerate(line, start=i) if j in kept]
            i += len(line)
            if chosen:
                out.append(" ".join(chosen))
        return "\n".join(out)


_LOADED: dict[str, TokenClassifier] = {}
_LOADING = threading.Lock()


def token_classifier(name: str | None = None) -> TokenClassifier:
    """The classifier ``name`` (default :data:`DEFAULT_MODEL`), loaded once per process from local files."""
    name = name or DEFAULT_MODEL
    with _LOADING:
        if name not in _LOADED:
            if not model_is_local(name):
                raise UnknownOptionError(missing_model_message(name))
            _LOADED[name] = TokenClassifier(name)
        return _LOADED[name]
