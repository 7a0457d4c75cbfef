"""Small random-weight Qwen3-VL / Qwen3 checkpoints for tests and benchmarks (built offline, saved locally).

They exercise the real loading path (``AsymSpecPipeline.from_pretrained`` on a local directory) and
real forwards; random weights emit noise, so they test mechanics, never accuracy.
"""

from __future__ import annotations

from pathlib import Path

from .build import build_processor, build_tokenizer, drafter_config, save_pair, verifier_config


def build_tiny_checkpoints(
    out_dir: str | Path,
    seed: int = 0,
    init_std: float = 0.1,
    drafter_kwargs: dict | None = None,
    verifier_kwargs: dict | None = None,
    max_pixels: int = 128 * 128,
    correlated: float | None = 0.03,
) -> tuple[Path, Path]:
    """Build and save a random drafter (Qwen3-VL) and verifier (Qwen3) sharing one tokenizer.

    Returns ``(drafter_dir, verifier_dir)``. ``init_std`` is larger than a trained model's so that
    greedy outputs vary from token to token. Output heads are untied so a token does not simply
    predict itself. With ``correlated`` set, the verifier has the drafter's text dimensions and
    starts from the drafter's language-model weights plus relative noise of that size, so the two
    agree often but not always, and the gate both accepts and rejects (independent random models
    would almost never agree).
    """
    from transformers import Qwen3VLForConditionalGeneration

    out = Path(out_dir)
    if (out / "drafter" / "config.json").exists() and (out / "verifier" / "config.json").exists():
        return out / "drafter", out / "verifier"
    tok = build_tokenizer()
    proc = build_processor(tok, min_pixels=32 * 32, max_pixels=max_pixels)
    d_cfg = drafter_config(tok, **(drafter_kwargs or {}))
    d_cfg.tie_word_embeddings = False
    d_cfg.text_config.tie_word_embeddings = False
    if correlated is not None and verifier_kwargs is None:
        t = d_cfg.text_config
        verifier_kwargs = dict(
            hidden_size=t.hidden_size,
            num_layers=t.num_hidden_layers,
            num_heads=t.num_attention_heads,
            num_kv_heads=t.num_key_value_heads,
            head_dim=t.head_dim,
            intermediate_size=t.intermediate_size,
        )
    v_cfg = verifier_config(tok, **(verifier_kwargs or {}))
    v_cfg.tie_word_embeddings = False
    d_cfg.text_config.initializer_range = init_std
    d_cfg.vision_config.initializer_range = init_std
    v_cfg.initializer_range = init_std
    drafter, verifier = _init_pair(Qwen3VLForConditionalGeneration, d_cfg, v_cfg, seed, correlated)
    return save_pair(drafter, verifier, tok, proc, out)


def _init_pair(drafter_cls, d_cfg, v_cfg, seed: int, correlated: float | None):
    """Random drafter (``drafter_cls``) and Qwen3 verifier from their configs, seeded ``seed`` / ``seed + 1``,
    the verifier pulled towards the drafter when ``correlated`` is set (see :func:`correlate_`)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    drafter = drafter_cls(d_cfg).eval()
    torch.manual_seed(seed + 1)
    verifier = Qwen3ForCausalLM(v_cfg).eval()
    if correlated is not None:
        correlate_(verifier, drafter, correlated)
    return drafter, verifier


def correlate_(verifier, drafter, scale: float) -> None:
    """Set every verifier weight that has a same-named, same-shaped drafter text weight to that weight
    plus relative Gaussian noise of size ``scale`` (in place), so the two models agree often, not always."""
    import torch

    source = {k.replace("model.language_model.", "model."): v for k, v in drafter.state_dict().items()}
    with torch.no_grad():
        for name, param in verifier.state_dict().items():
            if name in source and source[name].shape == param.shape:
                base = source[name]
                param.copy_(base + scale * base.std().clamp_min(1e-3) * torch.randn_like(base))


def build_text_pair(
    out_dir: str | Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 32,
    inter: int = 128,
    vocab: int | None = None,
    d_hidden: int | None = None,
    d_layers: int | None = None,
    correlated: float | None = 0.03,
    seed: int = 0,
):
    """A random Qwen3 text drafter and Qwen3 verifier sharing the project's tokenizer, saved under
    ``out_dir/{drafter,verifier}`` (for text-only engines, e.g. the vLLM tests and GPU check).

    Returns ``(drafter, verifier, (drafter_dir, verifier_dir))``. The drafter may be smaller
    (``d_hidden``/``d_layers``); ``correlated`` applies only where shapes match (see :func:`correlate_`).
    """
    from transformers import Qwen3ForCausalLM

    out = Path(out_dir)
    tok = build_tokenizer()
    v_cfg = verifier_config(
        tok, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter
    )
    d_cfg = verifier_config(
        tok,
        hidden_size=d_hidden or hidden,
        num_layers=d_layers or layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
    )
    for cfg in (v_cfg, d_cfg):
        cfg.tie_word_embeddings = False  # a token should not simply predict itself
        cfg.initializer_range = 0.1 if hidden <= 128 else 0.02
        if vocab:
            cfg.vocab_size = vocab
    drafter, verifier = _init_pair(Qwen3ForCausalLM, d_cfg, v_cfg, seed, correlated)
    dirs = []
    for name, model in (("drafter", drafter), ("verifier", verifier)):
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
        dirs.append(out / name)
    return drafter, verifier, tuple(dirs)
