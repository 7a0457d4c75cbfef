"""The vocabulary map of a cross-family pair (issue #44): tokens with identical decoded bytes are shared, each scheme
read by its own rule, special tokens paired by role. Checked against a brute-force comparison of the strings each
tokenizer's own ``decode`` gives, on real tokenizers: Qwen3's (the shipped hub files) against Mistral's Tekken (the
mistral-common wheel), and a SentencePiece-style one built here."""

from __future__ import annotations

import json
import os

import pytest

from asymspec_mm.base.vocab_map import build_vocab_map, special_ids, token_bytes, vocab_map

mistral_common = pytest.importorskip("mistral_common")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import AutoTokenizer

    from asymspec_mm.checkpoints.qwen_files import VERIFIER, hub_snapshot

    return AutoTokenizer.from_pretrained(hub_snapshot(VERIFIER, tmp_path_factory.mktemp("qwen3")))


@pytest.fixture(scope="module")
def tekken():
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json"))


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory):
    """A SentencePiece-style BPE (``▁`` for spaces, ``<0xNN>`` byte fallback), as Llama-2 and Mistral v1-v3 ship them
    for ``transformers``, trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    text = ["Which bar is the tallest? The red bar, at 10.", "The angle at B is 30 degrees; the triangle's angles sum to 180."]
    trained.train_from_iterator(text * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):  # the byte-fallback pieces are ordinary vocabulary entries, as in Llama-2's and Mistral's
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>")


def _strings(decode, ids, skip) -> dict[int, str]:
    """id -> the tokenizer's own decoding of that single id, for ids outside ``skip`` that decode to whole characters."""
    out = {}
    for i in ids:
        if i in skip:
            continue
        s = decode(i)
        if s and "\ufffd" not in s:
            out[i] = s
    return out


def _brute_force(d_strings: dict[int, str], v_strings: dict[int, str]) -> dict[int, int]:
    lowest: dict[str, int] = {}
    for v, s in sorted(v_strings.items()):
        lowest.setdefault(s, v)
    return {d: lowest[s] for d, s in d_strings.items() if s in lowest}


def test_qwen3_against_tekken_equals_the_brute_force_comparison(qwen, tekken):
    m = build_vocab_map(qwen, tekken)
    q_special = {i for i, t in qwen.added_tokens_decoder.items() if t.special}
    t_special = set(range(tekken.num_special_tokens))
    expected = _brute_force(
        _strings(lambda i: qwen.decode([i]), range(len(qwen)), q_special),
        _strings(lambda i: tekken.decode([i]), range(tekken.n_words), t_special),
    )
    got = {d: m.to_verifier[d] for d in expected}
    assert got == expected and len(expected) > 50_000
    # no other pair of whole-character tokens is mapped: the map's pairs among them are exactly the brute force's
    q_strings = _strings(lambda i: qwen.decode([i]), range(len(qwen)), q_special)
    paired = {d for d, _ in m.specials.values()}  # Qwen's <tool_call> is text, yet paired by role with [TOOL_CALLS]
    extra = {d for d, v in enumerate(m.to_verifier) if v >= 0 and d in q_strings and d not in expected and d not in paired}
    assert not extra
    for d, v in enumerate(m.to_verifier):  # one to one
        assert v < 0 or m.to_drafter[v] == d
    cov = m.coverage()
    assert cov["shared_tokens"] == m.shared and 0.3 < cov["drafter_share"] < 0.7 and 0.3 < cov["verifier_share"] < 0.8


def test_special_tokens_pair_by_role_and_never_by_spelling(qwen, tekken):
    m = build_vocab_map(qwen, tekken)
    q, t = special_ids(qwen), special_ids(tekken)
    assert m.specials["eos"] == (qwen.convert_tokens_to_ids("<|im_end|>"), tekken.eos_id) == (q["eos"], t["eos"])
    assert m.specials["turn_start"] == (qwen.convert_tokens_to_ids("<|im_start|>"), t["turn_start"])
    assert m.specials["tool_call_start"] == (qwen.convert_tokens_to_ids("<tool_call>"), t["tool_call_start"])
    assert "bos" not in q  # Qwen's "<s>" is an ordinary token, not a beginning-of-sequence marker
    assert m.to_verifier[qwen.convert_tokens_to_ids("<s>")] == -1  # and Tekken's <s> is special: no match by spelling


