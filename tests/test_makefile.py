"""The Makefile's front door: `make quickstart` ends by saying how to run the command line, and what it says works
in a shell that has not activated the venv (where a bare ``asymspec-mm`` is "command not found").

The targets run against this test's own venv (``VENV=`` the running interpreter's), with its ``.installed`` stamp
assumed up to date (``make -o``), so nothing is installed or changed in it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import REPO, read_page

VENV = Path(sys.prefix)
pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (VENV / "bin" / "activate").is_file(), reason="needs make and a venv")


def shell_env() -> dict[str, str]:
    """A new shell's environment: the venv neither active nor on PATH (the state the README's reader is in)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PYTEST_")}
    keep = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != (VENV / "bin").resolve()]
    env["PATH"] = os.pathsep.join(keep)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GRADIO_ANALYTICS_ENABLED="False", CUDA_VISIBLE_DEVICES="")
    return env


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=REPO, env=shell_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quickstart() -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "-o", f"{VENV}/.installed", "quickstart", f"VENV={VENV}"],
        cwd=REPO,
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_quickstart_answers_then_says_how_to_run_the_command_line(quickstart) -> None:
    assert quickstart.returncode == 0, quickstart.stderr[-3000:]
    assert "== AsymSpec" in quickstart.stdout  # the quickstart itself ran
    last = quickstart.stdout.strip().splitlines()[-1]
    assert last.startswith(f"next: source {VENV}/bin/activate ")
    assert f"{VENV}/bin/asymspec-mm without activating" in last


def test_the_hinted_commands_work_where_the_bare_command_is_not_found(quickstart) -> None:
    assert bash("asymspec-mm --help").returncode == 127  # what the issue saw: command not found
    activate = re.search(r"source (\S+)", quickstart.stdout.strip().splitlines()[-1]).group(1)
    activated = bash(f"source {activate} && asymspec-mm --help")
    assert activated.returncode == 0 and "quickstart" in activated.stdout, activated.stderr[-2000:]
    direct = bash(f"{VENV}/bin/asymspec-mm --help")
    assert direct.returncode == 0 and "quickstart" in direct.stdout


def test_the_readme_says_so_where_it_first_uses_the_command_line() -> None:
    readme = read_page("README.md")
    first_cli = readme.index("```bash\nasymspec-mm ")
    intro = readme[readme.rindex("\n\n", 0, first_cli - 1) : first_cli]
    assert "source .venv/bin/activate" in intro and ".venv/bin/asymspec-mm" in intro, intro


def dry_run_setup(*assignments: str) -> list[str]:
    """The commands `make setup` would run for a new venv (``-n``: none is run), one per line."""
    proc = subprocess.run(
        ["make", "-n", "-B", "setup", "VENV=/nonexistent/venv", *assignments], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_torch_comes_from_pypi_unless_an_index_is_named() -> None:
    plain = dry_run_setup()
    assert not any("--index-url" in line for line in plain)
    cpu = "https://download.pytorch.org/whl/cpu"
    named = dry_run_setup(f"TORCH_INDEX={cpu}")
    (torch_line,) = [line for line in named if "torch==" in line]
    assert torch_line.split()[-2:] == ["--index-url", cpu]
    # only torch and torchvision come from it: the package and its other requirements still come from PyPI
    assert [line for line in named if "--index-url" in line] == [torch_line]
    assert [line for line in named if line != torch_line] == [line for line in plain if "torch==" not in line]
