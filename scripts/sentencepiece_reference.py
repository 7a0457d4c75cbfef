"""Write tests/data/sentencepiece_reference.json: SentencePiece's own ids for Mistral's v1, v3 and v7 models on a set
of texts, the reference ``tests/test_mistral_tokenizers.py`` checks ``checkpoints.mistral.sentencepiece_tokenizer``
against (this environment has no ``sentencepiece``; the vLLM venv has it).

    python scripts/sentencepiece_reference.py texts tests/data/sentencepiece_reference.json     # the project's venv
    .venv-vllm/bin/python scripts/sentencepiece_reference.py ids tests/data/sentencepiece_reference.json

``texts`` picks the texts: MiniVista prompts and answers, MathVista prompts of the paper's subset (those with runs of
spaces and digits first: where SentencePiece's word boundaries matter) and a few edge cases. ``ids`` adds
``sentencepiece`` ``encode`` of each text for each model, and the model files' SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys

FILES = {
    "v1": "tokenizer.model.v1",
    "v3": "mistral_instruct_tokenizer_240323.model.v3",
    "v7": "mistral_instruct_tokenizer_241114.model.v7",
}
EDGE_CASES = [
    "",
    " ",
    "  two  spaces,   three",
    "\ttab\nnewline\n\nand 12345 67.89 x=3",
    "emoji 😀, accents é ü, 中文 text",
    " leading space",
    "trailing spaces   ",
    "a▁b uses the meta symbol",
    "values:  12,   7 and    100",
]


def pick_texts() -> list[str]:
    from asymspec_mm.eval import minivista as mv
    from asymspec_mm.eval.tokenizer_pairs import minivista_texts, paper_subset_texts

    mini = minivista_texts(8) + [p["response"] for p in mv.generate(8, mv.HELDOUT_SEED)]
    paper = paper_subset_texts()
    hard = [t for t in paper if re.search(r" {2,}\d| {3,}\S", t)][:4]
    return EDGE_CASES + mini + hard + [t for t in paper[:2] if t not in hard]


def add_ids(data: dict) -> dict:
    import mistral_common
    import sentencepiece

    folder = os.path.join(os.path.dirname(mistral_common.__file__), "data")
    for version, name in FILES.items():
        path = os.path.join(folder, name)
        sp = sentencepiece.SentencePieceProcessor(model_file=path)
        data[version] = {
            "file": name,
            "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
            "ids": [sp.encode(t) for t in data["texts"]],
        }
    data["sentencepiece"] = sentencepiece.__version__
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("texts", "ids"):
        print(__doc__, file=sys.stderr)
        return 2
    step, out = argv
    if step == "texts":
        data = {"texts": pick_texts()}
    else:
        with open(out, encoding="utf-8") as f:
            data = add_ids(json.load(f))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
