"""The ``tiny-xfamily`` pair (issue #44, item 4): the second tokenizer family (SentencePiece-style BPE, Llama-3's special
tokens and template), its map to the tiny drafter's vocabulary (checked against decoded strings), the verifier's
training (train.py's problems, a short real run that repeats exactly), the shipped verifier (the builder's vocabulary,
loads through ``from_pretrained``, what it learned alone) and the preset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from asymspec_mm.eval import minivista as mv
from asymspec_mm.tiny import xfamily

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "asymspec_mm" / "presets_data" / "tiny"
SHIPPED = ROOT / "asymspec_mm" / "presets_data" / "tiny-xfamily" / "verifier"


@pytest.fixture(scope="module")
def drafter_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY / "drafter")


@pytest.fixture(scope="module")
def vtok(drafter_tok):
    return xfamily.build_verifier_tokenizer(drafter_tok)


def test_the_second_family_spells_ids_and_specials_its_own_way(vtok, drafter_tok):
    from asymspec_mm.base.vocab_map import special_ids, token_bytes
    from asymspec_mm.checkpoints.xfamily import XFAMILY_SPECIAL_TOKENS

    assert [vtok.convert_tokens_to_ids(t) for t in XFAMILY_SPECIAL_TOKENS] == list(range(6))
    assert all(vtok.added_tokens_decoder[i].special for i in range(6))
    assert vtok.convert_ids_to_tokens(list(range(len(vtok) - 256, len(vtok)))) == [f"<0x{b:02X}>" for b in range(256)]
    assert (vtok.eos_token, vtok.bos_token, vtok.pad_token) == ("<|eot_id|>", "<|begin_of_text|>", "<|finetune_right_pad_id|>")
    pieces = token_bytes(vtok)
    assert vtok.convert_ids_to_tokens(vtok(" tallest", add_special_tokens=False)["input_ids"]) == ["▁tallest"]
    assert pieces[vtok.convert_tokens_to_ids("▁tallest")] == b" tallest"
    assert all(len(vtok(f" {i}", add_special_tokens=False)["input_ids"]) == 1 for i in range(1000))  # Llama-3's numbers
    assert not (set(vtok.get_vocab().items()) & set(drafter_tok.get_vocab().items()))  # no token at the same id alike
    text = "emoji 😀, é and 中"  # outside the corpus: byte fallback, and back
    ids = vtok(text, add_special_tokens=False)["input_ids"]
    assert "<0xF0>" in vtok.convert_ids_to_tokens(ids) and vtok.decode(ids) == text
    assert special_ids(vtok) == {"eos": 4, "turn_start": 2, "turn_end": 4, "bos": 0, "end_of_text": 1}


def test_the_map_pairs_what_both_decode_alike_and_covers_every_answer(vtok, drafter_tok):
    from asymspec_mm.base.vocab_map import build_vocab_map

    m = build_vocab_map(drafter_tok, vtok)
    assert (m.shared, len(m.to_verifier), len(m.to_drafter)) == (678, 755, 1573)
    assert m.specials == {"eos": (2, 4), "turn_start": (1, 2), "end_of_text": (0, 1)}

    def strings(tok, n):  # id -> its decoded text, whole characters only, special tokens left out
        special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
        out = {i: tok.decode([i]) for i in range(n) if i not in special}
        return {i: s for i, s in out.items() if s and "\ufffd" not in s}

    d_str, v_str = strings(drafter_tok, 755), strings(vtok, 1573)
    lowest: dict[str, int] = {}
    for v, s in sorted(v_str.items()):
        lowest.setdefault(s, v)
    for d, s in d_str.items():
        assert m.to_verifier[d] == lowest.get(s, -1), (d, s)
    held = mv.generate(300, mv.HELDOUT_SEED)
    answers = [p["response"] for p in held]
    aligned = [xfamily.mapped_ids(drafter_tok, vtok, a) == vtok(a, add_special_tokens=False)["input_ids"] for a in answers]
    assert sum(aligned) == 300
    assert m.corpus_coverage(i for a in answers for i in vtok(a, add_special_tokens=False)["input_ids"]) == 1.0


def test_the_llama3_style_template_renders_roles_and_refuses_tools(vtok):
    from jinja2.exceptions import TemplateError

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": " Hi "}, {"type": "image"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Which bar?"},
    ]
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhich bar?<|eot_id|>"
    )
    assert vtok.apply_chat_template(messages, tokenize=False) == expected
    rendered = vtok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert rendered == expected + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(TemplateError, match="no tools block"):
        vtok.apply_chat_template(messages, tools=[tool], tokenize=False)


def test_the_training_prompt_is_the_pipelines_and_the_problems_are_train_pys(vtok, drafter_tok):
    from transformers import Qwen3VLProcessor

    from asymspec_mm.request.prompts import build_prompts
    from asymspec_mm.tiny import data, train

    proc = Qwen3VLProcessor.from_pretrained(TINY / "drafter")
    mix = train.parse_families(train.VERIFIER_MIX)
    ours = xfamily.VerifierStream(vtok, 1 + 2 * 16 * 1300, mix).take(5)  # phase 2's first problems
    theirs = data.Stream(proc, drafter_tok, start=1 + 2 * 16 * 1300, stride=2, mix=mix).take(5)
    assert [e["problem"]["pid"] for e in ours] == [e["problem"]["pid"] for e in theirs]
    assert [e["family"] for e in ours] == ["figure", "visual", "geometry", "mixed", "mixed"]
    for e in ours:
        p = e["problem"]
        pr = build_prompts(proc, vtok, p["decoded_image"], mv.view_text(p), p["query"], "image+text")
        assert torch.equal(pr.verifier_ids[0], e["ver"])
        assert e["ver"][:4].tolist() == [0, 2, vtok.convert_tokens_to_ids("user"), 3]
        assert vtok.decode(e["ans"]) == p["response"] + "<|eot_id|>"
        dec = e["dec_idx"]
        assert dec is not None and vtok.decode(e["ans"][dec : dec + 1]).strip() == p["decisive"]


def test_a_short_run_trains_exports_a_loadable_verifier_and_repeats_exactly(tmp_path):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    args = ["--steps", "3", "--phase2-steps", "2", "--eval-every", "2", "--eval-n", "1", "--batch", "4", "--monitor-n", "4"]
    for run in ("a", "b"):
        assert xfamily.main(["--out", str(tmp_path / run), *args]) == 0
    a, b = tmp_path / "a" / "verifier", tmp_path / "b" / "verifier"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert {p.name for p in a.iterdir()} == {p.name for p in SHIPPED.iterdir()}
    log = (tmp_path / "a" / "_work" / "train.log").read_text()
    assert [line.split()[3] for line in log.splitlines() if " EVAL " in line] == ["2", "3", "5"]
    assert log.count("REPORT ") == 1
    model, tok = Qwen3ForCausalLM.from_pretrained(a), AutoTokenizer.from_pretrained(a)
    assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|eot_id|>")
    assert json.loads((a / "generation_config.json").read_text())["eos_token_id"] == 4


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the tiny-xfamily verifier is not shipped")
def test_the_shipped_verifier_is_the_builders_vocabulary_and_answers_what_the_text_tells(vtok):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    shipped = AutoTokenizer.from_pretrained(SHIPPED)
    assert shipped.get_vocab() == vtok.get_vocab() and shipped.chat_template == vtok.chat_template
    assert json.loads(shipped.backend_tokenizer.to_str())["model"] == json.loads(vtok.backend_tokenizer.to_str())["model"]
    model = Qwen3ForCausalLM.from_pretrained(SHIPPED).eval()
    assert sum(p.numel() for p in model.parameters()) == 1_523_136
    # alone it reads only the compressed view: geometry (the angles are in the OCR text) is right, a chart's
    # bar values (not in the text) are guesses
    acc = xfamily.floor_accuracy(model, shipped, mv.generate(32, mv.HELDOUT_SEED))
    assert acc["geometry"] == 1.0 and acc["figure"] <= 0.5


def test_the_preset_names_the_tiny_drafter_folder_and_recovers_the_gap():
    from asymspec_mm.pipeline.facade import AsymSpecPipeline
    from asymspec_mm.pipeline.presets import ocr_layout_of, resolve_preset

    preset = resolve_preset("tiny-xfamily")
    assert preset.drafter == str(TINY / "drafter") and Path(preset.verifier) == SHIPPED
    assert ocr_layout_of("tiny-xfamily") == "inline"
    pipe = AsymSpecPipeline.from_preset("tiny-xfamily", ocr="none")
    assert pipe.vocab_map is not None and pipe.vocab_map.coverage()["shared_tokens"] == 678
    # the target: AsymSpec recovers >= 80 % of the Floor -> drafter gap on figure and visual QA
    from asymspec_mm.decode import AsymSpecConfig

    cfg = AsymSpecConfig(max_new_tokens=40)
    probs = [p for p in mv.generate(32, mv.HELDOUT_SEED) if mv.family_of(p) in ("figure", "visual")]
    acc = {}
    for method in ("floor", "drafter", "asymspec"):
        runs = [pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, config=cfg) for p in probs]
        acc[method] = sum(mv.is_correct(r.text, p) for r, p in zip(runs, probs)) / len(probs)
    assert acc["drafter"] > acc["floor"]
    assert (acc["asymspec"] - acc["floor"]) / (acc["drafter"] - acc["floor"]) >= 0.8, acc


def test_results_keep_the_map_section_when_the_loop_fills_the_table():
    from asymspec_mm.tiny.results import RESULTS_FOR, kept_tail

    old = "# old\n\n## figure\n| a |\n\n## The vocabulary map\n\nmap text\n\n## Agent tasks\n\nagent text\n"
    assert kept_tail(old) == "\n## The vocabulary map\n\nmap text\n\n## Agent tasks\n\nagent text\n"
    assert kept_tail("# old\n\n## figure\n") == ""
    assert RESULTS_FOR["tiny-xfamily"].name == "RESULTS_xfamily.md"


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the tiny-xfamily verifier is not shipped")
def test_the_results_file_holds_the_maps_figures_of_the_shipped_pair(drafter_tok):
    from transformers import AutoTokenizer

    from asymspec_mm.tiny import xfamily_results as xr

    figures = xr.map_figures(drafter_tok, AutoTokenizer.from_pretrained(SHIPPED), mv.generate(300, mv.HELDOUT_SEED))
    assert figures["verifier_only"] == {"numbers": 819, "byte pieces": 59, "special tokens": 3, "subwords": 14}
    assert (figures["drafter_only"], figures["answers_aligned"], figures["answer_tokens_inside"]) == (77, 300, 1.0)
    text = xr.RESULTS_XFAMILY_MD.read_text()
    assert "\n".join(xr.map_section(figures)) in text and xr.FILL_COMMAND in text
    # the tables are results.py's through the pipeline: AsymSpec recovers at least 80% of the gap on figure and visual QA
    for family in ("figure", "visual"):
        table = text.split(f"\n## {family} ")[1].split("\n## ")[0]
        row = re.search(r"\| AsymSpec, bonus=verifier \| 75 \| ([0-9.]+) \| ([0-9]+)% \|", table)
        assert row and int(row.group(2)) >= 80, (family, table)
    # a rewrite of the map section keeps everything above it, and adds the section to a file without one
    assert xr.with_map_section(text, xr.map_section(figures)) == text
    assert (
        xr.with_map_section("# t\n\n## figure\n| a |\n", ["## The vocabulary map", "", "m", ""])
        == "# t\n\n## figure\n| a |\n\n## The vocabulary map\n\nm\n"
    )
