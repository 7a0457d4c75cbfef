"""Build Qwen-format checkpoints from scratch: tokenizer, chat templates, processor, configs.

Real Qwen3-VL / Qwen3 weights come from the hub; this module makes *small* checkpoints with
the same architecture classes, Qwen's special tokens and the real Qwen chat templates, so the
real loading path (``from_pretrained`` on a local directory) can be exercised offline. The tests
use random weights; the bundled ``tiny`` preset trains a pair built here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .qwen_files import DRAFTER, VERIFIER, chat_template

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)

# The real templates (Qwen3-VL-2B-Instruct's for the drafter, Qwen3-32B's for the verifier), byte for byte
DRAFTER_CHAT_TEMPLATE = chat_template(DRAFTER)
VERIFIER_CHAT_TEMPLATE = chat_template(VERIFIER)

DEFAULT_CORPUS = (
    "The chart shows five bars labelled A B C D E with values 12 30 7 45 and 21. "
    "Which bar is the tallest? The answer is D because 45 is the largest value. "
    "A red circle is left of a blue square and a green triangle. How many shapes are there? There are 3 shapes. "
    "In triangle ABC angle A = 50 degrees and angle B = 60 degrees, so angle C = 180 - 50 - 60 = 70. "
    "Image description: a bar chart. Image detected text: 0 10 20 30 40 50. Question: Choices: (A) (B) (C) (D) "
    "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end. "
    "Final answer: 0 1 2 3 4 5 6 7 8 9 + - * / = . , ; : ? ! ( ) [ ] { } % ° cm m kg $ "
)


def build_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 512, chat_template: str = VERIFIER_CHAT_TEMPLATE):
    """Train a byte-level BPE tokenizer with Qwen's special tokens and wrap it for transformers.

    Byte-level means every string is encodable, like Qwen's own tokenizer; the special tokens get
    the first ids so they are identical in every tokenizer built here.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) if corpus is not None else [DEFAULT_CORPUS] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        model_max_length=32768,
    )


def build_processor(tokenizer, patch_size: int = 16, merge_size: int = 2, min_pixels: int = 32 * 32, max_pixels: int = 256 * 256):
    """A real ``Qwen3VLProcessor`` (Qwen2-VL image processor, Qwen3-VL video processor) around ``tokenizer``."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=2,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    video_processor = Qwen3VLVideoProcessor(patch_size=patch_size, merge_size=merge_size)
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=DRAFTER_CHAT_TEMPLATE,
    )


def special_ids(tokenizer) -> dict[str, int]:
    """Ids of the special tokens the configs must agree on."""
    return {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def drafter_config(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    head_dim: int = 32,
    intermediate_size: int = 128,
    vision_depth: int = 2,
    vision_hidden: int = 32,
    patch_size: int = 16,
    deepstack: tuple[int, ...] = (0,),
    max_position_embeddings: int = 4096,
):
    """A small ``Qwen3VLConfig`` (interleaved 3D M-RoPE, deepstack) sharing ``tokenizer``'s ids."""
    from transformers import Qwen3VLConfig

    ids = special_ids(tokenizer)
    half = head_dim // 2
    t_sec = half - 2 * (half * 5 // 16)
    mrope_section = [t_sec, half * 5 // 16, half * 5 // 16]  # same proportions as Qwen3-VL's [24, 20, 20]
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=max(1, num_heads // 2),
            head_dim=head_dim,
            max_position_embeddings=max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": mrope_section, "mrope_interleaved": True},
            tie_word_embeddings=True,
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            bos_token_id=None,
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=vision_hidden,
            intermediate_size=vision_hidden * 2,
            num_heads=2,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=hidden_size,
            num_position_embeddings=64,
            deepstack_visual_indexes=list(deepstack),
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def verifier_config(
    tokenizer,
    hidden_size: int = 96,
    num_layers: int = 3,
    num_heads: int = 3,
    head_dim: int = 32,
    intermediate_size: int = 192,
    max_position_embeddings: int = 4096,
    num_kv_heads: int | None = None,
    specials: tuple[str, str, str | None] = ("<|im_end|>", "<|endoftext|>", None),
):
    """A small ``Qwen3Config`` sharing ``tokenizer``'s ids; ``specials``: the tokens that end an answer, pad, and begin a
    text (None: none), Qwen's by default."""
    from transformers import Qwen3Config

    eos, pad, bos = (None if t is None else tokenizer.convert_tokens_to_ids(t) for t in specials)
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=bos,
    )


def save_pair(drafter_model, verifier_model, tokenizer, processor, out_dir: str | Path) -> tuple[Path, Path]:
    """Save a drafter (with processor + VL template) and verifier (with Qwen3 template) side by side."""
    import copy

    out = Path(out_dir)
    d_dir, v_dir = out / "drafter", out / "verifier"
    drafter_model.save_pretrained(d_dir)
    processor.save_pretrained(d_dir)
    v_tok = copy.deepcopy(tokenizer)
    v_tok.chat_template = VERIFIER_CHAT_TEMPLATE
    verifier_model.save_pretrained(v_dir)
    v_tok.save_pretrained(v_dir)
    for d in (d_dir, v_dir):  # generation defaults: greedy, stop at <|im_end|>
        (d / "generation_config.json").write_text(
            f'{{"do_sample": false, "eos_token_id": {tokenizer.convert_tokens_to_ids("<|im_end|>")}, '
            f'"pad_token_id": {tokenizer.convert_tokens_to_ids("<|endoftext|>")}}}'
        )
    return d_dir, v_dir
