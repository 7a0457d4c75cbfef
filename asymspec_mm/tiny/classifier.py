"""A tiny LLMLingua-2 token classifier, trained here, that ships with the package so that the ``llmlingua2``
compressor runs offline (through the real ``llmlingua`` package when it is installed).

    python -m asymspec_mm.tiny.classifier --out asymspec_mm/presets_data/llmlingua2-tiny-bert-base-multilingual-cased

What it is: a ``BertForTokenClassification`` (2 layers, 64 wide, 2 heads) on a WordPiece tokenizer built here on
MiniVista's texts, label 1 = keep, label 0 = drop, as LLMLingua-2's released classifiers. The ``llmlingua`` package
picks its word-joining rules by the model's name (``bert-base-multilingual-cased``: WordPiece's ``##`` pieces;
``xlm-roberta-large``: SentencePiece's ``▁``), so the shipped folder's name carries the one whose rules this
tokenizer follows; the model is not that one.

Its labels are made by a rule, not distilled from a large model as LLMLingua-2's were: in a log's lines
(``bar 17: 42``) the name, the key and the colon are kept and the value is dropped; a log's header and other text
keep their words except a short list of function words and punctuation. A rule that drops the readings a later
question may ask for is the kind of loss the paper's compressed views suffer (the compressor cannot know which
line will matter); this classifier is a stand-in that makes the real package's code path run offline, not a
general-purpose compressor.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import time
from pathlib import Path
from typing import Any

import torch

#: words a rule label drops outside a log's lines (function words and punctuation)
STOP_WORDS = frozenset("a an the of is are was to and or in on at by for with it this that what which".split()) | set(string.punctuation)
_ROW = re.compile(r"^bar \d+: \d+$")
SIZES = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512}
VOCAB_SIZE = 800


def corpus(n: int, seed: int) -> list[str]:
    """``n`` texts a conversation of MiniVista holds: ``agent-log`` tables, its messages and questions, and the four
    families' queries and captions."""
    from ..eval import minivista as mv
    from ..eval.minivista_log import DONE, TASK, make_log_problem

    out: list[str] = []
    for i in range(n):
        p = make_log_problem(seed, i)
        out += [p["table"], p["question"]]
        if i % 4 == 0:
            q = mv.make_problem(seed, i)
            out += [q["query"], q["caption"], TASK, DONE]
    return out


def word_labels(text: str, tok) -> list[int]:
    """The rule's label of each word of ``text`` as ``tok``'s pre-tokenizer splits it (whitespace; each punctuation
    character a word): in a ``bar K: V`` line the value is 0, the rest 1; elsewhere function words and punctuation
    0, the rest 1."""
    labels: list[int] = []
    for line in text.split("\n"):
        words = [w for w, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(line)]
        if _ROW.match(line.strip()):
            labels += [1] * (len(words) - 1) + [0]
        else:
            labels += [0 if w.lower() in STOP_WORDS else 1 for w in words]
    return labels


def build_tokenizer(texts: list[str], out: Path):
    """A cased WordPiece tokenizer (BERT's special tokens) trained on ``texts``, saved in ``out``."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    wp = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    alphabet = list(string.ascii_letters + string.digits + string.punctuation)
    # every letter and digit as a word piece too (``##x``), twice: any ASCII word splits into known pieces, never [UNK]
    spelled = [" ".join("q" + c for c in string.ascii_letters + string.digits)] * 2
    wp.train_from_iterator(texts + spelled, vocab_size=VOCAB_SIZE, min_frequency=2, limit_alphabet=len(alphabet), initial_alphabet=alphabet)
    out.mkdir(parents=True, exist_ok=True)
    tok = BertTokenizerFast(
        tokenizer_object=wp._tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        do_lower_case=False,
    )
    tok.save_pretrained(out)
    return tok


def encode(text: str, tok) -> dict[str, torch.Tensor]:
    """``[CLS] text [SEP]`` ids and each token's label (its word's; -100 at the special tokens)."""
    enc = tok(text, truncation=True, max_length=512)
    labels = word_labels(text, tok)
    ids = enc.word_ids()
    return {
        "input_ids": torch.tensor(enc["input_ids"]),
        "labels": torch.tensor([-100 if w is None or w >= len(labels) else labels[w] for w in ids]),
    }


def batch_of(examples: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``labels`` ``[B, L]``."""
    L = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), L), pad_id)
    labels = torch.full((len(examples), L), -100)
    mask = torch.zeros((len(examples), L), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = e["input_ids"], e["labels"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def train(out: Path, steps: int = 300, batch: int = 16, seed: int = 0) -> dict[str, Any]:
    """Build the tokenizer, train the classifier on the rule's labels, save both in ``out``; returns a report
    (held-out token accuracy on seed 1's texts)."""
    from transformers import BertConfig, BertForTokenClassification

    from ..eval import minivista as mv

    torch.manual_seed(seed)
    t0 = time.time()
    texts = corpus(600, mv.TRAIN_SEED)
    tok = build_tokenizer(texts, out)
    cfg = BertConfig(vocab_size=len(tok), num_labels=2, id2label={0: "drop", 1: "keep"}, label2id={"drop": 0, "keep": 1}, **SIZES)
    model = BertForTokenClassification(cfg)
    data = [encode(t, tok) for t in texts]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        b = batch_of(rng.sample(data, batch), tok.pad_token_id)
        loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    held = [encode(t, tok) for t in corpus(60, mv.HELDOUT_SEED)]
    right = total = 0
    with torch.no_grad():
        for s in range(0, len(held), 16):
            b = batch_of(held[s : s + 16], tok.pad_token_id)
            pred = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
            ok = b["labels"] != -100
            right += int((pred[ok] == b["labels"][ok]).sum())
            total += int(ok.sum())
    model.save_pretrained(out)
    report = {
        "train_seconds": round(time.time() - t0, 1),
        "steps": steps,
        "heldout_token_accuracy": round(right / total, 4),
        "vocab": len(tok),
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the classifier's folder (its name should carry bert-base-multilingual-cased: see above)")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(train(Path(args.out), args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
