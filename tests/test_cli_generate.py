"""``asymspec-mm generate`` as a new user meets it: one-line errors before any model loads, a warning when the
tiny pair is asked what it never learned, provenance that names every steered token, JSON with token texts."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from argv_runs import Outcome, run_argvs

from asymspec_mm.base.errors import EmptyQuestionError, InvalidQuestionError, UnknownOptionError
from asymspec_mm.cli.main import DOMAIN_ADVICE
from asymspec_mm.request.domain import QUESTION_FORMS, domain_problems, domain_warning, request_warnings
from asymspec_mm.request.mathvista_query import mathvista_question
from asymspec_mm.request.questions import check_question

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "examples" / "chart.png"


def cli_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), **(extra_env or {}))
    return env


def cli(*args: str | bytes, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "asymspec_mm.cli", *args]
    return subprocess.run(cmd, cwd=REPO, env=cli_env(extra_env), capture_output=True, timeout=300)


# ----------------------------------------------------------------------------------------- the question


def test_check_question_accepts_text_and_utf8_bytes():
    assert check_question("Which bar?") == "Which bar?"
    assert check_question("Quelle barre est la plus élevée ?".encode()) == "Quelle barre est la plus élevée ?"


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (b"caf\xe9?", InvalidQuestionError, "byte 0xe9 at offset 3"),
        ("caf\udce9?", InvalidQuestionError, "0xe9 at character 3"),
        ("\ud800", InvalidQuestionError, "U+D800 at character 0"),
        (42, InvalidQuestionError, "not int"),
        (None, InvalidQuestionError, "not NoneType"),
        ("  \n", EmptyQuestionError, "empty"),
    ],
)
def test_check_question_refuses_with_the_reason(bad, error, words):
    with pytest.raises(error) as info:
        check_question(bad)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_mathvista_question_equals_minivista_queries():
    """Two implementations of MathVista's layout (ours for users, MiniVista's generator) agree on 80 problems."""
    from asymspec_mm.eval.minivista import make_problem

    for i in range(80):
        p = make_problem(5, i)
        if p["question_type"] == "multi_choice":
            ours = mathvista_question(p["question"], choices=p["choices"], unit=p["unit"])
        else:
            kind = {"integer": "integer", "list": "list"}.get(p["answer_type"]) or f"float{p['precision']}"
            ours = mathvista_question(p["question"], answer_type=kind, unit=p["unit"])
        assert ours == p["query"], p["pid"]


def test_mathvista_question_needs_exactly_one_form():
    for kwargs in ({}, {"choices": ["a"], "answer_type": "integer"}):
        with pytest.raises(UnknownOptionError):
            mathvista_question("How many?", **kwargs)
    with pytest.raises(UnknownOptionError, match="answer_type='int'"):
        mathvista_question("How many?", answer_type="int")


# ----------------------------------------------------------------------------------------- the tiny pair's domain


def test_every_minivista_problem_is_in_the_domain():
    import re

    from asymspec_mm.eval.minivista import make_problem
    from asymspec_mm.eval.minivista_agent import make_agent_problem
    from asymspec_mm.eval.minivista_log import TASK, make_log_problem
    from asymspec_mm.request.domain import question_stem

    stems = set()
    for seed in (0, 1):
        for i in range(120):
            p = make_problem(seed, i)
            assert domain_problems(p["query"], p["decoded_image"].size) == [], p["query"]
            stems.add(re.sub(r"\s*\(Unit: [^)]*\)$", "", question_stem(p["query"])))
    for i in range(40):  # the agent family's request, and its follow-up (asked in a later turn, without the hint)
        p = make_agent_problem(1, i)
        assert domain_problems(p["query"], p["image"].size) == [], p["query"]
        stems.add(question_stem(p["query"]))
        if p["followup"]:
            stems.add(p["followup"]["question"])
    for i in range(10):  # the agent-log family: its task and its question, asked plainly
        p = make_log_problem(1, i)
        for text in (TASK, p["question"]):
            assert domain_problems(text, None) == [], text
            stems.add(question_stem(text))
    for form in QUESTION_FORMS:  # every form was drawn
        assert any(re.fullmatch(form.replace("{w}", "[A-Za-z]+"), stem) for stem in stems), form


@pytest.mark.parametrize(
    "question, size, words",
    [
        ("Which bar is the tallest?", (128, 128), "not in MathVista's layout"),
        (mathvista_question("What is the capital of France?", choices=["Paris", "Rome"]), (128, 128), "not one of MiniVista's"),
        (mathvista_question("Which bar is the tallest?", choices=["red", "blue"]), (640, 480), "640x480"),
    ],
)
def test_out_of_domain_requests_are_named(question, size, words):
    warning = domain_warning(question, size)  # the Python API's advice; the command line names its flags
    assert warning is not None and words in warning and 'from_preset("qwen3")' in warning and "\n" not in warning
    (cli,) = request_warnings("tiny", question, [size], DOMAIN_ADVICE)
    assert words in cli and "add --choices" in cli and "--preset qwen3" in cli and "\n" not in cli


# ----------------------------------------------------------------------------------------- errors before loading


def stderr_of(proc: subprocess.CompletedProcess | Outcome) -> str:
    return proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()


def one_error_line(proc: subprocess.CompletedProcess | Outcome) -> str:
    err = stderr_of(proc)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_non_utf8_question_is_one_line_before_loading():
    """A process of its own: the bytes reach ``generate`` as the interpreter decodes a command line it is given."""
    proc = cli("generate", "--image", str(CHART), "--question", b"caf\xe9?", "--preset", "tiny")
    line = one_error_line(proc)
    assert "not valid UTF-8 (0xe9 at character 3)" in line
    assert b"loading the models" not in proc.stderr  # refused before any model loads


def _png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width`` x ``height`` with 100 bytes of pixel data: its size reads from the header, decoding
    it fails."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(100))) + chunk(b"IEND", b"")


BAD_IMAGES = ("missing", "empty", "corrupt", "truncated", "folder")
OUT_OF_RANGE = [
    (["--k", "100"], "error: --k 100 must be an integer >= 1 and <= 16"),
    (["--k", "0"], "error: --k 0 must be an integer >= 1 and <= 16"),
    (["--gamma", "2"], "error: --gamma 2.0 must be >= 0 and <= 1"),
    (["--beta", "-0.5"], "error: --beta -0.5 must be >= 0 and <= 4"),
    (["--lam", "11"], "error: --lam 11.0 must be >= 0 and <= 10"),
    (["--max-new-tokens", "0"], "error: --max-new-tokens 0 must be an integer >= 1"),
    (["--temperature", "3"], "error: --temperature 3.0 must be >= 0 and <= 2"),
    (["--top-k", "-1"], "error: --top-k -1 must be an integer >= 0"),
    (["--top-p", "0"], "error: top_p=0.0 must be > 0 and <= 1 (1 keeps every token)"),
    (["--seed", "-3"], "error: seed=-3 must be None or an integer >= 0 and < 2**63"),
]
UNLOADABLE = [
    ("./no-such-folder", "the drafter checkpoint './no-such-folder' does not exist"),
    ("Example-Org/not-downloaded-model", "is not in the local Hugging Face cache and HF_HUB_OFFLINE=1"),
]


def bad_image(folder: Path, kind: str) -> Path:
    """``folder/kind/image.png`` made ``kind`` of bad (``missing``: not made at all)."""
    path = folder / kind / "image.png"
    path.parent.mkdir()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "corrupt":
        path.write_bytes(b"not an image at all")
    elif kind == "truncated":
        path.write_bytes(CHART.read_bytes()[:200])
    elif kind == "folder":
        path.mkdir()
    return path


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict[str, tuple[Outcome, Path | None]]:
    """The command lines below that ``generate`` refuses, each through ``main(argv)``, all in one process (one start-up
    for all, :mod:`argv_runs`); name -> (what it did, the image it was given when that is one made here)."""
    folder = tmp_path_factory.mktemp("refused")
    ask = ["generate", "--image", str(CHART), "--question", "Which bar is the tallest?", "--preset", "tiny"]
    runs: dict[str, tuple[list[str], Path | None]] = {}
    for kind in BAD_IMAGES:
        path = bad_image(folder, kind)
        runs[f"image-{kind}"] = (["generate", "--image", str(path), "--question", "Which bar is the tallest?", "--preset", "tiny"], path)
    huge = folder / "huge.png"
    huge.write_bytes(_png_header(12000, 12000))
    runs["huge"] = (["generate", "--image", str(huge), "--question", "Which bar is the tallest?", "--preset", "tiny"], huge)
    for option, _ in OUT_OF_RANGE:
        runs[" ".join(option)] = ([*ask, *option], None)
    runs["help"] = (["generate", "--help"], None)
    runs["cuda"] = (["generate", "--image", str(CHART), "--question", "x", "--preset", "tiny", "--device", "cuda", "-q"], None)
    runs["dtype"] = (["generate", "--image", str(CHART), "--question", "x", "--dtype", "int4"], None)
    for drafter, _ in UNLOADABLE:
        runs[drafter] = (["generate", "--image", str(CHART), "--question", "x", "--drafter", drafter, "--verifier", drafter, "-q"], None)
    outcomes = run_argvs("asymspec_mm.cli.main:main", [argv for argv, _ in runs.values()], cwd=REPO, env=cli_env())
    return {name: (outcome, path) for (name, (_, path)), outcome in zip(runs.items(), outcomes)}


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing", "--image: image file not found: '{path}'"),
        ("empty", "--image: image file '{path}' is not a recognised image"),
        ("corrupt", "--image: image file '{path}' is not a recognised image"),
        ("truncated", "--image: image file '{path}' could not be decoded"),
        ("folder", "--image: image path '{path}' is a directory"),
    ],
)
def test_a_bad_image_is_one_line_before_loading(refused, kind, words):
    proc, path = refused[f"image-{kind}"]
    assert words.format(path=path) in one_error_line(proc)
    assert "loading the models" not in proc.stderr and "warning:" not in proc.stderr


def test_an_oversized_image_is_refused_first_naming_a_real_setting(refused):
    """12000x12000: refused from its header before the tiny pair's domain warning and the models, naming the
    variable that raises the limit (no option of the library's API); with the variable raised (in the environment a
    process starts with), the same file gets past the size check (and fails on its missing pixels instead)."""
    proc, path = refused["huge"]
    assert one_error_line(proc) == (
        f"error: --image {path} is 12000x12000 = 144,000,000 pixels, over the limit of 67,108,864 pixels: downscale it "
        "(e.g. to fit 8192x8192), or set ASYMSPEC_MAX_INPUT_PIXELS to a larger pixel count"
    )
    assert "warning:" not in proc.stderr and "loading the models" not in proc.stderr
    raised = cli("generate", "--image", str(path), "--question", "q", "--preset", "tiny", extra_env={"ASYMSPEC_MAX_INPUT_PIXELS": "2e8"})
    line = one_error_line(raised)
    assert "could not be decoded" in line and "pixels" not in line and b"loading the models" not in raised.stderr


@pytest.mark.parametrize("option, line", OUT_OF_RANGE)
def test_an_option_out_of_its_range_is_one_line_before_loading(refused, option, line):
    proc, _ = refused[" ".join(option)]
    assert one_error_line(proc) == line and "loading the models" not in proc.stderr


def test_help_shows_each_range(refused):
    proc, _ = refused["help"]
    assert proc.returncode == 0, proc.stderr
    flat = " ".join(proc.stdout.split())
    for words in (
        "draft length K, 1 to 16 [default: 4]",
        "(0 disables fusion), 0 to 4 [default: 1.0]",
        "tuned_kl), 0 to 10 [default: 0.1]",
    ):
        assert words in flat, words
    assert "divergence discount, 0 to 1 [default: 0.5]" in flat and "most tokens to generate, 1 or more [default: 512]" in flat


def test_cuda_without_a_gpu_is_one_line(refused):
    proc, _ = refused["cuda"]
    assert "device='cuda' but" in one_error_line(proc) and "--device cpu" in proc.stderr


def test_device_errors_name_the_fix():
    from asymspec_mm.engines.loading import resolve_device

    with pytest.raises(UnknownOptionError, match="not a torch device"):
        resolve_device("gpu0", None)
    if not __import__("torch").cuda.is_available():
        with pytest.raises(UnknownOptionError, match="--device cpu"):
            resolve_device("cuda:1", None)


def test_unknown_dtype_lists_the_choices(refused):
    proc, _ = refused["dtype"]
    assert proc.returncode == 2 and "invalid choice: 'int4'" in proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------- what it prints


@pytest.fixture(scope="module")
def tiny():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", device="cpu")


def test_generate_warns_out_of_domain_and_answers(tiny):
    """The answer is the library's, decoded as a row of the engine core (its stats hold a row's: ``engine_calls``,
    ``batch_size``), with the set-up's phases told on stderr before decoding starts."""
    proc = cli("generate", "--image", str(CHART), "--question", "Which bar is the tallest?", "--preset", "tiny", "--ocr", "")
    assert proc.returncode == 0
    err = proc.stderr.decode()
    assert "warning: the tiny pair answers only MiniVista questions" in err and "not in MathVista's layout" in err
    expected = tiny.generate(CHART, "Which bar is the tallest?", ocr="").text
    assert f"answer: {expected}\n" in proc.stdout.decode()
    phases = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("[")]
    assert phases[-3:-1] == ["captioning the image with the drafter", "prefilling the prompts"]
    assert phases[-1].startswith("decoding (method=asymspec")
    proc = cli(
        "generate", "--image", str(CHART), "--question", "Which bar is the tallest?", "--preset", "tiny", "--ocr", "", "--json", "-q"
    )
    data = json.loads(proc.stdout.decode())
    assert data["text"] == expected and data["stats"]["batch_size"] == 1 and data["stats"]["engine_calls"] > 0


