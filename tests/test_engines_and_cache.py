"""Cached streams equal no-cache forwards; vision features and M-RoPE positions are exact."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import make_case, make_image
from reference import Reference

from asymspec_mm import AsymSpecConfig
from asymspec_mm.engines import TextEngine, VLEngine
from vision_cache.image import image_content_hash
from vision_cache.positions import extension_positions, mrope_positions


def _rand_tokens(rng: random.Random, n: int, lo: int = 20, hi: int = 480) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def test_engines_equal_full_forward_over_random_rollbacks(tiny_pipe):
    """40 rounds of extend (1..5 tokens) and rollback (0..4 tokens) on all three streams."""
    case = make_case(11)
    res = tiny_pipe.generate(
        case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method="floor", config=AsymSpecConfig(max_new_tokens=1)
    )
    p, ref = res.prompts, Reference(tiny_pipe, res.prompts)
    features, _ = tiny_pipe.encoder.encode(p.pixel_values, p.image_grid_thw)
    full, comp, ver = VLEngine(tiny_pipe.drafter), VLEngine(tiny_pipe.drafter, "drafter_comp"), TextEngine(tiny_pipe.verifier)
    full.prefill_features(p.drafter_full_ids[0], p.mm_token_type_ids[0], features)
    comp.prefill(p.drafter_comp_ids[0])
    ver.prefill(p.verifier_ids[0])
    rng = random.Random(0)
    tokens: list[int] = []
    for _ in range(40):
        new = _rand_tokens(rng, rng.randint(1, 5))
        got = [e.extend(torch.tensor(new)) for e in (full, comp, ver)]
        tokens += new
        want = [ref.drafter_full(tokens)[-len(new) :], ref.drafter_comp(tokens)[-len(new) :], ref.verifier(tokens)[-len(new) :]]
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-4), (g - w).abs().max()
        drop = rng.randint(0, min(4, len(tokens)))
        if drop:
            tokens = tokens[:-drop]
            for e in (full, comp, ver):
                e.truncate(e.length - drop)
        assert full.length == p.drafter_full_ids.shape[1] + len(tokens)
        assert ver.length == p.verifier_ids.shape[1] + len(tokens)


def test_loop_caches_match_no_cache_forward_after_every_step(tiny_pipe):
    """After each step the run yields, every stream's next-token logits equal a full forward."""
    case = make_case(4)
    cfg = AsymSpecConfig(k=3, gamma=0.7, max_new_tokens=16)
    session = tiny_pipe.prepare(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=cfg, prefill=True)
    p, ref = session.prompts, Reference(tiny_pipe, session.prompts)
    prompt_len = {
        "drafter_full": p.drafter_full_ids.shape[1],
        "drafter_comp": p.drafter_comp_ids.shape[1],
        "verifier": p.verifier_ids.shape[1],
    }
    full_forward = {"drafter_full": ref.drafter_full, "drafter_comp": ref.drafter_comp, "verifier": ref.verifier}
    checked, pending_seen, tokens = [], set(), []
    for step, events in enumerate(tiny_pipe.run(session), start=1):
        tokens += [ev.token_id for ev in events]
        if len(tokens) >= cfg.max_new_tokens or tokens[-1] in session.eos_ids:
            continue
        # Each cache holds prompt + tokens but the pending ones: tokens[-1], and on the full stream after K
        # acceptances also d_K (tokens[-2]). Forwarding them on a probe, then rolling back, leaves state intact.
        for name, engine in session.streams.items():
            n_pending = prompt_len[name] + len(tokens) - engine.length
            assert n_pending in ((1, 2) if name == "drafter_full" else (1,)), (name, step, n_pending)
            if name == "drafter_full":
                pending_seen.add(n_pending)
            got = engine.extend(torch.tensor(tokens[-n_pending:]))[-1]
            engine.truncate(engine.length - n_pending)
            assert torch.allclose(got, full_forward[name](tokens)[-1], atol=1e-4), (name, step)
        checked.append(step)
    assert len(checked) >= 3
    assert pending_seen == {1, 2}  # both cases happened: a rejection and K acceptances (d_K carried)


@pytest.mark.parametrize("combo", range(26))
def test_mrope_positions_equal_get_rope_index(tiny_pipe, combo):
    """Image sizes, text before/after, one or two images: positions equal transformers' get_rope_index exactly."""
    rng = random.Random(combo)
    proc = tiny_pipe.processor
    n_images = 1 + (combo % 3 == 2)
    images = [make_image(combo * 7 + i, (rng.randint(16, 300), rng.randint(16, 300))) for i in range(n_images)]
    content = []
    for _ in images:
        content.append({"type": "text", "text": " ".join("word" for _ in range(rng.randint(0, 6)))})
        content.append({"type": "image"})
    content.append({"type": "text", "text": " ".join("tail" for _ in range(rng.randint(0, 9)))})
    text = proc.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    enc = proc(text=[text], images=images, return_tensors="pt")
    want, want_delta = tiny_pipe.drafter.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"], enc["image_grid_thw"])
    got, delta = mrope_positions(enc["mm_token_type_ids"][0], enc["image_grid_thw"], 2)
    assert torch.equal(got, want[:, 0]) and delta == int(want_delta)
    # Extensions after a rollback: positions of a full recompute over prompt + continuation.
    extra = rng.randint(1, 6)
    ids = torch.cat([enc["input_ids"], torch.full((1, extra), 30)], dim=1)
    types = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, extra, dtype=torch.long)], dim=1)
    full, _ = tiny_pipe.drafter.model.get_rope_index(ids, types, enc["image_grid_thw"])
    L = enc["input_ids"].shape[1]
    start = L + extra - rng.randint(1, extra)
    assert torch.equal(extension_positions(start, L + extra - start, delta), full[:, 0, start:])


