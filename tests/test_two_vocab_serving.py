"""A cross-family pair everywhere a request goes (issue #44 item 2): batched rows equal single rows (generate_batch, the
scheduler with every method in one batch, preemption), conversations render each model's own chat template and reuse
each stream's context in its own ids, a JSON schema is followed, and the server answers an ``openai`` client with the
tokens the pipeline gives alone."""

from __future__ import annotations

import json

import pytest

from asymspec_mm import AsymSpecConfig
from asymspec_mm.eval import minivista as mv


@pytest.fixture(scope="module")
def cases():
    return [dict(image=p["decoded_image"], question=p["query"], caption=p["caption"], ocr=p["ocr"]) for p in mv.generate(6, seed=1)]


def test_batched_rows_equal_single_rows(two_vocab_pipe, cases):
    pipe = two_vocab_pipe
    cfg = AsymSpecConfig(k=3, max_new_tokens=16)
    singles = [pipe.generate(**c, config=cfg) for c in cases[:4]]
    batch = pipe.generate_batch(cases[:4], config=cfg, batch_size=3)
    for one, row in zip(singles, batch):
        assert row.token_ids == one.token_ids
        assert [(e.source, e.verifier_alone, e.drafter_token_id) for e in row.trace] == [
            (e.source, e.verifier_alone, e.drafter_token_id) for e in one.trace
        ]
    assert max(r.stats["batch_size"] for r in batch) == 3


def test_every_method_in_one_scheduler_batch_equals_itself_alone(two_vocab_pipe, cases):
    pipe = two_vocab_pipe
    mix = [("asymspec", dict(k=3)), ("floor", {}), ("drafter", {}), ("asymspec", dict(k=2, bonus="gated")), ("asymspec", dict(k=4))]
    # the last request has no caption: the drafter writes it as a row of the same batch, in its own ids
    asks = [dict(c, method=m, **kw) for c, (m, kw) in zip(cases, mix)] + [dict(cases[5], caption=None)]
    with pipe.scheduler(max_batch_size=8) as sched:
        got = [h.result() for h in [sched.submit(**ask, max_new_tokens=14) for ask in asks]]
    for ask, res in zip(asks, got):
        alone = pipe.generate(**ask, max_new_tokens=14)
        assert res.token_ids == alone.token_ids and res.text == alone.text, ask["method"] if "method" in ask else "caption"
    assert got[-1].view.caption and got[-1].stats["caption_s"] > 0  # written by the drafter here
    assert max(r.stats["batch_size"] for r in got) >= len(mix)


def test_a_preempted_row_is_fed_back_its_own_ids(two_vocab_pipe, cases):
    """Preemption rebuilds each stream from its prompt and its tokens: the drafter's streams in the drafter's ids."""
    from asymspec_mm.core.decoder import BatchDecoder

    pipe = two_vocab_pipe
    cfg = AsymSpecConfig(k=3, max_new_tokens=20)
    decoder = BatchDecoder(pipe)
    for i, (c, m) in enumerate(zip(cases[:3], ("asymspec", "drafter", "floor"))):
        decoder.add(i, pipe.prepare(**c, method=m, config=cfg, ignore_eos=True, prefill=False))
    while decoder.arriving:
        decoder.prefill_step()
    results = {}
    for _ in range(2):
        results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
    for rid in list(decoder.rows):
        decoder.preempt(rid)
        decoder.resume(rid)
        while rid in decoder.arriving.rows:
            decoder.prefill_step()
    while decoder.rows:
        results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
    for i, (c, m) in enumerate(zip(cases[:3], ("asymspec", "drafter", "floor"))):
        alone = pipe.generate(**c, method=m, config=cfg, ignore_eos=True)
        assert results[i].token_ids == alone.token_ids and results[i].stats["preemptions"] == 1, m


