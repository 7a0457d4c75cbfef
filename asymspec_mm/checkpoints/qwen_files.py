"""The real Qwen3-32B and Qwen3-VL-2B-Instruct hub files (tokenizers, chat templates, configs; no weights).

They ship in ``asymspec_mm/qwen_data/`` (provenance and licence in its ``PROVENANCE.md``). Three large
files of the snapshots are derived rather than stored; :func:`hub_snapshot` writes a complete folder
of one model, laid out as a Hugging Face snapshot and checked byte for byte against ``SHA256SUMS``, so
``AutoTokenizer`` / ``AutoProcessor`` / ``AutoConfig`` load it as they load the hub's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[1] / "qwen_data"
VERIFIER = "qwen3"
DRAFTER = "qwen3-vl-2b"
HUB_IDS = {VERIFIER: "Qwen/Qwen3-32B", DRAFTER: "Qwen/Qwen3-VL-2B-Instruct"}

#: Files of a snapshot and how each is obtained: ``stored`` (copied from qwen_data/<model>/), or derived.
SNAPSHOT_FILES = {
    VERIFIER: {
        "LICENSE": "stored",
        "config.json": "stored",
        "generation_config.json": "stored",
        "tokenizer_config.json": "stored",
        "vocab.json": "stored",
        "merges.txt": "stored",
        "tokenizer.json": "built from vocab.json, merges.txt and the added tokens",
    },
    DRAFTER: {
        "config.json": "stored",
        "generation_config.json": "stored",
        "chat_template.json": "stored",
        "tokenizer_config.json": "stored",
        "preprocessor_config.json": "stored",
        "video_preprocessor_config.json": "stored",
        "vocab.json": "qwen3/vocab.json",
        "merges.txt": "qwen3/merges.txt without its '#version' line",
        "tokenizer.json": "qwen3/tokenizer.json (the same tokenizer; not the VL repo's own bytes)",
    },
}

# Qwen's pre-tokenizer split (the regex of its tiktoken BPE), part of tokenizer.json
_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pinned_sha256() -> dict[str, str]:
    """``{"qwen3/config.json": sha256, ...}``: the hub files' hashes (``SHA256SUMS``)."""
    pins = {}
    for line in (DATA_DIR / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            pins[name.strip()] = digest
    return pins


def stored(model: str, name: str) -> Path:
    """Path of a stored file (``model`` is ``"qwen3"`` or ``"qwen3-vl-2b"``)."""
    return DATA_DIR / model / name


def config(model: str) -> dict[str, Any]:
    """The model's real ``config.json`` as a dict."""
    return json.loads(stored(model, "config.json").read_text(encoding="utf-8"))


def chat_template(model: str) -> str:
    """The model's real chat template: Qwen3's from ``tokenizer_config.json``, Qwen3-VL's from ``chat_template.json``."""
    if model == DRAFTER:
        return json.loads(stored(DRAFTER, "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    return json.loads(stored(VERIFIER, "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]


def tokenizer_json_bytes() -> bytes:
    """Qwen3's ``tokenizer.json``, built from the stored vocabulary, merges and added tokens.

    The layout (NFC normalizer, Qwen's split regex then byte-level, BPE without ``ignore_merges``) is the
    hub file's; serialized by ``tokenizers`` it is the hub file byte for byte (checked by :func:`hub_snapshot`).
    """
    from tokenizers import Tokenizer

    vocab = json.loads(stored(VERIFIER, "vocab.json").read_text(encoding="utf-8"))
    lines = stored(VERIFIER, "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines[1:] if line]  # the first line is '#version: 0.2'
    added = json.loads(stored(VERIFIER, "tokenizer_config.json").read_text(encoding="utf-8"))["added_tokens_decoder"]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": int(i), **{k: t[k] for k in ("content", "single_word", "lstrip", "rstrip", "normalized", "special")}}
            for i, t in sorted(added.items(), key=lambda kv: int(kv[0]))
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": _SPLIT}, "behavior": "Isolated", "invert": False},
                dict(byte_level),
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False)).to_str(pretty=True).encode("utf-8")


def snapshot_bytes(model: str, name: str) -> bytes:
    """The bytes of one file of ``model``'s snapshot (see :data:`SNAPSHOT_FILES`)."""
    if model not in SNAPSHOT_FILES or name not in SNAPSHOT_FILES[model]:
        raise KeyError(f"{model}/{name} is not a file of the shipped Qwen snapshots ({sorted(SNAPSHOT_FILES)})")
    if SNAPSHOT_FILES[model][name] == "stored":
        return stored(model, name).read_bytes()
    if name == "tokenizer.json":
        return tokenizer_json_bytes()
    if name == "vocab.json":
        return stored(VERIFIER, "vocab.json").read_bytes()
    head, _, rest = stored(VERIFIER, "merges.txt").read_bytes().partition(b"\n")
    assert head.startswith(b"#version"), head
    return rest


def hub_snapshot(model: str, out_dir: str | Path) -> Path:
    """Write every non-weight file of ``model``'s hub snapshot into ``out_dir`` and return it.

    Each file with a pinned hash (all but the VL ``tokenizer.json``, see PROVENANCE.md) is checked before
    it is written; a mismatch raises with the file's name (e.g. a ``tokenizers`` release that serializes
    ``tokenizer.json`` differently).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pins = pinned_sha256()
    built: dict[str, bytes] = {}
    for name in SNAPSHOT_FILES[model]:
        if name == "tokenizer.json":  # one build serves both models
            data = built.setdefault(name, tokenizer_json_bytes())
            pin = pins[f"{VERIFIER}/tokenizer.json"]
        else:
            data, pin = snapshot_bytes(model, name), pins.get(f"{model}/{name}")
        if pin is not None and sha256_bytes(data) != pin:
            import tokenizers

            raise RuntimeError(
                f"{model}/{name} does not hash to the hub file's sha256 {pin[:12]}… (tokenizers {tokenizers.__version__}); "
                "the shipped Qwen files or their derivation changed"
            )
        (out / name).write_bytes(data)
    return out
