"""The paper protocol's prompts (``--protocol paper``, ``--dump-prompts``) on the MathVista text data shipped with the package.

Expected texts are written from the protocol's rules (issue #22): ``Image caption: {raw caption[:1600]}``,
``OCR text from image: {texts joined by spaces[:800]}`` only when not blank, ``{query}`` + the step-by-step
suffix, joined by blank lines; the drafter alone reads ``{query}`` + the suffix.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval.cli import main as cli_main

MV_DATA = mv.SHIPPED_DIR

SUFFIX = "\nLet's think step by step, then give the final answer."
MC_HINT = "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.\n"
INT_HINT = "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end.\n"
TINY_VERIFIER = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data" / "tiny" / "verifier"

# Hand-checked pids: (task, OCR text present) -> pid
# GPS: 499 with OCR, 256 without; VQA: 779 with, 158 without; FQA: 202 with, 145 without.
EXPECTED = {
    "499": (
        "Image caption: I cannot describe the fine-grained content of the image because I do not have the image. "
        "Can you please send it to me?\n\n"
        "OCR text from image: A 2 8 5 3 B D\n\n"
        + MC_HINT
        + "Question: Quadrilateral $ABDC$ is a rectangle. If $m\\angle1 = 38$, find $m \\angle 2$\n"
        "Choices:\n(A) 33\n(B) 38\n(C) 52\n(D) 87" + SUFFIX,
        MC_HINT + "Question: Quadrilateral $ABDC$ is a rectangle. If $m\\angle1 = 38$, find $m \\angle 2$\n"
        "Choices:\n(A) 33\n(B) 38\n(C) 52\n(D) 87" + SUFFIX,
    ),
    "256": (
        "Image caption: I can't process this file.\n\n"
        + MC_HINT
        + "Question: 如图，△ABC中，AD平分∠BAC，AD交BC于点D，DE⊥AB，垂足为E，若DE＝3，AC＝4，则△ADC的面积为（）\n"
        "Choices:\n(A) 3\n(B) 4\n(C) 5\n(D) 6" + SUFFIX,
        MC_HINT + "Question: 如图，△ABC中，AD平分∠BAC，AD交BC于点D，DE⊥AB，垂足为E，若DE＝3，AC＝4，则△ADC的面积为（）\n"
        "Choices:\n(A) 3\n(B) 4\n(C) 5\n(D) 6" + SUFFIX,
    ),
    "779": (
        "Image caption: I can't process this file.\n\n"
        "OCR text from image: MedPixe R AVN 000926a4-7637-4661-b434-6744fba59ae Uploader bnian 3indietun_ource bnan "
        "Asindietun Ub-24 2003\n\n"
        + MC_HINT
        + "Question: Is the cardiac silhouette less than half the diameter of the diaphragm?\nChoices:\n(A) Yes\n(B) No"
        + SUFFIX,
        MC_HINT + "Question: Is the cardiac silhouette less than half the diameter of the diaphragm?\nChoices:\n(A) Yes\n(B) No" + SUFFIX,
    ),
    "158": (
        "Image caption: I can't process this file.\n\n"
        + INT_HINT
        + "Question: What is the age gap between these two people in image? (Unit: years)"
        + SUFFIX,
        INT_HINT + "Question: What is the age gap between these two people in image? (Unit: years)" + SUFFIX,
    ),
    "202": (
        # the raw caption, its " \n\n" kept (no clean-up)
        "Image caption: I cannot describe the fine-grained content of the image because I do not have the image. \n\n"
        "Is there anything else I can do to help?\n\n"
        "OCR text from image: Title 10 1 8 1 0 3 3\n\n" + INT_HINT + "Question: What is the value of the smallest bar?" + SUFFIX,
        INT_HINT + "Question: What is the value of the smallest bar?" + SUFFIX,
    ),
}


def tiny_template(user_text: str) -> str:
    """The verifier's (Qwen3-format) chat template with the generation prompt and thinking off."""
    return f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def paper_dump(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The paper protocol's dump of the paper's subset, through the CLI, read back by pid."""
    out = tmp_path_factory.mktemp("dump") / "prompts.jsonl"
    rc = cli_main(
        ["eval", "mathvista", "--protocol", "paper", "--require-caption", "--text-dir", str(MV_DATA)]
        + ["--dump-prompts", str(out), "--verifier", str(TINY_VERIFIER)]
    )
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {r["pid"]: r for r in rows}


def raw(name: str) -> dict:
    return json.loads((MV_DATA / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("pid", sorted(EXPECTED))
def test_paper_prompts_of_hand_checked_pids(paper_dump, pid: str) -> None:
    verifier, alone = EXPECTED[pid]
    row = paper_dump[pid]
    assert set(row) == {
        "pid",
        "verifier_user_text",
        "drafter_full_user_text",
        "drafter_alone_user_text",
        "verifier_prompt",
        "verifier_prompt_tokens",
    }
    assert row["verifier_user_text"] == verifier
    assert row["drafter_full_user_text"] == verifier  # AsymSpec's full view: the image, then the verifier's text
    assert row["drafter_alone_user_text"] == alone
    assert row["verifier_prompt"] == tiny_template(verifier)


def test_fqa_without_ocr_keeps_the_raw_caption(paper_dump) -> None:
    """pid 145 (FQA, no OCR text): the whole raw Bard caption, "Sure." and its Markdown included."""
    caption = raw("captions_bard.json")["texts"]["145"]
    assert caption.startswith("Sure. The image shows a maze") and len(caption) < 1600
    query = INT_HINT + "Question: Can you find the missing term?"
    assert paper_dump["145"]["verifier_user_text"] == f"Image caption: {caption}\n\n{query}{SUFFIX}"
    assert paper_dump["145"]["drafter_alone_user_text"] == query + SUFFIX


def test_long_caption_and_ocr_are_cut_to_1600_and_800_characters(paper_dump) -> None:
    caption = raw("captions_bard.json")["texts"]["86"]
    assert len(caption) == 1918
    text = paper_dump["86"]["verifier_user_text"]
    assert text.startswith("Image caption: " + caption[:1600] + "\n\n") and caption[:1601] not in text
    items = ast.literal_eval(raw("ocrs_easyocr.json")["texts"]["229"])
    joined = " ".join(item[1] for item in items)
    assert len(joined) == 1101
    assert "\n\nOCR text from image: " + joined[:800] + "\n\n" in paper_dump["229"]["verifier_user_text"]
    assert joined[:801] not in paper_dump["229"]["verifier_user_text"]


def test_every_problem_of_the_subset_follows_the_rules(paper_dump) -> None:
    """All 587: the dump equals the rules applied to the raw files (an independent reading of them)."""
    problems, captions, ocrs, queries = (
        raw("testmini.json"),
        raw("captions_bard.json")["texts"],
        raw("ocrs_easyocr.json")["texts"],
        raw("query.json"),
    )
    tasks = {"geometry problem solving", "visual question answering", "figure question answering"}
    subset = [pid for pid, p in problems.items() if p["metadata"]["task"] in tasks and pid in captions]
    assert len(subset) == 587 and sorted(paper_dump) == sorted(subset)
    with_ocr = 0
    for pid in subset:
        ocr = " ".join(e[1] for e in ast.literal_eval(ocrs[pid])) if ocrs.get(pid) else ""
        parts = [f"Image caption: {captions[pid][:1600]}"] + ([f"OCR text from image: {ocr[:800]}"] if ocr.strip() else [])
        with_ocr += bool(ocr.strip())
        assert paper_dump[pid]["verifier_user_text"] == "\n\n".join(parts + [queries[pid] + SUFFIX]), pid
        assert paper_dump[pid]["drafter_alone_user_text"] == queries[pid] + SUFFIX
    assert with_ocr == 587 - 237


def test_mathvista_protocol_dump_keeps_mathvistas_labels(tmp_path: Path) -> None:
    """The default protocol: MathVista's labels, cleaned caption, plain OCR, no suffix; its drafter alone reads the same."""
    out = tmp_path / "p.jsonl"
    rc = cli_main(
        ["eval", "mathvista", "--text-dir", str(MV_DATA), "--tasks", "VQA", "--dump-prompts", str(out), "--verifier", str(TINY_VERIFIER)]
    )
    assert rc == 0
    rows = {r["pid"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    text = (
        "Image detected text: [([914, 4], 'MedPixe'), ([59, 73], 'R'), ([50, 110], 'AVN'), ([239, 829], "
        "'000926a4-7637-4661-b434-6744fba59ae Uploader'), ([508, 832], 'bnian'), ([546, 832], '3indietun_ource'), "
        "([636, 832], 'bnan'), ([664, 832], 'Asindietun Ub-24'), ([757, 829], '2003')]\n\n"
        + MC_HINT
        + "Question: Is the cardiac silhouette less than half the diameter of the diaphragm?\nChoices:\n(A) Yes\n(B) No"
    )
    assert rows["779"]["verifier_user_text"] == text  # "I can't process this file." is MathVista's boilerplate: removed
    assert rows["779"]["drafter_full_user_text"] == rows["779"]["drafter_alone_user_text"] == text
    assert rows["779"]["verifier_prompt"] == tiny_template(text)


def test_dump_prompts_loads_no_model(tmp_path: Path) -> None:
    """A fresh process with a verifier folder that holds only the tokenizer (no config, no weights): the dump
    works, and no modelling code, pipeline or vision cache is imported."""
    tok_dir = tmp_path / "tokenizer_only"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY_VERIFIER / name, tok_dir / name)
    out = tmp_path / "prompts.jsonl"
    code = (
        "import sys\nfrom asymspec_mm.eval.cli import main\n"
        f"rc = main(['eval', 'mathvista', '--protocol', 'paper', '--require-caption', '--text-dir', {str(MV_DATA)!r}, "
        f"'--dump-prompts', {str(out)!r}, '--verifier', {str(tok_dir)!r}, '--drafter', '/nonexistent/drafter'])\n"
        "bad = sorted(m for m in sys.modules if '.modeling_qwen' in m or m.startswith(('asymspec_mm.pipeline.facade', 'asymspec_mm.engines', 'vision_cache.features')))\n"
        "print(rc, bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 []"
    assert len(out.read_text(encoding="utf-8").splitlines()) == 587


def test_dump_prompts_refuses_auto_captions(tmp_path: Path, capsys) -> None:
    rc = cli_main(
        ["eval", "mathvista", "--compressed", "auto", "--text-dir", str(MV_DATA), "--limit", "2"]
        + ["--dump-prompts", str(tmp_path / "x.jsonl"), "--verifier", str(TINY_VERIFIER)]
    )
    err = capsys.readouterr().err.strip()
    assert (
        rc == 2 and err == "error: --dump-prompts needs the given texts: use --compressed official or none (auto captions with the models)"
    )


def test_pipeline_builds_the_dumped_prompts(tiny_pipe, paper_dump) -> None:
    """The pipeline with the paper style reads exactly the dumped texts: verifier tokens equal the dump's
    verifier prompt tokenized; the compressed stream the same user text; the full view the image then the
    text (the drafter alone: the query and suffix only); the templates' thinking switch as the models have it."""
    from PIL import Image

    texts = mv.TextData.load(MV_DATA)
    problem = {**raw("testmini.json")["499"], "pid": "499"}
    query = mv.official_query(problem, texts)
    caption, ocr = mv.paper_view(problem, texts)
    image = Image.new("RGB", (32, 32), (200, 30, 30))
    tok = tiny_pipe.verifier_tokenizer
    row = paper_dump["499"]
    for method, full_text in (("asymspec", row["drafter_full_user_text"]), ("drafter", row["drafter_alone_user_text"])):
        session = tiny_pipe.prepare(
            image, query, caption=caption, ocr=ocr, method=method, prompt_style=mv.PAPER_STYLE, max_new_tokens=2, prefill=True
        )
        p = session.prompts
        assert p.verifier_ids[0].tolist() == tok(row["verifier_prompt"], add_special_tokens=False)["input_ids"]
        comp = tiny_pipe.tokenizer.decode(p.drafter_comp_ids[0].tolist())
        assert comp == f"<|im_start|>user\n{row['verifier_user_text']}<|im_end|>\n<|im_start|>assistant\n"
        full = tiny_pipe.tokenizer.decode(p.drafter_full_ids[0].tolist())
        assert full.startswith("<|im_start|>user\n<|vision_start|><|image_pad|>")
        assert full.endswith(f"<|vision_end|>{full_text}<|im_end|>\n<|im_start|>assistant\n")  # no think block: Qwen3-VL Instruct's
    default = tiny_pipe.prepare(image, query, caption=caption, ocr=ocr, method="asymspec", max_new_tokens=2, prefill=True)
    assert "Image description:" in tok.decode(default.prompts.verifier_ids[0].tolist())  # the pipeline's own layout is unchanged


def test_protocol_and_prompt_style_must_agree(tiny_pipe, tmp_path: Path) -> None:
    with pytest.raises(UnknownOptionError, match="prompt_style=PAPER_STYLE"):
        mv.run_mathvista(tiny_pipe, [], [], tmp_path / "r.jsonl", protocol="paper", progress=False, log=lambda s: None)


def test_problem_own_texts_under_the_paper_protocol() -> None:
    """MiniVista problems carry their own caption and plain OCR text: used as given (cut to the budgets)."""
    problem = {"pid": "m1", "caption": "A bar chart. " * 200, "ocr": "10 8 6 4 2 0"}
    caption, ocr = mv.paper_view(problem, None)
    assert caption == ("A bar chart. " * 200)[:1600] and ocr == "10 8 6 4 2 0"
    assert mv.paper_view({"pid": "m2", "caption": "c", "ocr": ""}, None) == ("c", False)
    listed = {"pid": "m3", "caption": "c", "ocr": "[([[0, 0], [1, 0], [1, 1], [0, 1]], 'x', 0.9), ([[0, 0]], 'y', 0.5)]"}
    assert mv.paper_view(listed, None) == ("c", "x y")


def test_resume_under_another_protocol_is_refused(tmp_path: Path) -> None:
    from asymspec_mm.eval.mathvista.paper_prompts import check_records_protocol

    old = [{"pid": "1", "variant": "floor"}]  # written before records named their protocol: MathVista's
    check_records_protocol(old, "mathvista", tmp_path / "records.jsonl")
    with pytest.raises(UnknownOptionError) as info:
        check_records_protocol(old, "paper", tmp_path / "records.jsonl")
    assert str(info.value) == (
        f"{tmp_path / 'records.jsonl'} holds records of --protocol mathvista, now --protocol paper: "
        "use the same protocol to resume, or a new --out"
    )


def test_drafter_thinking_switch_reaches_templates_that_read_it() -> None:
    """The paper style turns thinking off in the drafter's templates too (as the harness does): a Qwen3-format
    template with the switch closes an empty think block; the Qwen3-VL Instruct template (no switch) is unchanged."""
    from transformers import AutoProcessor, AutoTokenizer

    from asymspec_mm.checkpoints.build import DRAFTER_CHAT_TEMPLATE
    from asymspec_mm.request.prompts import UserTexts, chat_texts

    drafter_dir = TINY_VERIFIER.parent / "drafter"
    tok = AutoTokenizer.from_pretrained(TINY_VERIFIER)
    texts = UserTexts("v", "c", "f")
    plain = AutoProcessor.from_pretrained(drafter_dir)
    assert "enable_thinking" not in plain.chat_template
    head = "<|im_start|>user\n"
    for off in (False, True):
        v, c, f = chat_texts(plain, tok, texts, drafter_thinking_off=off)
        assert v == tiny_template("v")
        assert (c, f) == (
            f"{head}c<|im_end|>\n<|im_start|>assistant\n",
            f"{head}<|vision_start|><|image_pad|><|vision_end|>f<|im_end|>\n<|im_start|>assistant\n",
        )
    # the real Qwen3-VL template with Qwen3's thinking switch in its generation prompt
    gen = "{{- '<|im_start|>assistant\\n' }}"
    assert gen in DRAFTER_CHAT_TEMPLATE
    with_switch = DRAFTER_CHAT_TEMPLATE.replace(
        gen, gen + "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    switched = AutoProcessor.from_pretrained(drafter_dir, chat_template=with_switch)
    _, c, f = chat_texts(switched, tok, texts, drafter_thinking_off=True)
    assert c == f"{head}c<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" and f.endswith(
        "f<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    _, c, _ = chat_texts(switched, tok, texts, drafter_thinking_off=False)
    assert c == f"{head}c<|im_end|>\n<|im_start|>assistant\n"
