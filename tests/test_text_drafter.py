"""Text-only drafters (issue #52 item 3): a Qwen3-4B-like text drafter stand-in, built from the real Qwen3 hub files,
loads through ``from_pretrained`` next to the Qwen3-32B stand-in and decodes a compressed conversation (its full view
the whole text, its compressed view and the verifier's the compressed text) equal to the independent no-cache
reference; a cross-family text pair decodes through the vocabulary map; an image is one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_image
from reference import Reference
from two_vocab_reference import TwoVocabReference

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline, Compression
from asymspec_mm.base.errors import TextDrafterImageError, UnknownOptionError
from asymspec_mm.checkpoints.standins import build_text_drafter_standin

PRESETS = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data"
LOG = "\n".join(f"row {i}: sensor {i % 7} read {i * 37 % 101} at step {i * 3}" for i in range(6))
HISTORY = [
    {"role": "system", "content": "You are a careful agent. Read the tool output and answer the question."},
    {"role": "user", "content": "Which sensor read 74?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "log", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": LOG},
    {"role": "user", "content": "Answer with the sensor number."},
]
COMP = Compression("truncate", limit=6, keep_last_turns=1)
# gamma 1 with the fixed gate: a draft passes only where the verifier likes it more than the compressed drafter does,
# so with a drafter this close to the verifier the gate both accepts and rejects (CDA's gamma 0.5 accepts everything)
SETTINGS = [AsymSpecConfig(k=3, gate="fixed", gamma=1.0, beta=1.0, max_new_tokens=6)]


@pytest.fixture(scope="module")
def text_dir(standin_dirs):
    return build_text_drafter_standin(standin_dirs[1].parent, standin_dirs[1])


@pytest.fixture(scope="module")
def text_pipe(text_dir, standin_dirs):
    return AsymSpecPipeline.from_pretrained(text_dir, standin_dirs[1], ocr="none")


def _equal_but_ties(got: list, ref: list, margins: list[float]) -> int:
    """1 when the runs part at a decision within float rounding of a tie in the reference, 0 when equal."""
    if got == ref:
        return 0
    first = next(i for i, (x, y) in enumerate(zip(got + [None] * len(ref), ref + [None] * len(got))) if x != y)
    assert first < len(margins) and margins[first] < 1e-4, (got, ref, first)
    return 1


def test_a_text_drafter_loads_from_its_hub_layout(text_pipe, text_dir):
    assert type(text_pipe.drafter).__name__ == "Qwen3ForCausalLM" and not text_pipe.models.reads_images
    assert text_pipe.vocab_map is None  # the Qwen3 tokenizer on both sides: one vocabulary, checked id by id
    assert text_pipe.drafter.config.vocab_size == 151936 and text_pipe.drafter.config.tie_word_embeddings
    assert text_pipe.eos_ids == {151645, 151643}
    assert (text_dir / "tokenizer.json").read_bytes() == (Path(text_pipe.verifier_tokenizer.name_or_path) / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("cfg", SETTINGS)
def test_asymspec_on_a_compressed_conversation_equals_the_reference(text_pipe, cfg):
    res = text_pipe.chat(HISTORY, compression=COMP, config=cfg)
    full = text_pipe.tokenizer.decode(res.prompts.drafter_full_ids[0])
    comp = text_pipe.tokenizer.decode(res.prompts.drafter_comp_ids[0])
    assert LOG in full and LOG not in comp and "tokens cut" in comp  # the drafter reads it whole, the verifier truncated
    assert text_pipe.verifier_tokenizer.decode(res.prompts.verifier_ids[0]) == comp
    assert res.prompts.pixel_values is None and res.stats["compression_ratio"] > 1.5
    assert [m["role"] for m in res.stats["compressed_view"]] == ["system", "user", "assistant", "tool"]
    reference = Reference(text_pipe, res.prompts)
    ref = reference.run(cfg, text_pipe.eos_ids)
    got = [(ev.token_id, ev.source) for ev in res.trace]
    _equal_but_ties(got, ref, reference.margins)  # equal, or parted at a float tie
    assert {src for _, src in got} >= {"accepted", "fused"}


def test_floor_sd_and_the_drafter_alone_equal_greedy_references(text_pipe):
    cfg = AsymSpecConfig(k=3, max_new_tokens=6)
    floor = text_pipe.chat(HISTORY, compression=COMP, method="floor", config=cfg)
    ref = Reference(text_pipe, floor.prompts)
    assert floor.token_ids == ref.greedy("verifier", 6, text_pipe.eos_ids)
    sd = text_pipe.chat(HISTORY, compression=COMP, method="sd", config=cfg)
    assert sd.token_ids == floor.token_ids and sd.stats["drafted"] > 0  # the text drafter on the compressed view drafts
    alone = text_pipe.chat(HISTORY, compression=COMP, method="drafter", config=cfg)
    assert alone.token_ids == ref.greedy("drafter_full", 6, text_pipe.eos_ids)


def test_a_question_without_an_image_is_its_one_turn_conversation(text_pipe):
    cfg = AsymSpecConfig(max_new_tokens=8)
    res = text_pipe.generate(None, "What is the capital of France?", config=cfg)
    chat = text_pipe.chat([{"role": "user", "content": "What is the capital of France?"}], config=cfg)
    assert res.token_ids == chat.token_ids and res.request.is_chat
    with pytest.raises(UnknownOptionError, match="caption describes an image but the request has none") as err:
        text_pipe.generate(None, "What?", caption="a cat")
    assert err.value.param == "caption"
    batch = text_pipe.generate_batch(
        [{"image": None, "question": "What is the capital of France?"}, {"messages": HISTORY, "compression": COMP}],
        config=cfg,
        batch_size=2,
    )
    assert batch[0].token_ids == res.token_ids  # batched rows: the text drafter's streams on text row engines
    assert batch[1].token_ids == text_pipe.chat(HISTORY, compression=COMP, config=cfg).token_ids


def test_an_image_sent_to_a_text_pair_is_one_line_naming_a_vl_drafter(text_pipe):
    img = make_image(1, (64, 64))
    with_image = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "What?"}]}]
    calls = (lambda: text_pipe.generate(img, "What is it?"), lambda: text_pipe.chat(with_image), lambda: text_pipe.compressed_view(img))
    for call in calls:
        with pytest.raises(TextDrafterImageError) as err:
            call()
        msg = str(err.value)
        assert "text-only model and cannot read images" in msg and "vision-language drafter" in msg and "\n" not in msg


def test_a_cross_family_text_pair_decodes_through_the_vocabulary_map():
    """The bundled tiny verifier (a Qwen3 text model, byte-level BPE) drafts for the tiny-xfamily verifier (Llama-3
    style SentencePiece): two vocabularies, the map between them, the loop equal to the two-vocabulary reference."""
    pipe = AsymSpecPipeline.from_pretrained(PRESETS / "tiny" / "verifier", PRESETS / "tiny-xfamily" / "verifier", ocr="none")
    assert pipe.vocab_map is not None and not pipe.models.reads_images
    history = [{"role": "user", "content": "Which sensor read 74?"}]
    cfg = AsymSpecConfig(k=3, max_new_tokens=5)
    res = pipe.chat(history, config=cfg)
    reference = TwoVocabReference(pipe, res.prompts)
    ref = reference.run(cfg, pipe.eos_ids)
    _equal_but_ties([(ev.token_id, ev.source, ev.verifier_alone) for ev in res.trace], ref, reference.margins)
    floor = pipe.chat(history, config=cfg, method="floor")
    assert floor.token_ids == reference.greedy_verifier(5, pipe.eos_ids)


def test_a_summary_by_the_pipelines_own_model_equals_its_greedy_answer(tiny_pipe):
    """``summary`` with ``summarizer="verifier"`` (or ``"drafter"``): the pipeline's own model writes each older
    message's summary, a row of the engine loop that sets the request up (the pipeline's direct loop, a scheduler's
    loop) or, set up outside any loop (the preparer called alone), on its single-row engines; each text equals that model's
    greedy answer to the summary prompt, decoded here without the pipeline's engines (a full forward per token)."""
    import torch

    from asymspec_mm.core.loop_client import direct_loop, serving_loop
    from asymspec_mm.request.compression import COMPRESSED
    from asymspec_mm.request.request import request_of
    from asymspec_mm.request.summarizer import SUMMARY_PROMPT, chat_prompt_ids

    history = [
        {"role": "user", "content": "Read the log.\n" + LOG},
        {"role": "assistant", "content": "Read."},
        {"role": "user", "content": "Which?"},
    ]
    while (other := serving_loop(tiny_pipe)) is not None:  # another file's scheduler left serving: none is wanted here
        other.close()
    loop = direct_loop(tiny_pipe)
    for who in ("verifier", "drafter"):
        model = tiny_pipe.verifier if who == "verifier" else tiny_pipe.drafter
        tok = tiny_pipe.verifier_tokenizer if who == "verifier" else tiny_pipe.processor.tokenizer
        ids, want = chat_prompt_ids(tiny_pipe.models, who, SUMMARY_PROMPT.format(text=history[0]["content"])), []
        with torch.no_grad():
            while len(want) < 5 and (not want or want[-1] not in tiny_pipe.eos_ids):
                want.append(int(model(input_ids=torch.tensor([ids + want])).logits[0, -1].argmax()))
        want_text = tok.decode(want, skip_special_tokens=True).strip()
        kw = dict(compression=f"summary,summarizer={who},limit=5,keep_last_turns=1", max_new_tokens=2, ocr=False)
        COMPRESSED.clear()  # each place below writes its summary (none is read from the cache)
        summaries = loop.added["summary"]
        res = tiny_pipe.chat(history, **kw)
        written = len(res.stats["compressed_view"])  # the two older messages, each summarized
        assert written == 2 and loop.added["summary"] == summaries + written  # each a row of the direct loop
        assert res.stats["compressed_view"][0]["text"] == want_text
        COMPRESSED.clear()
        with tiny_pipe.scheduler(max_batch_size=2) as sched:
            res = sched.submit_chat(history, **kw).result(timeout=120)
        assert res.stats["compressed_view"][0]["text"] == want_text
        COMPRESSED.clear()
        session = tiny_pipe.set_up(request_of(None, messages=history, **kw))  # pipe.set_up: the direct loop's rows too
        assert tiny_pipe.run(session).result.stats["compressed_view"][0]["text"] == want_text
        assert loop.added["summary"] == summaries + 2 * written
        COMPRESSED.clear()
        session = tiny_pipe.preparer.set_up(request_of(None, messages=history, **kw))  # outside any loop: the home loop's
        assert tiny_pipe.run(session).result.stats["compressed_view"][0]["text"] == want_text
        assert loop.added["summary"] == summaries + 3 * written
    with pytest.raises(UnknownOptionError, match="summarizer='gpt' must be a model the pipeline holds") as err:
        Compression.of({"method": "summary", "summarizer": "gpt"})
    assert err.value.param == "compression.summarizer"


