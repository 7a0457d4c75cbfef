"""KV reuse across turns (issue #29): the radix tree against a brute-force reference, reuse keys over images, and
real conversations. Turn N+1 decoded with reuse equals decoding it from scratch for every method, on the single-row
path and through the scheduler's batched prefill; the reused tokens are exactly the longest common prefix with
what earlier turns stored (found, not assumed: Qwen3's template renders the earlier answer without its empty think
block), and the tokens prefilled are exactly the rest."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import make_image

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
from asymspec_mm.engines.prefix_kv import PrefixKV, common_prefix, image_marker, reuse_key
from vision_cache.image import image_content_hash

CFG = AsymSpecConfig(k=3, max_new_tokens=12)
STREAMS = {"asymspec": ("drafter_full", "drafter_comp", "verifier"), "sd": ("drafter_comp", "verifier"), "floor": ("verifier",)}
STREAMS["drafter"] = ("drafter_full",)


# ---------------------------------------------------------------------------------------------- the tree alone
def _layers(seq: list[int], n_layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic KV of a context: position i's keys/values are a function of ``seq[: i + 1]`` alone, as a causal
    model's are, so reuse is right exactly when the returned values equal the query's own."""
    vals = torch.tensor([float(hash(tuple(seq[: i + 1])) % 9973) for i in range(len(seq))])
    k = vals.view(1, 1, -1, 1).expand(1, 2, -1, 3).clone()
    return [(k + layer, -k - layer) for layer in range(n_layers)]


def test_radix_tree_equals_brute_force():
    rng = random.Random(0)
    tree, stored = PrefixKV(2**30), []
    for _ in range(300):
        base = rng.choice(stored) if stored and rng.random() < 0.7 else []
        seq = base[: rng.randint(0, len(base))] + [rng.randint(0, 4) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5 and seq:
            if rng.random() < 0.5:  # the whole context's KV
                tree.insert("m", torch.tensor(seq), _layers(seq))
            else:  # only the part not stored yet (what a finished batched row hands over)
                off = tree.stored("m", torch.tensor(seq))
                assert tree.insert("m", torch.tensor(seq), [(k[:, :, off + 1 :], v) for k, v in _layers(seq)], offset=off + 1) == 0
                tree.insert("m", torch.tensor(seq), [(k[:, :, off:], v[:, :, off:]) for k, v in _layers(seq)], offset=off)
            stored.append(seq)
        hit = tree.match("m", torch.tensor(seq))
        want = max((common_prefix(torch.tensor(seq), torch.tensor(s)) for s in stored), default=0)
        assert hit.length == want
        if want:
            for got, ref in zip(hit.layers, _layers(seq[:want])):
                assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert tree.tokens() <= sum(len(s) for s in stored)
    assert tree.match("other model", torch.tensor(stored[-1])).length == 0  # spaces never share


def test_byte_budget_evicts_least_recently_used_and_stays_exact():
    per_token = sum(k.numel() * 4 + v.numel() * 4 for k, v in _layers([1]))
    tree = PrefixKV(per_token * 20)
    a, b, c = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9, 9, 9], [5] * 10
    tree.insert("m", torch.tensor(a), _layers(a))
    tree.insert("m", torch.tensor(b), _layers(b))  # shares 3 tokens: 13 stored
    assert tree.tokens() == 13 and tree.nbytes == 13 * per_token
    tree.match("m", torch.tensor(a))  # a is now more recent than b
    tree.insert("m", torch.tensor(c), _layers(c))  # 23 > 20: b's leaf goes
    assert tree.evictions == 1 and tree.nbytes <= tree.max_bytes and tree.tokens() == 18
    assert tree.match("m", torch.tensor(b)).length == 3 and tree.match("m", torch.tensor(a)).length == 8
    hit = tree.match("m", torch.tensor(c))
    assert hit.length == 10 and torch.equal(hit.layers[0][0], _layers(c)[0][0])
    assert PrefixKV(0).insert("m", torch.tensor(a), _layers(a)) == 0


