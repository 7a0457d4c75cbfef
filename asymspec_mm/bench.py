"""``asymspec-mm bench``: methods side by side in one process, interleaved, reported as medians and ratios.

What it measures (see ``BENCHMARKS.md`` for results):

* **Throughput**: decode tokens/s per method variant (Floor, drafter alone, symmetric SD, AsymSpec
  and its ablations) and the ratio to Floor. Repetitions are interleaved (every repetition runs
  every variant, the order rotating), and a ratio is the median over repetitions of the *paired*
  ratio ``tokens/s(variant, rep r) / tokens/s(Floor, rep r)``; a single absolute time is never the
  result (the machine is shared and noisy).
* **Per-step time split**: every engine call goes through a timing proxy
  (:class:`asymspec_mm.timing.TimedEngine`), the gate through a timed wrapper of
  ``decode.gate_step``, the trace's top-k through wrappers of ``decode._trace_tops`` / ``decode._topk``:
  drafter-full forwards | drafter-comp forward | verifier forward | gate + fusion | trace top-k |
  the rest (host overhead), summing to the loop's wall time. On CUDA the clock synchronizes,
  so throughput there comes from separate un-instrumented runs.
* **Bookkeeping**: tokens forwarded per stream per emitted token, acceptance rate, mean accepted
  length (tokens per step), acceptance per draft position, vision-tower calls; every run is checked
  (forwarded counts match the loop's rules, the split sums to the step time).
* **Scaling**: per-token time against the length of the compressed view (a caption made that long)
  and tokens/s against K.
* **Projection**: with random weights acceptance means nothing, so for random-weight pairs the
  AsymSpec / SD tokens/s are *projected* from the measured per-call costs for given acceptance
  statistics (the paper's AR 0.78-0.92, MAL 2.6-4.1); on a trained pair the same model is checked
  against the measurement.

Pairs: ``tiny`` (the bundled trained pair; falls back to random tiny checkpoints, and says so),
``random-tiny``, ``real-shapes`` (random weights with the published shapes: a Qwen3-0.6B-shaped
verifier stand-in and a Qwen3-VL-2B-shaped drafter, bf16, built in memory), ``real-shapes-32b``
(the paper's 2B / 32B shapes; GPU), ``dirs`` (``--drafter`` / ``--verifier`` checkpoints).
Prefill: ``pipeline`` (the real request path: prompts, vision cache, prefill) or ``synthetic``
(caches filled with random keys/values of the target length, so long contexts cost no prefill:
a decode-cost measurement, labelled as such).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .timing import Clock, Ledger, median, timed_functions, wrap_streams  # torch-free at import time

# ------------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------------

DEFAULT_VARIANTS = (
    "floor",
    "drafter",
    "sd",
    "asymspec",
    "asymspec:gate=fixed",
    "asymspec:gate=tuned",
    "asymspec:delta=scd",
    "asymspec:beta=0",
    "asymspec:bonus=gated",
)
PAPER_SCENARIOS = ((0.78, 2.6), (0.92, 4.1))  # (acceptance rate, mean accepted length) reported by the paper
PAIRS = ("tiny", "random-tiny", "real-shapes", "real-shapes-32b", "dirs")
STREAMS = ("drafter_full", "drafter_comp", "verifier")
SPLIT_KEYS = ("drafter_full", "drafter_comp", "verifier", "gate", "trace", "other")
SPLIT_LABELS = {
    "drafter_full": "drafter-full fwd",
    "drafter_comp": "drafter-comp fwd",
    "verifier": "verifier fwd",
    "gate": "gate + fusion",
    "trace": "trace top-k",
    "other": "rest (host)",
}
# Loop functions timed into a bucket: the gate (+ fusion) and the trace's top-k rows. Names the loop
# lacks are skipped (see timing.timed_functions), so a refactored loop still benches.
TIMED_LOOP_FUNCTIONS = {"gate_step": "gate", "_topk": "trace", "_topk_logp": "trace", "_trace_tops": "trace"}

# Published shapes (config.json of the hub checkpoints).
QWEN3_0_6B = dict(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072)
QWEN3_32B = dict(hidden_size=5120, num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=25600)
QWEN3_VL_2B = dict(hidden_size=2048, num_layers=28, num_heads=16, head_dim=128, intermediate_size=6144,
                   vision_depth=24, vision_hidden=1024, patch_size=16, deepstack=(5, 11, 17))
QWEN3_VL_2B_VISION = dict(num_heads=16, intermediate_size=4096, num_position_embeddings=2304)
QWEN_VOCAB = 151936
REAL_IMAGE_SIDE = 448  # 448x448, patch 16, merge 2: 196 image tokens
SYNTHETIC_PENDING_TOKEN = 17

FILLER = ("the chart shows a bar labelled with a value on the axis and a red circle left of a blue square "
          "next to a green triangle above the line with the title at the top and the legend at the bottom").split()


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Variant:
    """One benchmarked method: ``method`` plus config overrides, written ``method[:key=value,...]``."""

    name: str
    method: str
    overrides: tuple[tuple[str, Any], ...] = ()
    loop: str = "current"  # "alt": the decoding loop loaded from ``alt_decode`` (e.g. decode.py with perf.patch)

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        from .decode import METHODS
        from .errors import UnknownOptionError

        spec = spec.strip()
        method, _, rest = spec.partition(":")
        if method not in METHODS:
            raise UnknownOptionError(f"bench variant {spec!r}: method must be one of {', '.join(METHODS)}")
        over: list[tuple[str, Any]] = []
        loop = "current"
        for item in filter(None, (x.strip() for x in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise UnknownOptionError(f"bench variant {spec!r}: expected key=value, got {item!r}")
            if key.strip() == "loop":
                if value.strip() not in ("current", "alt"):
                    raise UnknownOptionError(f"bench variant {spec!r}: loop must be current or alt")
                loop = value.strip()
                continue
            over.append((key.strip(), _parse_value(value.strip())))
        return cls(spec, method, tuple(over), loop)

    def config(self, base) -> Any:
        return base.with_(**dict(self.overrides)).validated() if self.overrides else base.validated()


def _parse_value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


# ------------------------------------------------------------------------------------------------
# Pairs
# ------------------------------------------------------------------------------------------------


@dataclass
class BenchPair:
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
    from .testing import build_tiny_checkpoints

    dims = dict(hidden_size=64, num_layers=2, num_heads=2, head_dim=32, intermediate_size=128)
    return build_tiny_checkpoints(
        workdir,
        drafter_kwargs=dict(dims, max_position_embeddings=max_positions),
        verifier_kwargs=dict(dims, num_kv_heads=1, max_position_embeddings=max_positions),
    )


def _random_model(cls, config, dtype: torch.dtype, device: torch.device):
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


def build_real_shape_pair(verifier_shape: str = "0.6b", device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                          image_side: int = REAL_IMAGE_SIDE):
    """Random-weight models with the published shapes, built in memory: a Qwen3-VL-2B-shaped drafter and a
    Qwen3-0.6B-shaped (or 32B-shaped) verifier, vocabulary 151936, with the small Qwen-format tokenizer.

    Returns ``(drafter, processor, verifier, tokenizer)``.
    """
    import torch

    from transformers import Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    from .checkpoints import build_processor, build_tokenizer, drafter_config, verifier_config

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


def load_pair(pair: str = "tiny", *, drafter: str | None = None, verifier: str | None = None, device: str | None = None,
              dtype: str | torch.dtype | None = None, workdir: str | Path | None = None) -> BenchPair:
    """Load (or build) the pair to benchmark. ``tiny`` falls back to random tiny checkpoints when the bundled
    trained pair is missing, and records that in ``notes``."""
    import torch

    from .errors import UnknownOptionError
    from .pipeline import AsymSpecPipeline, resolve_device

    workdir = Path(workdir) if workdir is not None else Path("runs/bench")
    if pair == "tiny":
        from .presets import TINY_DIR

        if (TINY_DIR / "drafter").is_dir() and (TINY_DIR / "verifier").is_dir():
            pipe = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", TINY_DIR / "verifier", device=device or "cpu",
                                                    dtype=dtype or "fp32", ocr="none", local_files_only=True)
            return BenchPair(pipe, "tiny", "bundled trained tiny pair (asymspec_mm/presets_data/tiny)", trained=True)
        d_dir, v_dir = _build_random_tiny(workdir / "ckpt-random-tiny")
        pipe = AsymSpecPipeline.from_pretrained(d_dir, v_dir, device=device or "cpu", dtype=dtype or "fp32", ocr="none")
        return BenchPair(pipe, "tiny (fallback: random-tiny)", "random tiny checkpoints (correlated drafter/verifier)", trained=False,
                         notes=[f"the bundled tiny pair is missing from {TINY_DIR}: FELL BACK to random tiny checkpoints "
                                "(random weights: acceptance statistics and AsymSpec/SD tokens/s carry no meaning)"])
    if pair == "random-tiny":
        d_dir, v_dir = _build_random_tiny(workdir / "ckpt-random-tiny")
        pipe = AsymSpecPipeline.from_pretrained(d_dir, v_dir, device=device or "cpu", dtype=dtype or "fp32", ocr="none")
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
        return BenchPair(pipe, pair, f"RANDOM weights, published shapes: Qwen3-VL-2B-shaped drafter ({n_d:.2f}B) + {v_desc} ({n_v:.2f}B), "
                         f"vocab {QWEN_VOCAB}, {str(dt).replace('torch.', '')}", trained=False, image_side=REAL_IMAGE_SIDE)
    if pair == "dirs":
        if not (drafter and verifier):
            raise UnknownOptionError("pair 'dirs' needs --drafter and --verifier checkpoint directories")
        pipe = AsymSpecPipeline.from_pretrained(drafter, verifier, device=device, dtype=dtype, ocr="none")
        return BenchPair(pipe, "dirs", f"{drafter} + {verifier}", trained=True,
                         notes=["checkpoints given by path: assumed trained (acceptance statistics reported as measured)"])
    raise UnknownOptionError(f"unknown bench pair {pair!r}; choose one of {', '.join(PAIRS)}")


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def bench_cases(n: int, image_side: int | None = None, families: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """``n`` held-out MiniVista problems (image, query, caption, OCR), far from the training indices;
    ``families`` (e.g. ``("figure", "visual")``) rotate instead of all four."""
    from .errors import UnknownOptionError
    from .eval import minivista as mv

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


def _view_tokens(pipe, caption: str, ocr: str) -> int:
    from captioning.view import CompressedView

    return len(pipe.verifier_tokenizer(CompressedView(caption=caption, ocr_text=ocr).render(), add_special_tokens=False)["input_ids"])


def pad_caption(pipe, case: dict[str, Any], target_tokens: int) -> str:
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


@contextlib.contextmanager
def _caption_budget(enabled: bool) -> Iterator[None]:
    """Lift the compressed view's caption budget (1600 chars) so a padded caption reaches the model."""
    if not enabled:
        yield
        return
    import captioning.captioner as cap

    original = cap.compress

    def compress(*args, **kwargs):
        kwargs.setdefault("max_caption_chars", 10**9)
        return original(*args, **kwargs)

    cap.compress = compress
    try:
        yield
    finally:
        cap.compress = original


