"""Mistral's real tokenizers, offline, from the files the ``mistral-common`` wheel ships (issue #44, item 3).

``mistral_common/data`` holds Mistral's SentencePiece models (v1: Mistral-7B's 32,000 pieces; v3 and v7: 32,768, with
the instruction and tool control tokens) and its Tekken tokenizers (tiktoken-style byte-level BPE, 131,072 ids, the
first 1,000 special). Each is read here as a ``transformers`` fast tokenizer, so that the vocabulary map, the prompts
and ``from_pretrained`` see them as they see any other:

* Tekken: ``transformers.integrations.mistral.convert_tekken_tokenizer`` (transformers' own conversion, with the chat
  template mistral-common writes for it); ``AutoTokenizer`` also loads a folder holding ``tekken.json``;
* SentencePiece: transformers converts these only with the ``sentencepiece`` package, which this environment lacks
  (``MistralCommonBackend`` needs it too), so :func:`sentencepiece_tokenizer` reads the model file with protobuf
  (transformers' ``import_protobuf``) and builds the same BPE in ``tokenizers``: the pieces in their ids, merges
  ordered by the merged piece's rank, byte fallback, ``▁`` prepended and for spaces as SentencePiece's
  ``add_dummy_prefix`` does, words cut where SentencePiece cuts them (runs of spaces, ``split_digits``). Checked against SentencePiece itself (see
  ``tests/test_mistral_tokenizers.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: The wheel's files by version (v2 and v7m1 are not used here).
MISTRAL_FILES: dict[str, str] = {
    "v1": "tokenizer.model.v1",
    "v3": "mistral_instruct_tokenizer_240323.model.v3",
    "v7": "mistral_instruct_tokenizer_241114.model.v7",
    "tekken": "tekken_240911.json",
}

#: SentencePiece's words on the normalized text (spaces already ``▁``): the spaces of a run but its last (which starts
#: the next word), a word with at most one leading space, trailing spaces; with ``split_digits`` (:data:`DIGIT_WORDS`)
#: each digit is a word too, and a run of spaces before a digit stays whole.
SPACE_WORDS = r"▁+(?=▁[^▁])|▁?[^▁]+|▁+"
DIGIT_WORDS = r"\d|▁+(?=▁[^▁\d])|▁?[^▁\d]+|▁+"

# SentencePiece's piece types (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def mistral_file(version: str) -> Path:
    """The path of a shipped tokenizer file (``version`` in :data:`MISTRAL_FILES`); a one-line error when the
    version is unknown or ``mistral-common`` is not installed."""
    if version not in MISTRAL_FILES:
        raise ValueError(f"unknown Mistral tokenizer {version!r}: choose one of {', '.join(MISTRAL_FILES)}")
    try:
        import mistral_common
    except ImportError:
        raise ImportError("Mistral's tokenizers come with the mistral-common package: pip install mistral-common") from None
    path = Path(os.path.dirname(mistral_common.__file__)) / "data" / MISTRAL_FILES[version]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from this mistral-common install: reinstall mistral-common")
    return path


def mistral_tokenizer(version: str) -> Any:
    """The shipped tokenizer ``version`` as a ``transformers`` fast tokenizer (module docstring)."""
    path = mistral_file(version)
    return tekken_tokenizer(path) if version == "tekken" else sentencepiece_tokenizer(path)


def tekken_tokenizer(path: str | Path) -> Any:
    """A Tekken file through transformers' own conversion (byte-level BPE; Mistral's chat template)."""
    from transformers.integrations.mistral import convert_tekken_tokenizer

    return convert_tekken_tokenizer(str(path))


def _read_model(path: str | Path) -> Any:
    """The SentencePiece ``ModelProto`` of ``path`` (protobuf only, no ``sentencepiece``)."""
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def bpe_merges(pieces: list[str], ordinary: list[bool] | None = None) -> list[tuple[str, str]]:
    """The BPE merges of a vocabulary whose pieces are ranked by id: every split of an ordinary piece into two ordinary
    pieces, ordered by the merged piece's rank, then by the parts' ranks (the order in which SentencePiece's BPE would
    join them). ``ordinary[i]`` False keeps piece ``i`` out (control, user-defined and byte pieces never merge)."""
    keep = ordinary or [True] * len(pieces)
    rank = {p: i for i, p in enumerate(pieces) if keep[i]}
    merges: list[tuple[int, int, int]] = []
    for piece, r in rank.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in rank and right in rank:
                merges.append((r, rank[left], rank[right]))
    merges.sort()
    return [(pieces[a], pieces[b]) for _, a, b in merges]


def sentencepiece_tokenizer(path: str | Path) -> Any:
    """A SentencePiece BPE model with byte fallback (Mistral v1-v7, Llama-2) as a ``PreTrainedTokenizerFast``:
    the same ids, pieces and special tokens; control and unknown pieces are special added tokens, user-defined pieces
    plain added tokens. Raises ValueError for a unigram model or one without byte fallback (not what Mistral ships)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    proto = _read_model(path)
    spec = proto.trainer_spec
    if spec.model_type != 2 or not spec.byte_fallback:
        raise ValueError(f"{path}: only SentencePiece BPE models with byte fallback are read here (model type {spec.model_type})")
    pieces = [p.piece for p in proto.pieces]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = bpe_merges(pieces, [p.type == _NORMAL for p in proto.pieces])
    unk = pieces[spec.unk_id]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    dummy = [normalizers.Prepend("▁")] if proto.normalizer_spec.add_dummy_prefix else []
    tok.normalizer = normalizers.Sequence([*dummy, normalizers.Replace(" ", "▁")])
    # BPE never merges across SentencePiece's words (allow_whitespace_only_pieces, split_digits)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(DIGIT_WORDS if spec.split_digits else SPACE_WORDS), "isolated")
    strip = [decoders.Strip(" ", 1, 0)] if proto.normalizer_spec.add_dummy_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    tok.add_tokens([AddedToken(p.piece, special=False, normalized=False) for p in proto.pieces if p.type == _USER_DEFINED])
    tok.add_special_tokens([AddedToken(p.piece, special=True) for p in proto.pieces if p.type in (_CONTROL, _UNKNOWN)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=unk,
        bos_token=pieces[spec.bos_id] if spec.bos_id >= 0 else None,
        eos_token=pieces[spec.eos_id] if spec.eos_id >= 0 else None,
    )


def mistral_verifier_config(tokenizer: Any, shape: Any = None) -> dict[str, Any]:
    """Qwen3-32B's real ``config.json`` at the stand-in's reduced sizes (``standins.verifier_standin_config``) over a
    Mistral vocabulary: its size and its beginning, end and padding ids."""
    from .standins import StandinShape, verifier_standin_config

    cfg = verifier_standin_config(shape or StandinShape())
    cfg.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    cfg["pad_token_id"] = tokenizer.pad_token_id
    return cfg


def build_mistral_verifier_standin(
    out_dir: str | Path, version: str = "tekken", shape: Any = None, *, seed: int = 1, init_std: float = 0.1
) -> Path:
    """A Qwen3-shaped verifier stand-in (random weights, Qwen3-32B's layout at reduced sizes) with Mistral's tokenizer
    ``version`` and its chat template, written to ``out_dir`` in the ``from_pretrained`` layout (HF files only:
    ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``, ``config.json``,
    ``generation_config.json``, ``model.safetensors``); an existing one is reused. Returns ``out_dir``."""
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM

    out = Path(out_dir)
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    tok = mistral_tokenizer(version)
    if tok.chat_template is None:  # SentencePiece files carry none: Mistral's [INST] format
        tok.chat_template = MISTRAL_INST_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    real_layout = json.dumps(mistral_verifier_config(tok, shape), indent=2) + "\n"
    (out / "config.json").write_text(real_layout, encoding="utf-8")
    model_cfg = AutoConfig.from_pretrained(out)
    model_cfg.initializer_range = init_std
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(model_cfg).eval()
    model.save_pretrained(out)  # writes its own config.json: put the real layout back
    (out / "config.json").write_text(real_layout, encoding="utf-8")
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}) + "\n"
    )
    return out


#: Mistral's instruction format for the SentencePiece tokenizers, which carry no template: ``<s>``, then each user turn
#: as ``[INST]text[/INST]`` (a system message joins the first user turn) and each answer followed by ``</s>``.
MISTRAL_INST_TEMPLATE = (
    "{{- bos_token }}"
    "{%- set ns = namespace(system='') %}"
    "{%- for m in messages %}{%- if m['role'] == 'system' %}{%- set ns.system = m['content'] + '\n\n' %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}{{- '[INST]' + ns.system + m['content'] + '[/INST]' }}{%- set ns.system = '' %}"
    "{%- elif m['role'] == 'assistant' %}{{- m['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)
