"""Mistral's real tokenizers from the mistral-common wheel against Qwen3's (issue #44, item 3): the SentencePiece models
read without ``sentencepiece`` give SentencePiece's own ids (a reference it wrote, tests/data), the vocabulary map's
counts and round trips are what docs/cross-family.md reports (with each failing token checked to be outside the
verifier's vocabulary), and a Qwen3-shaped verifier stand-in saved with Tekken loads through ``from_pretrained``,
renders prompts as mistral-common does and decodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asymspec_mm.base.vocab_map import build_vocab_map, token_bytes

pytest.importorskip("mistral_common")

REFERENCE = Path(__file__).resolve().parent / "data" / "sentencepiece_reference.json"


@pytest.fixture(scope="module")
def qwen():
    from asymspec_mm.eval.tokenizer_pairs import qwen3_tokenizer

    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def mistral():
    from asymspec_mm.checkpoints.mistral import mistral_tokenizer

    cache: dict[str, object] = {}

    def get(version: str):
        if version not in cache:
            cache[version] = mistral_tokenizer(version)
        return cache[version]

    return get


@pytest.fixture(scope="module")
def vocab_map(qwen, mistral):
    """version -> ``build_vocab_map(qwen, mistral(version))``, built once per version for the module's tests."""
    cache: dict[str, object] = {}

    def get(version: str):
        if version not in cache:
            cache[version] = build_vocab_map(qwen, mistral(version))
        return cache[version]

    return get


@pytest.fixture(scope="module")
def qwen_strings(qwen) -> dict[int, str]:
    """:func:`_strings` of Qwen3's tokens that are not special (the same for every Mistral tokenizer compared)."""
    q_special = {i for i, t in qwen.added_tokens_decoder.items() if t.special}
    return _strings(qwen, [i for i in range(len(qwen)) if i not in q_special])


@pytest.fixture(scope="module")
def tekken_standin(tmp_path_factory) -> Path:
    """The Qwen3-shaped verifier stand-in saved with Tekken (its defaults), built once for the tests that load it."""
    from asymspec_mm.checkpoints.mistral import build_mistral_verifier_standin

    return build_mistral_verifier_standin(tmp_path_factory.mktemp("tekken-standin"))


@pytest.mark.parametrize("version", ["v1", "v3", "v7"])
def test_sentencepiece_models_read_without_sentencepiece_give_its_ids(mistral, version):
    import hashlib

    from asymspec_mm.checkpoints.mistral import mistral_file

    ref = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert hashlib.sha256(mistral_file(version).read_bytes()).hexdigest() == ref[version]["sha256"]  # the same model file
    tok = mistral(version)
    assert len(ref["texts"]) == 31 and any("  1" in t for t in ref["texts"])
    for text, ids in zip(ref["texts"], ref[version]["ids"]):
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, text[:60]
        if text.strip() == text and "▁" not in text:  # SentencePiece drops the dummy prefix's space when decoding
            assert tok.decode(ids) == text


def _strings(tok, ids) -> dict[int, str]:
    """id -> its text, for ids whose text is whole characters: decoded after an ``a`` (a SentencePiece decoder strips
    the leading space of what it decodes first) and cut off again."""
    a = tok.convert_tokens_to_ids("a")
    out = {}
    for i in ids:
        s = tok.decode([a, i], clean_up_tokenization_spaces=False)[1:]
        if s and "\ufffd" not in s:
            out[i] = s
    return out


@pytest.mark.parametrize(("version", "count"), [("v1", 29_235), ("v7", 29_237), ("tekken", 67_861)])
def test_the_counts_in_the_docs_equal_a_comparison_of_decoded_strings(qwen, mistral, vocab_map, qwen_strings, version, count):
    tok = mistral(version)
    m = vocab_map(version)
    assert m.shared == count and f"{count:,}" in (Path(__file__).resolve().parents[1] / "docs" / "cross-family.md").read_text()
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    v_str = _strings(tok, [i for i in range(len(tok)) if i not in special])
    q_str = qwen_strings
    # every pair of whole-character tokens spells the same text, and every text both spell is paired
    pairs = {d: v for d, v in enumerate(m.to_verifier) if v >= 0 and d in q_str and v in v_str}
    assert all(q_str[d] == v_str[v] for d, v in pairs.items())
    assert {q_str[d] for d in pairs} == set(q_str.values()) & set(v_str.values())
    if version != "tekken":  # "," is a piece and a byte piece <0x2C>: the map takes the piece the tokenizer emits
        assert m.to_verifier[qwen.convert_tokens_to_ids(",")] == tok.convert_tokens_to_ids(",") != tok.convert_tokens_to_ids("<0x2C>")