@contextlib.contextmanager
def _eos(pipe, ignore: bool) -> Iterator[None]:
    saved = pipe.eos_ids
    if ignore:
        pipe.eos_ids = set()
    try:
        yield
    finally:
        pipe.eos_ids = saved


def load_alt_decode(path: str | Path):
    """Import another version of ``asymspec_mm/decode.py`` (e.g. with perf.patch applied) as
    ``asymspec_mm.decode_alt``, so variants written ``method:loop=alt`` run it side by side with the current loop."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("asymspec_mm.decode_alt", str(path))
    if spec is None or spec.loader is None:
        from .errors import UnknownOptionError

        raise UnknownOptionError(f"cannot import a decoding loop from {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["asymspec_mm.decode_alt"] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _loop_module(mod) -> Iterator[None]:
    """Let the pipeline dispatch to ``mod``'s loops for one request."""
    if mod is None:
        yield
        return
    from . import pipeline as pl

    names = ("asymspec_steps", "sd_steps", "greedy_steps")
    saved = {n: getattr(pl, n) for n in names}
    for n in names:
        setattr(pl, n, getattr(mod, n))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(pl, n, fn)


ENGINES = ("dynamic", "static", "static-compile")


def engine_factories(engine: str, headroom: int, device: torch.device) -> dict[str, Callable] | None:
    """Engine constructors for ``engine`` (None: the pipeline's own). The static ones come from perf.patch."""
    from . import engines as eng
    from .errors import UnknownOptionError

    if engine == "dynamic":
        return None
    if engine not in ENGINES:
        raise UnknownOptionError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
    if not hasattr(eng, "StaticTextEngine"):
        raise UnknownOptionError(f"engine={engine!r} needs the static-cache engines (apply perf.patch to asymspec_mm/engines.py)")
    opts = dict(headroom=headroom, compile_decode=engine == "static-compile",
                compile_mode="reduce-overhead" if device.type == "cuda" else "default")
    return {"text": lambda model, name="verifier": eng.StaticTextEngine(model, name, **opts),
            "vl": lambda model, name="drafter_full": eng.StaticVLEngine(model, name, **opts)}


@contextlib.contextmanager
def _engines(factories: dict | None) -> Iterator[None]:
    """Let the pipeline build its streams with ``factories`` for one request."""
    if not factories:
        yield
        return
    from . import pipeline as pl

    saved = pl.TextEngine, pl.VLEngine
    pl.TextEngine, pl.VLEngine = factories["text"], factories["vl"]
    try:
        yield
    finally:
        pl.TextEngine, pl.VLEngine = saved


def synthetic_prefill(engine, length: int, seed: int = 0) -> None:
    """Fill ``engine``'s cache with ``length`` random key/value positions (nothing forwarded): a context of that
    length for decode-cost measurements without paying its prefill."""
    import torch

    from transformers import DynamicCache

    cfg = engine.model.config
    text = cfg.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = next(engine.model.parameters()).dtype
    dev = engine.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = DynamicCache(config=cfg)
    for layer in range(text.num_hidden_layers):
        shape = (1, text.num_key_value_heads, length, head_dim)
        k = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        v = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        cache.update(k, v, layer)
    engine.cache = cache
    if hasattr(engine, "rope_delta"):
        engine.rope_delta = 0


# ------------------------------------------------------------------------------------------------
# One run
# ------------------------------------------------------------------------------------------------


def _expected_forwarded(method: str, k: int, steps: int, full_accept_steps: int, deferred_at_end: int = 0) -> dict[str, int]:
    """Decode-phase tokens each stream must forward under the loop's rules (see decode.py's docstring): d_K of
    every step with K acceptances is forwarded once, in that step or the next, except a last one left pending."""
    if method == "asymspec":
        return {"drafter_full": steps * k + full_accept_steps - deferred_at_end, "drafter_comp": steps * (k + 1), "verifier": steps * (k + 1)}
    if method == "sd":
        return {"drafter_comp": steps * k + full_accept_steps - deferred_at_end, "verifier": steps * (k + 1)}
    if method == "floor":
        return {"verifier": steps}
    return {"drafter_full": steps}


def check_run(run: dict[str, Any]) -> dict[str, Any]:
    """Bookkeeping checks of one run: forwarded counts, accepted-per-position, token bounds, split sum."""
    import torch

    k, steps = run["k"], run["steps"]
    app = run["accepted_per_position"]
    method = run["method"]
    spec = method in ("asymspec", "sd")
    full = app[k - 1] if spec and len(app) >= k else 0
    expected = _expected_forwarded(method, k, steps, full, run.get("deferred_draft_at_end", 0))
    forwarded_ok = all(run["decode_forwarded"].get(s, 0) == n for s, n in expected.items())
    accepted_k = sum(app) if spec else 0
    tokens_ok = (accepted_k + steps - (k + 1 if spec else 1) < run["new_tokens"] <= accepted_k + steps) if steps else run["new_tokens"] == 0
    monotone = all(app[i] >= app[i + 1] for i in range(len(app) - 1))
    checks: dict[str, Any] = {"forwarded_ok": forwarded_ok, "expected_forwarded": expected, "tokens_ok": tokens_ok,
                              "per_position_monotone": monotone}
    if run.get("split"):
        total = sum(run["split"].values())
        checks["split_sum_rel_err"] = abs(total - run["decode_s"]) / run["decode_s"] if run["decode_s"] > 0 else 0.0
        checks["split_nonnegative"] = min(run["split"].values()) >= -0.01 * total
    return checks


