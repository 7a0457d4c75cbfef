"""Public API, exact counters, bad input, vocabulary check, captioner and CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_case, make_image

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline, MMResult
from asymspec_mm.base.errors import (
    ContextOverflowError,
    EmptyQuestionError,
    MissingCompressedViewError,
    UnknownOptionError,
    VocabularyMismatchError,
)
from vision_cache.image import InvalidImageError


def test_result_shape_and_trace_fields(tiny_pipe):
    case = make_case(2)
    res = tiny_pipe.generate(
        case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], config=AsymSpecConfig(max_new_tokens=12)
    )
    assert isinstance(res, MMResult) and res.method == "asymspec"
    assert res.token_ids == [ev.token_id for ev in res.trace]
    assert res.text == tiny_pipe.tokenizer.decode(res.token_ids, skip_special_tokens=True)
    assert res.view.caption == case["caption"] and res.view.ocr_text == case["ocr"]
    for ev in res.trace:
        assert ev.source in ("accepted", "fused", "bonus")
        assert 0.0 <= ev.p_verifier <= 1.0 and ev.verifier_argmax is not None
        assert ev.steered == (ev.token_id != ev.verifier_argmax)
        if ev.source != "bonus":
            assert 0.25 - 1e-6 <= ev.gamma_eff <= 0.5 + 1e-6 and 0 <= ev.jsd <= 0.6932
        assert len(ev.top_verifier) == 3 and len(ev.top_fused) == 3
    for key in (
        "steps",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "accepted_per_position",
        "vision_calls",
        "vision_cache_hits",
        "tokens_forwarded",
        "prefill_tokens",
        "wall_s",
        "tokens_per_s",
        "new_tokens",
    ):
        assert key in res.stats
    for attr in ("drafter_full_ids", "drafter_comp_ids", "verifier_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert getattr(res.prompts, attr) is not None
    json.dumps(res.as_dict())


def test_tokens_forwarded_exact_counts(tiny_pipe):
    """Prefill caches prompt[:-1]; each step forwards K on the full stream (+ d_K after K acceptances, in the
    next step's first forward; a last one may stay pending) and K+1 on the others."""
    k = 3
    case = make_case(7)
    image = make_image(7007)  # an image no other test shows this pipeline
    tiny_pipe.prefix_kv.clear()  # and no earlier request's text to reuse either
    res = tiny_pipe.generate(
        image, case["question"], caption=case["caption"], ocr=case["ocr"], config=AsymSpecConfig(k=k, max_new_tokens=15)
    )
    s, p = res.stats, res.prompts
    assert not s["prefix_cache_hit"]
    full_steps = s["accepted_per_position"][k - 1]  # steps whose K drafts were all accepted
    assert 0 < full_steps < s["steps"]
    # nothing stored before this request, and its three prompts are prefilled in the same turn of its engine core
    # (as a row of the loop), one forward each: neither drafter view reuses the other's opening
    assert s["cached_tokens"] == {"drafter_full": 0, "drafter_comp": 0, "verifier": 0}
    assert s["prefill_tokens"] == {
        "drafter_full": p.drafter_full_ids.shape[1] - 1,
        "drafter_comp": p.drafter_comp_ids.shape[1] - 1,
        "verifier": p.verifier_ids.shape[1] - 1,
    }
    fw = s["tokens_forwarded"]
    assert s["deferred_draft_at_end"] in (0, 1)
    assert fw["drafter_full"] == s["prefill_tokens"]["drafter_full"] + k * s["steps"] + full_steps - s["deferred_draft_at_end"]
    # the carried d_K shares a forward with the next pending token: one call per drafted position, never more
    # prefill: one call; then K calls per step
    assert s["forward_calls"]["drafter_full"] == 1 + k * s["steps"]
    assert fw["drafter_comp"] == s["prefill_tokens"]["drafter_comp"] + (k + 1) * s["steps"]
    assert fw["verifier"] == s["prefill_tokens"]["verifier"] + (k + 1) * s["steps"]
    assert s["drafted"] == k * s["steps"]
    assert s["accepted"] == sum(s["accepted_per_position"])
    # Every gate decision of the steps before the last is in the trace; max_new_tokens may cut the last step.
    last = s["steps"]
    before_last = sum(ev.source == "accepted" and ev.step < last for ev in res.trace)
    in_last = sum(ev.source == "accepted" and ev.step == last for ev in res.trace)
    assert before_last + in_last <= s["accepted"] <= before_last + k


def test_bad_inputs_raise_clear_errors(tiny_pipe, tiny_dirs):
    img = make_image(1)
    with pytest.raises(EmptyQuestionError, match="question is empty"):
        tiny_pipe.generate(img, "   ", caption="x", ocr=False)
    with pytest.raises(UnknownOptionError, match="method='beam'"):
        tiny_pipe.generate(img, "q?", caption="x", ocr=False, method="beam")
    with pytest.raises(UnknownOptionError, match="gate='magic'"):
        tiny_pipe.generate(img, "q?", caption="x", ocr=False, gate="magic")
    with pytest.raises(UnknownOptionError, match="k=0"):
        tiny_pipe.generate(img, "q?", caption="x", ocr=False, k=0)
    with pytest.raises(ContextOverflowError, match="context window is 4096"):
        tiny_pipe.generate(img, "word " * 3000 + "?", caption="x", ocr=False)
    with pytest.raises(InvalidImageError):
        tiny_pipe.generate(b"not an image", "q?", caption="x", ocr=False)
    from asymspec_mm import AsymSpecPipeline

    no_captioner = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", captioner=None)
    with pytest.raises(MissingCompressedViewError, match="no caption"):
        no_captioner.generate(img, "q?", caption=None, ocr=False)


def test_vocabulary_mismatch_names_ids(tiny_dirs, tmp_path):
    from transformers import AutoTokenizer

    from asymspec_mm.checkpoints.build import build_tokenizer
    from asymspec_mm.pipeline.facade import check_vocabularies

    d_tok = AutoTokenizer.from_pretrained(tiny_dirs[0])
    other = build_tokenizer(["completely different corpus of words " * 20], vocab_size=len(d_tok))
    with pytest.raises(VocabularyMismatchError, match="shared ids hold different tokens .*id \\d+: drafter"):
        check_vocabularies(d_tok, other, len(d_tok), len(d_tok))
    with pytest.raises(VocabularyMismatchError, match="output logits"):
        check_vocabularies(d_tok, d_tok, 100, 200)
    check_vocabularies(d_tok, AutoTokenizer.from_pretrained(tiny_dirs[1]), 10, 10)
    # Through loading: a verifier saved with another tokenizer is a cross-family pair (tests/test_two_vocab_loading.py),
    # refused when the two vocabularies overlap less than min_vocab_overlap of either.
    import shutil

    bad = tmp_path / "verifier"
    shutil.copytree(tiny_dirs[1], bad)
    for f in bad.glob("tokenizer*"):
        f.unlink()
    other.save_pretrained(bad)
    share = AsymSpecPipeline.from_pretrained(tiny_dirs[0], bad, ocr="none").vocab_map.coverage()["drafter_share"]
    with pytest.raises(VocabularyMismatchError, match="tokens in common"):
        AsymSpecPipeline.from_pretrained(tiny_dirs[0], bad, ocr="none", min_vocab_overlap=share + 0.01)


def test_inputs_of_every_kind(tiny_pipe, tmp_path):
    import numpy as np

    img = make_image(5)
    path = tmp_path / "x.png"
    img.save(path)
    kw = dict(caption="c", ocr=False, method="drafter", config=AsymSpecConfig(max_new_tokens=4))
    outs = [tiny_pipe.generate(x, "q?", **kw).token_ids for x in (img, str(path), path.read_bytes(), np.asarray(img))]
    assert all(o == outs[0] for o in outs)


def test_stop_string_trims_text(tiny_pipe):
    case = make_case(0)
    base = tiny_pipe.generate(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], max_new_tokens=12)
    piece = base.trace[3].text
    if not piece.strip():
        pytest.skip("token 3 is whitespace")
    res = tiny_pipe.generate(
        case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], max_new_tokens=12, stop_strings=(piece,)
    )
    assert res.stats["stopped_by"] == "stop_string" and piece not in res.text
    assert res.token_ids == base.token_ids[: len(res.token_ids)]


