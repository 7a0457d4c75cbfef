"""A cost-emulating twin of a verifier: the same function, a chosen cost per forward.

The speed claim of AsymSpec rests on one ratio: a verifier forward costs many drafter forwards (Qwen3-32B against
Qwen3-VL-2B: 16x the parameters). The shipped tiny pair's two models cost about the same, so no run of them can show
it. A twin makes the ratio on any machine without changing what the verifier says:

* it keeps every layer of the verifier and appends ``extra_layers`` decoder layers, each a copy of one of the
  verifier's own layers (real weights, so the work is real: attention over the whole cache, the MLP) whose two output
  projections, ``self_attn.o_proj`` and ``mlp.down_proj``, are zero;
* a decoder layer adds its attention's and its MLP's outputs to the residual stream, and both are then exactly
  ``0.0`` (a product with an all-zero matrix), so every hidden state, and so every logit, is bit for bit the
  verifier's. The twin's tokens equal the verifier's, always (the bench checks it on its own problems).

It is a **cost emulator, not a bigger model**: it knows nothing the verifier does not. Extra layers (rather than
zero-widened MLPs, which change the rounding of the wider products) keep the function exact; they cost what a
decoder layer costs, attention over the cache included, so a forward of K + 1 tokens costs about what a one-token
forward costs where the forward is latency-bound, as a 32B model's decode step is on a GPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: Written into every twin's folder and its config, so that no one mistakes it for a model.
NOTE = (
    "COST EMULATOR, NOT A BIGGER MODEL: this checkpoint is {base} with {extra} appended decoder layers whose output "
    "projections (self_attn.o_proj, mlp.down_proj) are zero. Its logits equal {base}'s bit for bit; it only costs more "
    "per forward. Built by asymspec_mm.bench.twin for the cost-ratio benchmark."
)
#: The weights of a decoder layer whose output the twin zeroes.
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def build_twin(verifier_dir: str | Path, out_dir: str | Path, extra_layers: int) -> Path:
    """Write a twin of the verifier checkpoint in ``verifier_dir`` (a Qwen3 text model's folder: ``config.json``,
    ``model.safetensors`` and its tokenizer files) with ``extra_layers`` zero-output layers appended (layer ``n + j``
    copies layer ``j % n``); returns ``out_dir``. ``extra_layers=0`` writes a plain copy."""
    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(verifier_dir), Path(out_dir)
    if extra_layers < 0:
        raise ValueError(f"extra_layers={extra_layers!r} must be >= 0")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    n = int(config["num_hidden_layers"])
    weights = load_file(str(src / "model.safetensors"))
    prefix = "model.layers."
    for j in range(extra_layers):
        source, target = f"{prefix}{j % n}.", f"{prefix}{n + j}."
        for name in [k for k in weights if k.startswith(source)]:
            tensor = weights[name].clone()
            if name.endswith(ZEROED):
                tensor = torch.zeros_like(tensor)
            weights[target + name[len(source) :]] = tensor
    config["num_hidden_layers"] = n + extra_layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = [config["layer_types"][i % n] for i in range(n + extra_layers)]
    config["max_window_layers"] = max(int(config.get("max_window_layers", 0)), n + extra_layers)
    note = NOTE.format(base=src.name, extra=extra_layers)
    config["asymspec_cost_emulator"] = {"base_layers": n, "extra_layers": extra_layers, "note": note}
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, out / f.name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt", "asymspec_cost_emulator": note})
    (out / "COST_EMULATOR.txt").write_text(note + "\n", encoding="utf-8")
    return out


def is_twin(model_dir: str | Path) -> bool:
    """Whether a checkpoint folder is a cost-emulating twin."""
    config = Path(model_dir) / "config.json"
    return config.is_file() and "asymspec_cost_emulator" in json.loads(config.read_text(encoding="utf-8"))


def layers_for_ratio(ratio: float, base_layers: int, cost_at: dict[int, float], drafter_cost: float) -> int:
    """The layer count whose verifier forward costs ``ratio`` drafter forwards, from the forward costs measured at two
    or more layer counts (``cost_at``: layers -> seconds): a least-squares line through them (cost is linear in layers:
    each layer is the same work); at least ``base_layers``."""
    xs, ys = zip(*sorted(cost_at.items()))
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    per_layer = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - per_layer * mx
    return max(base_layers, round((ratio * drafter_cost - fixed) / max(per_layer, 1e-12)))
