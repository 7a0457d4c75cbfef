"""Other libraries' chatter goes through logging (#41): RapidOCR's coloured ``[WARNING] ... text detection result is
empty``, transformers' "Loading weights" bars and its "Token indices sequence length is longer..." notice are absent
by default and present with verbose logging (``logging.basicConfig(level=logging.INFO)``, ``asymspec-mm <command>
--verbose``). Each case runs in a fresh interpreter: the libraries' logging state is per process. The two library
cases (an OCR read, a load) share one interpreter per logging setting (:func:`library_output`): both read the same
state, and an interpreter that imports torch is most of either case's time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
ENV.pop("TRANSFORMERS_VERBOSITY", None)
VERBOSE = "import logging; logging.basicConfig(level=logging.INFO)\n"


def run_python(code: str, verbose: bool) -> str:
    """stdout and stderr of ``code`` in a fresh interpreter, with INFO logging on when ``verbose``."""
    proc = subprocess.run(
        [sys.executable, "-c", (VERBOSE if verbose else "") + code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


BLANK_OCR = """
from PIL import Image
from captioning.ocr import RapidOCREngine
assert RapidOCREngine().read(Image.new("RGB", (128, 128), "white")) == []
"""


def test_rapidocr_on_a_blank_image_is_quiet_unless_verbose(library_output):
    pytest.importorskip("rapidocr")
    assert "detection result is empty" not in library_output[False]
    out = library_output[True]
    assert "RapidOCR: The text detection result is empty" in out and "\x1b[" not in out  # through logging, no colours


LOAD = """
from asymspec_mm import AsymSpecPipeline
pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
from transformers.utils import logging as hf_logging
assert hf_logging.is_progress_bar_enabled()  # restored after the load
"""


@pytest.fixture(scope="module")
def library_output() -> dict[bool, str]:
    """verbose -> the output of a fresh interpreter that loads the tiny pair (:data:`LOAD`), after reading a blank
    image with RapidOCR (:data:`BLANK_OCR`) where it is installed."""
    import importlib.util

    code = (BLANK_OCR if importlib.util.find_spec("rapidocr") else "") + LOAD
    return {verbose: run_python(code, verbose) for verbose in (False, True)}


def test_loading_the_tiny_pair_shows_no_bars_unless_verbose(library_output):
    assert "Loading weights" not in library_output[False]
    assert "Loading weights" in library_output[True]


def test_cli_keeps_transformers_notices_for_verbose_on_the_subcommand(tmp_path):
    """A prompt over the tokenizer's nominal length: transformers' notice and the loading bars only with the
    subcommand's ``--verbose``; the answer is the CLI's own one-line error either way."""
    from PIL import Image

    image = tmp_path / "blank.png"
    Image.new("RGB", (128, 128), "white").save(image)
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "generate", "--preset", "tiny", "--image", str(image), "--ocr", "", "--caption", ""]
    cmd += ["--question", "7," * 20000]  # 40,000 tokens: over the tokenizer's 32,768
    for verbose in (False, True):
        proc = subprocess.run(cmd + (["--verbose"] if verbose else []), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "error: the verifier prompt has" in proc.stderr, proc.stderr
        for chatter in ("Token indices sequence length is longer", "Loading weights"):
            assert (chatter in proc.stderr) == verbose, (verbose, chatter, proc.stderr[-2000:])


def test_verbose_on_a_subcommand_does_not_undo_the_top_level_flag():
    from asymspec_mm.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["-v", "serve"]).verbose and parser.parse_args(["serve", "-v"]).verbose
    assert not parser.parse_args(["serve"]).verbose
    assert parser.parse_args(["eval", "report", "x", "--verbose"]).verbose