class _Runner:
    """Runs single requests of one pair, instrumented or plain, through the pipeline or on synthetic caches."""

    def __init__(self, pair: BenchPair, *, ignore_eos: bool, image_tokens: int, sync: bool, factories: dict | None = None,
                 alt_decode: Any = None):
        self.pair = pair
        self.factories = factories
        self.alt_decode = alt_decode
        self.pipe = pair.pipe
        self.ignore_eos = ignore_eos
        self.image_tokens = image_tokens
        self.clock = Clock(sync=sync)
        self.current: Ledger | None = None

    def run(self, variant: Variant, cfg, *, case: dict | None = None, caption: str | None = None, length: int | None = None,
            instrument: bool = True, synthetic: bool = False) -> dict[str, Any]:
        ledger = Ledger() if instrument else None
        self.current = ledger
        self._prefill_calls: dict[str, int] = {}
        try:
            with _eos(self.pipe, self.ignore_eos):
                if synthetic:
                    stats, loop_s, context = self._run_synthetic(variant, cfg, length or 256, ledger)
                else:
                    stats, loop_s, context = self._run_pipeline(variant, cfg, case or {}, caption, ledger)
        finally:
            self.current = None
        return self._record(variant, cfg, stats, loop_s, context, ledger, case, synthetic)

    # -- the request path: compress, prompts, vision cache, prefill, loop -----------------------
    def _run_pipeline(self, variant: Variant, cfg, case: dict, caption: str | None, ledger: Ledger | None):
        pipe = self.pipe
        marks: dict[str, float] = {}
        contexts: dict[str, int] = {}

        def start(method, prompts, c, image=None):
            streams, pending = type(pipe)._start(pipe, method, prompts, c, image)
            contexts.update({n: e.length + 1 for n, e in streams.items()})
            self._prefill_calls = {n: e.forward_calls for n, e in streams.items()}
            if ledger is not None:
                streams = wrap_streams(streams, ledger, self.clock)
                for e in streams.values():
                    e.mark_decode()
            marks["ready"] = self.clock.now()
            return streams, pending

        pipe._start = start  # instance attribute: shadows the method for this request only
        try:
            alt = self.alt_decode if variant.loop == "alt" else None
            with _caption_budget(caption is not None), _engines(self.factories), _loop_module(alt):
                gen = pipe.stream(case["image"], case["question"], caption=caption if caption is not None else case["caption"],
                                  ocr=case["ocr"], method=variant.method, config=cfg)
                loop_s = 0.0
                while True:
                    t0 = self.clock.now()
                    try:
                        next(gen)
                    except StopIteration as stop:
                        result = stop.value
                        loop_s += self.clock.now() - max(t0, marks.get("ready", t0))
                        break
                    loop_s += self.clock.now() - max(t0, marks.get("ready", t0))
        finally:
            pipe.__dict__.pop("_start", None)
        return result.stats, loop_s, contexts

    # -- synthetic caches: decode cost at a given context length, no prefill ---------------------
    def _run_synthetic(self, variant: Variant, cfg, length: int, ledger: Ledger | None):
        import torch

        from .decode import Counters
        from .engines import TextEngine, VLEngine

        pipe = self.pipe
        need = {"asymspec": STREAMS, "sd": ("drafter_comp", "verifier"), "floor": ("verifier",), "drafter": ("drafter_full",)}[variant.method]
        streams: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        contexts: dict[str, int] = {}
        text_cls, vl_cls = (self.factories["text"], self.factories["vl"]) if self.factories else (TextEngine, VLEngine)
        for i, name in enumerate(need):
            e = text_cls(pipe.verifier, name="verifier") if name == "verifier" else vl_cls(pipe.drafter, name=name)
            n = length + (self.image_tokens if name == "drafter_full" else 0)
            synthetic_prefill(e, n, seed=i)
            if hasattr(e, "_to_static"):
                e._to_static()
            streams[name] = e
            pending[name] = torch.tensor([SYNTHETIC_PENDING_TOKEN], device=e.device)
            contexts[name] = n + 1
        self._prefill_calls = {n: e.forward_calls for n, e in streams.items()}
        if ledger is not None:
            streams = wrap_streams(streams, ledger, self.clock)
            for e in streams.values():
                e.mark_decode()
        counters = Counters(cfg.k, streams)
        with _loop_module(self.alt_decode if variant.loop == "alt" else None):
            gen = pipe._loop(variant.method, streams, pending, cfg, None, counters)
        loop_s = 0.0
        t_ready = self.clock.now()
        for _ in gen:
            pass
        loop_s = self.clock.now() - t_ready
        stats = counters.as_dict()
        stats.update(stopped_by=getattr(counters, "stopped_by", "max_new_tokens"), vision_calls=0, prefill_s=0.0)
        return stats, loop_s, contexts

    def _record(self, variant, cfg, stats, loop_s, contexts, ledger, case, synthetic) -> dict[str, Any]:
        prefill = stats.get("prefill_tokens", {})
        decode_fwd = {s: n - prefill.get(s, 0) for s, n in stats["tokens_forwarded"].items()}
        run: dict[str, Any] = {
            "variant": variant.name,
            "method": variant.method,
            "k": cfg.k,
            "case": case.get("id") if case else None,
            "synthetic": synthetic,
            "context": contexts,
            "new_tokens": stats["new_tokens"],
            "steps": stats["steps"],
            "decode_s": stats["decode_wall_s"],
            "tokens_per_s": stats["tokens_per_s"],
            "drafted": stats["drafted"],
            "accepted": stats["accepted"],
            "bonus_drafted": stats.get("bonus_drafted", 0),
            "bonus_accepted": stats.get("bonus_accepted", 0),
            "deferred_draft_at_end": stats.get("deferred_draft_at_end", 0),
            "accepted_per_position": list(stats["accepted_per_position"]) if variant.method in ("asymspec", "sd") else [],
            "decode_forwarded": decode_fwd,
            "forward_calls": dict(stats["forward_calls"]),
            "prefill_calls": dict(getattr(self, "_prefill_calls", {})),
            "prefill_tokens": dict(prefill),
            "vision_calls": stats.get("vision_calls", 0),
            "vision_cache_hits": stats.get("vision_cache_hits", 0),
            "prefill_s": stats.get("prefill_s", 0.0),
            "stopped_by": stats.get("stopped_by"),
            "instrumented": ledger is not None,
        }
        if ledger is not None:
            split = {s: ledger.forward_seconds(s) for s in STREAMS}
            split["gate"] = ledger.buckets.get("gate", 0.0)
            split["trace"] = ledger.buckets.get("trace", 0.0)
            split["other"] = loop_s - sum(split.values())
            run["loop_s"] = loop_s
            run["split"] = split
            run["truncate_s"] = ledger.truncate_seconds()
            run["gate_calls"] = ledger.bucket_calls.get("gate", 0)
            run["extend_costs"] = {s: {str(n): ts for n, ts in d.items()} for s, d in ledger.extend_costs().items()}
        run["checks"] = check_run(run)
        return run


# ------------------------------------------------------------------------------------------------
# Aggregation
# ------------------------------------------------------------------------------------------------


def _sum(runs: list[dict], key: str) -> float:
    return float(sum(r[key] for r in runs))


def rep_summary(runs: list[dict]) -> dict[str, Any]:
    """One repetition of one variant (its runs over the cases) -> tokens/s, per-step and per-token times, split."""
    new, steps, dec = _sum(runs, "new_tokens"), _sum(runs, "steps"), _sum(runs, "decode_s")
    out: dict[str, Any] = {"new_tokens": new, "steps": steps, "decode_s": dec,
                           "tokens_per_s": new / dec if dec > 0 else 0.0,
                           "step_s": dec / steps if steps else float("nan"),
                           "token_s": dec / new if new else float("nan")}
    inst = [r for r in runs if r.get("split")]
    if inst:
        isteps = sum(r["steps"] for r in inst)
        loop = sum(r["loop_s"] for r in inst)
        out["split_step_s"] = {k: sum(r["split"][k] for r in inst) / isteps for k in SPLIT_KEYS} if isteps else {}
        out["split_frac"] = {k: sum(r["split"][k] for r in inst) / loop for k in SPLIT_KEYS} if loop > 0 else {}
        out["loop_step_s"] = loop / isteps if isteps else float("nan")
    return out


def paired_ratios(per_rep: dict[str, list[dict]], key: str = "tokens_per_s", reference: str = "floor") -> dict[str, list[float]]:
    """Per repetition r: ``value(variant, r) / value(reference, r)`` -- ratios of runs made side by side."""
    ref = per_rep.get(reference)
    if not ref:
        return {}
    out = {}
    for name, reps in per_rep.items():
        out[name] = [a[key] / b[key] if b[key] else float("nan") for a, b in zip(reps, ref)]
    return out


def variant_summary(runs: list[dict], reps: list[dict], ratios: list[float] | None) -> dict[str, Any]:
    """Medians over repetitions + pooled counters over every run of the variant."""
    new, steps = _sum(runs, "new_tokens"), _sum(runs, "steps")
    drafted, accepted = _sum(runs, "drafted"), _sum(runs, "accepted")
    k = runs[0]["k"] if runs else 0
    app = [sum(r["accepted_per_position"][i] for r in runs) for i in range(k)] if runs and runs[0]["accepted_per_position"] else []
    fwd: dict[str, float] = {}
    for r in runs:
        for s, n in r["decode_forwarded"].items():
            fwd[s] = fwd.get(s, 0) + n
    tps = [r["tokens_per_s"] for r in reps]
    out: dict[str, Any] = {
        "method": runs[0]["method"] if runs else None,
        "k": k,
        "tokens_per_s": median(tps),
        "tokens_per_s_min": min(tps) if tps else float("nan"),
        "tokens_per_s_max": max(tps) if tps else float("nan"),
        "ratio_to_floor": median(ratios) if ratios else None,
        "ratio_to_floor_reps": ratios,
        "step_s": median([r["step_s"] for r in reps]),
        "token_s": median([r["token_s"] for r in reps]),
        "new_tokens": new,
        "steps": steps,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": new / steps if steps else None,
        "accepted_per_position": app,
        "accepted_per_position_rate": [a / steps for a in app] if steps else [],
        "full_accept_fraction": (app[-1] / steps) if app and steps else None,
        "forwarded_per_token": {s: n / new for s, n in fwd.items()} if new else {},
        "vision_calls": int(_sum(runs, "vision_calls")),
        "vision_cache_hits": int(_sum(runs, "vision_cache_hits")),
        "requests": len(runs),
        "context": runs[0]["context"] if runs else {},
    }
    split_reps = [r for r in reps if r.get("split_step_s")]
    if split_reps:
        out["split_step_s"] = {k2: median([r["split_step_s"][k2] for r in split_reps]) for k2 in SPLIT_KEYS}
        out["split_frac"] = {k2: median([r["split_frac"][k2] for r in split_reps]) for k2 in SPLIT_KEYS}
        out["loop_step_s"] = median([r["loop_step_s"] for r in split_reps])
        out["host_overhead_frac"] = median([r["split_frac"]["gate"] + r["split_frac"]["trace"] + r["split_frac"]["other"] for r in split_reps])
        out["gate_frac"] = out["split_frac"]["gate"]
    return out


