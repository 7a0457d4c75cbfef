"""pipe.chat (issue #29, first part): a conversation's two views through the real templates, every image through
the vision tower, decoded by the one decoder. One user message with one image equals pipe.generate; a multi-turn
conversation with two images equals an independent reference built by hand from the templates and the engines."""

from __future__ import annotations

import pytest
import torch
from conftest import make_case, make_image

from asymspec_mm import AsymSpecConfig
from asymspec_mm.decode import steps_for
from asymspec_mm.engines import TextEngine, VLEngine
from asymspec_mm.request.conversation import ConversationError

CFG = AsymSpecConfig(k=3, max_new_tokens=10)


def _one_message(case):
    return [{"role": "user", "content": [{"type": "image", "image": case["image"]}, {"type": "text", "text": case["question"]}]}]


@pytest.mark.parametrize("method", ["asymspec", "floor", "sd", "drafter"])
def test_one_user_message_equals_generate(tiny_pipe, method):
    case = make_case(71)
    got = tiny_pipe.chat(_one_message(case), caption=case["caption"], ocr=case["ocr"], method=method, config=CFG)
    want = tiny_pipe.generate(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method=method, config=CFG)
    assert got.token_ids == want.token_ids and [e.source for e in got.trace] == [e.source for e in want.trace]
    assert got.prompts.verifier_ids.tolist() == want.prompts.verifier_ids.tolist()
    assert got.finish_reason == want.finish_reason == ("length" if want.stats["stopped_by"] == "max_new_tokens" else "stop")
    assert got.stats["images"] == 1


def _conversation(img1, img2):
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "image", "image": img1}, {"type": "text", "text": "What is the largest bar?"}]},
        {"role": "assistant", "content": "The blue one."},
        {"role": "user", "content": [{"type": "text", "text": "Compare with this one:"}, {"type": "image", "image": img2}]},
    ]


def _reference(pipe, method: str, img1, img2, views: tuple[str, str]) -> list[int]:
    """The same conversation decoded from prompts written out by hand: the templates over the documented layout, the
    processor over both images, every stream prefilled directly (no preparer), then the one decoder."""
    proc, tok = pipe.processor, pipe.verifier_tokenizer
    u1 = f"{views[0]}\n\nWhat is the largest bar?"
    u2 = f"[Image 2]\n{views[1]}\n\nCompare with this one:"  # a message's images first, wherever it puts them
    plain = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": u1},
        {"role": "assistant", "content": "The blue one."},
        {"role": "user", "content": u2},
    ]
    vl = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in plain]
    full = [dict(m, content=list(m["content"])) for m in vl]
    full[1]["content"].insert(0, {"type": "image"})
    full[3]["content"].insert(0, {"type": "image"})
    v_ids = tok(
        tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, enable_thinking=False), add_special_tokens=False
    )["input_ids"]
    c_ids = proc.tokenizer(proc.apply_chat_template(vl, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    enc = proc(text=[proc.apply_chat_template(full, tokenize=False, add_generation_prompt=True)], images=[img1, img2], return_tensors="pt")
    features, _ = pipe.encoder.encode(enc["pixel_values"], enc["image_grid_thw"])
    f_ids = enc["input_ids"][0]
    streams = {"verifier": TextEngine(pipe.verifier, "verifier"), "drafter_comp": VLEngine(pipe.drafter, "drafter_comp")}
    streams["drafter_full"] = VLEngine(pipe.drafter, "drafter_full")
    streams["verifier"].prefill(torch.tensor(v_ids[:-1]))
    streams["drafter_comp"].prefill(torch.tensor(c_ids[:-1]))
    streams["drafter_full"].prefill_features(f_ids[:-1], enc["mm_token_type_ids"][0][:-1], features)
    pending = {"verifier": torch.tensor(v_ids[-1:]), "drafter_comp": torch.tensor(c_ids[-1:]), "drafter_full": f_ids[-1:]}
    names = {"asymspec": ("drafter_full", "drafter_comp", "verifier"), "floor": ("verifier",), "drafter": ("drafter_full",)}[method]
    steps = steps_for(method, {n: streams[n] for n in names}, {n: pending[n] for n in names}, CFG, pipe.eos_ids)
    return [ev.token_id for events in steps for ev in events]


@pytest.mark.parametrize("method", ["asymspec", "floor", "drafter"])
def test_a_conversation_with_two_images_equals_the_hand_built_reference(tiny_pipe, method):
    img1, img2 = make_image(81, (96, 72)), make_image(82, (64, 80))
    captions, ocrs = ["a bar chart", "a second chart"], ["12 7", ""]
    res = tiny_pipe.chat(_conversation(img1, img2), caption=captions, ocr=ocrs, method=method, config=CFG)
    from captioning.view import CompressedView

    views = tuple(CompressedView(c, o).render() for c, o in zip(captions, ocrs))
    assert res.token_ids == _reference(tiny_pipe, method, img1, img2, views)
    assert res.stats["images"] == 2 and res.view.caption == "a second chart"
    if method != "floor":
        assert res.stats["vision_calls"] + res.stats["vision_cache_hits"] == 2  # each image through the tower on its own


def test_a_text_only_conversation_and_per_image_arguments(tiny_pipe):
    msgs = [
        {"role": "user", "content": "Name a shape."},
        {"role": "assistant", "content": "A circle."},
        {"role": "user", "content": "Another?"},
    ]
    res = tiny_pipe.chat(msgs, config=CFG)
    assert res.stats["images"] == 0 and len(res.token_ids) >= 1
    floor = tiny_pipe.chat(msgs, method="floor", config=CFG)
    assert floor.token_ids and floor.finish_reason in ("stop", "length")
    two = _conversation(make_image(1), make_image(2))
    with pytest.raises(ConversationError, match="2 images; give a list with one caption per image"):
        tiny_pipe.chat(two, caption="one caption", ocr=False, config=CFG)
    with pytest.raises(ConversationError, match="a list of 2"):
        tiny_pipe.chat(two, caption=["only one"], ocr=False, config=CFG)
