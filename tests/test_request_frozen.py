"""A checked request is never changed (issue #51, item 1): ``Request.checked()`` returns a read-only request (its
messages a read-only copy, no longer shared with the edge's list), and the server decodes a request's images into
``Request.images`` instead of rewriting its messages after the check; the request it answers is the one it checked,
unchanged. Real forwards of the tiny random pair."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
from conftest import make_case
from test_serve import data_url, user_message

from asymspec_mm import AsymSpecConfig, Request
from asymspec_mm.base.frozen import FrozenDict, frozen, thawed
from asymspec_mm.request.tools import prompt_tools
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


def _changeable_parts(value, path: str):
    """The paths of every changeable container inside ``value`` (a list, dict, set, bytearray, or a dataclass that is
    not frozen); a :class:`FrozenDict`, a tuple and a frozen dataclass are walked into."""
    if isinstance(value, FrozenDict):
        for key, item in value.items():
            yield from _changeable_parts(item, f"{path}[{key!r}]")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _changeable_parts(item, f"{path}[{i}]")
    elif isinstance(value, (list, dict, set, bytearray)):
        yield path
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        if not type(value).__dataclass_params__.frozen:
            yield path
        for f in dataclasses.fields(value):
            yield from _changeable_parts(getattr(value, f.name), f"{path}.{f.name}")


def _frozen_dicts(value):
    if isinstance(value, FrozenDict):
        yield value
        for item in value.values():
            yield from _frozen_dicts(item)
    elif isinstance(value, tuple):
        for item in value:
            yield from _frozen_dicts(item)


def _container_types(value) -> set[type]:
    """The types of every container (dict or list-like) in ``value``, all the way down."""
    if isinstance(value, dict):
        return {type(value)}.union(*(_container_types(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return {type(value)}.union(*(_container_types(v) for v in value))
    return set()


def _full_chat_request() -> tuple[Request, dict]:
    """A conversation with every JSON-shaped option set, and the edge's own objects it was built from."""
    case = make_case(5700)
    weather = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
    edge = {
        "messages": _messages(case),
        "tools": [{"type": "function", "function": {"name": "weather", "description": "today's", "parameters": weather}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "required": ["a"]}}},
        "caption": ["a chart"],
        "ocr": ["12 34"],
        "compression": {"method": "truncate", "limit": 40, "roles": ["tool"]},
    }
    return Request(**edge, config=AsymSpecConfig(stop_strings=("END",)), seed=3).checked(), edge


def test_every_field_of_a_checked_request_refuses_change():
    """Not only ``messages``: the tools, the tool choice, the response format, the per-image captions and OCR texts,
    the compression settings and the config are read-only too, and share nothing with the edge's objects."""
    req, edge = _full_chat_request()
    single = Request(image=make_case(5701)["image"], question="What?", caption="c", ocr=False).checked()
    for request in (req, single):
        for f in dataclasses.fields(request):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(request, f.name, getattr(request, f.name))
            assert list(_changeable_parts(getattr(request, f.name), f.name)) == [], f.name
    dicts = list(_frozen_dicts((req.tools, req.tool_choice, req.response_format)))
    assert len(dicts) >= 10  # every level of the tools, the choice and the schema
    for d in dicts:
        with pytest.raises(TypeError, match="read-only"):
            d["added"] = 1
    with pytest.raises(AttributeError):
        req.caption.append("more")  # a tuple
    # the edge's objects change; the checked request does not
    edge["tools"][0]["function"]["parameters"]["properties"]["city"]["enum"].append("Oslo")
    edge["response_format"]["json_schema"]["schema"]["required"].append("b")
    edge["caption"][0] = "changed"
    assert req.tools[0]["function"]["parameters"]["properties"]["city"]["enum"] == ("Paris", "Rome")
    assert req.response_format["json_schema"]["schema"]["required"] == ("a",)
    assert req.caption == ("a chart",) and req.ocr == ("12 34",)


def test_templates_and_grammars_get_plain_copies_of_the_frozen_tools():
    """What leaves the toolkit (the tools a chat template renders, what xgrammar compiles) is a plain ``dict`` /
    ``list`` copy (:func:`thawed`): a change to it leaves the request as it was; JSON of both is the same."""
    req, _ = _full_chat_request()
    rendered = prompt_tools(req.tools, "auto")
    assert _container_types(rendered) == {list, dict} and _container_types(req.tools) == {tuple, FrozenDict}
    rendered[0]["function"]["parameters"]["required"].append("country")
    assert req.tools[0]["function"]["parameters"]["required"] == ("city",)
    plain = thawed(req.response_format)
    assert _container_types(plain) == {list, dict}
    assert json.dumps(plain, sort_keys=True) == json.dumps(req.response_format, sort_keys=True)
    assert thawed(frozen(plain)) == plain