def test_round_trips_count_every_token_outside_the_set(qwen, mistral, vocab_map):
    from asymspec_mm.eval.tokenizer_pairs import minivista_texts, paper_subset_texts, round_trips

    texts = {"minivista": minivista_texts(300), "mathvista": paper_subset_texts()}
    assert len(texts["mathvista"]) == 587
    expected = {("v7", "minivista"): 0, ("v7", "mathvista"): 0, ("tekken", "minivista"): 195, ("tekken", "mathvista"): 2}
    q_bytes, pieces = token_bytes(qwen), {}  # version -> its pieces' bytes
    for (version, corpus), exact in expected.items():
        tok = mistral(version)
        m = vocab_map(version)
        rt = round_trips(texts[corpus], qwen, tok, m.to_verifier, m.to_drafter)
        assert (rt.exact, rt.mismatched) == (exact, 0) and rt.exact + rt.outside_texts == rt.texts, (version, corpus)
        if version not in pieces:  # each corpus of a version reads the same pieces
            pieces[version] = token_bytes(tok)
        v_pieces = pieces[version]
        v_bytes = set(v_pieces)
        outside = 0
        for text in texts[corpus]:
            ids = qwen(text, add_special_tokens=False)["input_ids"]
            missing = [i for i in ids if m.to_verifier[i] < 0]
            outside += len(missing)
            assert all(q_bytes[i] not in v_bytes for i in missing)  # truly no verifier token spells it
            if not missing:  # inside the set: the verifier's tokens hold the text's bytes, in order
                assert b"".join(v_pieces[m.to_verifier[i]] for i in ids) == text.encode()
        assert outside == rt.outside_tokens > 0


def test_a_verifier_standin_with_tekken_loads_renders_and_decodes(tekken_standin):
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from asymspec_mm.checkpoints.mistral import mistral_file
    from asymspec_mm.request.prompts import verifier_chat_text
    from asymspec_mm.tiny.evaluate import greedy

    folder = tekken_standin
    assert "tekken.json" not in {p.name for p in folder.iterdir()}  # the HF files alone
    tok = AutoTokenizer.from_pretrained(folder)
    model = Qwen3ForCausalLM.from_pretrained(folder).eval()
    assert len(tok) == model.config.vocab_size == 131_072 and model.config.eos_token_id == tok.eos_token_id == 2
    question = "Which bar is the tallest?"
    ids = tok(verifier_chat_text(tok, question), add_special_tokens=False)["input_ids"]
    reference = MistralTokenizer.from_file(str(mistral_file("tekken")))
    assert ids == reference.encode_chat_completion(ChatCompletionRequest(messages=[UserMessage(content=question)])).tokens
    with_system = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    request = ChatCompletionRequest(messages=[SystemMessage(content="Be brief."), UserMessage(content=question)])
    assert tok(with_system, add_special_tokens=False)["input_ids"] == reference.encode_chat_completion(request).tokens
    prompt = torch.tensor([ids])
    model.generation_config.eos_token_id = None  # six tokens whatever they are
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False)[0, len(ids) :].tolist()
    assert cached == greedy(model, {"input_ids": prompt}, eos_id=-1, max_new=6)  # the cache against full recompute
    assert all(0 <= i < 131_072 for i in cached) and isinstance(tok.decode(cached), str)


def test_the_pipeline_decodes_with_a_tekken_verifier(standin_dirs, tekken_standin):
    """A Qwen3-VL drafter stand-in steering the Tekken verifier stand-in: Floor is the verifier's own greedy decoding;
    AsymSpec writes text both vocabularies spell."""
    from conftest import make_image
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from asymspec_mm.pipeline.facade import AsymSpecPipeline
    from asymspec_mm.request.prompts import verifier_chat_text
    from captioning.view import CompressedView

    verifier_dir = tekken_standin
    pipe = AsymSpecPipeline.from_pretrained(standin_dirs[0], verifier_dir, ocr="none")
    from asymspec_mm.decode import AsymSpecConfig

    tok = AutoTokenizer.from_pretrained(verifier_dir)
    model = Qwen3ForCausalLM.from_pretrained(verifier_dir).eval()
    cfg = AsymSpecConfig(max_new_tokens=6)
    image, question = make_image(0), "Which bar is the tallest?"
    floor = pipe.generate(image, question, caption="A bar chart.", ocr=False, method="floor", config=cfg, ignore_eos=True)
    user = CompressedView(caption="A bar chart.").render() + "\n\n" + question
    ids = tok(verifier_chat_text(tok, user), add_special_tokens=False)["input_ids"]
    model.generation_config.eos_token_id = None
    own = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids) :]
    assert floor.text == tok.decode(own, skip_special_tokens=True)
    asym = pipe.generate(image, question, caption="A bar chart.", ocr=False, method="asymspec", config=cfg, ignore_eos=True)
    m = build_vocab_map(AutoTokenizer.from_pretrained(standin_dirs[0]), tok)
    assert m.shared == 67_861 and isinstance(asym.text, str) and asym.stats["new_tokens"] == 6