def test_drafter_full_stream_equals_pixel_forward_every_step(tiny_pipe):
    """With cached features, the full stream's logits equal a plain forward with pixel_values (1e-5) at every step."""
    case = make_case(9)
    res = tiny_pipe.generate(
        case["image"],
        case["question"],
        caption=case["caption"],
        ocr=case["ocr"],
        method="drafter",
        config=AsymSpecConfig(max_new_tokens=10),
    )
    p, ref = res.prompts, Reference(tiny_pipe, res.prompts)
    features, _ = tiny_pipe.encoder.encode(p.pixel_values, p.image_grid_thw)
    eng = VLEngine(tiny_pipe.drafter)
    eng.prefill_features(p.drafter_full_ids[0, :-1], p.mm_token_type_ids[0, :-1], features)
    pending = p.drafter_full_ids[0, -1:]
    for i, tok in enumerate(res.token_ids):
        got = eng.extend(pending)[-1]
        want = ref.drafter_full(res.token_ids[:i])[-1]
        assert torch.allclose(got, want, atol=1e-5)
        pending = torch.tensor([tok])


def test_vision_tower_runs_once_per_image(tiny_dirs):
    """A forward hook on the visual module: once on a miss (whole request), zero times on a hit."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    calls = []
    pipe.drafter.model.visual.register_forward_hook(lambda *a: calls.append(1))
    img = make_image(42)
    cfg = AsymSpecConfig(max_new_tokens=6)
    r1 = pipe.generate(img, "first question?", caption="a chart", ocr=False, config=cfg)
    assert len(calls) == 1 and r1.stats["vision_calls"] == 1 and r1.stats["vision_cache_hits"] == 0
    for q in ("second question?", "third question?"):
        r = pipe.generate(img.copy(), q, caption="a chart", ocr=False, config=cfg)
        assert r.stats["vision_calls"] == 0 and r.stats["vision_cache_hits"] == 1
    assert len(calls) == 1
    # Captioning reuses the same features: no extra tower pass for a cached image.
    pipe.generate(img, "with a generated caption?", caption=None, ocr=False, config=cfg)
    assert len(calls) == 1
    # A different image is a miss; a zero budget disables the cache.
    pipe.generate(make_image(43), "q?", caption="x", ocr=False, config=cfg)
    assert len(calls) == 2
    nocache = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", vision_cache_bytes=0)
    calls2 = []
    nocache.drafter.model.visual.register_forward_hook(lambda *a: calls2.append(1))
    for _ in range(2):
        nocache.generate(img, "q?", caption="x", ocr=False, config=cfg)
    assert len(calls2) == 2


def test_prefix_kv_reuse_equals_fresh_prefill(tiny_dirs):
    """Second question about one image: the image prefix's KV comes from the store; logits equal a fresh prefill."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    fresh = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=0)
    img = make_image(21)
    cfg = AsymSpecConfig(k=3, max_new_tokens=10)
    first = pipe.generate(img, "what is the first value?", caption="a chart", ocr=False, config=cfg)
    assert not first.stats["prefix_cache_hit"]
    for q in ("which bar is tallest?", "how many bars?"):
        reused = pipe.generate(img, q, caption="a chart", ocr=False, config=cfg)
        base = fresh.generate(img, q, caption="a chart", ocr=False, config=cfg)
        assert reused.stats["prefix_cache_hit"] and not base.stats["prefix_cache_hit"]
        assert reused.token_ids == base.token_ids
        assert reused.stats["prefill_tokens"]["drafter_full"] < base.stats["prefill_tokens"]["drafter_full"]
        # Logit-level equality of the reused stream against a no-cache forward.
        p = reused.prompts
        features, _ = pipe.encoder.encode(p.pixel_values, p.image_grid_thw)
        eng = VLEngine(pipe.drafter, prefix_kv=pipe.prefix_kv)
        keys = (image_content_hash(img),)
        eng.prefill_features(p.drafter_full_ids[0], p.mm_token_type_ids[0], features, keys)
        # the whole prompt and the answer were stored: even the prompt's last token (its answer's first input) is reused
        assert eng.prefix_hit and eng.cached_tokens == p.drafter_full_ids.shape[1]
        got = eng.extend(torch.tensor([40, 41]))
        want = Reference(pipe, p).drafter_full([40, 41])[-2:]
        assert torch.allclose(got, want, atol=1e-5)
