"""Real-layout stand-ins of Qwen3-VL-2B-Instruct and Qwen3-32B: the real hub files, small random weights.

A stand-in folder is what a hub snapshot of the real model is (the real tokenizer, chat template,
processor and generation configs, see :mod:`asymspec_mm.checkpoints.qwen_files`), except that ``config.json`` is the
real config with reduced depth and width and ``model.safetensors`` holds random weights. Everything a
user's first run on the real pair depends on (the 151,936-token vocabulary, the special-token ids, the
templates, image sizing by the real preprocessor, interleaved 3D M-RoPE in the real proportions, the rope
theta, the context windows, the EOS ids) is the real thing; only the numbers the weights produce are not.
Load them with ``AsymSpecPipeline.from_pretrained(drafter_dir, verifier_dir)``, exactly as a snapshot.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .qwen_files import DRAFTER, VERIFIER, config, hub_snapshot, snapshot_bytes


@dataclass(frozen=True)
class StandinShape:
    """Reduced sizes shared by the two stand-ins (equal text dimensions, so the verifier can start from the
    drafter's language model, see :func:`asymspec_mm.checkpoints.small.correlate_`). ``head_dim`` must be a multiple of
    16 so that the real M-RoPE sections ``[24, 20, 20]`` (of ``head_dim / 2 = 64``) scale to whole numbers."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_heads: int = 2


def scaled_mrope_section(section: list[int], head_dim: int) -> list[int]:
    """The real ``mrope_section`` (t, h, w frequency counts summing to the real ``head_dim / 2``) scaled to
    ``head_dim / 2`` in the same proportions; ``[24, 20, 20]`` at head_dim 32 is ``[6, 5, 5]``."""
    total, half = sum(section), head_dim // 2
    if (half * section[1]) % total or (half * section[2]) % total:
        raise ValueError(f"head_dim={head_dim} does not scale mrope_section {section} to whole numbers: use a multiple of 16")
    h, w = half * section[1] // total, half * section[2] // total
    return [half - h - w, h, w]


def drafter_standin_config(shape: StandinShape = StandinShape()) -> dict[str, Any]:
    """Qwen3-VL-2B-Instruct's real ``config.json`` with reduced sizes; every id, rope setting and patch size
    as the real one. The deepstack taps (real: vision layers 5, 11, 17 of 24) become the first
    ``min(3, vision_depth)`` layers."""
    cfg = copy.deepcopy(config(DRAFTER))
    text, vision = cfg["text_config"], cfg["vision_config"]
    text.update(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
    )
    text["rope_scaling"]["mrope_section"] = scaled_mrope_section(text["rope_scaling"]["mrope_section"], shape.head_dim)
    vision.update(
        depth=shape.vision_depth,
        hidden_size=shape.vision_hidden,
        intermediate_size=shape.vision_hidden * 4,
        num_heads=shape.vision_heads,
        out_hidden_size=shape.hidden_size,
        deepstack_visual_indexes=list(range(min(3, shape.vision_depth))),
    )
    return cfg


def verifier_standin_config(shape: StandinShape = StandinShape()) -> dict[str, Any]:
    """Qwen3-32B's real ``config.json`` with reduced sizes (vocabulary, ids, rope theta, context window, untied
    head as the real one)."""
    cfg = copy.deepcopy(config(VERIFIER))
    cfg.update(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        max_window_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
    )
    return cfg


def build_standin_pair(
    out_dir: str | Path,
    shape: StandinShape = StandinShape(),
    *,
    seed: int = 0,
    init_std: float = 0.1,
    correlated: float | None = 0.03,
) -> tuple[Path, Path]:
    """Write ``out_dir/qwen3-vl-2b`` and ``out_dir/qwen3`` (random weights) and return ``(drafter_dir, verifier_dir)``.

    ``init_std`` is larger than a trained model's so greedy outputs vary; with ``correlated`` the verifier
    starts from the drafter's language model plus relative noise of that size (its untied head from the
    drafter's tied embedding), so the gate both accepts and rejects. An existing pair is reused.
    """
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from .small import correlate_

    out = Path(out_dir)
    d_dir, v_dir = out / DRAFTER, out / VERIFIER
    if (d_dir / "model.safetensors").exists() and (v_dir / "model.safetensors").exists():
        return d_dir, v_dir
    configs = {DRAFTER: drafter_standin_config(shape), VERIFIER: verifier_standin_config(shape)}
    for name, folder in ((DRAFTER, d_dir), (VERIFIER, v_dir)):
        hub_snapshot(name, folder)
        (folder / "config.json").write_text(json.dumps(configs[name], indent=2) + "\n", encoding="utf-8")
    d_cfg, v_cfg = AutoConfig.from_pretrained(d_dir), AutoConfig.from_pretrained(v_dir)
    d_cfg.text_config.initializer_range = d_cfg.vision_config.initializer_range = v_cfg.initializer_range = init_std
    torch.manual_seed(seed)
    drafter = Qwen3VLForConditionalGeneration(d_cfg).eval()
    torch.manual_seed(seed + 1)
    verifier = Qwen3ForCausalLM(v_cfg).eval()
    if correlated is not None:
        correlate_(verifier, drafter, correlated)
        with torch.no_grad():
            emb = drafter.get_input_embeddings().weight
            verifier.lm_head.weight.copy_(emb + correlated * emb.std() * torch.randn_like(emb))
    for name, folder, model in ((DRAFTER, d_dir, drafter), (VERIFIER, v_dir, verifier)):
        model.save_pretrained(folder)  # writes its own config.json / generation_config.json: put the real-layout ones back
        (folder / "config.json").write_text(json.dumps(configs[name], indent=2) + "\n", encoding="utf-8")
        (folder / "generation_config.json").write_bytes(snapshot_bytes(name, "generation_config.json"))
    return d_dir, v_dir


#: The folder of the text drafter stand-in (the paper's text settings draft with Qwen3-4B or Qwen3-1.7B).
TEXT_DRAFTER = "qwen3-4b"


def text_drafter_standin_config(shape: StandinShape = StandinShape()) -> dict[str, Any]:
    """A Qwen3-4B-like text drafter's ``config.json``: Qwen3-32B's real config (the same tokenizer ids, rope theta and
    context window as Qwen3-4B's and Qwen3-1.7B's) with reduced sizes and tied embeddings, as those two have."""
    cfg = verifier_standin_config(shape)
    cfg["tie_word_embeddings"] = True
    return cfg


def build_text_drafter_standin(
    out_dir: str | Path,
    verifier_dir: str | Path | None = None,
    shape: StandinShape = StandinShape(),
    *,
    seed: int = 2,
    init_std: float = 0.1,
    correlated: float | None = 0.03,
) -> Path:
    """Write ``out_dir/qwen3-4b``, a text drafter stand-in laid out as a hub snapshot of Qwen3 (the real tokenizer and
    chat template, :func:`text_drafter_standin_config`, random weights) and return it. With ``verifier_dir`` (a
    :func:`build_standin_pair` verifier) and ``correlated``, its weights are the verifier's plus relative noise of that
    size, so the pair both accepts and rejects. An existing folder is reused."""
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM

    from .small import correlate_

    folder = Path(out_dir) / TEXT_DRAFTER
    if (folder / "model.safetensors").exists():
        return folder
    cfg_dict = text_drafter_standin_config(shape)
    hub_snapshot(VERIFIER, folder)
    (folder / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n", encoding="utf-8")
    cfg = AutoConfig.from_pretrained(folder)
    cfg.initializer_range = init_std
    torch.manual_seed(seed)
    drafter = Qwen3ForCausalLM(cfg).eval()
    if verifier_dir is not None and correlated is not None:
        correlate_(drafter, Qwen3ForCausalLM.from_pretrained(verifier_dir).eval(), correlated)
    drafter.save_pretrained(folder)  # its own config.json / generation_config.json: put the real-layout ones back
    (folder / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n", encoding="utf-8")
    (folder / "generation_config.json").write_bytes(snapshot_bytes(VERIFIER, "generation_config.json"))
    return folder
