"""The documentation stays true: every runnable block of the README and the docs pages is run by a test (or listed
here as not runnable, with the reason), and the site builds with ``mkdocs build --strict`` (no broken link, no
missing API object).

A block is run when a test calls ``block_with(page, lang, marker)`` on it with literal arguments (read here from the
tests' source, so a renamed marker or a new block cannot go unnoticed), or when it is the same text as such a block
on another page (the README's examples repeat the pages' word for word).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import DOCS, REPO, block_with, blocks, doc_pages, fenced_blocks, read_page

#: Languages whose blocks are programs a reader would run.
RUNNABLE = ("python", "bash", "sh", "shell", "console")
#: The test files whose ``block_with`` calls count as running a block.
RUNNERS = ("tests/test_readme.py", "tests/test_docs.py", "tests/test_two_vocab_loading.py")

GPU_QWEN = "needs the real Qwen3-VL-2B-Instruct / Qwen3-32B weights (a GPU and the Hugging Face hub)"
VLLM = "needs a vLLM install (tests/test_vllm_engine.py runs in the separate .venv-vllm; CI runs it)"

#: (page, marker) -> why the block containing ``marker`` is not run as written.
NOT_RUN: dict[tuple[str, str], str] = {
    ("README.md", "make quickstart"): "the set-up commands themselves: `make test` is this suite, and `make quickstart` "
    "runs `asymspec-mm quickstart` after creating .venv (the command is tested in tests/test_cli_generate.py)",
    ("docs/cli.md", "--drafter Qwen/Qwen3-VL-2B-Instruct --verifier Qwen/Qwen3-32B"): GPU_QWEN
    + "; its other lines start the demo, the eval and the bench, tested in tests/test_ui*.py, test_eval_run.py, test_bench.py",
    ("docs/mathvista.md", "--protocol paper --drafter Qwen/Qwen3-VL-2B-Instruct"): GPU_QWEN
    + " and MathVista's images; the MiniVista line below runs the same path",
    ("docs/python-api.md", "pipe.generate_batch("): "a signature sketch (`...` for the requests and the loop body); "
    "tests/test_batch.py and tests/test_scheduler_faults.py run both calls",
    ("docs/conversations.md", '"The blue one."'): "a sketch: `chart` and `photo` stand for the caller's images; "
    "tests/test_conversation.py runs pipe.chat on such messages",
    ("docs/compressed-view.md", "StaticCaptioner("): "a sketch: `img`, `q` and the mathvista/ text files stand for the "
    "caller's; tests/test_static_texts.py runs StaticCaptioner and StaticOCR on MathVista's files",
    ("docs/architecture.md", "pipe.prepare("): "a sketch: `image`, `question`, `cfg` and `my_timer` stand for the "
    "caller's; tests/test_structure.py runs prepare, run, the engine factories and the timer",
    ("docs/files/BENCHMARKS.md", "gpu_bench.sh"): "benchmark runs of minutes to hours, and a GPU script; "
    "tests/test_bench.py and tests/test_gpu_scripts.py run their code on small settings",
    ("docs/files/BENCHMARKS.md", "vllm_batch_bench.py"): VLLM,
    ("docs/files/BENCHMARKS.md", "--ocr none --out runs/serving-bench-no-ocr"): VLLM
    + " beside this project's; ~5 min each; tests/test_serving_bench.py runs the script on 4 prompts",
    ("docs/files/BENCHMARKS.md", "--concurrency 16 --methods asymspec"): VLLM
    + " beside this project's; six rounds of four arms, ~30 min; tests/test_serving_bench.py runs the script on 4 prompts",
    ("docs/files/BENCHMARKS.md", "aiperf_bench.sh --prompts 8"): "needs AIPerf in its own venv (~3 min); "
    "tests/test_aiperf_bench.py runs the script on 2 prompts where AIPerf is installed",
    ("docs/files/VLLM.md", 'verifier_backend="vllm"'): VLLM + " and the real models",
    ("docs/files/VLLM.md", "VLLMModel.from_pretrained"): VLLM + " and Qwen3-8B",
    ("docs/files/VLLM.md", "bash scripts/vllm_venv.sh"): VLLM + ": these lines create that venv and run those tests",
    ("docs/files/VLLM.md", "vllm_gpu_check.py"): VLLM + " on a GPU",
    ("docs/deployment.md", "pip install vllm-router=="): "starts a server and a router that run until stopped; "
    "tests/test_router_e2e.py starts both routers with these flags on free ports, and tests/test_router_bodies.py "
    "checks the lines equal its commands",
    ("docs/deployment.md", "--policy manual"): "starts two servers and a router that run until stopped; "
    "tests/test_router_sessions.py starts them on free ports and checks the router lines equal its commands",
    ("docs/deployment.md", "--cb-failure-threshold"): "routers that run until stopped; tests/test_router_failover.py "
    "starts them in front of two replicas on free ports and checks the lines equal its commands",
    ("docs/deployment.md", "# serve_tp.py"): GPU_QWEN + ", vLLM and several GPUs (a tensor-parallel verifier)",
    ("docs/compressed-views.md", 'Compression("llmlingua2"'): "needs the LLMLingua-2 classifier in the local cache "
    "and the caller's `messages`; tests/test_compression.py runs pipe.chat and submit_chat with compression=",
    ("docs/compressed-views.md", 'from_pretrained("Qwen/Qwen3-4B"'): "needs the real Qwen3-4B / Qwen3-32B weights and the "
    "caller's `history`; tests/test_text_drafter.py runs the same calls on stand-ins built from the real Qwen3 files",
    ("docs/cli.md", "--drafter Qwen/Qwen3-4B --verifier Qwen/Qwen3-32B"): "needs the real Qwen3-4B / Qwen3-32B weights "
    "and the caller's history.json; tests/test_text_drafter.py runs generate and chat with these flags on stand-ins",
    ("docs/compressed-views.md", "--families agent-log --minivista-n 40"): "the agent-log evaluation and its openai-agents "
    "run against a server: tests/test_tiny_log.py runs both paths on a few tasks",
    ("docs/compressed-views.md", '"compression": False'): "a sketch: `client` and `history` stand for the caller's; "
    "tests/test_serve_compression.py sends both bodies with the openai client",
}


def _hook_pages() -> dict[str, str]:
    """The repository files the site publishes as pages (``PAGES`` of docs/hooks/repo_files.py): source -> page.
    Read from the hook's source, so the check needs no mkdocs."""
    tree = ast.parse((DOCS / "hooks" / "repo_files.py").read_text(encoding="utf-8"))
    (pages,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["PAGES"]]
    return ast.literal_eval(pages)


