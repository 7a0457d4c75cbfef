"""A second tokenizer family for cross-family pairs (issue #44): SentencePiece-style BPE with Llama-3's special tokens.

:func:`build_tokenizer_xfamily` differs from :func:`asymspec_mm.checkpoints.build.build_tokenizer` (byte-level BPE,
Qwen's special tokens and templates) in every way a real second family does:

* spelling: SentencePiece's (``▁`` for a space, ``<0xNN>`` byte-fallback pieces for bytes outside the vocabulary),
  not GPT-2's byte alphabet;
* ids: Llama-3's special tokens first (``<|begin_of_text|>``, ``<|end_of_text|>``, ``<|start_header_id|>``,
  ``<|end_header_id|>``, ``<|eot_id|>``, and Llama-3.1's pad ``<|finetune_right_pad_id|>``), then the learned pieces,
  then the 256 byte pieces; no id holds the same token as in the Qwen-style vocabulary;
* size: every number 0..999 is one token, as in Llama-3 (whose digits group by three), so the vocabulary is about
  twice the byte-level one built on the same corpus;
* chat template: Llama-3's header format (:data:`XFAMILY_CHAT_TEMPLATE`), ending each turn with ``<|eot_id|>``.

What it keeps from the byte-level tokenizer is where words are cut: the same pre-tokenizing pattern (letters with
their leading space, digits with theirs, punctuation apart), so on the MiniVista corpus every answer's tokens have the
same bytes in both vocabularies and the map between them (:mod:`asymspec_mm.base.vocab_map`) covers them all. The byte
pieces come after the learned ones (Llama-2 and Mistral put them first; the map leaves out a byte piece whose byte is
also a learned piece either way, since the tokenizer never emits it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Llama-3's special tokens (and Llama-3.1's padding token), in id order.
XFAMILY_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)
XFAMILY_EOS = "<|eot_id|>"
XFAMILY_PAD = "<|finetune_right_pad_id|>"
XFAMILY_BOS = "<|begin_of_text|>"

#: Where words are cut before BPE: GPT-2's pattern (a letter run or a digit run with its leading space, punctuation
#: runs, whitespace), the same cuts as the byte-level tokenizer's pre-tokenizer.
WORD_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: A Llama-3-style chat template: ``<|begin_of_text|>``, then per message
#: ``<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>`` (content trimmed; a list of parts keeps its text
#: parts), then the assistant's header when a generation prompt is asked for. It has no tools block and says so rather
#: than dropping the tools; ``enable_thinking`` and other switches are ignored.
XFAMILY_CHAT_TEMPLATE = (
    "{%- if tools %}{{ raise_exception('this chat template has no tools block: give the tools to a verifier "
    "whose template renders them') }}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (content | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)


def number_line(last: int = 999) -> str:
    """``"0 1 2 ... last"``: a corpus line that makes every number up to ``last`` one token."""
    return " ".join(str(i) for i in range(last + 1))


def build_tokenizer_xfamily(corpus: Iterable[str], vocab_size: int = 4096, numbers: int = 999) -> Any:
    """Train the SentencePiece-style BPE (module docstring) on ``corpus`` plus the chat roles and the number line
    0..``numbers``, and wrap it for transformers (a ``PreTrainedTokenizerFast`` with the Llama-3-style template).

    ``vocab_size`` bounds the learned pieces (special tokens included, byte pieces not); on a small corpus BPE runs
    out of merges first, and every word of the corpus is then one piece."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(WORD_PATTERN), "isolated"),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False),
        ]
    )
    texts = list(corpus) + ["system\nuser\nassistant\n"] * 200 + [number_line(numbers)] * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(XFAMILY_SPECIAL_TOKENS), show_progress=False)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre
    learner.train_from_iterator(texts, trainer=trainer)
    vocab, merges = _pieces_and_merges(learner)
    for b in range(256):  # byte fallback, after the learned pieces
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(list(XFAMILY_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=XFAMILY_BOS,
        eos_token=XFAMILY_EOS,
        pad_token=XFAMILY_PAD,
        chat_template=XFAMILY_CHAT_TEMPLATE,
        model_max_length=8192,
    )


def _pieces_and_merges(learner: Any) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A trained BPE's vocabulary (piece -> id, in the trainer's order) and merges."""
    import json

    model = json.loads(learner.to_str())["model"]
    vocab = {piece: i for i, (piece, _) in enumerate(sorted(model["vocab"].items(), key=lambda kv: kv[1]))}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def xfamily_special_ids(tokenizer: Any) -> dict[str, int]:
    """Ids of :data:`XFAMILY_SPECIAL_TOKENS` in ``tokenizer``."""
    return {t: tokenizer.convert_tokens_to_ids(t) for t in XFAMILY_SPECIAL_TOKENS}


def xfamily_verifier_config(tokenizer: Any, **sizes: Any) -> Any:
    """A small ``Qwen3Config`` over ``tokenizer``'s vocabulary, ending an answer at ``<|eot_id|>`` (Qwen3's layers; the
    tokenizer, specials and template are the second family's); ``sizes`` as :func:`~.build.verifier_config`'s."""
    from .build import verifier_config

    return verifier_config(tokenizer, **sizes, specials=(XFAMILY_EOS, XFAMILY_PAD, XFAMILY_BOS))


def generation_config_json(tokenizer: Any) -> str:
    """``generation_config.json`` of a verifier over ``tokenizer``: greedy, stop at ``<|eot_id|>``."""
    ids = xfamily_special_ids(tokenizer)
    return f'{{"do_sample": false, "bos_token_id": {ids[XFAMILY_BOS]}, "eos_token_id": {ids[XFAMILY_EOS]}, "pad_token_id": {ids[XFAMILY_PAD]}}}'