def test_provenance_names_each_steered_token_and_the_gate(tiny):
    from asymspec_mm.cli.output import gate_decision, print_result

    ex = json.loads((REPO / "asymspec_mm" / "examples_data" / "examples.json").read_text())
    steered_seen = 0
    for e in ex[:6]:
        res = tiny.generate(REPO / "asymspec_mm" / "examples_data" / e["image"], e["question"], caption=e["caption"], ocr=e["ocr"] or False)
        out = io.StringIO()
        print_result(res, tiny.tokenizer, out=out)
        text = out.getvalue()
        assert "<|im_end|>" not in text.split("provenance: ", 1)[1].splitlines()[0]
        steered = [ev for ev in res.trace if ev.steered]
        steered_seen += len(steered)
        assert f"{len(steered)} differ from the verifier alone" in text
        for ev in steered:
            alone = tiny.tokenizer.decode([ev.verifier_argmax])
            assert f"  #{ev.index} {ev.text!r}: " in text and f"verifier alone: {alone!r}" in text
        for ev in res.trace:
            decision = gate_decision(ev)
            if ev.source == "accepted":  # the numbers really satisfy Eq. 4
                assert ev.p_verifier > ev.gamma_eff * ev.p_base and decision.endswith("-> accepted")
            elif ev.source == "fused":
                assert ev.draft_p_verifier <= ev.gamma_eff * ev.draft_p_base and decision.endswith("-> draft rejected")
            else:
                assert decision is None
        assert f"settings: method=asymspec k={res.config.k} beta={res.config.beta}" in text
        assert "OCR" in text and ("(given)" in text or "(off)" in text)
    assert steered_seen > 0  # the examples do exercise the steered lines