def all_blocks() -> list[tuple[str, str, str]]:
    """``(page, lang, text)`` of every runnable block of the README, the docs pages and the published repository
    files (named by their page under docs/)."""
    found = [(page, lang, text) for page in doc_pages() for lang, text in fenced_blocks(page) if lang in RUNNABLE]
    for source, page in _hook_pages().items():
        found += [(f"docs/{page}", lang, text) for lang, text in fenced_blocks(source) if lang in RUNNABLE]
    return found


def run_claims() -> set[tuple[str, str, str]]:
    """``(page, lang, marker)`` of every ``block_with`` call with literal arguments in the runner tests."""
    claims = set()
    for runner in RUNNERS:
        for node in ast.walk(ast.parse((REPO / runner).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "block_with" and len(node.args) == 3:
                if all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
                    claims.add(tuple(a.value for a in node.args))
    return claims


def page_text(page: str) -> str:
    source = {f"docs/{p}": s for s, p in _hook_pages().items()}.get(page, page)
    return read_page(source)


def test_every_runnable_block_is_run_or_says_why_not():
    every = all_blocks()
    assert len(every) > 20
    run = {}
    for page, lang, marker in run_claims():
        matches = [text for p, lg, text in every if p == page and lg == lang and marker in text]
        assert len(matches) == 1, f"block_with({page!r}, {lang!r}, {marker!r}) matches {len(matches)} blocks"
        run[matches[0]] = (page, marker)
    skipped = {}
    for (page, marker), reason in NOT_RUN.items():
        matches = [text for p, _lang, text in every if p == page and marker in text]
        assert len(matches) == 1, f"NOT_RUN entry ({page!r}, {marker!r}) matches {len(matches)} blocks: update it"
        assert reason.strip()
        skipped[matches[0]] = reason
    orphans = [
        f"{page}: ```{lang} block starting {text.splitlines()[0][:70]!r}"
        for page, lang, text in every
        if text not in run and text not in skipped
    ]
    assert not orphans, (
        "these blocks are neither run by a test (block_with in tests/test_readme.py) nor listed in "
        "tests/test_docs.py's NOT_RUN with a reason:\n" + "\n".join(orphans)
    )


def test_the_readme_is_a_front_door():
    readme = read_page("README.md")
    lines = readme.splitlines()
    assert len(lines) <= 200, f"the README has {len(lines)} lines: move detail to a docs page"
    setup = blocks("README.md", "bash")[0]
    assert readme.startswith("# asymspec-mm\n\n```bash\n" + setup + "```\n")
    assert "make quickstart" in setup and "make test" in setup
    for page in doc_pages()[1:]:  # every guide page is on the README's map (the API pages through its first)
        if not page.startswith("docs/api/") and page != "docs/index.md":  # index.md: the site's home, the README's twin
            assert f"]({page})" in readme, f"the README's map of the documentation misses {page}"


def test_the_site_publishes_every_repository_note():
    pages = _hook_pages()
    assert "BENCHMARKS.md" in pages and "VLLM.md" in pages
    for source, page in pages.items():
        assert (REPO / source).is_file(), source
        assert f"files/{Path(page).name}" in (REPO / "mkdocs.yml").read_text(encoding="utf-8"), f"{page} is not in the nav"


def test_mkdocs_builds_strictly(tmp_path):
    """The Getting started page's build command, into a scratch folder: strict, so a broken link, a missing page or
    an API object mkdocstrings cannot find fails the build."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs / mkdocstrings are not installed (pip install -e '.[dev]')")
    command = block_with("docs/getting-started.md", "bash", "mkdocs build --strict").split("#")[0].split()
    assert command == ["mkdocs", "build", "--strict"]
    proc = subprocess.run(
        [mkdocs, *command[1:], "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    for page in ("api/config", "api/events", "api/batch", "api/gate", "api/sampling", "api/serve", "api/tools", "files/BENCHMARKS"):
        html = (tmp_path / "site" / page / "index.html").read_text(encoding="utf-8")
        assert "doc-object" in html or page.startswith("files/"), f"{page}: no API object rendered"
    config = (tmp_path / "site" / "api" / "config" / "index.html").read_text(encoding="utf-8")
    assert "trace_top" in config and ":class:" not in config