def test_reuse_key_marks_each_images_pads():
    ids = torch.tensor([5, 9, 9, 9, 6, 9, 9, 7])
    types = torch.tensor([0, 1, 1, 1, 0, 1, 1, 0])
    key = reuse_key(ids, types, ("img-a", "img-b"))
    assert key.tolist() == [5, *[image_marker("img-a")] * 3, 6, *[image_marker("img-b")] * 2, 7]
    assert image_marker("img-a") < 0 and image_marker("img-a") != image_marker("img-b")
    assert reuse_key(ids).tolist() == ids.tolist()


# ---------------------------------------------------------------------------------------------- conversations
def _turns(img1, img2):
    """Three requests of one conversation: each the previous one's messages, its answer and a new user message."""
    first = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "image", "image": img1}, {"type": "text", "text": "What is the largest bar?"}]},
    ]
    second = [{"role": "user", "content": [{"type": "text", "text": "And in this one?"}, {"type": "image", "image": img2}]}]
    third = [{"role": "user", "content": "Which of the two is larger?"}]
    return first, second, third


def _ids(res, name: str) -> list[int]:
    p = res.prompts
    return {"drafter_full": p.drafter_full_ids, "drafter_comp": p.drafter_comp_ids, "verifier": p.verifier_ids}[name][0].tolist()


def _key(res, name: str, images: list) -> torch.Tensor:
    """A stream's prompt as the reuse cache knows it: token ids, each image's pads as that image's marker."""
    ids = torch.tensor(_ids(res, name))
    if name != "drafter_full" or not images:
        return ids
    return reuse_key(ids, res.prompts.mm_token_type_ids[0], [image_content_hash(img) for img in images])


def _expected_cached(earlier: list, res, name: str, images: list, method: str) -> int:
    """The longest common prefix of this prompt (but its last token) with anything stored before it on the same
    model, computed from the token ids alone: every earlier turn's prompt + answer as each stream keeps it (all but
    the answer's last token). The drafter's two streams share a model, so they share what is stored; a request's
    own streams are prefilled in the same turn of its engine core (alone as in a batch), so none finds another."""
    on_model = [s for s in STREAMS[method] if (s == "verifier") == (name == "verifier")]
    mine = _key(res, name, images[-1])[:-1]
    stored = []
    for prev, prev_images in zip(earlier, images):
        for s in on_model:
            key = torch.cat([_key(prev, s, prev_images), torch.tensor(prev.token_ids)])
            stored.append(key[: len(_ids(prev, s)) + len(prev.token_ids) - 1])
    return max((common_prefix(mine, k) for k in stored), default=0)


def _chat_kwargs(n_images: int) -> dict:
    return {"caption": [f"a bar chart number {i}" for i in range(n_images)], "ocr": False}


@pytest.fixture(scope="module")
def images():
    return make_image(41), make_image(42)


@pytest.mark.parametrize("method", ["asymspec", "floor", "sd", "drafter"])
def test_each_turn_with_reuse_equals_from_scratch(tiny_dirs, images, method):
    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    scratch = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=0)
    first, second, third = _turns(*images)
    messages, done, shown = [], [], []
    for turn, new in enumerate((first, second, third)):
        messages = messages + new
        n_images = 1 if turn == 0 else 2
        shown.append(list(images[:n_images]))
        got = pipe.chat(messages, method=method, config=CFG, **_chat_kwargs(n_images))
        want = scratch.chat(messages, method=method, config=CFG, **_chat_kwargs(n_images))
        assert got.token_ids == want.token_ids and [e.source for e in got.trace] == [e.source for e in want.trace]
        if "drafter_full" in STREAMS[method]:  # the tower sees each image once: the first turn's, then the new one
            assert got.stats["vision_calls"] == (0 if turn == 2 else 1)
        for name in STREAMS[method]:
            cached = got.stats["cached_tokens"][name]
            assert cached == _expected_cached(done, got, name, shown, method), (turn, name)
            assert got.stats["prefill_tokens"][name] == len(_ids(got, name)) - 1 - cached
            assert want.stats["cached_tokens"][name] == 0
        if turn:
            # from the second turn on, only what is new is prefilled: the previous answer and the new message
            prev = done[-1]
            for name in STREAMS[method]:
                assert got.stats["prefill_tokens"][name] <= len(_ids(got, name)) - len(_ids(prev, name)) + len(prev.token_ids)
        done.append(got)
        messages = messages + [{"role": "assistant", "content": got.text}]
    if method in ("asymspec", "floor", "sd"):
        # Qwen3 renders the earlier answer without the empty think block that followed its generation prompt, so the
        # verifier reuses turn 1 up to "<|im_start|>assistant\n" and no further
        tok = pipe.verifier_tokenizer
        second_res = done[1]
        cached = second_res.stats["cached_tokens"]["verifier"]
        assert tok.decode(_ids(second_res, "verifier")[:cached]).endswith("<|im_start|>assistant\n")
        assert "<think>" in tok.decode(_ids(done[0], "verifier")[cached:])