def test_a_sampled_run_names_its_seed_and_repeats_with_it(tiny):
    from asymspec_mm.cli.output import print_result

    ex = json.loads((REPO / "asymspec_mm" / "examples_data" / "examples.json").read_text())[1]
    args = (REPO / "asymspec_mm" / "examples_data" / ex["image"], ex["question"])
    res = tiny.generate(*args, caption=ex["caption"], ocr=ex["ocr"] or False, temperature=1.5, top_k=40)
    out = io.StringIO()
    print_result(res, tiny.tokenizer, out=out)
    text = out.getvalue()
    seed = res.stats["seed"]
    assert f"sampled at temperature 1.5 with seed {seed} (repeat with --seed {seed})" in text
    assert f"temperature=1.5 top_p=1.0 top_k=40 seed={seed}" in text and "mean gate excess" in text
    again = tiny.generate(*args, caption=ex["caption"], ocr=ex["ocr"] or False, temperature=1.5, top_k=40, seed=seed)
    assert again.token_ids == res.token_ids
    greedy = io.StringIO()
    print_result(tiny.generate(*args, caption=ex["caption"], ocr=ex["ocr"] or False), tiny.tokenizer, out=greedy)
    assert "sampled at" not in greedy.getvalue() and "temperature=" not in greedy.getvalue()