def test_a_sentencepiece_style_vocabulary_reads_spaces_and_byte_fallback(qwen, metaspace):
    pieces = token_bytes(metaspace)
    assert pieces[metaspace.convert_tokens_to_ids("<0x41>")] == b"A"
    assert pieces[metaspace.convert_tokens_to_ids("▁bar")] == b" bar"
    special = {metaspace.convert_tokens_to_ids(s) for s in ("<unk>", "<s>", "</s>", "[INST]", "[/INST]")}
    assert all(pieces[i] is None for i in special)
    m = build_vocab_map(metaspace, qwen)
    # brute force over the pieces that decode alone (Metaspace's decoder strips a leading space: compare bytes here)
    q_bytes = {}
    for v, b in enumerate(token_bytes(qwen)):
        if b is not None:
            q_bytes.setdefault(b, v)
    taken: set[int] = set()  # bytes spelled twice ("▁" and "<0x20>"): the lowest drafter id takes the verifier's token
    for d, b in enumerate(pieces):
        if d in special:
            continue
        want = q_bytes.get(b) if b is not None else None
        expect = want if want is not None and want not in taken else -1
        taken.add(expect)
        assert m.to_verifier[d] == expect, (d, b)
    assert m.to_verifier[metaspace.convert_tokens_to_ids("▁bar")] == qwen.convert_tokens_to_ids("Ġbar")
    assert m.specials["eos"] == (metaspace.eos_token_id, qwen.convert_tokens_to_ids("<|im_end|>"))
    assert m.specials["turn_start"] == (metaspace.convert_tokens_to_ids("[INST]"), qwen.convert_tokens_to_ids("<|im_start|>"))


def test_one_vocabulary_maps_every_id_to_itself_and_is_built_once(qwen):
    m = vocab_map(qwen, qwen)
    assert m.same_vocabulary and m.to_verifier == list(range(len(m.to_verifier))) and m.coverage()["drafter_share"] == 1.0
    assert vocab_map(qwen, qwen) is m


def test_corpus_coverage_counts_the_tokens_inside_the_shared_set(qwen, tekken):
    m = build_vocab_map(qwen, tekken)
    text = "Hint: Please answer the question. Question: Which bar is the tallest? Choices: (A) red (B) green 東京"
    ids = tekken.encode(text, bos=False, eos=False)
    inside = sum(m.to_drafter[i] >= 0 for i in ids)
    assert m.corpus_coverage(ids) == inside / len(ids) and 0 < inside <= len(ids)
    assert m.corpus_coverage([]) == 0.0


def test_byte_pieces_the_tokenizer_never_emits_leave_the_pairing_to_the_piece_it_does(qwen):
    """Llama-2 and Mistral put their 256 byte-fallback pieces first: ``<0x2C>`` has a lower id than ``,``. The
    tokenizer emits ``,`` (it falls back to bytes only for characters it has no piece for), so the map pairs Qwen's
    ``,`` with ``,``; a byte with no piece of its own (``<0xC3>``, the first byte of ``é``) keeps its byte piece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(
        ["The red bar, at 10; the blue bar, at 7."] * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"])
    )
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens(["<unk>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    sp = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    assert sp.convert_ids_to_tokens(sp("a, é", add_special_tokens=False)["input_ids"])[-4:] == [",", "▁", "<0xC3>", "<0xA9>"]
    pieces = token_bytes(sp)
    assert pieces[sp.convert_tokens_to_ids("<0x2C>")] is None and pieces[sp.convert_tokens_to_ids(",")] == b","
    m = build_vocab_map(qwen, sp)
    assert m.to_verifier[qwen.convert_tokens_to_ids(",")] == sp.convert_tokens_to_ids(",")
    assert m.to_drafter[sp.convert_tokens_to_ids("<0xC3>")] == qwen.convert_tokens_to_ids("Ã")  # GPT-2's spelling of 0xC3
