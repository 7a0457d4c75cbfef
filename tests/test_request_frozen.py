"""A checked request is never changed (issue #51, item 1): ``Request.checked()`` returns a read-only request (its
messages a read-only copy, no longer shared with the edge's list), and the server decodes a request's images into
``Request.images`` instead of rewriting its messages after the check; the request it answers is the one it checked,
unchanged. Real forwards of the tiny random pair."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from conftest import make_case
from test_serve import data_url, user_message

from asymspec_mm import AsymSpecConfig, Request
from asymspec_mm.serve.chat_request import parse_chat_request


def _messages(case: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": case["image"]}, {"type": "text", "text": case["question"]}]}]


def test_a_checked_request_refuses_every_change_and_shares_nothing_with_the_edge():
    case = make_case(5500)
    edge = _messages(case)
    req = Request(messages=edge, caption="a chart", ocr=False).checked()
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.caption = "another"  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        req.messages[0]["content"] = "rewritten"
    with pytest.raises(TypeError, match="read-only"):
        req.messages[0]["content"][1].update(text="rewritten")
    with pytest.raises(AttributeError):
        req.messages[0]["content"].append({"type": "text", "text": "more"})  # a tuple
    edge[0]["content"][1]["text"] = "changed at the edge after the check"
    edge.append({"role": "user", "content": "and more"})
    assert req.messages[0]["content"][1]["text"] == case["question"] and len(req.messages) == 1
    assert req.messages[0]["content"][0]["image"] is case["image"]  # images are kept, not copied
    for again in (copy.copy(req), copy.deepcopy(req), pickle.loads(pickle.dumps(req.messages))):
        msgs = again.messages if isinstance(again, Request) else again
        with pytest.raises(TypeError, match="read-only"):
            msgs[0]["role"] = "system"


def test_the_server_decodes_images_beside_the_checked_request_and_never_changes_it(tiny_pipe):
    case = make_case(5600)
    body = {
        "model": "tiny",
        "messages": [user_message(case["question"], data_url(case["image"]))],
        "max_tokens": 6,
        "asymspec": {"caption": case["caption"], "ocr": case["ocr"]},
    }
    chat = parse_chat_request(body)
    req = chat.request
    parts = req.messages[0]["content"]
    assert [p["type"] for p in parts] == ["image", "text"] and parts[0]["image"] == 0  # the part names images[0]
    assert len(req.images) == 1 and req.images[0].size == case["image"].size
    before = (req.messages, req.images, req.config, req.caption, req.ocr)
    with tiny_pipe.scheduler(max_batch_size=1) as sched:
        res = sched.add(req).result(timeout=120)
    assert res.request is req
    assert (req.messages, req.images, req.config, req.caption, req.ocr) == before
    assert before[0][0]["content"][0]["image"] == 0  # still the index: nothing wrote the image into it
    direct = tiny_pipe.chat(
        [{"role": "user", "content": [{"type": "image", "image": req.images[0]}, {"type": "text", "text": case["question"]}]}],
        caption=case["caption"],
        ocr=case["ocr"],
        config=AsymSpecConfig(max_new_tokens=6, temperature=req.config.temperature),
    )
    assert res.token_ids == direct.token_ids
