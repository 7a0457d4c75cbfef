"""The pairs the benchmark runs (trained tiny, random tiny, random weights with the published shapes, given
checkpoints) and its inputs (held-out MiniVista problems, captions padded to a target view length)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import (
    FILLER,
    PAIRS,
    QWEN3_0_6B,
    QWEN3_32B,
    QWEN3_VL_2B,
    QWEN3_VL_2B_VISION,
    QWEN_VOCAB,
    REAL_IMAGE_SIDE,
    UNBOUNDED_CAPTION,
    log,
)

if TYPE_CHECKING:
    import torch

    from ..base.config import AsymSpecConfig


@dataclass
class BenchPair:
    """A loaded pipeline and what the report says about it: ``trained`` decides whether acceptance (hence
    AsymSpec/SD throughput) is a result; ``image_side``: cases are resized to this square side."""

    pipe: Any
    name: str
    description: str
    trained: bool
    notes: list[str] = field(default_factory=list)
    image_side: int | None = None

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device(self.pipe.device)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.pipe.verifier.parameters()).dtype


def _build_random_tiny(workdir: Path, max_positions: int = 8192) -> tuple[Path, Path]:
    """Correlated random tiny checkpoints (the tests' kind), with a context window for the 4k sweep."""
    from ..checkpoints.small import build_tiny_checkpoints

    dims = dict(hidden_size=64, num_layers=2, num_heads=2, head_dim=32, intermediate_size=128)
    return build_tiny_checkpoints(
        workdir,
        drafter_kwargs=dict(dims, max_position_embeddings=max_positions),
        verifier_kwargs=dict(dims, num_kv_heads=1, max_position_embeddings=max_positions),
    )


def _random_model(cls: type, config: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """Instantiate ``cls(config)`` directly in ``dtype`` on ``device`` (random init, nothing saved)."""
    import torch

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def build_real_shape_pair(
    verifier_shape: str = "0.6b", device: str | torch.device = "cpu", dtype: torch.dtype | None = None, image_side: int = REAL_IMAGE_SIDE
):
    """Random-weight models with the published shapes, built in memory: a Qwen3-VL-2B-shaped drafter and a
    Qwen3-0.6B-shaped (or 32B-shaped) verifier, vocabulary 151936, with the small Qwen-format tokenizer.

    Returns ``(drafter, processor, verifier, tokenizer)``.
    """
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from ..checkpoints.build import build_processor, build_tokenizer, drafter_config, verifier_config

    dtype = dtype or torch.bfloat16
    tok = build_tokenizer()
    proc = build_processor(tok, min_pixels=image_side * image_side, max_pixels=image_side * image_side)
    d_cfg = drafter_config(tok, max_position_embeddings=40960, **QWEN3_VL_2B)
    d_cfg.text_config.vocab_size = QWEN_VOCAB
    d_cfg.text_config.num_key_value_heads = 8
    for key, value in QWEN3_VL_2B_VISION.items():
        setattr(d_cfg.vision_config, key, value)
    shape = {"0.6b": QWEN3_0_6B, "32b": QWEN3_32B}[verifier_shape]
    v_cfg = verifier_config(tok, max_position_embeddings=40960, **shape)
    v_cfg.vocab_size = QWEN_VOCAB
    if verifier_shape == "32b":
        v_cfg.tie_word_embeddings = False
    for c in (d_cfg.text_config, d_cfg.vision_config, v_cfg):
        c.initializer_range = 0.02
    dev = torch.device(device)
    torch.manual_seed(0)
    drafter = _random_model(Qwen3VLForConditionalGeneration, d_cfg, dtype, dev)
    torch.manual_seed(1)
    verifier = _random_model(Qwen3ForCausalLM, v_cfg, dtype, dev)
    return drafter, proc, verifier, tok


def load_pair(
    pair: str = "tiny",
    *,
    drafter: str | None = None,
    verifier: str | None = None,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    workdir: str | Path | None = None,
    sd_drafter: str | Path | None = None,
) -> BenchPair:
    """Load (or build) the pair to benchmark. ``tiny`` falls back to random tiny checkpoints when the bundled
    trained pair is missing, and records that in ``notes``. ``sd_drafter``: SD's own text drafter (see
    :meth:`AsymSpecPipeline.from_pretrained`; not for the real-shape pairs, which are built, not loaded)."""

    from ..base.errors import UnknownOptionError
    from ..pipeline.facade import AsymSpecPipeline, resolve_device

    workdir = Path(workdir) if workdir is not None else Path("runs/bench")
    sd = {"sd_drafter": sd_drafter} if sd_drafter is not None else {}
    if sd and pair.startswith("real-shapes"):
        raise UnknownOptionError(f"--sd-drafter needs a loaded pair (tiny, random-tiny, dirs), not {pair!r}")
    if pair == "tiny":
        from ..pipeline.presets import TINY_DIR

        if (TINY_DIR / "drafter").is_dir() and (TINY_DIR / "verifier").is_dir():
            pipe = AsymSpecPipeline.from_pretrained(
                TINY_DIR / "drafter",
                TINY_DIR / "verifier",
                device=device or "cpu",
                dtype=dtype or "fp32",
                ocr="none",
                local_files_only=True,
                **sd,
            )
            return BenchPair(pipe, "tiny", "bundled trained tiny pair (asymspec_mm/presets_data/tiny)", trained=True)
        d_dir, v_dir = _build_random_tiny(workdir / "ckpt-random-tiny")
        pipe = AsymSpecPipeline.from_pretrained(d_dir, v_dir, device=device or "cpu", dtype=dtype or "fp32", ocr="none", **sd)
        return BenchPair(
            pipe,
            "tiny (fallback: random-tiny)",
            "random tiny checkpoints (correlated drafter/verifier)",
            trained=False,
            notes=[
                f"the bundled tiny pair is missing from {TINY_DIR}: FELL BACK to random tiny checkpoints "
                "(random weights: acceptance statistics and AsymSpec/SD tokens/s carry no meaning)"
            ],
        )
    if pair == "random-tiny":
        d_dir, v_dir = _build_random_tiny(workdir / "ckpt-random-tiny")
        pipe = AsymSpecPipeline.from_pretrained(d_dir, v_dir, device=device or "cpu", dtype=dtype or "fp32", ocr="none", **sd)
        return BenchPair(pipe, "random-tiny", "random tiny checkpoints (correlated drafter/verifier)", trained=False)
    if pair in ("real-shapes", "real-shapes-32b"):
        dev, dt = resolve_device(device, dtype or "bf16")
        shape = "32b" if pair.endswith("32b") else "0.6b"
        t0 = time.perf_counter()
        d_model, proc, v_model, tok = build_real_shape_pair(shape, dev, dt)
        log(f"built random {pair} models in {time.perf_counter() - t0:.0f}s")
        pipe = AsymSpecPipeline(d_model, proc, v_model, tok, device=dev, ocr="none", name=pair)
        v_desc = "Qwen3-0.6B-shaped verifier stand-in" if shape == "0.6b" else "Qwen3-32B-shaped verifier"
        n_d = sum(p.numel() for p in d_model.parameters()) / 1e9
        n_v = sum(p.numel() for p in v_model.parameters()) / 1e9
        return BenchPair(
            pipe,
            pair,
            f"RANDOM weights, published shapes: Qwen3-VL-2B-shaped drafter ({n_d:.2f}B) + {v_desc} ({n_v:.2f}B), "
            f"vocab {QWEN_VOCAB}, {str(dt).replace('torch.', '')}",
            trained=False,
            image_side=REAL_IMAGE_SIDE,
        )
    if pair == "dirs":
        if not (drafter and verifier):
            raise UnknownOptionError("pair 'dirs' needs --drafter and --verifier checkpoint directories")
        pipe = AsymSpecPipeline.from_pretrained(drafter, verifier, device=device, dtype=dtype, ocr="none", **sd)
        return BenchPair(
            pipe,
            "dirs",
            f"{drafter} + {verifier}",
            trained=True,
            notes=["checkpoints given by path: assumed trained (acceptance statistics reported as measured)"],
        )
    raise UnknownOptionError(f"unknown bench pair {pair!r}; choose one of {', '.join(PAIRS)}")


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def bench_cases(n: int, image_side: int | None = None, families: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """``n`` held-out MiniVista problems (image, query, caption, OCR), far from the training indices;
    ``families`` (e.g. ``("figure", "visual")``) rotate instead of all four."""
    from ..base.errors import UnknownOptionError
    from ..eval import minivista as mv

    bad = [f for f in families or () if f not in mv.FAMILIES]
    if bad:
        raise UnknownOptionError(f"case family {bad[0]!r} does not exist; choose among {', '.join(mv.FAMILIES)}")
    out = []
    for p in mv.generate(n, seed=mv.HELDOUT_SEED, families=families or None, start=50_000):
        img = p["decoded_image"]
        if image_side:
            img = img.resize((image_side, image_side))
        out.append({"id": p["pid"], "image": img, "question": p["query"], "caption": p["caption"], "ocr": p["ocr"]})
    return out


def _view_tokens(pipe: Any, caption: str, ocr: str) -> int:
    """Tokens of the compressed view of ``caption`` + ``ocr`` in the verifier's tokenizer."""
    from captioning.view import CompressedView

    return len(pipe.verifier_tokenizer(CompressedView(caption=caption, ocr_text=ocr).render(), add_special_tokens=False)["input_ids"])


def pad_caption(pipe: Any, case: dict[str, Any], target_tokens: int) -> str:
    """The case's caption extended with filler words until the compressed view has about ``target_tokens`` tokens."""
    caption, words = case["caption"], []
    have = _view_tokens(pipe, caption, case["ocr"])
    if have >= target_tokens:
        return caption
    per_word = max(1e-3, _view_tokens(pipe, caption + " " + " ".join(FILLER * 8), case["ocr"]) - have) / (len(FILLER) * 8)
    n = int((target_tokens - have) / per_word)
    words = [FILLER[i % len(FILLER)] for i in range(max(0, n))]
    text = caption + " " + " ".join(words)
    # Trim (or grow) word by word to land at the target from below.
    while words and _view_tokens(pipe, text, case["ocr"]) > target_tokens:
        words = words[: max(0, len(words) - max(1, len(words) // 50))]
        text = caption + " " + " ".join(words)
    return text


def fits_context(bp: BenchPair, length: int, cfg: AsymSpecConfig, synthetic: bool, image_tokens: int) -> bool:
    """Whether a view of ``length`` tokens plus the request fits every stream's context window (on the request
    path: whether the pipeline sets the request up, which checks the windows before it prefills)."""
    from ..base.errors import ContextOverflowError

    need = cfg.max_new_tokens + cfg.k + 1
    if synthetic:
        return length + image_tokens + need <= context_limit(bp.pipe)
    case = bench_cases(1, bp.image_side)[0]
    try:
        bp.pipe.prepare(
            case["image"],
            case["question"],
            caption=pad_caption(bp.pipe, case, length),
            ocr=case["ocr"],
            method="asymspec",
            config=cfg,
            max_caption_chars=UNBOUNDED_CAPTION,
        )
    except ContextOverflowError:
        return False
    return True


def context_limit(pipe: Any) -> int:
    """The smallest context window of the pair's models (a large number when neither states one)."""
    lim = [
        getattr(pipe.verifier.config, "max_position_embeddings", None),
        getattr(pipe.drafter.config.get_text_config(), "max_position_embeddings", None),
    ]
    lim = [x for x in lim if x]
    return min(lim) if lim else 1 << 30
