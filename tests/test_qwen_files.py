"""The real Qwen3-32B / Qwen3-VL-2B-Instruct hub files shipped in the package, and the pipeline on stand-ins built
from them (the real tokenizer, templates, processor and configs; reduced sizes, random weights)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_image, start_serve, stop_serve
from PIL import Image

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.errors import ContextOverflowError, VocabularyMismatchError
from asymspec_mm.checkpoints.qwen_files import DATA_DIR, DRAFTER, SNAPSHOT_FILES, VERIFIER, chat_template, hub_snapshot, pinned_sha256

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    """``{model: folder}``: complete hub-layout snapshots written by :func:`hub_snapshot`."""
    out = tmp_path_factory.mktemp("qwen_snapshots")
    return {m: hub_snapshot(m, out / m) for m in (VERIFIER, DRAFTER)}


@pytest.fixture(scope="module")
def real_tok(snapshots):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(snapshots[VERIFIER])


@pytest.fixture(scope="module")
def real_proc(snapshots):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(snapshots[DRAFTER])


# ---------------------------------------------------------------- the files themselves


def test_every_stored_and_derived_file_has_the_hub_files_sha256(snapshots):
    pins = pinned_sha256()
    assert len(pins) == 15 and (DATA_DIR / "PROVENANCE.md").is_file() and "Apache License" in (DATA_DIR / VERIFIER / "LICENSE").read_text()
    for model, files in SNAPSHOT_FILES.items():
        assert sorted(p.name for p in snapshots[model].iterdir()) == sorted(files)
        for name in files:
            data = (snapshots[model] / name).read_bytes()
            key = f"{model}/{name}"
            if key == f"{DRAFTER}/tokenizer.json":  # the caveat: the Qwen3 file, not the VL repo's bytes
                assert data == (snapshots[VERIFIER] / name).read_bytes()
                assert key not in pins
            else:
                assert hashlib.sha256(data).hexdigest() == pins[key], key
            if files[name] == "stored":
                assert (DATA_DIR / model / name).read_bytes() == data
    assert (snapshots[DRAFTER] / "merges.txt").read_bytes().split(b"\n", 1)[0] != b"#version: 0.2"


def test_no_test_reads_the_shared_folder():
    """A user's clone has no shared folder beside it: nothing under tests/ may point there."""
    needles = ("../" + "shared", "parents[1]" + ".parent", "/work/" + "shared", "'sha" + "red'", '"sha' + 'red"')
    here = Path(__file__).name  # this test spells the needles
    offenders = [p.name for p in (ROOT / "tests").glob("*.py") if p.name != here and any(n in p.read_text() for n in needles)]
    assert offenders == []


def test_real_tokenizer_ids(real_tok, real_proc):
    assert len(real_tok) == 151669 and len(real_proc.tokenizer) == 151669
    ids = real_tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>"])
    assert ids == [151643, 151644, 151645, 151652, 151655]
    assert real_tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<tool_response>", "<think>", "</think>"]) == [
        151657,
        151658,
        151665,
        151667,
        151668,
    ]
    assert real_tok("Hello world")["input_ids"] == [9707, 1879]
    assert real_proc.tokenizer("Hello world")["input_ids"] == [9707, 1879]
    assert real_tok.chat_template == chat_template(VERIFIER) and real_proc.chat_template == chat_template(DRAFTER)


# ---------------------------------------------------------------- the tiny pair renders with the real templates