def test_json_names_every_token(tiny):
    from asymspec_mm.cli.output import print_result

    ex = json.loads((REPO / "asymspec_mm" / "examples_data" / "examples.json").read_text())[0]
    res = tiny.generate(REPO / "asymspec_mm" / "examples_data" / ex["image"], ex["question"], caption=ex["caption"], ocr=ex["ocr"])
    out = io.StringIO()
    print_result(res, tiny.tokenizer, as_json=True, out=out)
    data = json.loads(out.getvalue())
    dec = lambda i: None if i is None else tiny.tokenizer.decode([i])  # noqa: E731
    assert len(data["trace"]) == len(res.trace)
    for entry, ev in zip(data["trace"], res.trace):
        assert entry["verifier_text"] == dec(ev.verifier_argmax) and entry["draft_text"] == dec(ev.draft_token)
        assert [t[:2] for t in entry["top_verifier"]] == [[i, dec(i)] for i, _ in ev.top_verifier]
        assert [t[:2] for t in entry["top_fused"]] == [[i, dec(i)] for i, _ in ev.top_fused]
    assert data["config"] == res.config.as_dict() | {"stop_strings": []}


def test_stats_name_the_ocr_engine(tiny):
    from asymspec_mm.pipeline.presets import tiny_ocr_engine

    res = tiny.generate(CHART, mathvista_question("Which bar is the tallest?", choices=["red", "green"]), max_new_tokens=2)
    assert res.stats["ocr_engine"] == tiny_ocr_engine() and res.stats["ocr_s"] > 0
    assert tiny.generate(CHART, "x?", ocr="10 8", max_new_tokens=1).stats["ocr_engine"] == "given"
    assert tiny.generate(CHART, "x?", ocr=False, max_new_tokens=1).stats["ocr_engine"] == "off"


@pytest.mark.parametrize("drafter, words", UNLOADABLE)
def test_a_checkpoint_that_cannot_load_is_one_line(refused, drafter, words):
    proc, _ = refused[drafter]
    assert words in one_error_line(proc)