def test_a_conversation_renders_each_template_and_reuses_each_stream_in_its_own_ids(two_vocab_pipe, two_vocab_verifier, cases):
    from two_vocab_pair import TINY_DRAFTER

    from asymspec_mm import AsymSpecPipeline

    c = cases[0]
    first = [{"role": "user", "content": [{"type": "image", "image": c["image"]}, {"type": "text", "text": c["question"]}]}]
    kw = dict(caption=c["caption"], ocr=c["ocr"], config=AsymSpecConfig(k=3, max_new_tokens=12))
    one = two_vocab_pipe.chat(first, **kw)
    turns = first + [{"role": "assistant", "content": one.text}, {"role": "user", "content": "Say it again."}]
    again = two_vocab_pipe.chat(turns, **kw)
    fresh = AsymSpecPipeline.from_pretrained(TINY_DRAFTER, two_vocab_verifier, ocr="none", prefix_cache_bytes=0).chat(turns, **kw)
    assert again.token_ids == fresh.token_ids
    assert all(again.stats["cached_tokens"][name] > 0 for name in ("drafter_full", "drafter_comp", "verifier"))
    v_text = two_vocab_pipe.verifier_tokenizer.decode(again.prompts.verifier_ids[0])
    d_text = two_vocab_pipe.processor.tokenizer.decode(again.prompts.drafter_comp_ids[0])
    assert v_text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert v_text.endswith(
        f"{one.text.strip()}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nSay it again.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert d_text.startswith("<|im_start|>user") and d_text.endswith("<|im_start|>assistant\n") and "<|eot_id|>" not in d_text


def test_a_json_schema_answer_follows_the_schema(two_vocab_pipe, cases):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["A", "B", "C", "D"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "choice", "schema": schema}}
    for c in cases[:3]:
        messages = [{"role": "user", "content": [{"type": "image", "image": c["image"]}, {"type": "text", "text": c["question"]}]}]
        res = two_vocab_pipe.chat(
            messages, caption=c["caption"], ocr=c["ocr"], response_format=fmt, config=AsymSpecConfig(k=3, max_new_tokens=40)
        )
        jsonschema.validate(json.loads(res.text), schema)
        assert any(ev.source == "accepted" for ev in res.trace)
        assert all(ev.drafter_token_id is not None for ev in res.trace)


def test_the_server_answers_an_openai_client_as_the_pipeline_alone(two_vocab_pipe, cases):
    import base64
    import io

    openai = pytest.importorskip("openai")
    from asymspec_mm.serve import ServerThread, create_app

    def url(img) -> str:
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    cfg = AsymSpecConfig(k=3, max_new_tokens=16)
    app = create_app(two_vocab_pipe, max_batch_size=4)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        for c in cases[:2]:
            alone = two_vocab_pipe.generate(**c, config=cfg)
            messages = [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url(c["image"])}}, {"type": "text", "text": c["question"]}],
                }
            ]
            extra = {"asymspec": {"caption": c["caption"], "ocr": c["ocr"], "k": 3, "return_trace": True}}
            got = client.chat.completions.create(model="x", messages=messages, max_tokens=16, extra_body=extra)
            assert got.choices[0].message.content == alone.text
            trace = got.model_extra["asymspec"]["trace"]
            assert [t["token_id"] for t in trace] == alone.token_ids
            assert [(t["drafter_token_id"], t["verifier_alone"]) for t in trace] == [
                (e.drafter_token_id, e.verifier_alone) for e in alone.trace
            ]
            assert all(t["drafter_token_id"] == two_vocab_pipe.vocab_map.to_drafter[t["token_id"]] for t in trace)
            streamed = client.chat.completions.create(model="x", messages=messages, max_tokens=16, extra_body=extra, stream=True)
            assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == alone.text
        # symmetric SD cannot run on two vocabularies: a 400 naming the field as the client spelled it
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="x", messages=messages, max_tokens=4, extra_body={"asymspec": {"method": "sd"}})
        body = err.value.body
        assert body["param"] == "asymspec.method" and 'method "floor"' in body["message"]
