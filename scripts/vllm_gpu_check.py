#!/usr/bin/env python
"""The vLLM backend on a GPU: the CPU tests' equality checks on CUDA vLLM, then a throughput comparison.

Needs CUDA vLLM (``pip install 'asymspec-mm[vllm]'``) and a GPU; nothing is downloaded: the models are
random Qwen3 checkpoints built here with the project's tokenizer (tiny fp32 ones for equality, a
~1.5B bf16 verifier for speed). Run it from the repository root:

    python scripts/vllm_gpu_check.py --out runs/vllm_gpu            # equality + throughput (+ TP when >1 GPU)
    python scripts/vllm_gpu_check.py --only equality                # a quick check (about 2 minutes)
    python scripts/vllm_gpu_check.py --device cpu --only equality   # the same code on vLLM's CPU build

Checks (results in OUT/vllm_gpu_check.json, exit code 1 when an equality check fails):
  1. equality: VLLMEngine vs the transformers TextEngine over 40 random accept/reject rounds (fp32, TF32
     off; max |diff| <= --atol), and the AsymSpec loop's tokens with the verifier on vLLM vs transformers.
  2. tp: the same logits with tensor_parallel_size=2 (when at least 2 GPUs), in a subprocess.
  vl: the drafter's Qwen3-VL streams on vLLM (a tiny random Qwen3-VL + Qwen3 pair, fp32, in a subprocess):
     the full-view (image) stream's logits vs the transformers VLEngine over --rounds rounds, and the
     pipeline with every stream on vLLM vs the transformers pipeline (same tokens for each method).
  3. throughput (bf16): verifier step latency (K+1 tokens at a long context) and AsymSpec tokens/s with
     the verifier on transformers vs on vLLM (drafter streams on transformers in both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_pair(out: Path, *, correlated=True, **dims):
    """A Qwen3 text drafter and verifier sharing the project's tokenizer (``asymspec_mm.checkpoints.small.build_text_pair``)."""
    from asymspec_mm.checkpoints.small import build_text_pair

    return build_text_pair(out, correlated=0.03 if correlated else None, **dims)[2]


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def check_equality(args, work: Path, llm_kw: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from asymspec_mm.decode import AsymSpecConfig, asymspec_steps
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm import VLLMModel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    d_dir, v_dir = build_pair(work / "tiny")
    served = VLLMModel.from_pretrained(v_dir, dtype="float32", max_model_len=2048, seed=0, **llm_kw)
    verifier = AutoModelForCausalLM.from_pretrained(v_dir, dtype=torch.float32).to(dev).eval()
    drafter = AutoModelForCausalLM.from_pretrained(d_dir, dtype=torch.float32).to(dev).eval()
    vocab = verifier.config.vocab_size
    rng = random.Random(0)
    ref, eng = TextEngine(verifier), served.engine()
    prompt = torch.tensor([rng.randrange(vocab) for _ in range(300)], device=dev)
    ref.prefill(prompt[:-1])
    eng.prefill(prompt[:-1])
    pending, worst, per_step = prompt[-1:], 0.0, []
    for _ in range(args.rounds):
        k = rng.randint(1, 6)
        x = torch.cat([pending, torch.tensor([rng.randrange(vocab) for _ in range(k)], device=dev)])
        base, computed = ref.length, eng.tokens_computed
        a, b = ref.extend(x).float(), eng.extend(x).float().to(dev)
        worst = max(worst, (a - b).abs().max().item())
        per_step.append(eng.tokens_computed - computed)
        keep = rng.randint(0, k) + 1
        ref.truncate(base + keep)
        eng.truncate(base + keep)
        pending = torch.tensor([rng.randrange(vocab)], device=dev)
    loops = []
    for seed in range(3):
        r = random.Random(100 + seed)
        full_p = torch.tensor([r.randrange(vocab) for _ in range(r.randint(40, 90))], device=dev)
        text_p = torch.tensor([r.randrange(vocab) for _ in range(r.randint(20, 70))], device=dev)
        tokens = []
        for ver in (TextEngine(verifier), served.engine()):
            full, comp = TextEngine(drafter, "drafter_full"), TextEngine(drafter, "drafter_comp")
            full.prefill(full_p[:-1])
            comp.prefill(text_p[:-1])
            ver.prefill(text_p[:-1])
            cfg = AsymSpecConfig(k=4, max_new_tokens=48, gamma=1.0)
            steps = asymspec_steps(full, comp, ver, (full_p[-1:], text_p[-1:], text_p[-1:]), cfg, set())
            tokens.append([ev.token_id for s in steps for ev in s])
        loops.append(tokens[0] == tokens[1])
    res = {
        "max_abs_diff": worst,
        "atol": args.atol,
        "logits_ok": worst <= args.atol,
        "max_tokens_recomputed_per_step": max(per_step),
        "loop_tokens_identical": loops,
        "engine_device": str(eng.device),
        "rerequests": eng.cache_rerequests,
    }
    res["ok"] = res["logits_ok"] and all(loops)
    del served
    return res


def check_vl(args, work: Path, llm_kw: dict) -> dict:
    """The drafter's streams (Qwen3-VL with an image) on vLLM vs transformers, through AsymSpecPipeline."""
    import torch
    from PIL import Image, ImageDraw

    from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
    from asymspec_mm.checkpoints.small import build_tiny_checkpoints
    from asymspec_mm.engines import VLEngine
    from asymspec_mm.request.prompts import build_prompts

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dirs = build_tiny_checkpoints(work / "tiny_vl", max_pixels=256 * 256)
    kw = dict(dtype="float32", max_model_len=2048, seed=0, **llm_kw)
    ref = AsymSpecPipeline.from_pretrained(*dirs, device=args.device, dtype="float32", ocr="none")
    pipe = AsymSpecPipeline.from_pretrained(
        *dirs,
        device=args.device,
        dtype="float32",
        ocr="none",
        verifier_backend="vllm",
        drafter_backend="vllm",
        vllm_kwargs=kw,
        drafter_vllm_kwargs=kw,
    )
    rng = random.Random(0)

    def image(seed, size):
        r = random.Random(seed)
        img = Image.new("RGB", size, tuple(r.randint(0, 255) for _ in range(3)))
        d = ImageDraw.Draw(img)
        for _ in range(3):
            x0, y0 = r.randint(0, size[0] - 2), r.randint(0, size[1] - 2)
            d.rectangle([x0, y0, r.randint(x0 + 1, size[0]), r.randint(y0 + 1, size[1])], fill=tuple(r.randint(0, 255) for _ in range(3)))
        return img

    dev = torch.device(args.device)
    vocab = ref.drafter.config.text_config.vocab_size
    worst, per_step = 0.0, []
    for seed, size in ((0, (256, 160)), (1, (72, 136))):
        img = image(seed, size)
        p = build_prompts(ref.processor, ref.verifier_tokenizer, img, "a chart with bars", "Which bar is the tallest?")
        features, _ = ref.encoder.encode(p.pixel_values, p.image_grid_thw)
        ids = p.drafter_full_ids[0].to(dev)
        a, b = VLEngine(ref.drafter, name="drafter_full"), pipe.drafter_full.vision_engine()
        a.prefill_features(ids[:-1], p.mm_token_type_ids[0, :-1], features)
        b.prefill(ids[:-1], [img])
        assert a.length == b.length, (a.length, b.length)
        pending = ids[-1:]
        for _ in range(args.rounds):
            k = rng.randint(1, 6)
            x = torch.cat([pending, torch.tensor([rng.randrange(vocab) for _ in range(k)], device=dev)])
            base, computed = a.length, b.tokens_computed
            worst = max(worst, (a.extend(x).float() - b.extend(x).float().to(dev)).abs().max().item())
            per_step.append(b.tokens_computed - computed - (k + 1))
            keep = rng.randint(0, k) + 1
            a.truncate(base + keep)
            b.truncate(base + keep)
            pending = torch.tensor([rng.randrange(vocab)], device=dev)
    same = {}
    cfg = AsymSpecConfig(max_new_tokens=32, gamma=1.0)
    for seed in range(2):
        img = image(10 + seed, (160, 120))
        for method in ("asymspec", "sd", "floor", "drafter"):
            x = ref.generate(img, "What is the largest value?", caption="bars", ocr="1 2 3", method=method, config=cfg)
            y = pipe.generate(img, "What is the largest value?", caption="bars", ocr="1 2 3", method=method, config=cfg)
            same[f"{method}/{seed}"] = x.token_ids == y.token_ids
    res = {
        "full_view_max_abs_diff": worst,
        "atol": args.atol,
        "logits_ok": worst <= args.atol,
        "max_extra_tokens_recomputed_per_step": max(per_step),
        "pipeline_tokens_identical": same,
    }
    res["ok"] = res["logits_ok"] and all(same.values())
    return res


def _in_subprocess(args, out: Path, only: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--only",
        only,
        "--device",
        args.device,
        "--rounds",
        str(args.rounds),
        "--atol",
        str(args.atol),
        "--out",
        str(out / only),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    path = out / only / "vllm_gpu_check.json"
    res = json.loads(path.read_text()).get(only) if path.exists() else None
    res = res or {"ok": False, "stderr": proc.stderr[-3000:]}
    res["wall_s"] = time.time() - t0
    return res


def check_tp(args, work: Path) -> dict:
    """Run the logits check with tensor_parallel_size=2 in a subprocess (a fresh distributed group)."""
    import torch

    if args.device != "cuda" or torch.cuda.device_count() < 2:
        return {"skipped": f"needs 2 GPUs, found {torch.cuda.device_count() if args.device == 'cuda' else 0}"}
    cmd = [
        sys.executable,
        __file__,
        "--only",
        "equality",
        "--tp",
        "2",
        "--device",
        "cuda",
        "--rounds",
        str(args.rounds),
        "--atol",
        str(args.atol),
        "--out",
        str(work / "tp2"),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = work / "tp2" / "vllm_gpu_check.json"
    res = json.loads(out.read_text())["equality"] if out.exists() else {"ok": False, "stderr": proc.stderr[-3000:]}
    res["wall_s"] = time.time() - t0
    return res


def check_throughput(args, work: Path, llm_kw: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from asymspec_mm.decode import AsymSpecConfig, Counters, asymspec_steps
    from asymspec_mm.engines import TextEngine
    from asymspec_mm.engines.vllm import VLLMModel

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    size = (
        dict(hidden=2048, layers=24, heads=16, kv_heads=8, head_dim=128, inter=6144, vocab=151936, d_hidden=1024, d_layers=8)
        if args.bench_size == "medium"
        else dict(hidden=64, layers=2, head_dim=32)
    )
    d_dir, v_dir = build_pair(work / f"bench_{args.bench_size}", correlated=False, **size)
    served = VLLMModel.from_pretrained(v_dir, dtype=str(dtype).removeprefix("torch."), max_model_len=4096, seed=0, **llm_kw)
    verifier = AutoModelForCausalLM.from_pretrained(v_dir, dtype=dtype).to(dev).eval()
    drafter = AutoModelForCausalLM.from_pretrained(d_dir, dtype=dtype).to(dev).eval()
    vocab = min(verifier.config.vocab_size, 494)  # tokens the tokenizer knows
    rng = random.Random(0)
    ctx = torch.tensor([rng.randrange(vocab) for _ in range(args.context)], device=dev)
    k = 4
    latency = {}
    for name, eng in (("transformers", TextEngine(verifier)), ("vllm", served.engine())):
        eng.prefill(ctx[:-1])
        pending, times = ctx[-1:], []
        for i in range(args.steps + 5):
            x = torch.cat([pending, torch.tensor([rng.randrange(vocab) for _ in range(k)], device=dev)])
            base = eng.length
            _sync(dev)
            t0 = time.perf_counter()
            eng.extend(x)
            _sync(dev)
            if i >= 5:
                times.append(time.perf_counter() - t0)
            eng.truncate(base + rng.randint(1, k + 1))
            pending = torch.tensor([rng.randrange(vocab)], device=dev)
        latency[name] = {"median_ms": 1000 * statistics.median(times), "p90_ms": 1000 * sorted(times)[int(0.9 * len(times))]}
    loop = {}
    full_p = torch.tensor([rng.randrange(vocab) for _ in range(args.context)], device=dev)
    text_p = torch.tensor([rng.randrange(vocab) for _ in range(args.context // 2)], device=dev)
    outs = {}
    for name in ("transformers", "vllm"):
        ver = TextEngine(verifier) if name == "transformers" else served.engine()
        full, comp = TextEngine(drafter, "drafter_full"), TextEngine(drafter, "drafter_comp")
        full.prefill(full_p[:-1])
        comp.prefill(text_p[:-1])
        ver.prefill(text_p[:-1])
        cfg = AsymSpecConfig(k=k, max_new_tokens=args.new_tokens, trace_top=0)
        counters = Counters(k, {"drafter_full": full, "drafter_comp": comp, "verifier": ver})
        _sync(dev)
        t0 = time.perf_counter()
        tokens = [
            ev.token_id
            for s in asymspec_steps(full, comp, ver, (full_p[-1:], text_p[-1:], text_p[-1:]), cfg, set(), counters=counters)
            for ev in s
        ]
        _sync(dev)
        wall = time.perf_counter() - t0
        outs[name] = tokens
        loop[name] = {
            "tokens": len(tokens),
            "wall_s": wall,
            "tokens_per_s": len(tokens) / wall,
            "acceptance_rate": counters.as_dict()["acceptance_rate"],
        }
    same = sum(a == b for a, b in zip(outs["transformers"], outs["vllm"]))
    return {
        "size": args.bench_size,
        "dtype": str(dtype),
        "context": args.context,
        "k": k,
        "verifier_step_latency": latency,
        "asymspec_loop": loop,
        "tokens_agreeing": f"{same}/{len(outs['vllm'])} (bf16: kernels differ, so the greedy paths may part)",
        "vllm_over_transformers_step_speedup": latency["transformers"]["median_ms"] / latency["vllm"]["median_ms"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/vllm_gpu")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--only", choices=["equality", "tp", "vl", "throughput"])
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of the equality check")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile in the throughput run")
    ap.add_argument("--bench-size", default="medium", choices=["medium", "tiny"])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()

    if args.device == "cpu":
        for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):
            os.environ.setdefault(k, v)
    elif args.tp == 1:
        # engine core in this process: logits stay on the GPU (no pickling through the engine's IPC)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm

    from asymspec_mm.engines.vllm import check_vllm

    check_vllm()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for the CPU build", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "gpus": torch.cuda.device_count() if args.device == "cuda" else 0,
    }
    eq_kw = {"enforce_eager": True, "tensor_parallel_size": args.tp}
    if args.device == "cpu":
        eq_kw["block_size"] = 32
    else:
        eq_kw["gpu_memory_utilization"] = 0.25
    bench_kw = {"enforce_eager": args.enforce_eager or args.device == "cpu"}
    bench_kw.update({"block_size": 32} if args.device == "cpu" else {"gpu_memory_utilization": 0.4})
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, fn in (
            ("equality", lambda: check_equality(args, work, eq_kw)),
            ("tp", lambda: check_tp(args, out)),
            # in a subprocess unless asked alone: a fresh process for its two more vllm.LLMs
            ("vl", lambda: check_vl(args, work, eq_kw) if args.only == "vl" else _in_subprocess(args, out, "vl")),
            ("throughput", lambda: check_throughput(args, work, bench_kw)),
        ):
            if args.only and name != args.only:
                continue
            if name == "tp" and args.tp != 1:
                continue
            t0 = time.time()
            try:
                report[name] = fn()
            except Exception as exc:  # report and go on to the next check
                import traceback

                report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]}
            report[name]["check_s"] = round(time.time() - t0, 1)
            ok &= report[name].get("ok", True)
            print(json.dumps({name: report[name]}, indent=1, default=str), flush=True)
            (out / "vllm_gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"vllm_gpu_check: {'OK' if ok else 'FAILED'} -> {out / 'vllm_gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
