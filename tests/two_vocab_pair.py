"""A cross-family pair for the tests: the bundled tiny drafter (byte-level BPE, Qwen's special tokens and templates) and a
random-weight Qwen3 verifier with a tokenizer of another family, built here.

The verifier's tokenizer is SentencePiece-style (``▁`` for a space, ``<0xNN>`` byte-fallback pieces after the learned
ones), trained on the MiniVista corpus with another vocabulary size, with Llama-3's special tokens and a Llama-3-style
chat template of its own. Its weights are the drafter's language model plus noise, its embedding row of every token the
drafter also has that token's drafter row, so the two agree often (the gate accepts and rejects); the rows of the tokens
only the verifier has are random and scaled up, so that at some positions its best token is one the drafter cannot say.
"""

from __future__ import annotations

from pathlib import Path

TINY_DRAFTER = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data" / "tiny" / "drafter"

SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

#: The verifier's chat template: each message between header tokens, ended by <|eot_id|>; no tools, no thinking switch.
TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m['content'] is string %}{%- set text = m['content'] %}"
    "{%- else %}{%- set text = m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + (text | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)


def build_tokenizer(vocab_size: int = 900):
    """The verifier's SentencePiece-style BPE (``PreTrainedTokenizerFast``), trained on MiniVista's corpus."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from asymspec_mm.eval import minivista as mv

    texts = mv.corpus(600, mv.TRAIN_SEED) + ["user\nassistant\n\n"] * 50
    trained = Tokenizer(models.BPE(unk_token=None))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trained.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):  # byte fallback pieces after the learned ones: "," pairs with the piece the tokenizer emits
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.add_special_tokens(list(SPECIALS))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        chat_template=TEMPLATE,
        model_max_length=4096,
    )


def build_verifier(out_dir: str | Path, *, noise: float = 0.03, outside_scale: float = 1.5, seed: int = 0) -> Path:
    """Save the verifier (``Qwen3ForCausalLM``, the tiny drafter's text sizes) with :func:`build_tokenizer`'s tokenizer
    under ``out_dir``; returns the folder. Built once per folder."""
    import torch
    from transformers import AutoProcessor, Qwen3Config, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from asymspec_mm.base.vocab_map import build_vocab_map

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    tok = build_tokenizer()
    drafter = Qwen3VLForConditionalGeneration.from_pretrained(TINY_DRAFTER)
    text = drafter.config.text_config
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_hidden_layers=text.num_hidden_layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads,
        head_dim=text.head_dim,
        max_position_embeddings=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": text.rope_parameters["rope_theta"]},
        tie_word_embeddings=True,
        eos_token_id=ids["<|eot_id|>"],
        bos_token_id=ids["<|begin_of_text|>"],
        pad_token_id=ids["<|end_of_text|>"],
    )
    torch.manual_seed(seed)
    verifier = Qwen3ForCausalLM(cfg).eval()
    source = {k.replace("model.language_model.", "model."): v for k, v in drafter.state_dict().items()}
    d_tok = AutoProcessor.from_pretrained(TINY_DRAFTER).tokenizer
    to_drafter = build_vocab_map(d_tok, tok).to_drafter
    with torch.no_grad():
        for name, param in verifier.state_dict().items():
            if name in source and source[name].shape == param.shape:
                base = source[name]
                param.copy_(base + noise * base.std().clamp_min(1e-3) * torch.randn_like(base))
        d_embed = source["model.embed_tokens.weight"]
        v_embed = verifier.model.embed_tokens.weight
        std = float(d_embed.std())
        for v in range(v_embed.shape[0]):
            d = to_drafter[v] if v < len(to_drafter) else -1
            if d >= 0:
                v_embed[v] = d_embed[d] + noise * std * torch.randn_like(d_embed[d])
            else:
                v_embed[v] = outside_scale * std * torch.randn_like(v_embed[v])
    verifier.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(f'{{"do_sample": false, "eos_token_id": {ids["<|eot_id|>"]}}}')
    return out
