"""A map between two tokenizers' vocabularies, for a drafter and a verifier of different families (issue #44; the
paper's Table 10 pairs Qwen3 with Llama-3 through the 109,566 tokens whose strings are identical).

Two tokens are shared when their decoded **byte strings** are identical. Each scheme spells a token's bytes its own
way, so each is read by its own rule (:func:`token_bytes`):

* byte-level BPE (GPT-2's, Qwen's, Llama-3's): every byte is one printable character of GPT-2's byte alphabet;
* SentencePiece-style (Llama-2, Mistral v1-v7 as ``tokenizers`` or ``sentencepiece`` models): ``▁`` is a space and
  ``<0xNN>`` a single byte (byte fallback);
* Tekken (mistral-common): the vocabulary holds the bytes themselves.

Added tokens that are not special (Qwen's ``<tool_call>``) are their text. Special tokens never match by spelling:
they are paired by role (end of sequence, turn start and end, tool-call start and end) where both tokenizers have the
role. A token whose bytes occur twice in one vocabulary maps to its lowest id, except that a SentencePiece byte-fallback
piece whose byte is also an ordinary piece is left out (the tokenizer never emits it). The map is pure data: building it
runs no model, and :func:`vocab_map` keeps each built map by the two vocabularies' hashes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

#: Special tokens by role, as each family spells them, in pairing order (the answer's end first); a role pairs the
#: first spelling each tokenizer has among its special (added) tokens, and a token pairs once.
ROLES: dict[str, tuple[str, ...]] = {
    "turn_start": ("<|im_start|>", "<|start_header_id|>", "[INST]", "<start_of_turn>"),
    "turn_end": ("<|im_end|>", "<|eot_id|>", "[/INST]", "<end_of_turn>"),
    "tool_call_start": ("<tool_call>", "[TOOL_CALLS]"),
    "tool_call_end": ("</tool_call>",),
    "bos": ("<|begin_of_text|>", "<s>"),
    "end_of_text": ("<|endoftext|>", "<|end_of_text|>", "</s>"),
}
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte alphabet, character -> byte: printable bytes stand for themselves, the others are shifted to
    code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


def _byte_level(token: str) -> bytes | None:
    alphabet = _byte_alphabet()
    try:
        return bytes(alphabet[c] for c in token)
    except KeyError:  # not a byte-level spelling (e.g. an added token written as text)
        return None


def _metaspace(token: str) -> bytes:
    fallback = _BYTE_FALLBACK.fullmatch(token)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


def _hf_scheme(tokenizer: Any) -> str:
    """``"byte_level"`` or ``"metaspace"``: how a ``transformers`` fast tokenizer spells its tokens (its decoder)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    text = json.dumps(spec.get("decoder")) + json.dumps(spec.get("pre_tokenizer"))
    if '"ByteLevel"' in text:
        return "byte_level"
    if "▁" in text or '"Metaspace"' in text or '"ByteFallback"' in text:
        return "metaspace"
    raise ValueError(f"{type(tokenizer).__name__}: neither a byte-level nor a SentencePiece-style tokenizer; cannot read its bytes")


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """Each id's decoded bytes (``None`` for special tokens and unused ids), read by the tokenizer's own scheme (module
    docstring): a ``transformers`` fast tokenizer, a ``sentencepiece.SentencePieceProcessor`` or mistral-common's
    ``Tekkenizer``."""
    if hasattr(tokenizer, "id_to_byte_piece") and hasattr(tokenizer, "is_special"):  # Tekken
        return [None if tokenizer.is_special(i) else tokenizer.id_to_byte_piece(i) for i in range(tokenizer.n_words)]
    if hasattr(tokenizer, "id_to_piece") and hasattr(tokenizer, "is_control"):  # sentencepiece
        out: list[bytes | None] = []
        for i in range(tokenizer.get_piece_size()):
            special = tokenizer.is_control(i) or tokenizer.is_unknown(i)
            out.append(None if special else _metaspace(tokenizer.id_to_piece(i)))
        return _unshadowed(out, [tokenizer.id_to_piece(i) for i in range(len(out))])
    scheme = _hf_scheme(tokenizer)
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items()}
    size = max([*tokenizer.get_vocab().values(), *added]) + 1
    out = [None] * size
    spelled: list[str | None] = [None] * size
    for token, i in tokenizer.get_vocab().items():
        if i in added:
            out[i] = None if added[i].special else added[i].content.encode("utf-8")
        else:
            out[i] = _byte_level(token) if scheme == "byte_level" else _metaspace(token)
            spelled[i] = token
    return out if scheme == "byte_level" else _unshadowed(out, spelled)


def _unshadowed(pieces: list[bytes | None], spelled: Sequence[str | None]) -> list[bytes | None]:
    """``pieces`` without the byte-fallback pieces (``<0xNN>``) whose byte is also an ordinary piece: a SentencePiece
    tokenizer falls back to bytes only for characters it has no piece for, so it never emits those (``<0x2C>`` where
    ``,`` is a piece). Left in, they would take the pairing by the lowest-id rule (Llama-2's and Mistral's byte pieces
    come first), and the map would carry the drafter's ``,`` to an id the verifier never sees in its own text."""
    fallback = [s is not None and _BYTE_FALLBACK.fullmatch(s) is not None for s in spelled]
    ordinary = {p for p, fb in zip(pieces, fallback) if p is not None and not fb}
    return [None if fb and p in ordinary else p for p, fb in zip(pieces, fallback)]