def test_generated_caption_is_cached_and_used(tiny_pipe):
    img = make_image(77)
    r1 = tiny_pipe.generate(img, "q?", caption=None, ocr=False, max_new_tokens=3)
    r2 = tiny_pipe.generate(img, "other?", caption=None, ocr=False, max_new_tokens=3)
    assert r1.view.caption == r2.view.caption
    assert tiny_pipe.captioner.cache.hits >= 1
    assert r1.view.render() in tiny_pipe.tokenizer.decode(r1.prompts.verifier_ids[0]) or not r1.view.caption.strip()


def test_streaming_yields_the_same_events(tiny_pipe):
    case = make_case(3)
    gen = tiny_pipe.stream(case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], max_new_tokens=10)
    seen = []
    try:
        while True:
            seen.extend(next(gen))
    except StopIteration as stop:
        res = stop.value
    assert [e.token_id for e in seen] == res.token_ids


def test_cli_generate_prints_result_and_json(tiny_dirs, tmp_path, capsys):
    from asymspec_mm.cli.main import main

    img = tmp_path / "img.png"
    make_image(3).save(img)
    args = [
        "generate",
        "--image",
        str(img),
        "--question",
        "What is shown?",
        "--caption",
        "a chart",
        "--no-ocr",
        "--drafter",
        str(tiny_dirs[0]),
        "--verifier",
        str(tiny_dirs[1]),
        "--max-new-tokens",
        "8",
        "--ocr-engine",
        "none",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "answer:" in out and "acceptance rate" in out and "vision calls 1" in out
    assert main(args + ["--json", "--method", "floor"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["method"] == "floor" and len(data["trace"]) == len(data["token_ids"]) > 0
    assert main(args[:3] + ["--question", " "] + args[5:]) == 2
    assert "question is empty" in capsys.readouterr().err


def test_complete_is_verifier_greedy(tiny_pipe):
    out = tiny_pipe.complete("Extract the answer: The answer is 42.", max_new_tokens=6)
    text = tiny_pipe.verifier_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Extract the answer: The answer is 42."}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    ids = tiny_pipe.verifier_tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    want = []
    for _ in range(6):
        nxt = int(tiny_pipe.verifier(input_ids=torch.cat([ids, torch.tensor([want], dtype=torch.long)], 1)).logits[0, -1].argmax())
        want.append(nxt)
        if nxt in tiny_pipe.eos_ids:
            break
    assert out == tiny_pipe.verifier_tokenizer.decode(want, skip_special_tokens=True).strip()


def test_cli_generate_without_caption_or_ocr(tiny_dirs, tmp_path, capsys):
    """The compressed view is produced: caption by the drafter, OCR by the auto engine (RapidOCR offline)."""
    pytest.importorskip("rapidocr")
    from PIL import ImageDraw

    from asymspec_mm.cli.main import main

    img = make_image(8, (200, 80))
    ImageDraw.Draw(img).text((10, 30), "TOTAL 42", fill=(0, 0, 0))
    path = tmp_path / "img.png"
    img.save(path)
    assert (
        main(
            [
                "generate",
                "--image",
                str(path),
                "--question",
                "What is the total?",
                "--drafter",
                str(tiny_dirs[0]),
                "--verifier",
                str(tiny_dirs[1]),
                "--max-new-tokens",
                "4",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["stats"]["caption_s"] > 0 and data["stats"]["ocr_s"] > 0
    assert data["view"]["caption"] is not None and isinstance(data["view"]["ocr_text"], str)


def test_the_facade_reads_and_writes_through_to_its_parts(tiny_pipe):
    """The pipeline composes a ModelSet and a RequestPreparer: its attributes are theirs, read and written (a
    request set up after ``pipe.eos_ids = ...`` uses the new ids), and it has every member of ServingPipeline."""
    from asymspec_mm.request.models import ModelSet
    from asymspec_mm.request.preparing import RequestPreparer, ServingPipeline

    pipe = tiny_pipe
    assert isinstance(pipe.models, ModelSet) and isinstance(pipe.preparer, RequestPreparer)
    assert pipe.preparer.models is pipe.models
    assert pipe.drafter is pipe.models.drafter and pipe.tokenizer is pipe.models.tokenizer
    assert pipe.captioner is pipe.preparer.captioner and pipe.engines is pipe.preparer.engines
    assert pipe.stream_models("sd") == pipe.models.stream_models("sd")
    assert {name for name in vars(ServingPipeline) if not name.startswith("_")} <= set(dir(pipe))
    case = make_case(5)
    before = pipe.eos_ids
    try:
        pipe.eos_ids = {123}
        assert pipe.models.eos_ids == {123}
        session = pipe.prepare(
            case["image"], case["question"], caption=case["caption"], ocr=False, method="floor", max_new_tokens=2, prefill=True
        )
        assert session.eos_ids == {123}
    finally:
        pipe.eos_ids = before
    assert pipe.models.eos_ids is before