def test_reuse_through_the_scheduler_and_two_conversations_sharing_a_prefix(tiny_dirs, images):
    """Batched, chunked prefill starts from the same stored prefixes: two conversations with the same first turn,
    each asking its own follow-up at once, equal decoding from scratch; each reuses the shared first turn."""
    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    scratch = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=0)
    first, _, _ = _turns(*images)
    opening = pipe.chat(first, config=CFG, **_chat_kwargs(1))
    history = first + [{"role": "assistant", "content": opening.text}]
    follow_ups = [history + [{"role": "user", "content": q}] for q in ("Why?", "What colour is the largest bar?")]
    with pipe.scheduler(max_batch_size=4, prefill_chunk_tokens=16) as sched:
        handles = [sched.submit_chat(m, config=CFG, **_chat_kwargs(1)) for m in follow_ups]
        results = [h.result() for h in handles]
    for res, m in zip(results, follow_ups):
        want = scratch.chat(m, config=CFG, **_chat_kwargs(1))
        assert res.token_ids == want.token_ids
        for name in STREAMS["asymspec"]:
            shown = [[images[0]], [images[0]]]
            assert res.stats["cached_tokens"][name] >= _expected_cached([opening], res, name, shown, "asymspec") > 0
            assert res.stats["prefill_tokens"][name] == len(_ids(res, name)) - 1 - res.stats["cached_tokens"][name]


def test_a_small_byte_budget_evicts_and_stays_exact(tiny_dirs, images):
    scratch = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=0)
    probe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    first, second, _ = _turns(*images)
    probe.chat(first, config=CFG, **_chat_kwargs(1))
    budget = probe.prefix_kv.nbytes // 2  # not even one turn fits whole
    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=budget)
    messages = first
    for turn in range(2):
        got = pipe.chat(messages, config=CFG, **_chat_kwargs(turn + 1))
        assert got.token_ids == scratch.chat(messages, config=CFG, **_chat_kwargs(turn + 1)).token_ids
        assert pipe.prefix_kv.nbytes <= budget
        messages = messages + [{"role": "assistant", "content": got.text}] + second
    assert pipe.prefix_kv.evictions > 0


def test_generate_batch_takes_conversations(tiny_dirs, images):
    """Conversations and single questions mixed in one generate_batch: each equals pipe.chat / pipe.generate alone."""
    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    scratch = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", prefix_cache_bytes=0)
    first, second, _ = _turns(*images)
    follow = first + [{"role": "assistant", "content": "Blue."}] + second
    requests = [
        {"messages": first, **_chat_kwargs(1)},
        {"image": images[1], "question": "How many bars?", "caption": "bars", "ocr": False},
        {"messages": follow, **_chat_kwargs(2)},
    ]
    got = pipe.generate_batch(requests, config=CFG, batch_size=3)
    assert got[0].token_ids == scratch.chat(first, config=CFG, **_chat_kwargs(1)).token_ids
    assert got[1].token_ids == scratch.generate(images[1], "How many bars?", caption="bars", ocr=False, config=CFG).token_ids
    assert got[2].token_ids == scratch.chat(follow, config=CFG, **_chat_kwargs(2)).token_ids
    with pytest.raises(Exception, match="unknown field"):
        pipe.generate_batch([{"messages": first, "question": "x"}], config=CFG)