def call_costs(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Median seconds of one decode-phase extend per stream and tokens per call, pooled over runs."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for s, d in r.get("extend_costs", {}).items():
            for n, ts in d.items():
                pooled.setdefault(s, {}).setdefault(n, []).extend(ts)
    return {s: {n: {"median_s": median(ts), "calls": len(ts)} for n, ts in sorted(d.items(), key=lambda x: int(x[0]))}
            for s, d in pooled.items()}


def project(costs: dict, k: int, *, floor_token_s: float, asym_host_step_s: float, sd_host_step_s: float | None,
            scenarios: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """PROJECTED tokens/s from measured per-call costs for given (acceptance rate, mean accepted length).

    AsymSpec step = (K - f) * c(drafter_full, 1 token) + f * c(drafter_full, 2 tokens) + c(drafter_comp, K+1)
    + c(verifier, K+1) + host, where f = AR^K is the fraction of steps that follow a step accepting all K
    drafts (i.i.d. positions), whose first drafting forward also carries that step's d_K (without a measured
    2-token cost, 2 x the 1-token cost: a separate forward); tokens/s = MAL / step. SD likewise with the
    compressed stream drafting.
    Floor is measured (its cost does not depend on acceptance).
    """
    def cost(stream: str, n: int) -> float | None:
        c = costs.get(stream, {}).get(str(n))
        return c["median_s"] if c else None

    full1, comp_k1, ver_k1, comp1 = cost("drafter_full", 1), cost("drafter_comp", k + 1), cost("verifier", k + 1), cost("drafter_comp", 1)
    full2, comp2 = cost("drafter_full", 2), cost("drafter_comp", 2)

    def drafting(one: float, two: float | None, f: float) -> float:
        return (k - f) * one + f * (two if two is not None else 2 * one)

    rows = []
    for ar, mal in scenarios:
        f = ar ** k
        row: dict[str, Any] = {"acceptance_rate": ar, "mean_accepted_length": mal, "full_accept_fraction": f,
                               "floor_tokens_per_s": 1.0 / floor_token_s if floor_token_s else None}
        if None not in (full1, comp_k1, ver_k1):
            step = drafting(full1, full2, f) + comp_k1 + ver_k1 + asym_host_step_s
            row.update(asymspec_step_s=step, asymspec_tokens_per_s=mal / step,
                       asymspec_ratio_to_floor=(mal / step) * floor_token_s if floor_token_s else None)
        if None not in (comp1, ver_k1) and sd_host_step_s is not None:
            step = drafting(comp1, comp2, f) + ver_k1 + sd_host_step_s
            row.update(sd_step_s=step, sd_tokens_per_s=mal / step, sd_ratio_to_floor=(mal / step) * floor_token_s if floor_token_s else None)
        rows.append(row)
    return rows


def _host_step(summary: dict | None) -> float | None:
    if not summary or "split_step_s" not in summary:
        return None
    s = summary["split_step_s"]
    return s["gate"] + s["trace"] + s["other"]


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


def _rotate(items: Sequence, r: int) -> list:
    items = list(items)
    if not items:
        return items
    r %= len(items)
    return items[r:] + items[:r]


def run_bench(
    pair: str = "tiny",
    *,
    pipeline: Any = None,
    drafter: str | None = None,
    verifier: str | None = None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    reps: int = 3,
    warmup: int = 1,
    cases: int = 2,
    case_families: Sequence[str] | None = None,
    max_new_tokens: int = 32,
    k: int = 4,
    trace_top: int | None = None,
    prompt_lengths: Sequence[int] = (256, 1024, 4096),
    length_variants: Sequence[str] = ("floor", "asymspec"),
    k_values: Sequence[int] = (1, 2, 4, 8),
    k_variants: Sequence[str] = ("asymspec",),
    scenarios: Sequence[tuple[float, float]] = PAPER_SCENARIOS,
    prefill: str = "auto",
    image_tokens: int | None = None,
    ignore_eos: bool | None = None,
    device: str | None = None,
    dtype: str | None = None,
    plain_runs: bool | None = None,
    probe_batching: bool = True,
    probe_reps: int = 3,
    workdir: str | Path | None = None,
    threads: int | None = None,
    engine: str = "dynamic",
    alt_decode: str | Path | None = None,
    loop_vocabs: Sequence[int] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """Run the benchmark and return its results (JSON-ready). See the module docstring.

    ``pipeline``: reuse a loaded :class:`AsymSpecPipeline` (``pair`` is then only its label).
    ``prefill``: ``pipeline`` | ``synthetic`` | ``auto`` (synthetic for real-shape pairs on CPU).
    ``plain_runs``: time throughput in separate un-instrumented runs (default: on CUDA only).
    Empty ``prompt_lengths`` / ``k_values`` skip those sweeps. ``threads``: torch CPU threads for the run
    (restored after); on a loaded machine 1 thread is often faster for tiny models (no OpenMP barrier waits).
    ``engine``: ``dynamic`` (the engines the pipeline uses), ``static`` / ``static-compile`` (the opt-in
    static-KV-cache engines of perf.patch, the latter with a compiled one-token decode; untested on GPU).
    """
    import torch

    prev_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_bench(pair, pipeline=pipeline, drafter=drafter, verifier=verifier, variants=variants, reps=reps, warmup=warmup,
                          cases=cases, case_families=case_families, max_new_tokens=max_new_tokens, k=k, trace_top=trace_top, prompt_lengths=prompt_lengths,
                          length_variants=length_variants, k_values=k_values, k_variants=k_variants, scenarios=scenarios,
                          prefill=prefill, image_tokens=image_tokens, ignore_eos=ignore_eos, device=device, dtype=dtype,
                          plain_runs=plain_runs, probe_batching=probe_batching, probe_reps=probe_reps, workdir=workdir,
                          engine=engine, alt_decode=alt_decode, loop_vocabs=loop_vocabs, progress=progress)
    finally:
        torch.set_num_threads(prev_threads)


def _run_bench(pair, *, pipeline, drafter, verifier, variants, reps, warmup, cases, case_families, max_new_tokens, k, trace_top, prompt_lengths,
               length_variants, k_values, k_variants, scenarios, prefill, image_tokens, ignore_eos, device, dtype, plain_runs,
               probe_batching, probe_reps, workdir, engine, alt_decode, loop_vocabs, progress) -> dict[str, Any]:
    from . import decode
    from .decode import AsymSpecConfig

    say = log if progress else (lambda _msg: None)
    t_start = time.perf_counter()
    if pipeline is not None:
        bp = BenchPair(pipeline, pair, getattr(pipeline, "name", pair), trained=pair not in ("random-tiny",) and "random" not in pair)
    else:
        bp = load_pair(pair, drafter=drafter, verifier=verifier, device=device, dtype=dtype, workdir=workdir)
    dev = bp.device
    real = pair.startswith("real-shapes")
    if prefill == "auto":
        prefill = "synthetic" if real and dev.type == "cpu" else "pipeline"
    synthetic = prefill == "synthetic"
    ignore_eos = (not bp.trained) if ignore_eos is None else ignore_eos
    plain_runs = (dev.type == "cuda") if plain_runs is None else plain_runs
    image_tokens = image_tokens if image_tokens is not None else ((REAL_IMAGE_SIDE // 32) ** 2 if real else 16)
    base_cfg = AsymSpecConfig(k=k, max_new_tokens=max_new_tokens)
    if trace_top is not None:
        base_cfg = base_cfg.with_(trace_top=trace_top)
    vs = [Variant.parse(v) for v in variants]
    if not any(v.name == "floor" for v in vs):
        vs.insert(0, Variant.parse("floor"))  # every ratio is paired against Floor
    factories = engine_factories(engine, headroom=max_new_tokens + 2 * max(k, *(k_values or [k])) + 8, device=dev)
    vs_check = [Variant.parse(v) for v in variants]
    alt_mod = None
    if any(v.loop == "alt" for v in vs_check):
        from .errors import UnknownOptionError

        if alt_decode is None:
            raise UnknownOptionError("variants with loop=alt need alt_decode (--alt-decode PATH)")
        alt_mod = load_alt_decode(alt_decode)
    runner = _Runner(bp, ignore_eos=ignore_eos, image_tokens=image_tokens, sync=dev.type == "cuda", factories=factories,
                     alt_decode=alt_mod)
    inputs = bench_cases(cases, bp.image_side, case_families)
    base_len = prompt_lengths[0] if prompt_lengths else 256
    notes = list(bp.notes)
    if not bp.trained:
        notes.append("RANDOM weights: acceptance rate, mean accepted length and the measured AsymSpec/SD tokens/s mean nothing; "
                     "read the per-step costs and the PROJECTION (labelled) instead. Floor and drafter-alone tokens/s do not "
                     "depend on acceptance and are measured.")
    if synthetic:
        notes.append(f"SYNTHETIC prefill: caches filled with random keys/values ({base_len} tokens of compressed view, "
                     f"+{image_tokens} image positions on the drafter's full stream); no prompt is forwarded, the vision "
                     "tower is not run (vision calls 0). Decode costs at that context length are real.")
    if ignore_eos:
        notes.append("EOS ignored: every request decodes exactly max_new_tokens tokens.")
    if engine != "dynamic":
        notes.append(f"engines: {engine} (opt-in static KV caches{' + compiled one-token decode' if 'compile' in engine else ''}; "
                     "UNTESTED ON GPU unless this run is on one).")
    if plain_runs:
        notes.append("tokens/s from un-instrumented runs; the split from separate instrumented runs (synchronizing clocks).")
    else:
        notes.append("tokens/s and split from the same runs (CPU: the timing proxies add two clock reads per call).")

    def one(v: Variant, cfg, *, case=None, caption=None, length=None, instrument=True) -> dict:
        if synthetic:
            return runner.run(v, cfg, length=length or base_len, instrument=instrument, synthetic=True)
        return runner.run(v, cfg, case=case, caption=caption, instrument=instrument)

    def cell(v: Variant, cfg, *, length: int | None = None, padded: bool = False) -> list[dict]:
        """All cases of one variant in one repetition (plain + instrumented runs when asked)."""
        out = []
        for case in (inputs if not synthetic else inputs[:1]):
            caption = pad_caption(bp.pipe, case, length) if (padded and length and not synthetic) else None
            if plain_runs:
                plain = one(v, cfg, case=case, caption=caption, length=length, instrument=False)
                inst = one(v, cfg, case=case, caption=caption, length=length, instrument=True)
                inst["instrumented_decode_s"] = inst["decode_s"]  # its checks were made against this one
                inst.update({key: plain[key] for key in ("decode_s", "tokens_per_s")})
                inst["plain_new_tokens"] = plain["new_tokens"]
                out.append(inst)
            else:
                out.append(one(v, cfg, case=case, caption=caption, length=length, instrument=True))
        return out

    result: dict[str, Any] = {"meta": _meta(bp, dev, prefill, reps, warmup, cases if not synthetic else 1, max_new_tokens, k, base_cfg,
                                            ignore_eos, plain_runs, image_tokens, None if synthetic else case_families), "notes": notes}
    result["meta"]["engine"] = engine
    if alt_mod is not None:
        notes.append(f"variants marked loop=alt run the decoding loop of {alt_decode}, side by side with the current one.")
        result["meta"]["alt_decode"] = str(alt_decode)
    with timed_functions(decode, TIMED_LOOP_FUNCTIONS, lambda: runner.current, runner.clock), \
            (timed_functions(alt_mod, TIMED_LOOP_FUNCTIONS, lambda: runner.current, runner.clock) if alt_mod else contextlib.nullcontext()):
        # ---- main comparison -------------------------------------------------------------------
        for w in range(warmup):
            say(f"warm-up {w + 1}/{warmup}")
            for v in vs:
                cfg = v.config(base_cfg.with_(max_new_tokens=min(2, max_new_tokens)))
                one(v, cfg, case=inputs[0], length=base_len, instrument=True)
        per_rep: dict[str, list[dict]] = {v.name: [] for v in vs}
        runs_by: dict[str, list[dict]] = {v.name: [] for v in vs}
        for r in range(reps):
            for v in _rotate(vs, r):
                t0 = time.perf_counter()
                runs = cell(v, v.config(base_cfg), length=base_len)
                for run in runs:
                    run["rep"] = r
                runs_by[v.name].extend(runs)
                per_rep[v.name].append(rep_summary(runs))
                say(f"rep {r + 1}/{reps} {v.name}: {per_rep[v.name][-1]['tokens_per_s']:.2f} tok/s ({time.perf_counter() - t0:.1f}s)")
        ratios = paired_ratios(per_rep)
        summary = {name: variant_summary(runs_by[name], per_rep[name], ratios.get(name)) for name in per_rep}
        all_runs = [run for runs in runs_by.values() for run in runs]
        costs = call_costs([run for run in all_runs if run["method"] in ("asymspec", "sd")])
        result["main"] = {"variants": summary, "per_rep": per_rep, "runs": all_runs, "context": base_len if synthetic else "natural"}
        result["call_costs"] = costs
        result["checks"] = _collect_checks(all_runs)

        # ---- projection (random weights) / model check (trained) --------------------------------
        floor_token_s = summary["floor"]["token_s"]
        asym = summary.get("asymspec")
        sd = summary.get("sd")
        proj: dict[str, Any] = {"label": "PROJECTION from measured per-call costs, not a measured throughput", "k": k}
        if asym and _host_step(asym) is not None:
            proj["scenarios"] = project(costs, k, floor_token_s=floor_token_s, asym_host_step_s=_host_step(asym),
                                        sd_host_step_s=_host_step(sd), scenarios=scenarios)
            if bp.trained and asym["acceptance_rate"] is not None:
                f_meas = asym["full_accept_fraction"] or 0.0
                ar_equiv = f_meas ** (1.0 / k) if f_meas > 0 else 0.0
                check = project(costs, k, floor_token_s=floor_token_s, asym_host_step_s=_host_step(asym), sd_host_step_s=None,
                                scenarios=[(ar_equiv, asym["mean_accepted_length"])])[0]
                proj["model_check"] = {"measured_tokens_per_s": asym["tokens_per_s"],
                                       "projected_tokens_per_s": check.get("asymspec_tokens_per_s"),
                                       "measured_acceptance": {"mal": asym["mean_accepted_length"], "full_accept_fraction": f_meas}}
        result["projection"] = proj

        # ---- scaling with the prompt length -------------------------------------------------------
        result["scaling_length"] = _length_sweep(bp, cell, base_cfg, prompt_lengths, length_variants, reps, synthetic, image_tokens, say)
        # ---- scaling with K ------------------------------------------------------------------------
        result["scaling_k"] = _k_sweep(cell, base_cfg, k_values, k_variants, reps, base_len, say)
        # ---- probes -----------------------------------------------------------------------------------
        if probe_batching:
            say("probe: batching the drafter's two streams")
            result["probes"] = {"batching": probe_drafter_batching(bp, k, base_len + image_tokens, probe_reps, runner.clock)}
            say("probe: loop host cost with the models removed")
            import torch

            vocab = bp.pipe.verifier.get_output_embeddings().weight.shape[0]
            mods = {"current": decode, **({"alt": alt_mod} if alt_mod is not None else {})}
            result["probes"]["loop"] = [probe_loop(vocab, k, 20, max(3, probe_reps), bp.dtype, dev, mods, runner.clock, trace_top)]
            for extra_vocab in loop_vocabs:
                result["probes"]["loop"].append(probe_loop(extra_vocab, k, 10, max(3, probe_reps), torch.bfloat16, dev, mods,
                                                           runner.clock, trace_top))
    result["targets"] = evaluate_targets(result, bp)
    result["meta"]["bench_wall_s"] = time.perf_counter() - t_start
    return result


def _length_sweep(bp, cell, base_cfg, lengths, names, reps, synthetic, image_tokens, say) -> dict[str, Any]:
    if not lengths or not names:
        return {}
    vs = [Variant.parse(n) for n in names]
    if not any(v.name == "floor" for v in vs):
        vs.insert(0, Variant.parse("floor"))
    limit = _context_limit(bp.pipe)
    usable = [L for L in lengths if _fits(bp, L, base_cfg, synthetic, image_tokens)]
    skipped = [L for L in lengths if L not in usable]
    rows: dict[int, dict[str, list[dict]]] = {L: {v.name: [] for v in vs} for L in usable}
    runs_at: dict[int, dict[str, list[dict]]] = {L: {v.name: [] for v in vs} for L in usable}
    for r in range(reps):
        for L in _rotate(usable, r):
            for v in _rotate(vs, r):
                runs = cell(v, v.config(base_cfg), length=L, padded=True)
                runs_at[L][v.name].extend(runs)
                rows[L][v.name].append(rep_summary(runs))
            say(f"length sweep rep {r + 1}/{reps} L={L}: " + ", ".join(f"{n} {rows[L][n][-1]['token_s'] * 1e3:.1f} ms/tok" for n in rows[L]))
    out: dict[str, Any] = {"lengths": usable, "skipped": skipped, "context_limit": limit, "by_length": {}}
    for L in usable:
        ratios = paired_ratios(rows[L])
        out["by_length"][str(L)] = {n: variant_summary(runs_at[L][n], rows[L][n], ratios.get(n)) for n in rows[L]}
    if len(usable) >= 2:
        lo, hi = str(usable[0]), str(usable[-1])
        growth = {}
        for n in rows[usable[0]]:
            a, b = out["by_length"][lo][n], out["by_length"][hi][n]
            growth[n] = {"token_s": b["token_s"] / a["token_s"] if a["token_s"] else None,
                         "step_s": b["step_s"] / a["step_s"] if a["step_s"] else None}
        out["growth"] = growth
        if "floor" in growth and "asymspec" in growth and growth["floor"]["token_s"]:
            out["growth_ratio_asymspec_vs_floor"] = growth["asymspec"]["token_s"] / growth["floor"]["token_s"]
            out["growth_ratio_asymspec_step_vs_floor"] = growth["asymspec"]["step_s"] / growth["floor"]["token_s"]
    return out


def _k_sweep(cell, base_cfg, k_values, names, reps, base_len, say) -> dict[str, Any]:
    if not k_values or not names:
        return {}
    floor = Variant.parse("floor")
    vs = [Variant.parse(n) for n in names]
    per: dict[str, list[dict]] = {"floor": []}
    runs_by: dict[str, list[dict]] = {"floor": []}
    labels = []
    for kk in k_values:
        for v in vs:
            labels.append((f"{v.name}@k={kk}", v, kk))
            per[labels[-1][0]] = []
            runs_by[labels[-1][0]] = []
    for r in range(reps):
        runs = cell(floor, floor.config(base_cfg), length=base_len)
        runs_by["floor"].extend(runs)
        per["floor"].append(rep_summary(runs))
        for label, v, kk in _rotate(labels, r):
            runs = cell(v, v.config(base_cfg.with_(k=kk)), length=base_len)
            runs_by[label].extend(runs)
            per[label].append(rep_summary(runs))
        say(f"K sweep rep {r + 1}/{reps} done")
    ratios = paired_ratios(per)
    out = {"k_values": list(k_values), "by_k": {}}
    for label in per:
        s = variant_summary(runs_by[label], per[label], ratios.get(label))
        out["by_k"][label] = s
    return out


def _fits(bp: BenchPair, length: int, cfg, synthetic: bool, image_tokens: int) -> bool:
    """Whether a view of ``length`` tokens plus the request fits every stream's context window."""
    from .errors import ContextOverflowError
    from .prompts import build_prompts

    need = cfg.max_new_tokens + cfg.k + 1
    if synthetic:
        return length + image_tokens + need <= _context_limit(bp.pipe)
    case = bench_cases(1, bp.image_side)[0]
    caption = pad_caption(bp.pipe, case, length)
    from captioning.view import CompressedView

    view = CompressedView(caption=caption, ocr_text=case["ocr"]).render()
    prompts = build_prompts(bp.pipe.processor, bp.pipe.verifier_tokenizer, case["image"], view, case["question"], cfg.drafter_view)
    try:
        bp.pipe._check_context(prompts, cfg, "asymspec")
    except ContextOverflowError:
        return False
    return True


def _context_limit(pipe) -> int:
    lim = [getattr(pipe.verifier.config, "max_position_embeddings", None),
           getattr(pipe.drafter.config.get_text_config(), "max_position_embeddings", None)]
    lim = [x for x in lim if x]
    return min(lim) if lim else 1 << 30


def probe_drafter_batching(bp: BenchPair, k: int, length: int, reps: int, clock: Clock) -> dict[str, Any]:
    """Does one forward of the drafter's two streams' tokens pay? Times ``extend(1) + extend(K+1)`` (full stream's
    one-token draft, compressed stream's K+1 tokens: two forwards) against ``extend(K+2)`` (one forward with
    both token counts) on a synthetic cache, interleaved. An upper bound on the saving of batching: a real
    batch of the two streams also pays padding and a second cache's attention."""
    import torch

    from .engines import VLEngine

    with torch.no_grad():
        return _probe(bp, k, length, reps, clock, VLEngine)


def _probe(bp, k, length, reps, clock, VLEngine) -> dict[str, Any]:
    import torch

    e = VLEngine(bp.pipe.drafter, name="probe")
    synthetic_prefill(e, length, seed=7)
    tok = torch.tensor([SYNTHETIC_PENDING_TOKEN] * (k + 2), device=e.device)
    base = e.length
    e.extend(tok[:1])  # warm
    e.truncate(base)
    sep, bat = [], []
    for r in range(reps):
        for mode in (("sep", "bat") if r % 2 == 0 else ("bat", "sep")):
            t0 = clock.now()
            if mode == "sep":
                e.extend(tok[:1])
                e.extend(tok[: k + 1])
            else:
                e.extend(tok[: k + 2])
            dt = clock.now() - t0
            e.truncate(base)
            (sep if mode == "sep" else bat).append(dt)
    s, b = median(sep), median(bat)
    return {"context": length, "k": k, "separate_s": s, "batched_s": b, "saving_frac": (s - b) / s if s else None,
            "separate_reps": sep, "batched_reps": bat,
            "label": "one (K+2)-token forward vs a 1-token + a (K+1)-token forward of the drafter (upper bound of a two-stream batch)"}


class _FakeEngine:
    """A zero-cost stream for the loop probe: ``extend`` returns precomputed logits rows (no model)."""

    def __init__(self, name: str, pool, length: int = 64):
        self.name, self.pool, self._len = name, pool, length
        self.tokens_forwarded = self.forward_calls = 0
        self.device = pool.device
        self._at = 0

    @property
    def length(self) -> int:
        return self._len

    def prefill(self, ids, *args, **kwargs) -> None:
        self._len = int(ids.numel())

    def extend(self, ids):
        n = int(ids.shape[-1])
        self._at = (self._at + n) % (self.pool.shape[0] - 16)
        self._len += n
        self.tokens_forwarded += n
        self.forward_calls += 1
        return self.pool[self._at:self._at + n]

    def truncate(self, length: int) -> None:
        self._len = min(self._len, length)


def probe_loop(vocab: int, k: int, steps: int, reps: int, dtype, device, modules: dict[str, Any], clock: Clock,
               trace_top: int | None = None) -> dict[str, Any]:
    """Host cost of one AsymSpec step with the models taken out: the three streams are zero-cost fakes returning
    precomputed ``[n, vocab]`` logits, so what remains is the loop itself (gate, trace, packing, transfers,
    events, truncation). ``modules``: name -> decode module (e.g. the current loop and perf.patch's), run
    interleaved; medians of per-step time."""
    import torch

    from .decode import AsymSpecConfig, Counters

    gen = torch.Generator(device="cpu").manual_seed(3)
    base = torch.randn(256, vocab, generator=gen) * 3.0
    pools = {s: (base + 0.8 * torch.randn(256, vocab, generator=gen)).to(device=device, dtype=dtype) for s in STREAMS}
    cfg = AsymSpecConfig(k=k, max_new_tokens=10**6)
    if trace_top is not None:
        cfg = cfg.with_(trace_top=trace_top)
    per: dict[str, list[float]] = {name: [] for name in modules}
    accepted: dict[str, int] = {}
    for r in range(reps):
        for name in _rotate(list(modules), r):
            mod = modules[name]
            streams = {s: _FakeEngine(s, pools[s]) for s in STREAMS}
            counters = Counters(k, streams)
            pend = torch.tensor([5], device=device)
            it = mod.asymspec_steps(streams["drafter_full"], streams["drafter_comp"], streams["verifier"], (pend, pend, pend), cfg,
                                    set(), None, counters)
            next(it)  # first step allocates buffers
            t0 = clock.now()
            for _ in range(steps):
                next(it)
            per[name].append((clock.now() - t0) / steps)
            accepted[name] = counters.accepted
    out = {"vocab": vocab, "k": k, "steps": steps, "dtype": str(dtype).replace("torch.", ""), "trace_top": cfg.trace_top,
           "step_s": {n: median(v) for n, v in per.items()}, "reps_s": per,
           "label": "AsymSpec loop with zero-cost fake engines (models removed): host cost per step"}
    names = list(modules)
    if len(names) == 2 and out["step_s"][names[0]]:
        out["ratio"] = median([b / a for a, b in zip(per[names[0]], per[names[1]])])
    return out


def _collect_checks(runs: list[dict]) -> dict[str, Any]:
    errs = [r["checks"].get("split_sum_rel_err", 0.0) for r in runs]
    return {"runs": len(runs),
            "forwarded_ok": all(r["checks"]["forwarded_ok"] for r in runs),
            "tokens_ok": all(r["checks"]["tokens_ok"] for r in runs),
            "per_position_monotone": all(r["checks"]["per_position_monotone"] for r in runs),
            "split_nonnegative": all(r["checks"].get("split_nonnegative", True) for r in runs),
            "split_sum_max_rel_err": max(errs) if errs else 0.0}


def _meta(bp, dev, prefill, reps, warmup, cases, max_new, k, cfg, ignore_eos, plain_runs, image_tokens,
          case_families: Sequence[str] | None = None) -> dict[str, Any]:
    import torch

    import transformers

    from .eval.minivista import FAMILIES

    return {
        "pair": bp.name,
        "pair_description": bp.description,
        "trained": bp.trained,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(bp.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prefill": prefill,
        "reps": reps,
        "warmup": warmup,
        "cases": cases,
        "case_families": list(case_families or FAMILIES),
        "max_new_tokens": max_new,
        "k": k,
        "config": cfg.as_dict(),
        "ignore_eos": ignore_eos,
        "plain_runs": plain_runs,
        "image_tokens_synthetic": image_tokens if prefill == "synthetic" else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "timed_functions": TIMED_LOOP_FUNCTIONS,
    }


TARGETS = {
    "loop_overhead": ("loop overhead (all but model forwards) <= 5% of AsymSpec step time", 0.05),
    "gate_fusion": ("gate + fusion <= 1% of AsymSpec step time", 0.01),
    "tiny_speedup": ("tiny pair: AsymSpec tokens/s >= 1.3x Floor (paired)", 1.3),
    "length_growth": ("per-token time growth with prompt length: AsymSpec / Floor <= 1.2", 1.2),
}


def evaluate_targets(result: dict[str, Any], bp: BenchPair) -> list[dict[str, Any]]:
    rows = []
    asym = result.get("main", {}).get("variants", {}).get("asymspec")
    if asym and "host_overhead_frac" in asym:
        rows.append({"target": "loop_overhead", "text": TARGETS["loop_overhead"][0], "measured": asym["host_overhead_frac"],
                     "met": asym["host_overhead_frac"] <= TARGETS["loop_overhead"][1]})
        rows.append({"target": "gate_fusion", "text": TARGETS["gate_fusion"][0], "measured": asym["gate_frac"],
                     "met": asym["gate_frac"] <= TARGETS["gate_fusion"][1]})
    if asym and bp.name.startswith("tiny") and asym.get("ratio_to_floor") is not None:
        rows.append({"target": "tiny_speedup", "text": TARGETS["tiny_speedup"][0], "measured": asym["ratio_to_floor"],
                     "met": asym["ratio_to_floor"] >= TARGETS["tiny_speedup"][1],
                     "note": None if bp.trained else "random tiny fallback: acceptance is not the trained pair's"})
    sl = result.get("scaling_length", {})
    key = "growth_ratio_asymspec_vs_floor" if bp.trained else "growth_ratio_asymspec_step_vs_floor"
    g = sl.get(key)
    if g is not None:
        rows.append({"target": "length_growth", "text": TARGETS["length_growth"][0], "measured": g, "met": g <= TARGETS["length_growth"][1],
                     "note": None if bp.trained else "random weights: AsymSpec per-step time (per-token time at fixed acceptance) vs Floor per-token"})
    return rows


# ------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return fmt.format(x * scale)


def render_markdown(res: dict[str, Any], title: str | None = None) -> str:
    """The benchmark's tables as Markdown (no absolute time is presented without its ratio context)."""
    m = res["meta"]
    trained = m["trained"]
    lines = [f"## {title or 'Benchmark: ' + m['pair']}", ""]
    lines += [f"- pair: **{m['pair']}**: {m['pair_description']}",
              f"- device: {m['device']} ({m['device_name']}), dtype {m['dtype']}, {m['threads']} torch threads, "
              f"torch {m['torch']}, transformers {m['transformers']}",
              f"- settings: K={m['k']}, max_new_tokens={m['max_new_tokens']}, {m['reps']} interleaved repetitions "
              f"(+{m['warmup']} warm-up), {m['cases']} request(s) per cell ({'/'.join(m.get('case_families', []))}), prefill={m['prefill']}, trace_top={m['config']['trace_top']}",
              f"- {m['date']}, bench wall {m.get('bench_wall_s', 0):.0f}s",
              "- every number is a median over repetitions; a ratio is the median of per-repetition ratios of runs made side "
              "by side (variant vs Floor in the same repetition)."]
    for n in res.get("notes", []):
        lines.append(f"- **note:** {n}")
    lines.append("")
    main = res.get("main", {}).get("variants", {})
    if main:
        lines += ["### Throughput and acceptance", ""]
        lines.append("| variant | tokens/s (median) | ratio to Floor | MAL (tok/step) | accept rate | accepted per position | "
                     "fwd tokens / emitted token (full, comp, ver) | vision tower calls |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for name, s in main.items():
            meaningless = (not trained) and s["method"] in ("asymspec", "sd")
            tps = _f(s["tokens_per_s"]) + (" (random weights: not a result)" if meaningless else "")
            ratio = _f(s["ratio_to_floor"], "{:.2f}x") + (" *" if meaningless else "")
            fwd = s["forwarded_per_token"]
            fwd_s = ", ".join(_f(fwd.get(st), "{:.2f}") for st in STREAMS)
            app = "/".join(_f(x, "{:.2f}") for x in s["accepted_per_position_rate"]) or "–"
            lines.append(f"| {name} | {tps} | {ratio} | {_f(s['mean_accepted_length'])} | {_f(s['acceptance_rate'])} | {app} | {fwd_s} | "
                         f"{s['vision_calls']} tower / {s['vision_cache_hits']} cached / {s['requests']} req |")
        if not trained:
            lines.append("\n\\* random weights: acceptance (hence AsymSpec/SD tokens/s) is not meaningful; see the projection.")
        lines.append("")
        lines += ["### Per-step time split (instrumented runs)", ""]
        lines.append("| variant | step (ms, median) | " + " | ".join(SPLIT_LABELS[k2] for k2 in SPLIT_KEYS) + " | host overhead (gate+trace+rest) |")
        lines.append("|---|---|" + "---|" * (len(SPLIT_KEYS) + 1))
        for name, s in main.items():
            if "split_frac" not in s:
                continue
            cells = [f"{_f(s['split_step_s'][k2], '{:.1f}', 1e3)} ({_f(s['split_frac'][k2], '{:.1f}%', 100)})" for k2 in SPLIT_KEYS]
            lines.append(f"| {name} | {_f(s['loop_step_s'], '{:.1f}', 1e3)} | " + " | ".join(cells) + f" | {_f(s['host_overhead_frac'], '{:.1f}%', 100)} |")
        lines.append("")
    costs = res.get("call_costs", {})
    if costs:
        lines += ["### Per-call forward costs (decode phase, AsymSpec and SD runs)", "", "| stream | tokens per call | median ms | calls |", "|---|---|---|---|"]
        for st, d in costs.items():
            for n, c in d.items():
                lines.append(f"| {st} | {n} | {_f(c['median_s'], '{:.1f}', 1e3)} | {c['calls']} |")
        lines.append("")
    proj = res.get("projection", {})
    if proj.get("scenarios"):
        lines += [f"### {proj['label']}", "",
                  "AsymSpec step = (K - AR^K) x c(full, 1 tok) + AR^K x c(full, 2 tok) (d_K carried) + c(comp, K+1) + c(verifier, K+1) "
                  "+ measured host overhead per step; "
                  "tokens/s = MAL / step. Floor measured.", "",
                  "| AR | MAL | P(all K accepted) | Floor tok/s (measured) | AsymSpec tok/s (projected) | ratio | SD tok/s (projected) | ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in proj["scenarios"]:
            lines.append(f"| {r['acceptance_rate']:.2f} | {r['mean_accepted_length']:.1f} | {r['full_accept_fraction']:.2f} | "
                         f"{_f(r['floor_tokens_per_s'])} | {_f(r.get('asymspec_tokens_per_s'))} | {_f(r.get('asymspec_ratio_to_floor'), '{:.2f}x')} | "
                         f"{_f(r.get('sd_tokens_per_s'))} | {_f(r.get('sd_ratio_to_floor'), '{:.2f}x')} |")
        if proj.get("model_check"):
            mc = proj["model_check"]
            lines.append(f"\nModel check on this trained pair: measured AsymSpec {_f(mc['measured_tokens_per_s'])} tok/s, projected from "
                         f"its own acceptance {_f(mc['projected_tokens_per_s'])} tok/s.")
        lines.append("")
    sl = res.get("scaling_length", {})
    if sl.get("by_length"):
        lines += ["### Scaling with the compressed-view length", "",
                  "| view tokens (target) | contexts (full/comp/ver) | " + " | ".join(f"{n} ms/token" for n in next(iter(sl["by_length"].values()))) +
                  " | asymspec ms/step | asymspec ratio to Floor |", "|---|---|" + "---|" * (len(next(iter(sl["by_length"].values()))) + 2)]
        for L, row in sl["by_length"].items():
            ctx = row.get("asymspec", row.get("floor", {})).get("context", {})
            ctx_s = "/".join(str(ctx.get(s, "–")) for s in STREAMS)
            cells = " | ".join(_f(s["token_s"], "{:.1f}", 1e3) for s in row.values())
            a = row.get("asymspec", {})
            lines.append(f"| {L} | {ctx_s} | {cells} | {_f(a.get('step_s'), '{:.1f}', 1e3)} | {_f(a.get('ratio_to_floor'), '{:.2f}x')} |")
        if sl.get("growth"):
            g = sl["growth"]
            lines.append("\nGrowth from the shortest to the longest view (per-token time): " +
                         ", ".join(f"{n} {_f(v['token_s'], '{:.2f}x')}" for n, v in g.items()) +
                         f"; AsymSpec growth / Floor growth = **{_f(sl.get('growth_ratio_asymspec_vs_floor'), '{:.2f}')}**"
                         f" (per-step: {_f(sl.get('growth_ratio_asymspec_step_vs_floor'), '{:.2f}')}).")
        if sl.get("skipped"):
            lines.append(f"\nSkipped lengths {sl['skipped']}: beyond the models' context window ({sl['context_limit']}).")
        lines.append("")
    sk = res.get("scaling_k", {})
    if sk.get("by_k"):
        lines += ["### Scaling with K", "", "| variant | tokens/s | ratio to Floor | MAL | accept rate | step ms |", "|---|---|---|---|---|---|"]
        for label, s in sk["by_k"].items():
            lines.append(f"| {label} | {_f(s['tokens_per_s'])} | {_f(s['ratio_to_floor'], '{:.2f}x')} | {_f(s['mean_accepted_length'])} | "
                         f"{_f(s['acceptance_rate'])} | {_f(s['step_s'], '{:.1f}', 1e3)} |")
        lines.append("")
    pb = res.get("probes", {}).get("batching")
    if pb:
        lines += ["### Probe: batching the drafter's two streams in one forward", "",
                  f"{pb['label']}, context {pb['context']}: separate {_f(pb['separate_s'], '{:.1f}', 1e3)} ms, one forward "
                  f"{_f(pb['batched_s'], '{:.1f}', 1e3)} ms, saving **{_f(pb['saving_frac'], '{:.0f}%', 100)}** of those two forwards.", ""]
    probes_loop = res.get("probes", {}).get("loop") or []
    if probes_loop:
        names = list(probes_loop[0]["step_s"])
        lines += ["### Probe: the loop alone (models replaced by zero-cost fakes)", "",
                  f"{probes_loop[0]['label']}; K={probes_loop[0]['k']}, trace_top={probes_loop[0]['trace_top']}; medians over interleaved reps.", "",
                  "| vocab | dtype | " + " | ".join(f"{n} ms/step" for n in names) + (" | alt / current (paired) |" if len(names) == 2 else " |"),
                  "|---|---|" + "---|" * (len(names) + (1 if len(names) == 2 else 0))]
        for pl in probes_loop:
            cells = " | ".join(_f(pl["step_s"][n], "{:.2f}", 1e3) for n in names)
            ratio = f" | {_f(pl.get('ratio'), '{:.2f}')} |" if len(names) == 2 else " |"
            lines.append(f"| {pl['vocab']} | {pl['dtype']} | {cells}{ratio}")
        lines.append("")
    tg = res.get("targets", [])
    if tg:
        lines += ["### Targets", "", "| target | measured | met |", "|---|---|---|"]
        for t in tg:
            meas = _f(t["measured"], "{:.2f}x") if t["target"] == "tiny_speedup" else (
                _f(t["measured"], "{:.2f}") if t["target"] == "length_growth" else _f(t["measured"], "{:.2f}%", 100))
            lines.append(f"| {t['text']} | {meas} | {'yes' if t['met'] else '**no**'}{(' (' + t['note'] + ')') if t.get('note') else ''} |")
        lines.append("")
    ch = res.get("checks")
    if ch:
        lines.append(f"Bookkeeping checks over {ch['runs']} runs: forwarded counts {'ok' if ch['forwarded_ok'] else 'MISMATCH'}, "
                     f"token bounds {'ok' if ch['tokens_ok'] else 'MISMATCH'}, split sums to the step time within "
                     f"{ch['split_sum_max_rel_err'] * 100:.2f}%.")
        lines.append("")
    return "\n".join(lines)


def render_chart(res: dict[str, Any], path: str | Path) -> Path:
    """A PNG with up to four panels: ratio to Floor, step split, per-token time vs view length, ratio vs K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = res.get("main", {}).get("variants", {})
    sl = res.get("scaling_length", {})
    sk = res.get("scaling_k", {})
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax1, ax2), (ax3, ax4) = axes
    names = list(main)
    ratios = [main[n]["ratio_to_floor"] or 0 for n in names]
    ax1.barh(names, ratios, color=["#888" if main[n]["method"] == "floor" else "#3a7" for n in names])
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.set_xlabel("tokens/s ratio to Floor (median of paired reps)")
    ax1.set_title("Throughput" + ("" if res["meta"]["trained"] else " (random weights: AsymSpec/SD not meaningful)"), fontsize=10)
    ax1.invert_yaxis()
    split_names = [n for n in names if "split_frac" in main[n]]
    left = [0.0] * len(split_names)
    colors = {"drafter_full": "#4c72b0", "drafter_comp": "#55a868", "verifier": "#c44e52", "gate": "#8172b2", "trace": "#ccb974", "other": "#999"}
    for key in SPLIT_KEYS:
        vals = [main[n]["split_frac"][key] * 100 for n in split_names]
        ax2.barh(split_names, vals, left=left, color=colors[key], label=SPLIT_LABELS[key])
        left = [a + b for a, b in zip(left, vals)]
    ax2.set_xlabel("% of step time")
    ax2.set_title("Per-step time split", fontsize=10)
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    ax2.invert_yaxis()
    if sl.get("by_length"):
        Ls = [int(L) for L in sl["by_length"]]
        for n in next(iter(sl["by_length"].values())):
            ax3.plot(Ls, [sl["by_length"][str(L)][n]["token_s"] * 1e3 for L in Ls], marker="o", label=n)
        ax3.set_xscale("log", base=2)
        ax3.set_xlabel("compressed-view tokens")
        ax3.set_ylabel("ms per emitted token (median)")
        ax3.legend(fontsize=8)
        ax3.set_title("Per-token time vs prompt length", fontsize=10)
    else:
        ax3.axis("off")
    if sk.get("by_k"):
        labels = [lab for lab in sk["by_k"] if lab != "floor"]
        ax4.bar(labels, [sk["by_k"][lab]["ratio_to_floor"] or 0 for lab in labels], color="#3a7")
        ax4.axhline(1.0, color="k", lw=0.8)
        ax4.set_ylabel("tokens/s ratio to Floor")
        ax4.set_title("Scaling with K", fontsize=10)
        ax4.tick_params(axis="x", labelsize=7, rotation=30)
    else:
        ax4.axis("off")
    fig.suptitle(f"asymspec-mm bench: {res['meta']['pair']} ({res['meta']['device']}, {res['meta']['dtype']})", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_outputs(res: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(_jsonable(res), indent=1))
    paths["markdown"].write_text(render_markdown(res) + "\n")
    render_chart(res, paths["png"])
    return paths


def update_section(path: str | Path, key: str, markdown: str, header: str = "# Benchmarks\n") -> Path:
    """Replace (or append) the section between ``<!-- bench:KEY -->`` markers of a Markdown file."""
    path = Path(path)
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{markdown.strip()}\n{end}"
    text = path.read_text() if path.exists() else header
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on a subparsers object (``func`` = :func:`bench_main`)."""
    p = subparsers.add_parser("bench", help="side-by-side speed benchmark: methods interleaved, medians and ratios",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="tiny", choices=PAIRS, help="[default: %(default)s]")
    p.add_argument("--drafter", default=None, help="drafter checkpoint directory (pair 'dirs')")
    p.add_argument("--verifier", default=None, help="verifier checkpoint directory (pair 'dirs')")
    p.add_argument("--variants", default=";".join(DEFAULT_VARIANTS),
                   help="semicolon list of method[:key=value,...] [default: %(default)s]")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions [default: %(default)s]")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cases", type=int, default=2, help="requests per cell (MiniVista held-out problems) [default: %(default)s]")
    p.add_argument("--case-families", default="", help="MiniVista families the cases rotate through, e.g. figure,visual [default: all four]")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--trace-top", type=int, default=None, help="trace top-k per token [library default]")
    p.add_argument("--lengths", default="256,1024,4096", help="compressed-view lengths of the length sweep ('' skips)")
    p.add_argument("--length-variants", default="floor;asymspec")
    p.add_argument("--k-values", default="1,2,4,8", help="K sweep ('' skips)")
    p.add_argument("--k-variants", default="asymspec")
    p.add_argument("--scenarios", default="0.78:2.6,0.92:4.1", help="AR:MAL pairs for the projection")
    p.add_argument("--prefill", choices=["auto", "pipeline", "synthetic"], default="auto")
    p.add_argument("--image-tokens", type=int, default=None, help="synthetic prefill: image positions on the full stream")
    p.add_argument("--ignore-eos", choices=["auto", "yes", "no"], default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--plain-runs", choices=["auto", "yes", "no"], default="auto")
    p.add_argument("--no-probe", action="store_true", help="skip the probes (batching, loop alone)")
    p.add_argument("--loop-vocabs", default="", help="extra vocab sizes for the loop-alone probe, e.g. 151936")
    p.add_argument("--out", default="runs/bench", help="output folder for bench.json / bench.md / bench.png [default: %(default)s]")
    p.add_argument("--stem", default=None, help="output file stem [default: bench-<pair>]")
    p.add_argument("--update-benchmarks", default=None, metavar="MD",
                   help="also write the tables into this Markdown file, in the section named after --stem (else the pair)")
    p.add_argument("--title", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads during the bench [default: torch's]")
    p.add_argument("--alt-decode", default=None, metavar="PATH",
                   help="another decode.py (e.g. with perf.patch); variants 'method:loop=alt' run its loops side by side")
    p.add_argument("--engine", choices=list(ENGINES), default="dynamic",
                   help="stream engines: the pipeline's (dynamic) or perf.patch's static-cache ones, optionally with a compiled "
                        "one-token decode (untested on GPU) [default: %(default)s]")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=bench_main)
    return p


def _tri(x: str) -> bool | None:
    return None if x == "auto" else x == "yes"


def bench_main(args: argparse.Namespace) -> int:
    from .errors import AsymSpecError

    try:
        scen = [tuple(float(v) for v in s.split(":")) for s in args.scenarios.split(",") if s.strip()]
        res = run_bench(
            args.pair, drafter=args.drafter, verifier=args.verifier,
            variants=[v for v in args.variants.split(";") if v.strip()], reps=args.reps, warmup=args.warmup, cases=args.cases,
            case_families=[f.strip() for f in args.case_families.split(",") if f.strip()] or None,
            max_new_tokens=args.max_new_tokens, k=args.k, trace_top=args.trace_top, prompt_lengths=_ints(args.lengths),
            length_variants=[v for v in args.length_variants.split(";") if v.strip()], k_values=_ints(args.k_values),
            k_variants=[v for v in args.k_variants.split(";") if v.strip()], scenarios=scen, prefill=args.prefill,
            image_tokens=args.image_tokens, ignore_eos=_tri(args.ignore_eos), device=args.device, dtype=args.dtype,
            plain_runs=_tri(args.plain_runs), probe_batching=not args.no_probe, workdir=args.out, threads=args.threads,
            engine=args.engine, alt_decode=args.alt_decode, loop_vocabs=_ints(args.loop_vocabs), progress=not args.quiet,
        )
    except AsymSpecError as e:
        print(f"asymspec-mm bench: {e}", file=sys.stderr)
        return 2
    paths = write_outputs(res, args.out, args.stem or f"bench-{args.pair}")
    if args.update_benchmarks:
        update_section(args.update_benchmarks, args.stem or args.pair, render_markdown(res, args.title))
        paths["benchmarks"] = Path(args.update_benchmarks)
    for kind, pth in paths.items():
        print(f"{kind}: {pth}")
    for t in res["targets"]:
        print(f"target {t['target']}: measured {t['measured']:.4f} -> {'met' if t['met'] else 'NOT met'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asymspec-mm")
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":  # python -m asymspec_mm.bench [bench options]
    raise SystemExit(main())