def test_the_cli_answers_a_text_pair_on_every_command(text_pipe, text_dir, standin_dirs, tmp_path, capsys):
    """The commands on the text pair: ``chat --messages FILE --compression SPEC`` answers as ``pipe.chat`` and lists
    each compressed message as the verifier read it; ``generate`` without ``--image`` and a ``batch`` line without
    ``image`` answer as ``pipe.generate(None, q)`` (a line with an image fails alone, naming a VL drafter); ``eval
    mathvista`` is refused once; a bad ``--compression`` is one line before any model loads."""
    import json

    from asymspec_mm.cli.main import main

    path = tmp_path / "messages.json"
    path.write_text(json.dumps(HISTORY), encoding="utf-8")
    models = ["--drafter", str(text_dir), "--verifier", str(standin_dirs[1]), "--ocr-engine", "none", "-q"]
    chat = ["chat", "--messages", str(path), "--compression", "truncate,limit=6,keep_last_turns=1", "--max-new-tokens", "4"]
    assert main([*chat, *models]) == 0
    printed = capsys.readouterr().out.splitlines()
    want = text_pipe.chat(HISTORY, compression=COMP, max_new_tokens=4)
    assert printed[0] == f"answer: {want.text}" and any(line.startswith("  [3] tool: row 0:") and "tokens cut" in line for line in printed)
    assert main([*chat, "--json", *models]) == 0
    data = json.loads(capsys.readouterr().out)  # decoded as a row of the engine core: a row's stats
    assert data["token_ids"] == want.token_ids and data["stats"]["batch_size"] == 1 and data["stats"]["engine_calls"] > 0
    question = "What is the capital of France?"
    alone = text_pipe.generate(None, question, max_new_tokens=4)
    assert main(["generate", "--question", question, "--max-new-tokens", "4", "--json", *models]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == alone.token_ids
    inp, out = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    make_image(4, (32, 32)).save(tmp_path / "x.png")
    lines = [{"id": 1, "question": question}, {"id": 2, "image": "x.png", "question": "What?"}]
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert main(["batch", "--input", str(inp), "--output", str(out), "--max-new-tokens", "4", "--no-progress", *models[:-1]]) == 1
    (answer,) = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert answer["id"] == 1 and answer["answer"] == alone.text
    (error,) = [json.loads(x) for x in (tmp_path / "a.jsonl.errors.jsonl").read_text(encoding="utf-8").splitlines()]
    assert error["id"] == 2 and "vision-language drafter" in error["error"]
    capsys.readouterr()
    evaluation = ["eval", "mathvista", "--dataset", "minivista", "--limit", "1", "--out", str(tmp_path / "eval"), *models[:-1]]
    assert main(evaluation) == 2  # every MiniVista problem has an image: refused once, not problem by problem
    assert "eval mathvista asks about images: this pair's drafter" in capsys.readouterr().err
    assert main(["chat", "--messages", str(path), "--compression", "truncate,rate=2", *models]) == 2
    assert "--compression.rate=2 must be a number in (0, 1]" in capsys.readouterr().err


def test_the_demo_loads_a_text_pair_and_answers_a_question_without_an_image(text_pipe, tmp_path):
    """The inspector on a text pair: the image input says images need a VL drafter and takes none; a question alone
    runs (AsymSpec with Floor and the drafter alone beside it) and answers as the library does; an upload is the
    library's one-line refusal."""
    import gradio as gr

    from ui import app as ui_app

    demo = ui_app.build_app(text_pipe, examples=[])
    (image,) = [c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "asym-image"]
    assert "images need a vision-language drafter" in image.label and image.interactive is False
    state = ui_app.DemoApp(text_pipe, stream_interval=0.0)
    try:
        args = ("", "", False, "asymspec", 4, 1.0, 0.5, "cda", "contrast", "verifier", 4, "image+text", True)
        last = ui_app.outputs_as_dict(list(state.run(None, "What is the capital of France?", *args, session="text"))[-1])
        assert "Done" in last["status"]
        assert last["answer_text"] == text_pipe.generate(None, "What is the capital of France?", max_new_tokens=4).text
        make_image(2, (32, 32)).save(tmp_path / "q.png")
        with pytest.raises(gr.Error, match="text-only model and cannot read images"):
            list(state.run({"path": str(tmp_path / "q.png")}, "What?", *args, session="image"))
    finally:
        state.close()


@pytest.fixture(scope="module")
def server_pipe(text_pipe):
    """This module's server serves the text pair."""
    return text_pipe


def test_the_server_answers_a_text_pair_on_chat_completions_and_responses(text_pipe, client):
    """The openai client against the text pair: chat completions with compression and the Responses API each answer
    as ``pipe.chat``; an image is a 400 naming the fix, and the server keeps serving."""
    import openai

    resp = client.chat.completions.create(
        model=text_pipe.name,
        messages=HISTORY,
        max_tokens=4,
        extra_body={"asymspec": {"compression": {"method": "truncate", "limit": 6, "keep_last_turns": 1}, "return_trace": True}},
    )
    want = text_pipe.chat(HISTORY, compression=COMP, max_new_tokens=4)
    assert [t["token_id"] for t in resp.model_extra["asymspec"]["trace"]] == want.token_ids
    assert resp.model_extra["asymspec"]["view"]["messages"] == want.stats["compressed_view"]
    answer = client.responses.create(model=text_pipe.name, input="What is the capital of France?", max_output_tokens=4)
    assert answer.output_text == text_pipe.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=4).text
    import base64
    import io

    buf = io.BytesIO()
    make_image(3, (32, 32)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with_image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=text_pipe.name, messages=with_image, max_tokens=2)
    assert "text-only model and cannot read images: load a vision-language drafter" in str(err.value)
    assert client.chat.completions.create(model=text_pipe.name, messages=HISTORY[1:2], max_tokens=1).choices[0].message is not None
