"""Small random-weight Qwen3-VL / Qwen3 checkpoints for tests and benchmarks (built offline, saved locally).

They exercise the real loading path (``AsymSpecPipeline.from_pretrained`` on a local directory) and
real forwards; random weights emit noise, so they test mechanics, never accuracy.
"""

from __future__ import annotations

from pathlib import Path

from .checkpoints import build_processor, build_tokenizer, drafter_config, save_pair, verifier_config


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
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

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
        verifier_kwargs = dict(hidden_size=t.hidden_size, num_layers=t.num_hidden_layers, num_heads=t.num_attention_heads,
                               num_kv_heads=t.num_key_value_heads, head_dim=t.head_dim, intermediate_size=t.intermediate_size)
    v_cfg = verifier_config(tok, **(verifier_kwargs or {}))
    v_cfg.tie_word_embeddings = False
    d_cfg.text_config.initializer_range = init_std
    d_cfg.vision_config.initializer_range = init_std
    v_cfg.initializer_range = init_std
    torch.manual_seed(seed)
    drafter = Qwen3VLForConditionalGeneration(d_cfg).eval()
    torch.manual_seed(seed + 1)
    verifier = Qwen3ForCausalLM(v_cfg).eval()
    if correlated is not None:
        source = {k.replace("model.language_model.", "model."): v for k, v in drafter.state_dict().items()}
        with torch.no_grad():
            for name, param in verifier.state_dict().items():
                if name in source and source[name].shape == param.shape:
                    base = source[name]
                    param.copy_(base + correlated * base.std().clamp_min(1e-3) * torch.randn_like(base))
    return save_pair(drafter, verifier, tok, proc, out)
