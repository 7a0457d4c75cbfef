"""Conversation rendering (issue #29, first part): OpenAI-format messages become the two views' chat messages; the
real Qwen templates (the stand-ins carry the hub files) render them; one user message with one image is exactly
today's single-request prompt; earlier messages render the same in every later turn."""

from __future__ import annotations

import pytest
import torch
from conftest import make_image

from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.request.conversation import ConversationError, ImagePart, parse_messages, truncate, view_messages
from asymspec_mm.request.prompts import chat_texts, default_user_texts

VIEW_1 = "Image description: a bar chart with three bars\nText in the image: 12 30 7"
VIEW_2 = "Image description: a red triangle"


def _user(*parts):
    return {"role": "user", "content": list(parts)}


def _text(t):
    return {"type": "text", "text": t}


def _image(img):
    return {"type": "image", "image": img}


def _conversation():
    return [
        {"role": "system", "content": "You answer questions about charts."},
        _user(_image(make_image(1, (96, 64))), _text("Which bar is tallest?")),
        {"role": "assistant", "content": "The middle one."},
        _user(_text("And this one?"), _image(make_image(2, (64, 64))), _text("Notes: " + "x" * 50)),
        {"role": "assistant", "content": [_text("A triangle.")]},
        _user(_text("How many sides does it have?")),
    ]


@pytest.mark.parametrize("question_first", [False, True])
def test_one_user_message_is_todays_prompt(standin_pipe, question_first):
    """[image, question] (or [question, image]) renders to the single-request prompt strings of every stream,
    character for character."""
    proc, tok = standin_pipe.processor, standin_pipe.verifier_tokenizer
    q = "Which bar is tallest?"
    parts = [_image(make_image(1)), _text(q)]
    vm = view_messages(parse_messages([_user(*(parts[::-1] if question_first else parts))]), {1: VIEW_1})
    want_v, want_c, want_f = chat_texts(proc, tok, default_user_texts(VIEW_1, q))
    assert tok.apply_chat_template(vm.compressed, tokenize=False, add_generation_prompt=True, enable_thinking=False) == want_v
    assert proc.apply_chat_template(vm.compressed_vl, tokenize=False, add_generation_prompt=True) == want_c
    assert proc.apply_chat_template(vm.full, tokenize=False, add_generation_prompt=True) == want_f


def test_a_conversation_renders_the_documented_layout_token_for_token(standin_pipe):
    """System prompt, three user turns, two assistant turns, two images: both views equal the real templates over the
    layout written out by hand (the second image labelled, each image's view in place), and the full view's 3D
    positions equal get_rope_index over both images."""
    from vision_cache.positions import mrope_positions

    proc, tok = standin_pipe.processor, standin_pipe.verifier_tokenizer
    turns = parse_messages(_conversation())
    assert [p.index for t in turns for p in t.images] == [1, 2]
    vm = view_messages(turns, {1: VIEW_1, 2: VIEW_2})
    second = "[Image 2]\n" + VIEW_2 + "\n\nAnd this one?\n\nNotes: " + "x" * 50  # the message's image first
    want = [
        {"role": "system", "content": "You answer questions about charts."},
        {"role": "user", "content": VIEW_1 + "\n\nWhich bar is tallest?"},
        {"role": "assistant", "content": "The middle one."},
        {"role": "user", "content": second},
        {"role": "assistant", "content": "A triangle."},
        {"role": "user", "content": "How many sides does it have?"},
    ]
    assert vm.compressed == want
    render = lambda msgs: tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, enable_thinking=False)  # noqa: E731
    got_ids, want_ids = render(vm.compressed), render(want)
    assert (got_ids["input_ids"] if isinstance(got_ids, dict) else got_ids) == (
        want_ids["input_ids"] if isinstance(want_ids, dict) else want_ids
    )
    full_want = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in want]
    full_want[1]["content"].insert(0, {"type": "image"})
    full_want[3]["content"].insert(0, {"type": "image"})
    assert vm.full == full_want
    text = proc.apply_chat_template(vm.full, tokenize=False, add_generation_prompt=True)
    enc = proc(text=[text], images=[make_image(1, (96, 64)), make_image(2, (64, 64))], return_tensors="pt")
    assert enc["image_grid_thw"].shape[0] == 2
    positions, delta = mrope_positions(enc["mm_token_type_ids"][0], enc["image_grid_thw"], proc.image_processor.merge_size)
    ref, ref_delta = standin_pipe.drafter.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"], enc["image_grid_thw"])
    assert torch.equal(positions, ref[:, 0]) and delta == int(ref_delta[0])


def test_earlier_messages_render_the_same_in_every_later_turn():
    """Stable: the messages of turn k's views are the first messages of every later turn's, text compressor included
    (a long part is compressed the same way each time, and a later image never relabels an earlier one)."""
    long_doc = "log line\n" * 400
    msgs = _conversation()
    msgs.insert(3, {"role": "user", "content": long_doc})
    msgs.insert(4, {"role": "assistant", "content": "Noted."})
    views = {1: VIEW_1, 2: VIEW_2}
    full = view_messages(parse_messages(msgs), views, text_compressor=truncate())
    assert "[... 2100 characters cut ...]" in full.compressed[3]["content"] and len(full.compressed[3]["content"]) < 1600
    assert full.full[3]["content"][-1]["text"] == long_doc.strip()  # the drafter's full view reads the document whole
    for k in range(2, len(msgs) + 1, 2):
        part = view_messages(parse_messages(msgs[:k]), {i: v for i, v in views.items() if i <= k}, text_compressor=truncate())
        for name in ("compressed", "compressed_vl", "full"):
            assert getattr(part, name) == getattr(full, name)[:k], (k, name)


def test_truncate_keeps_head_and_tail():
    cut = truncate(limit=20, head=5, tail=3)
    assert cut("short") == "short" and cut("x" * 20) == "x" * 20
    assert cut("abcdefghijklmnopqrstuvwxyz") == "abcde\n[... 18 characters cut ...]\nxyz"
    with pytest.raises(UnknownOptionError, match="head \\+ tail"):
        truncate(limit=10, head=8, tail=5)


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "hi"}], "role 'robot'"),
        (
            [{"role": "assistant", "content": [{"type": "image", "image": b"x"}]}, _user(_text("q"))],
            "images go in user and tool messages only",
        ),
        ([_user(_text("q")), {"role": "assistant", "content": "a"}], "last message must be the user's"),
        ([{"role": "user", "content": None}], "content must be a string or a list"),
        ([_user({"type": "audio"})], "parts are"),
        ([_user({"type": "image_url", "image_url": {}})], "image_url.url"),
    ],
)
def test_bad_conversations_are_refused_in_one_line(messages, match):
    with pytest.raises(ConversationError, match=match):
        parse_messages(messages)


def test_image_parts_keep_their_source():
    turns = parse_messages([_user({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "q")])
    assert turns[0].parts == (ImagePart(1, "data:image/png;base64,AAAA"), "q")