def special_ids(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special token ids by role (:data:`ROLES`), and ``eos`` (its end-of-sequence token)."""
    if hasattr(tokenizer, "id_to_byte_piece"):  # Tekken: its specials by name
        get = getattr(tokenizer, "get_special_token", None) or tokenizer.get_control_token
        lookup = lambda s: _try(lambda: get(s))  # noqa: E731
        eos = tokenizer.eos_id
    elif hasattr(tokenizer, "piece_to_id") and hasattr(tokenizer, "is_control"):  # sentencepiece
        lookup = lambda s: (lambda i: i if tokenizer.id_to_piece(i) == s else None)(tokenizer.piece_to_id(s))  # noqa: E731
        eos = tokenizer.eos_id()
    else:  # only added tokens: "<s>" may be an ordinary BPE token (Qwen's is)
        added = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
        lookup = added.get
        eos = tokenizer.eos_token_id
    roles = {"eos": eos} if eos is not None and eos >= 0 else {}
    for role, spellings in ROLES.items():
        for s in spellings:
            i = lookup(s)
            if i is not None:
                roles[role] = int(i)
                break
    return roles


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a token this tokenizer does not have
        return None


def vocabulary_hash(pieces: Sequence[bytes | None], specials: dict[str, int]) -> str:
    """A vocabulary's identity: every id's bytes (or its absence) and the special tokens by role."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(b"\xff" if piece is None else len(piece).to_bytes(2, "little") + piece)
    h.update(json.dumps(specials, sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class VocabMap:
    """The shared set of a drafter's and a verifier's vocabularies: ``to_verifier[d]`` (a verifier id or -1) and
    ``to_drafter[v]`` (a drafter id or -1), one-to-one on the shared tokens; ``specials``: role -> (drafter id,
    verifier id)."""

    to_verifier: list[int]
    to_drafter: list[int]
    specials: dict[str, tuple[int, int]] = field(default_factory=dict)
    same_vocabulary: bool = False

    @property
    def shared(self) -> int:
        """Tokens in the shared set (the special pairs included)."""
        return sum(v >= 0 for v in self.to_verifier)

    def coverage(self) -> dict[str, Any]:
        """The shared count and the share of each vocabulary it covers."""
        return {
            "shared_tokens": self.shared,
            "drafter_vocabulary": len(self.to_verifier),
            "verifier_vocabulary": len(self.to_drafter),
            "drafter_share": self.shared / len(self.to_verifier),
            "verifier_share": self.shared / len(self.to_drafter),
            "special_pairs": dict(self.specials),
        }

    def corpus_coverage(self, verifier_ids: Iterable[int]) -> float:
        """The share of a corpus's tokens (verifier ids) that lie inside the shared set: what generation restricted
        to the shared set can still say token for token."""
        total = inside = 0
        for i in verifier_ids:
            total += 1
            inside += 0 <= i < len(self.to_drafter) and self.to_drafter[i] >= 0
        return inside / total if total else 0.0


def build_vocab_map(drafter: Any, verifier: Any) -> VocabMap:
    """The :class:`VocabMap` of two tokenizers (module docstring)."""
    d_pieces, v_pieces = token_bytes(drafter), token_bytes(verifier)
    return map_of(d_pieces, v_pieces, special_ids(drafter), special_ids(verifier))


def map_of(
    d_pieces: Sequence[bytes | None], v_pieces: Sequence[bytes | None], d_specials: dict[str, int], v_specials: dict[str, int]
) -> VocabMap:
    """The map of two vocabularies given as their tokens' bytes and their special ids by role."""
    first: dict[bytes, int] = {}
    for v, piece in enumerate(v_pieces):
        if piece is not None:
            first.setdefault(piece, v)
    to_verifier, to_drafter = [-1] * len(d_pieces), [-1] * len(v_pieces)
    for d, piece in enumerate(d_pieces):
        v = first.get(piece) if piece is not None else None
        if v is not None and to_drafter[v] < 0:
            to_verifier[d], to_drafter[v] = v, d
    same = list(d_pieces) == list(v_pieces) and d_specials == v_specials
    if same:  # one vocabulary: every id is itself (today's path, bit for bit)
        ids = list(range(len(d_pieces)))
        return VocabMap(ids, list(ids), {r: (i, i) for r, i in d_specials.items()}, True)
    specials = {}
    order = ["eos", *ROLES]
    for role in [r for r in order if r in d_specials and r in v_specials]:
        d, v = d_specials[role], v_specials[role]
        if d < len(to_verifier) and v < len(to_drafter) and to_verifier[d] < 0 and to_drafter[v] < 0:
            to_verifier[d], to_drafter[v] = v, d
            specials[role] = (d, v)
    return VocabMap(to_verifier, to_drafter, specials, False)


_CACHE: dict[tuple[str, str], VocabMap] = {}
_CACHE_LOCK = threading.Lock()


def vocab_map(drafter: Any, verifier: Any) -> VocabMap:
    """:func:`build_vocab_map`, built once per pair of vocabularies (keyed by their :func:`vocabulary_hash`)."""
    d_pieces, v_pieces = token_bytes(drafter), token_bytes(verifier)
    d_specials, v_specials = special_ids(drafter), special_ids(verifier)
    key = (vocabulary_hash(d_pieces, d_specials), vocabulary_hash(v_pieces, v_specials))
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = map_of(d_pieces, v_pieces, d_specials, v_specials)
        return _CACHE[key]
