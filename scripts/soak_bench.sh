#!/usr/bin/env bash
# The soak and failover benchmark (issue #50 item 7): two `asymspec-mm serve --preset tiny` replicas on free
# 127.0.0.1 ports (one shared --responses-store) behind vllm-router, clients in agent-like sessions (a MiniVista
# agent task: the image and the question with the add/subtract tools, the tool's result, two follow-ups; every
# request streamed) for --duration seconds: with `X-Session-Id` (consistent_hash), then without a key (round_robin),
# then SIGTERM and SIGKILL of one replica under keyed load. Every loop is bounded in count and time.
#
#   bash scripts/soak_bench.sh [--duration 600] [--clients 16] [--keyless S] [--failover S] [--router-bin DIR]
#                              [--out runs/soak]
#
# Writes soak.json, soak.md (printed) and the replicas' and routers' logs under --out. The router: vllm-router 0.1.17
# (`pip install vllm-router==0.1.17`, in $ASYMSPEC_ROUTER_BIN, this venv or on PATH). Settings (environment): VENV
# (this project's venv, default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="$VENV/bin/python"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
exec "$PYTHON" -m asymspec_mm.bench.soak "$@"
