"""The ``asymspec-mm`` command exits without the interpreter's last full garbage collections: the objects left at
its end are frozen (``gc.freeze``), since walking the half a million objects torch and transformers leave took 5 s
to 9 s after each server's shutdown and command on a busy machine, to free memory the exit frees anyway. Both ways
in (``python -m asymspec_mm.cli`` and the console script) go through :func:`asymspec_mm.cli.main.run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
#: Runs the command as ``python -m asymspec_mm.cli`` does and reports, from an exit handler (these run before the
#: interpreter's last collections), how many objects were frozen by then.
AT_EXIT = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count(), file=sys.stderr))
sys.argv = ["asymspec-mm", *sys.argv[1:]]
runpy.run_module("asymspec_mm.cli", run_name="__main__")
"""


def test_the_command_freezes_what_is_left_before_it_exits(tmp_path):
    missing = tmp_path / "missing"  # a command that fails fast, before any model loads: the exit path is the same
    proc = subprocess.run(
        [sys.executable, "-c", AT_EXIT, "serve", "--allow-local-images", str(missing)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and "is not a directory" in proc.stderr, proc.stderr
    frozen = int(proc.stderr.rsplit("frozen at exit:", 1)[1].split()[0])
    assert frozen > 1000, proc.stderr  # the command's modules and objects, not a handful


def test_the_console_script_goes_through_the_same_exit():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()  # read as text: tomllib is Python 3.11+
    assert 'asymspec-mm = "asymspec_mm.cli.main:run"' in lines
