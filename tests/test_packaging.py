"""The package builds as pip builds it, without setuptools' deprecation warnings, and declares its licence the
current way (an SPDX expression plus the licence file, PEP 639).

The wheel is built offline (``--no-build-isolation``, no index) with this environment's setuptools, from a copy of
the checkout so the build's ``build/`` and ``*.egg-info`` stay out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from docblocks import REPO
from packaging.requirements import Requirement
from packaging.version import Version

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "asymspec_mm", "vision_cache", "captioning", "ui")


def test_the_build_backend_here_is_one_the_project_requires() -> None:
    import setuptools

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    requires = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]]
    setuptools_req = next(r for r in requires if r.name == "setuptools")
    assert Version(setuptools.__version__) in setuptools_req.specifier
    assert "77" in str(setuptools_req.specifier)  # the first setuptools that reads an SPDX `license` and `license-files`


def test_the_wheel_builds_without_deprecation_warnings_and_carries_its_licence(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "deprecated" not in log.lower(), next(ln for ln in log.splitlines() if "deprecated" in ln.lower())
    (wheel,) = (tmp_path / "dist").glob("asymspec_mm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        licence = zf.read(f"{dist_info}/licenses/LICENSE").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert licence == (REPO / "LICENSE").read_text() and "Apache License" in licence and "Version 2.0" in licence
