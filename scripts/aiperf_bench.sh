#!/usr/bin/env bash
# AIPerf (NVIDIA's serving benchmark client, `aiperf profile`) against `asymspec-mm serve` (issue #49 item 11): its
# `chat` endpoint on /v1/chat/completions, streamed, held-out MiniVista problems with their images (AIPerf's
# `single_turn` JSONL, PNG data URLs), greedy, once per method. AIPerf reads each answer's per-request
# `metrics.speculative_decoding` (vLLM's shape, sent on the stream's usage chunk) into its "Spec Decode" table; the
# table here sets AIPerf's figures beside the growth of the server's `vllm:spec_decode_*` counters over the same run,
# and the run fails if AIPerf's totals (steps, drafts, accepted drafts) differ from the counters'.
#
#   bash scripts/aiperf_bench.sh [--prompts 8] [--concurrency 2] [--methods asymspec,sd] [--max-tokens 48]
#                                [--ocr server|none] [--port 0] [--out runs/aiperf-bench]
#
# Each method gets a fresh `asymspec-mm serve --preset tiny` on 127.0.0.1; then 2 warm-up requests on other images,
# /metrics, `aiperf profile` (--request-count = --prompts, every answer --max-tokens long: `ignore_eos`), /metrics.
# Writes, under --out: dataset.jsonl, METHOD/ (AIPerf's artifacts: profile_export_aiperf.json, its console text),
# METHOD.{before,after}.prom, METHOD.aiperf.log, server-METHOD.log, summary.json and table.md (printed).
#
# Settings (environment): VENV (this project's venv, default .venv); AIPERF (the `aiperf` command; default
# .venv-aiperf/bin/aiperf, else `aiperf` on PATH: python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install
# aiperf), SERVE_ARGS (more `serve` options), READY_S (seconds to wait for a server, 180).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

PROMPTS=8 CONCURRENCY=2 METHODS=asymspec,sd MAX_TOKENS=48 OCR=server PORT=0 OUT=runs/aiperf-bench THREADS=""
usage="(--prompts N | --concurrency N | --methods asymspec,sd | --max-tokens N | --ocr server|none | --port P | --out DIR)"
while [ $# -gt 0 ]; do
  case "$1" in
    --prompts|--concurrency|--methods|--max-tokens|--ocr|--port|--out)
      [ $# -ge 2 ] || { echo "aiperf_bench: $1 needs a value $usage" >&2; exit 2; }
      case "$1" in
        --prompts) PROMPTS=$2 ;; --concurrency) CONCURRENCY=$2 ;; --methods) METHODS=$2 ;; --max-tokens) MAX_TOKENS=$2 ;;
        --ocr) OCR=$2 ;; --port) PORT=$2 ;; --out) OUT=$2 ;;
      esac
      shift 2 ;;
    *) echo "aiperf_bench: unknown option $1 $usage" >&2; exit 2 ;;
  esac
done
for pair in "prompts:$PROMPTS" "concurrency:$CONCURRENCY" "max-tokens:$MAX_TOKENS"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || { echo "aiperf_bench: --${pair%%:*} ${pair#*:} must be an integer >= 1" >&2; exit 2; }
done
[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "aiperf_bench: --port $PORT must be an integer (0: any free port)" >&2; exit 2; }
case "$OCR" in server) OCR_OPT="" ;; none) OCR_OPT=', "ocr": false' ;; *) echo "aiperf_bench: --ocr $OCR must be server or none" >&2; exit 2 ;; esac
IFS=, read -r -a METHOD_LIST <<< "$METHODS"
for m in "${METHOD_LIST[@]}"; do  # Floor and the drafter alone draft nothing: no acceptance to read
  case "$m" in asymspec|sd) ;; *) echo "aiperf_bench: --methods: '$m' drafts nothing to accept; choose from asymspec, sd" >&2; exit 2 ;; esac
done

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
READY_S="${READY_S:-180}"
if [ -z "${AIPERF:-}" ]; then
  if [ -x .venv-aiperf/bin/aiperf ]; then AIPERF=.venv-aiperf/bin/aiperf; else AIPERF=$(command -v aiperf || true); fi
else
  AIPERF=$(command -v "$AIPERF" || echo "$AIPERF")  # a command name or a path
fi
[ -x "$PY" ] || { echo "aiperf_bench: no $PY: run \`make setup\` (or set VENV to this project's venv)" >&2; exit 1; }
[ -n "$AIPERF" ] && [ -x "$AIPERF" ] ||
  { echo "aiperf_bench: no aiperf: python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf (or set AIPERF)" >&2; exit 1; }
BENCH=aiperf_bench
# shellcheck source=scripts/bench_server.sh
source scripts/bench_server.sh  # prepare_bench (sets TOKENIZER), start_server LOG (sets URL), stop_server
prepare_bench

"$PY" -m asymspec_mm.bench.aiperf_pass dataset --out "$OUT/dataset.jsonl" --prompts "$PROMPTS" --max-tokens "$MAX_TOKENS"
COMMAND="bash scripts/aiperf_bench.sh --prompts $PROMPTS --concurrency $CONCURRENCY --methods $METHODS --max-tokens $MAX_TOKENS --ocr $OCR"
echo "aiperf_bench: $COMMAND ($("$AIPERF" --version 2>/dev/null | tail -n 1 || echo "aiperf"))"
for m in "${METHOD_LIST[@]}"; do
  ASYMSPEC="{\"method\": \"$m\"$OCR_OPT}"
  rm -rf "${OUT:?}/$m"
  start_server "$OUT/server-$m.log"
  "$PY" -m asymspec_mm.bench.serving warmup --url "$URL" --asymspec "$ASYMSPEC" --max-tokens "$MAX_TOKENS" || exit 1  # its one line
  curl -sf "$URL/metrics" >"$OUT/$m.before.prom.tmp"
  # AIPerf's offline mode takes a tokenizer path for a hub name: it reads the tiny verifier's files with the hub off
  # anyway (a local folder), and the server's count of the tokens is the one used (--use-server-token-count)
  env -u HF_HUB_OFFLINE "$AIPERF" profile --model tiny --url "$URL" --endpoint-type chat --streaming \
    --tokenizer "$TOKENIZER" --use-server-token-count --input-file "$OUT/dataset.jsonl" --custom-dataset-type single_turn \
    --request-count "$PROMPTS" --concurrency "$CONCURRENCY" --random-seed 0 \
    --extra-inputs "{\"asymspec\": $ASYMSPEC, \"ignore_eos\": true, \"temperature\": 0}" \
    --output-artifact-dir "$OUT/$m" --no-auto-plot >"$OUT/$m.aiperf.log" 2>&1 ||
    { echo "aiperf_bench: aiperf profile failed for $m: $(grep -v '^\s*$' "$OUT/$m.aiperf.log" | tail -n 1) (log: $OUT/$m.aiperf.log)" >&2; exit 1; }
  curl -sf "$URL/metrics" >"$OUT/$m.after.prom"
  mv "$OUT/$m.before.prom.tmp" "$OUT/$m.before.prom"
  stop_server
  echo "aiperf_bench: $m done; AIPerf printed:"
  sed -n '/LLM Metrics: Spec Decode/,/Accepted drafts per step/p' "$OUT/$m.aiperf.log"
done
"$PY" -m asymspec_mm.bench.aiperf_pass table --out "$OUT" --methods "$METHODS" --command "$COMMAND"
