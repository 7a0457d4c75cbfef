# Sourced by the serving benchmarks (scripts/serving_bench.sh, scripts/aiperf_bench.sh): `prepare_bench` runs the
# checks and settings both share (curl, the tiny pair's tokenizer as TOKENIZER, the servers' environment, --out as
# $OUT without an earlier run's table); then one fresh `asymspec-mm serve --preset tiny` on 127.0.0.1 at a time.
# `start_server LOG` starts it (--port $PORT; 0: a free port, read from its log) and sets URL once /health answers,
# else prints one line and exits 1; `stop_server` stops it (SIGINT, then SIGKILL after 30 s), and runs on exit.
# Reads: ROOT (the checkout), OUT, PY (this project's python), PORT, READY_S, THREADS (OpenMP threads; empty: torch's
# default), SERVE_ARGS (more `serve` options) and BENCH (the one-line errors' prefix).
prepare_bench() {
  command -v curl >/dev/null || { echo "$BENCH: curl is needed (apt-get install curl)" >&2; exit 1; }
  TOKENIZER="$ROOT/asymspec_mm/presets_data/tiny/verifier"
  [ -f "$TOKENIZER/tokenizer.json" ] || { echo "$BENCH: the tiny pair is missing ($TOKENIZER): reinstall asymspec-mm" >&2; exit 1; }
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False TOKENIZERS_PARALLELISM=false
  mkdir -p "$OUT"
  rm -f "$OUT"/*.before.prom "$OUT"/*.after.prom "$OUT"/summary.json "$OUT"/table.md  # nothing of an earlier run in the table
}

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -INT "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

start_server() {
  local log=$1 deadline=$((SECONDS + READY_S)) line
  : >"$log"  # before the server's own redirection opens it: the loop below reads it at once
  # shellcheck disable=SC2086  # SERVE_ARGS is a list of options
  ${THREADS:+env OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS} \
    "$PY" -m asymspec_mm.cli serve --preset tiny --host 127.0.0.1 --port "$PORT" ${SERVE_ARGS:-} >"$log" 2>&1 &
  SERVER_PID=$!
  URL=""
  while [ -z "$URL" ]; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      line=$(grep -v '^\s*$' "$log" | tail -n 1 || true)
      echo "$BENCH: the server exited before it was ready: ${line:-no output} (log: $log)" >&2; exit 1
    fi
    [ $SECONDS -lt $deadline ] || { echo "$BENCH: the server was not ready within ${READY_S} s (log: $log); raise READY_S" >&2; exit 1; }
    URL=$(sed -n 's|.* on \(http://[^ ]*\)/v1 .*|\1|p' "$log" | head -n 1 || true)
    [ -n "$URL" ] || sleep 0.5
  done
  until curl -sf "$URL/health" >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "$BENCH: $URL/health did not answer within ${READY_S} s (log: $log)" >&2; exit 1; }
    sleep 0.5
  done
}
