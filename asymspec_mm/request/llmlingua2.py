"""LLMLingua-2 (Pan et al., 2024): a token classifier scores each word's chance of being kept, and the compressed text
keeps the top ``rate`` of the words in their order.

Two engines, one interface (:func:`token_classifier`): when the ``llmlingua`` package is installed (0.2.2), its own
``PromptCompressor`` runs (``compress_prompt_llmlingua2``), loaded with
``trust_remote_code=False`` from local files; otherwise :class:`TokenClassifier`, the same algorithm on transformers
directly: the classifier's probability of the "keep" label (label 1) per token, averaged over each word's tokens,
the words above the ``1 - rate`` quantile kept, chunks of at most 512 tokens. The package also serves only the
classifiers whose name holds ``xlm-roberta-large`` or ``bert-base-multilingual-cased`` (it picks its word-piece rules
by name); any other classifier runs on :class:`TokenClassifier`.

The package's constructor loads tiktoken's ``cl100k_base`` (it counts the ratio in GPT tokens), which tiktoken
downloads once; offline, :func:`load_cl100k` reads the copy that ``litellm`` ships when tiktoken's own cache has
none. The classifier is read from the local Hugging Face cache (``microsoft/llmlingua-2-xlm-roberta-large-meetingbank``
by default) or a directory, such as the tiny one shipped in ``asymspec_mm/presets_data``
(:data:`TINY_CLASSIFIER`, trained by ``python -m asymspec_mm.tiny.classifier``).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from ..base.errors import UnknownOptionError

DEFAULT_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"
#: The tiny classifier shipped with the package (BERT-shaped, WordPiece; its labels: ``asymspec_mm.tiny.classifier``).
TINY_CLASSIFIER = str(Path(__file__).resolve().parents[1] / "presets_data" / "llmlingua2-tiny-bert-base-multilingual-cased")
#: The names ``llmlingua``'s LLMLingua-2 code knows word-piece rules for.
PACKAGE_MODEL_KINDS = ("xlm-roberta-large", "bert-base-multilingual-cased")
#: tiktoken's cache name of ``cl100k_base`` (the SHA-1 of its URL) and where ``litellm`` ships a copy.
CL100K_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
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


def load_cl100k() -> None:
    """Make tiktoken's ``cl100k_base`` loadable (the ``llmlingua`` package's constructor needs it): from tiktoken's
    cache, else from the copy ``litellm`` ships (read once; tiktoken keeps it in memory). A one-line error when
    neither has it."""
    import tiktoken

    try:
        tiktoken.get_encoding("cl100k_base")
        return
    except Exception:  # noqa: BLE001 - offline and not cached: try the shipped copy
        pass
    spec = importlib.util.find_spec("litellm")
    shipped = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers" if spec and spec.origin else None
    if shipped is None or not (shipped / CL100K_FILE).is_file():
        raise UnknownOptionError(
            "compression.model: the llmlingua package needs tiktoken's cl100k_base, which is not cached; run once online "
            "`python -c \"import tiktoken; tiktoken.get_encoding('cl100k_base')\"` (or install litellm, which ships it)"
        )
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(shipped)
    try:
        tiktoken.get_encoding("cl100k_base")
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


def package_available() -> bool:
    """Whether the ``llmlingua`` package is installed."""
    return importlib.util.find_spec("llmlingua") is not None


class PackageCompressor:
    """The ``llmlingua`` package's LLMLingua-2 ``PromptCompressor`` on the classifier ``name`` (local files only,
    ``trust_remote_code`` off), with :class:`TokenClassifier`'s ``compress`` interface."""

    def __init__(self, name: str):
        import torch

        load_cl100k()
        from llmlingua import PromptCompressor

        self.name = name
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        config = {"trust_remote_code": False, "local_files_only": True}
        self.compressor = PromptCompressor(model_name=name, device_map=self.device, model_config=config, use_llmlingua2=True)
        self._lock = threading.Lock()

    def compress(self, text: str, rate: float, force: Sequence[str] = ()) -> str:
        """``text`` at ``rate`` through ``compress_prompt_llmlingua2`` (the words in ``force`` always kept)."""
        if not text.split():
            return ""
        with self._lock:
            out = self.compressor.compress_prompt_llmlingua2([text], rate=rate, force_tokens=list(force))
        return out["compressed_prompt"].strip()


def uses_package(name: str) -> bool:
    """Whether the classifier ``name`` runs through the ``llmlingua`` package (installed, and a name it knows)."""
    return package_available() and any(kind in name for kind in PACKAGE_MODEL_KINDS)


_LOADED: dict[str, TokenClassifier | PackageCompressor] = {}
_LOADING = threading.Lock()


def token_classifier(name: str | None = None) -> TokenClassifier | PackageCompressor:
    """The classifier ``name`` (default :data:`DEFAULT_MODEL`), loaded once per process from local files: through the
    ``llmlingua`` package where :func:`uses_package`, else on transformers."""
    name = name or DEFAULT_MODEL
    with _LOADING:
        if name not in _LOADED:
            if not model_is_local(name):
                raise UnknownOptionError(missing_model_message(name))
            _LOADED[name] = PackageCompressor(name) if uses_package(name) else TokenClassifier(name)
        return _LOADED[name]
