"""Loading a cross-family pair (issue #44 item 5): ``from_pretrained`` on two folders whose tokenizers differ builds the
map between the vocabularies, logs it with its coverage, and refuses a pair whose vocabularies overlap too little in
one line naming both tokenizers and the overlap. A pair of one vocabulary builds no map."""

from __future__ import annotations

import logging

import pytest
from two_vocab_pair import TINY_DRAFTER

from asymspec_mm import AsymSpecPipeline
from asymspec_mm.base.errors import VocabularyMismatchError
from asymspec_mm.engines.loading import MIN_VOCAB_OVERLAP


@pytest.fixture(scope="module")
def verifier_dir(two_vocab_verifier):
    return two_vocab_verifier


def test_from_pretrained_logs_the_map_and_its_coverage(verifier_dir, caplog):
    from transformers import AutoTokenizer

    from asymspec_mm.base.vocab_map import build_vocab_map

    with caplog.at_level(logging.INFO, logger="asymspec_mm"):
        pipe = AsymSpecPipeline.from_pretrained(TINY_DRAFTER, verifier_dir, ocr="none")
    d_tok, v_tok = AutoTokenizer.from_pretrained(TINY_DRAFTER), AutoTokenizer.from_pretrained(verifier_dir)
    expect = build_vocab_map(d_tok, v_tok)  # built afresh, not the pipeline's cached map
    assert pipe.vocab_map.to_drafter == expect.to_drafter and pipe.vocab_map.specials == expect.specials
    n = sum(d >= 0 for d in expect.to_verifier)
    line = f"vocabulary map {TINY_DRAFTER} -> {verifier_dir}: {n} shared tokens ({100 * n / len(d_tok):.1f}% / {100 * n / len(v_tok):.1f}%)"
    assert line in [r.getMessage() for r in caplog.records]
    assert pipe.tokenizer is pipe.verifier_tokenizer
    assert pipe.eos_ids == {v_tok.convert_tokens_to_ids("<|eot_id|>"), v_tok.convert_tokens_to_ids("<|end_of_text|>")}


def test_one_vocabulary_builds_no_map(tiny_pipe, caplog):
    assert tiny_pipe.vocab_map is None and tiny_pipe.models.vocab is None
    assert tiny_pipe.tokenizer is tiny_pipe.processor.tokenizer


def _junk_tokenizer(tmp_path):
    """A SentencePiece-style BPE of 2,000 tokens learnt from random letter strings: it shares little but single
    letters with the tiny drafter's vocabulary."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["".join(rng.choice("qxzjkvwy") for _ in range(rng.randint(4, 9))) for _ in range(4000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    tok.train_from_iterator([" ".join(words)] * 3, trainers.BpeTrainer(vocab_size=2000, special_tokens=["</s>"], show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    fast.save_pretrained(tmp_path)
    return fast


def test_a_pair_that_overlaps_too_little_is_refused_in_one_line(verifier_dir, tmp_path):
    import shutil

    bad = tmp_path / "junk-verifier"
    shutil.copytree(verifier_dir, bad)
    for f in bad.glob("tokenizer*"):
        f.unlink()
    junk = _junk_tokenizer(bad)
    with pytest.raises(VocabularyMismatchError) as err:
        AsymSpecPipeline.from_pretrained(TINY_DRAFTER, bad, ocr="none")
    msg = str(err.value)
    assert "\n" not in msg
    assert f"the drafter tokenizer {str(TINY_DRAFTER)!r} and the verifier tokenizer {str(bad)!r} have " in msg
    assert f"of the verifier's {len(junk)})" in msg and f"under the {MIN_VOCAB_OVERLAP:.0%} of each vocabulary" in msg
    assert "min_vocab_overlap=" in msg
    # the same pair loads when asked to (and then decodes inside the few tokens both have)
    pipe = AsymSpecPipeline.from_pretrained(TINY_DRAFTER, bad, ocr="none", min_vocab_overlap=0.0)
    assert 0 < pipe.vocab_map.coverage()["verifier_share"] < MIN_VOCAB_OVERLAP


def test_the_cross_family_page_example_runs(two_vocab_verifier, capsys, monkeypatch):
    from docblocks import REPO, block_with

    code = block_with("docs/cross-family.md", "python", "AsymSpecPipeline.from_pretrained(drafter_dir, verifier_dir)")
    monkeypatch.chdir(REPO)
    exec(code, {"drafter_dir": str(TINY_DRAFTER), "verifier_dir": str(two_vocab_verifier)})
    lines = capsys.readouterr().out.splitlines()
    assert int(lines[0]) > 600 and 2 <= len(lines) <= 6
    for line in lines[1:]:
        verifier_id, drafter_id, source, alone = line.split()
        assert int(verifier_id) >= 0 and int(drafter_id) >= 0 and source in ("accepted", "fused", "bonus") and alone in ("True", "False")