def test_tiny_pair_templates_are_the_real_ones_and_minivista_prompts_keep_their_layout():
    """Byte for byte the real templates; for MiniVista's one-user-message prompts they render the layout the pair was
    trained on (the previous hand-written templates' output, spelled out here), so no retraining was needed."""
    from transformers import AutoProcessor, AutoTokenizer

    from asymspec_mm.eval import minivista as mv
    from asymspec_mm.pipeline.presets import resolve_preset
    from asymspec_mm.request.prompts import build_prompts

    preset = resolve_preset("tiny")
    proc, tok = AutoProcessor.from_pretrained(preset.drafter), AutoTokenizer.from_pretrained(preset.verifier)
    assert Path(preset.drafter, "chat_template.jinja").read_text() == chat_template(DRAFTER) == proc.chat_template
    assert Path(preset.verifier, "chat_template.jinja").read_text() == chat_template(VERIFIER) == tok.chat_template
    ids = lambda t, text: t(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for seed in (mv.TRAIN_SEED, mv.HELDOUT_SEED):
        for problem in mv.generate(24, seed=seed):
            view, query = mv.view_text(problem), problem["query"]
            text = f"{view.strip()}\n\n{query}" if view.strip() else query
            p = build_prompts(proc, tok, problem["decoded_image"], view, query)
            want_v = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
            want_c = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
            assert p.verifier_ids[0].tolist() == ids(tok, want_v)
            assert p.drafter_comp_ids[0].tolist() == ids(proc.tokenizer, want_c)
            n_img = int(p.image_grid_thw.prod()) // 4
            want_f = want_c.replace("user\n", "user\n<|vision_start|>" + "<|image_pad|>" * n_img + "<|vision_end|>", 1)
            assert p.drafter_full_ids[0].tolist() == ids(proc.tokenizer, want_f)


def test_tiny_tokenizer_has_one_plain_token_per_tool_tag():
    """The tiny tokenizer holds each tool tag as one added token, as the real tokenizer does (151657, 151665, ...), and
    like Qwen's it is not special: an answer's text keeps its tags when special tokens are skipped."""
    from transformers import AutoTokenizer

    from asymspec_mm.pipeline.presets import resolve_preset

    tok = AutoTokenizer.from_pretrained(resolve_preset("tiny").verifier)
    for tag in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == tag
        assert ids[0] not in tok.all_special_ids


# ---------------------------------------------------------------- image sizing and positions on the real configs

SIZES = [(1, 1), (28, 28), (100, 60), (1514, 720), (640, 480), (4000, 60), (60, 4000), (3000, 2000), (5000, 4000), (33, 3000)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_image_token_count_equals_the_real_processor(real_proc, snapshots, size):
    """Tiny, MathVista-typical, very wide / tall, large and over-the-limit images: the count from the
    preprocessor config alone equals what transformers' processor makes of the pixels."""
    from vision_cache.qwen_sizing import image_token_count

    cfg = json.loads((snapshots[DRAFTER] / "preprocessor_config.json").read_text())
    grid = real_proc.image_processor(images=[Image.new("RGB", size, (90, 20, 200))], return_tensors="pt")["image_grid_thw"]
    assert image_token_count(size[1], size[0], cfg) == int(grid.prod()) // 4


def test_mrope_positions_on_the_real_config_equal_get_rope_index(standin_pipe):
    from vision_cache.positions import mrope_positions

    proc = standin_pipe.processor
    assert standin_pipe.drafter.config.text_config.rope_parameters["mrope_section"] == [6, 5, 5]
    assert standin_pipe.drafter.config.text_config.rope_parameters["mrope_interleaved"] is True
    for k, sizes in enumerate([[(40, 30)], [(300, 90), (64, 200)], [(1514 // 4, 720 // 4)]]):
        images = [make_image(50 + k * 3 + i, s) for i, s in enumerate(sizes)]
        content = [item for _ in images for item in ({"type": "text", "text": "look"}, {"type": "image"})]
        content.append({"type": "text", "text": "and answer"})
        text = proc.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
        enc = proc(text=[text], images=images, return_tensors="pt")
        want, delta = standin_pipe.drafter.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"], enc["image_grid_thw"])
        got, got_delta = mrope_positions(enc["mm_token_type_ids"][0], enc["image_grid_thw"], 2)
        assert torch.equal(got, want[:, 0]) and got_delta == int(delta)


# ---------------------------------------------------------------- loading checks on the stand-ins


def test_standins_load_as_hub_snapshots(standin_dirs, standin_pipe):
    d_dir, v_dir = standin_dirs
    assert json.loads((v_dir / "config.json").read_text())["rope_theta"] == 1000000
    assert standin_pipe.verifier.config.vocab_size == standin_pipe.drafter.config.text_config.vocab_size == 151936
    assert standin_pipe.verifier.config.max_position_embeddings == 40960
    assert standin_pipe.drafter.config.text_config.max_position_embeddings == 262144
    assert standin_pipe.eos_ids == {151645, 151643}  # both generation_configs: [151645, 151643]
    assert standin_pipe.processor.image_processor.size == {"longest_edge": 16777216, "shortest_edge": 65536}
    assert (standin_pipe.processor.image_processor.patch_size, standin_pipe.processor.image_processor.merge_size) == (16, 2)


def test_vocabulary_check_passes_the_real_pair_and_names_the_first_difference(snapshots, real_tok, real_proc, tmp_path):
    from transformers import AutoTokenizer

    from asymspec_mm.engines.loading import check_vocabularies

    check_vocabularies(real_proc.tokenizer, real_tok, 151936, 151936)
    # ids: two vocabulary entries swapped
    swapped = tmp_path / "swapped"
    shutil.copytree(snapshots[VERIFIER], swapped)
    spec = json.loads((swapped / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["Hello"], vocab["world"] = vocab["world"], vocab["Hello"]
    (swapped / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(
        VocabularyMismatchError,
        match=r"2 of 151669 shared ids hold different tokens \(first: id 9707: drafter 'world' vs verifier 'Hello', id 14615",
    ):
        check_vocabularies(AutoTokenizer.from_pretrained(swapped), real_tok, 151936, 151936)
    # added tokens: one more, and one whose special flag differs
    extra = AutoTokenizer.from_pretrained(snapshots[VERIFIER])
    extra.add_tokens(["<|my_tool|>"], special_tokens=True)
    with pytest.raises(VocabularyMismatchError, match=r"added token id 151669: drafter absent vs verifier '<\|my_tool\|>' \(special\)"):
        check_vocabularies(real_proc.tokenizer, extra, 151936, 151936)
    flag = tmp_path / "flag"
    shutil.copytree(snapshots[VERIFIER], flag)
    spec = json.loads((flag / "tokenizer.json").read_text(encoding="utf-8"))
    next(t for t in spec["added_tokens"] if t["content"] == "<tool_call>")["special"] = True
    (flag / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tc = json.loads((flag / "tokenizer_config.json").read_text(encoding="utf-8"))
    tc["added_tokens_decoder"]["151657"]["special"] = True
    (flag / "tokenizer_config.json").write_text(json.dumps(tc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(
        VocabularyMismatchError, match=r"added token id 151657: drafter '<tool_call>' \(not special\) vs verifier '<tool_call>' \(special\)"
    ):
        check_vocabularies(real_proc.tokenizer, AutoTokenizer.from_pretrained(flag), 151936, 151936)


def test_prompts_equal_the_real_templates_token_for_token(standin_pipe, real_tok, real_proc):
    """The verifier's prompt is Qwen3's template with thinking off; the drafter's two are Qwen3-VL's with and
    without the image (pixels and grid as the real processor makes them)."""
    img = make_image(3, (300, 180))
    session = standin_pipe.prepare(img, "How many bars are there?", caption="a bar chart", ocr="12 30 7", prefill=True)
    p = session.prompts
    text = session.view.render().strip() + "\n\nHow many bars are there?"
    want_v = real_tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, enable_thinking=False, return_dict=True
    )["input_ids"]
    assert p.verifier_ids[0].tolist() == list(want_v)
    comp = real_proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": text}]}], tokenize=True, add_generation_prompt=True, return_dict=True
    )
    assert p.drafter_comp_ids[0].tolist() == list(comp["input_ids"][0] if hasattr(comp["input_ids"][0], "__len__") else comp["input_ids"])
    full = real_proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": text}]}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )
    assert torch.equal(p.drafter_full_ids, full["input_ids"]) and torch.equal(p.image_grid_thw, full["image_grid_thw"])
    assert torch.equal(p.pixel_values, full["pixel_values"]) and torch.equal(p.mm_token_type_ids, full["mm_token_type_ids"])


def test_context_window_comes_from_the_real_config(standin_pipe):
    with pytest.raises(ContextOverflowError, match=r"the verifier prompt has 4\d{4} tokens.*context window is 40960"):
        standin_pipe.prepare(make_image(1, (64, 64)), "word " * 41000 + "?", caption="", ocr="", prefill=True)


# ---------------------------------------------------------------- the whole path on the stand-ins


@pytest.mark.parametrize("method", ["asymspec", "floor", "drafter", "sd"])
def test_generate_every_method_on_standins(standin_pipe, method):
    res = standin_pipe.generate(
        make_image(7, (120, 90)), "What is shown?", caption="a chart", ocr="", method=method, config=AsymSpecConfig(max_new_tokens=12)
    )
    assert len(res.token_ids) == 12 or res.token_ids[-1] in standin_pipe.eos_ids
    assert all(0 <= t < 151936 for t in res.token_ids) and res.text == standin_pipe.tokenizer.decode(
        res.token_ids, skip_special_tokens=True
    )
    if method in ("asymspec", "sd"):
        assert res.stats["drafted"] > 0


def test_generate_batch_on_standins_equals_single_requests(standin_pipe):
    reqs = [
        {"image": make_image(20 + i, (90 + 30 * i, 80)), "question": f"Question {i}?", "caption": "a chart", "ocr": str(i)}
        for i in range(3)
    ]
    cfg = AsymSpecConfig(max_new_tokens=10)
    batched = standin_pipe.generate_batch(reqs, config=cfg, batch_size=3)
    for req, res in zip(reqs, batched):
        assert res.token_ids == standin_pipe.generate(**req, config=cfg).token_ids


@pytest.mark.timeout(300)
def test_serve_on_standins_answers_the_openai_client(standin_dirs, standin_pipe):
    import base64
    import io

    import openai

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--drafter", str(standin_dirs[0]), "--verifier", str(standin_dirs[1])]
    proc, url = start_serve(cmd + ["--ocr-engine", "none", "--port", "0", "--log-level", "warning"], ROOT, env)
    try:
        img = make_image(4, (100, 70))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        ref = standin_pipe.generate(img, "What is it?", caption="a box", ocr="", config=AsymSpecConfig(max_new_tokens=6))
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        resp = client.chat.completions.create(
            model="standin",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is it?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}},
                    ],
                }
            ],
            max_tokens=6,
            extra_body={"asymspec": {"caption": "a box", "ocr": ""}},
        )
        assert resp.choices[0].message.content == ref.text
        assert resp.usage.prompt_tokens == ref.prompts.verifier_ids.shape[1]
    finally:
        stop_serve(proc)


@pytest.mark.parametrize("protocol", ["mathvista", "paper"])
def test_eval_dump_prompts_with_the_real_verifier_tokenizer(standin_dirs, real_tok, tmp_path, protocol):
    from asymspec_mm.cli.main import main

    out = tmp_path / "prompts.jsonl"
    args = ["eval", "mathvista", "--protocol", protocol, "--tasks", "FQA", "--limit", "5", "--dump-prompts", str(out)]
    assert main(args + ["--verifier", str(standin_dirs[1])]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        want = real_tok.apply_chat_template(
            [{"role": "user", "content": row["verifier_user_text"]}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        assert row["verifier_prompt"] == want and want.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert row["verifier_prompt_tokens"] == len(real_tok(want, add_special_tokens=False)["input_ids"])


PAPER_LENGTHS = (
    "verifier prompt: longest 1,028 tokens (pid 394), median 370, 0 over 32,704\n"
    "drafter full view: longest 7,219 tokens (pid 688), median 569, 0 over 32,704"
)


def test_paper_protocol_prompt_lengths_with_the_real_files(snapshots, real_tok, real_proc, tmp_path, capsys):
    """All 587 paper-protocol prompts with the real tokenizers: none exceeds the harness' 32,704-token window; the
    figures are the MathVista page's (docs/mathvista.md). A row's counts equal the real tokenizer's / processor's own."""
    from asymspec_mm.cli.main import main

    out = tmp_path / "paper.jsonl"
    args = ["eval", "mathvista", "--protocol", "paper", "--require-caption", "--dump-prompts", str(out)]
    assert main(args + ["--verifier", str(snapshots[VERIFIER]), "--drafter", str(snapshots[DRAFTER])]) == 0
    printed = capsys.readouterr().out
    assert "587 prompts (paper protocol)" in printed and PAPER_LENGTHS in printed
    page = " ".join((ROOT / "docs" / "mathvista.md").read_text(encoding="utf-8").split())
    assert "the longest verifier prompt is 1,028 tokens (pid 394; median 370)" in page
    assert "7,219 tokens (pid 688, 6,633 of them the image's; median 569)" in page
    rows = {r["pid"]: r for r in map(json.loads, out.read_text().splitlines())}
    row = rows["688"]
    assert row["verifier_prompt_tokens"] == len(real_tok(row["verifier_prompt"], add_special_tokens=False)["input_ids"])
    from asymspec_mm.eval.mathvista.shipped import SHIPPED_DIR

    meta = json.loads((SHIPPED_DIR / "testmini.json").read_text(encoding="utf-8"))["688"]["metadata"]
    # the image's own count, through the real processor on an image of the recorded size
    grid = real_proc.image_processor(images=[Image.new("RGB", (meta["img_width"], meta["img_height"]))], return_tensors="pt")
    assert row["image_tokens"] == int(grid["image_grid_thw"].prod()) // 4 == 6633
