#!/usr/bin/env bash
# Real-shape benchmark on one GPU, in under 9 minutes (prepared on CPU; NOT YET RUN ON A GPU).
#
#   scripts/gpu_bench.sh [--paper-slice | --paper-slice-only | --no-paper-slice] [--gaia | --no-gaia]
#                        [--simpleqa | --no-simpleqa] [--dry-run] [-- SLICE OPTIONS]
#                                   # outputs in $OUT (when set, e.g. on the device machine) or runs/gpu-bench
#
# Phase 0, the paper slice (scripts/gpu_paper_slice.sh: 30 MathVista problems, the paper's protocol, the REAL pair
# Qwen3-VL-2B + Qwen3-32B): by default it runs when both models are in the local Hugging Face cache, with
# PAPER_SLICE_S seconds (default 300) of the budget, and the shape phases share what is left; --paper-slice runs it
# whatever the cache says (it then fails in seconds when a model is missing), --paper-slice-only gives it the whole
# budget, --no-paper-slice skips it. Options after -- go to the slice (e.g. -- --images-dir DIR --limit 20).
# --dry-run: no GPU needed; the slice's dry run (its eval selection, no model) and the phases that would run.
#
# Phase 0b, the GAIA harness (asymspec-mm eval gaia: the smolagents ReAct loop with per-turn LLMLingua-2 at 0.3, the
# last 2 turns verbatim, K = 2, beta = 1; the REAL pair): by default it runs when both models and the LLMLingua-2
# classifier are in the local Hugging Face cache and $GAIA_DIR holds a GAIA split (metadata.jsonl and its files; the
# dataset is gated: see docs/compressed-views.md), on the first $GAIA_LIMIT tasks (default 4) with the rows
# $GAIA_ROWS (default floor,asymspec) in GAIA_S seconds (default 240); --gaia runs it whatever the cache says,
# --no-gaia skips it. Its records and table4.md are in $OUT/gaia even when its time runs out.
# Phase 0c, SimpleQA through the same harness (asymspec-mm eval simpleqa), when $SIMPLEQA_CSV names OpenAI's
# simple_qa_test_set.csv, $SIMPLEQA_TOOL_CACHE the web tools' cached returns (the device has no network) and the same
# models are cached: $SIMPLEQA_N questions drawn with seed 0 (default 8), rows $SIMPLEQA_ROWS (default floor,asymspec),
# in SIMPLEQA_S seconds (default 120); --simpleqa / --no-simpleqa force it. Records in $OUT/simpleqa.
#
# Needs: a CUDA build of torch, transformers 5.x and matplotlib in $PYTHON (default: .venv/bin/python if present,
# else python3). No network: the models are RANDOM-weight, built in memory with the published shapes
# (Qwen3-VL-2B-shaped drafter + Qwen3-32B-shaped verifier, bf16; ~70 GB of GPU memory), so acceptance
# means nothing there and the Markdown labels AsymSpec/SD throughput as a PROJECTION from per-call costs.
#
# Phases (each under its own timeout, so a slow phase cannot eat the others' time):
#   1. dynamic engines (the pipeline's, default): main comparison + prompt-length sweep (256/1k/4k view
#      tokens, real prefill) + K sweep; tokens/s from un-instrumented runs, the split from synchronised ones.
#   2. batched decoding (issue #19): generate_batch at B = 8 and 32 against the sequential loop (B = 1: pipe.generate
#      one request after another) over 32 requests, Floor and AsymSpec, 2B/32B shapes, real prefill: tokens/s,
#      ratio to B = 1, time per decoder step, KV bytes per row.
#   2b. batched decoding on static slots (issue 28): the stepped BatchDecoder on StaticBatchEngine rows with
#      compiled fixed-shape forwards (torch.compile reduce-overhead = CUDA graphs) at B = 8 and 32, against B = 1
#      (the sequential loop), AsymSpec, 2B/32B shapes: decode tokens/s, time per step.
#   3. static KV caches + compiled one-token decode (torch.compile reduce-overhead = CUDA graphs).
#   4. a 0.6B-verifier run (the CPU bench's pair) for a like-for-like comparison with BENCHMARKS.md's CPU tables.
#   1b. the speed-up-vs-cost-ratio curve (issue 33) on the GPU: cost-emulating twins of the tiny verifier (the same
#      tokens, a forward of K+1 tokens costing r drafter forwards) at r = 4, 16, 32, Floor / SD / AsymSpec / the
#      drafter alone, B = 1 and 8; the real 32B cannot be cached here, so the twin stands in (every output says so).
# Phases 2b, 3 and 4 run only when enough of the budget is left.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then PY=.venv/bin/python; else PY=python3; fi
fi
SLICE=auto GAIA=auto SIMPLEQA=auto DRY=0 SLICE_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --paper-slice) SLICE=yes; shift ;;
    --paper-slice-only) SLICE=only; shift ;;
    --no-paper-slice) SLICE=no; shift ;;
    --gaia) GAIA=yes; shift ;;
    --no-gaia) GAIA=no; shift ;;
    --simpleqa) SIMPLEQA=yes; shift ;;
    --no-simpleqa) SIMPLEQA=no; shift ;;
    --dry-run) DRY=1; shift ;;
    --) shift; SLICE_ARGS=("$@"); break ;;
    *) echo "gpu_bench.sh: unknown option $1 (--paper-slice | --paper-slice-only | --no-paper-slice | --gaia | --no-gaia | --simpleqa | --no-simpleqa | --dry-run | -- SLICE OPTIONS)" >&2; exit 2 ;;
  esac
done
BUDGET=530   # seconds for everything (one device command: <= 10 min)
if [ "$SLICE" = auto ]; then
  # both real models cached (the device has no network): then the slice runs
  if "$PY" -c "import sys; from huggingface_hub import try_to_load_from_cache as c; sys.exit(0 if all(isinstance(c(m, 'config.json'), str) for m in ('Qwen/Qwen3-VL-2B-Instruct', 'Qwen/Qwen3-32B')) else 1)" 2>/dev/null; then
    SLICE=yes
  else
    SLICE=no; echo "paper slice skipped: Qwen/Qwen3-VL-2B-Instruct and Qwen/Qwen3-32B are not both in the local Hugging Face cache"
  fi
fi
# the agent harnesses' models: the real pair and the LLMLingua-2 classifier of their per-turn compression
harness_models_cached() {
  "$PY" -c "import sys; from huggingface_hub import try_to_load_from_cache as c; sys.exit(0 if all(isinstance(c(m, 'config.json'), str) for m in ('Qwen/Qwen3-VL-2B-Instruct', 'Qwen/Qwen3-32B', 'microsoft/llmlingua-2-xlm-roberta-large-meetingbank')) else 1)" 2>/dev/null
}
GAIA_S="${GAIA_S:-240}"
if [ "$GAIA" = auto ]; then
  if [ "$SLICE" = only ]; then GAIA=no
  elif [ ! -f "${GAIA_DIR:-}/metadata.jsonl" ]; then
    GAIA=no; echo "gaia harness skipped: GAIA_DIR does not name a GAIA split (a folder holding metadata.jsonl and its files)"
  elif ! harness_models_cached; then
    GAIA=no; echo "gaia harness skipped: Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3-32B and microsoft/llmlingua-2-xlm-roberta-large-meetingbank are not all in the local Hugging Face cache"
  else GAIA=yes
  fi
fi
SIMPLEQA_S="${SIMPLEQA_S:-120}"
if [ "$SIMPLEQA" = auto ]; then
  if [ "$SLICE" = only ]; then SIMPLEQA=no
  elif [ ! -f "${SIMPLEQA_CSV:-}" ] || [ ! -f "${SIMPLEQA_TOOL_CACHE:-}" ]; then
    SIMPLEQA=no; echo "simpleqa harness skipped: SIMPLEQA_CSV and SIMPLEQA_TOOL_CACHE do not both name files (the questions' CSV, the web tools' cache)"
  elif ! harness_models_cached; then
    SIMPLEQA=no; echo "simpleqa harness skipped: Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3-32B and microsoft/llmlingua-2-xlm-roberta-large-meetingbank are not all in the local Hugging Face cache"
  else SIMPLEQA=yes
  fi
fi
SIMPLEQA_CMD=("$PY" -m asymspec_mm.cli eval simpleqa --simpleqa-csv "${SIMPLEQA_CSV:-}" --tool-cache "${SIMPLEQA_TOOL_CACHE:-}"
  --sample "${SIMPLEQA_N:-8}" --rows "${SIMPLEQA_ROWS:-floor,asymspec}"
  --drafter Qwen/Qwen3-VL-2B-Instruct --verifier Qwen/Qwen3-32B --device cuda --dtype bf16 --out "${OUT:-runs/gpu-bench}/simpleqa")
GAIA_CMD=("$PY" -m asymspec_mm.cli eval gaia --gaia-dir "${GAIA_DIR:-}" --limit "${GAIA_LIMIT:-4}" --rows "${GAIA_ROWS:-floor,asymspec}"
  --drafter Qwen/Qwen3-VL-2B-Instruct --verifier Qwen/Qwen3-32B --device cuda --dtype bf16 --out "${OUT:-runs/gpu-bench}/gaia")
SLICE_S=$([ "$SLICE" = only ] && echo $(( BUDGET - 20 )) || echo "${PAPER_SLICE_S:-300}")
# Phase 2b's options (the dry run checks that the bench parses them)
STATIC_ROWS=(--variants "" --lengths "" --k-values "" --no-probe --batch-sizes 1,8,32 --batch-cases 32 --batch-variants asymspec
  --batch-engine static-compile --batch-max-len 1024 --reps 1 --warmup 1 --max-new-tokens 32)
if [ "$DRY" = 1 ]; then
  echo "dry run: gaia harness: $GAIA (${GAIA_S}s)$([ "$GAIA" = yes ] && printf ': %s' "${GAIA_CMD[*]}")"
  echo "dry run: simpleqa harness: $SIMPLEQA (${SIMPLEQA_S}s)$([ "$SIMPLEQA" = yes ] && printf ': %s' "${SIMPLEQA_CMD[*]}")"
  echo "dry run: paper slice: $SLICE (${SLICE_S}s); shape phases: $([ "$SLICE" = only ] && echo none || echo "1, 1b (cost curve), 2, 2b, 3, 4 in the time left")"
  if [ "$SLICE" != only ]; then
    "$PY" -c 'import argparse, sys
from asymspec_mm.bench.cli import add_bench_parser
p = argparse.ArgumentParser(prog="gpu_bench.sh")
add_bench_parser(p.add_subparsers())
a = p.parse_args(["bench", *sys.argv[1:]])
print(f"phase 2b: batch sweep at B={a.batch_sizes} on {a.batch_engine} rows ({a.batch_max_len} columns), {a.batch_variants}")' "${STATIC_ROWS[@]}" || exit $?
  fi
  [ "$SLICE" = no ] || PYTHON="$PY" scripts/gpu_paper_slice.sh --dry-run --budget "$SLICE_S" "${SLICE_ARGS[@]}"
  exit $?
fi
OUTDIR="${OUT:-runs/gpu-bench}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_bench.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 MPLBACKEND=Agg
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }   # seconds left of the ~9-minute budget

{
  echo "== gpu_bench.sh $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"
} 2>&1 | tee "$LOG"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || { echo "no CUDA device: stop" | tee -a "$LOG"; exit 2; }

# Phase 0: the paper slice with the real pair (its own time limit inside; records kept when it ends).
if [ "$SLICE" != no ]; then
  OUT="$OUTDIR" PYTHON="$PY" scripts/gpu_paper_slice.sh --budget "$SLICE_S" "${SLICE_ARGS[@]}" 2>&1 | tee -a "$LOG"
  echo "phase 0 (paper slice) rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
  [ "$SLICE" = only ] && { echo "== done in $(( $(date +%s) - T0 ))s; outputs in $OUTDIR" | tee -a "$LOG"; exit 0; }
fi

# Phase 0b: the GAIA harness with the real pair (records and table4.md are written as each task finishes).
if [ "$GAIA" = yes ] && [ "$(left)" -gt $(( GAIA_S + 30 )) ]; then
  timeout "$GAIA_S" "${GAIA_CMD[@]}" 2>&1 | tee -a "$LOG"
  echo "phase 0b (gaia harness) rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

# Phase 0c: SimpleQA through the same harness (records written as each question finishes).
if [ "$SIMPLEQA" = yes ] && [ "$(left)" -gt $(( SIMPLEQA_S + 30 )) ]; then
  timeout "$SIMPLEQA_S" "${SIMPLEQA_CMD[@]}" 2>&1 | tee -a "$LOG"
  echo "phase 0c (simpleqa harness) rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

COMMON=(--device cuda --dtype bf16 --prefill pipeline --ignore-eos yes --plain-runs yes --cases 1 --out "$OUTDIR" --update-benchmarks "$OUTDIR/BENCHMARKS-gpu.md")

# Phase 1: ~4 min (less after the paper slice). 2B drafter + 32B verifier shapes.
[ "$(left)" -gt 90 ] && timeout $(( $(left) < 290 ? $(left) - 20 : 270 )) "$PY" -m asymspec_mm.bench --preset real-shapes-32b "${COMMON[@]}" --stem bench-gpu-32b \
  --variants "floor;drafter;sd;asymspec;asymspec@gate=fixed;asymspec@delta=scd;asymspec@bonus=gated" \
  --reps 3 --warmup 1 --max-new-tokens 48 --lengths 256,1024,4096 --length-variants "floor;asymspec" \
  --k-values 2,4,6 --k-variants "asymspec;sd" --title "GPU: Qwen3-VL-2B + Qwen3-32B shapes (random weights), dynamic caches" \
  2>&1 | tee -a "$LOG"
echo "phase 1 rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"

# Phase 1b: ~2 min, the cost-ratio curve on the GPU (the twin stands in for the 32B).
if [ "$(left)" -gt 200 ]; then
  timeout 150 "$PY" -m asymspec_mm.bench --cost-ratio 4,16,32 --device cuda --cost-cases 4 --reps 2 --max-new-tokens 32 \
    --cost-batch 8 --out "$OUTDIR" --stem cost-curve-gpu 2>&1 | tee -a "$LOG"
  echo "phase 1b rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

# Phase 2: ~3 min, batched decoding at 2B/32B shapes (B = 1 sequential, 8, 32; 32 requests; one repetition).
# --variants '' skips the main comparison (phase 1 has it); the models are built again (random init, seconds on a GPU).
if [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) < 220 ? $(left) - 20 : 200 )) "$PY" -m asymspec_mm.bench --preset real-shapes-32b "${COMMON[@]}" --stem bench-gpu-32b-batch \
    --variants "" --lengths "" --k-values "" --no-probe --batch-sizes 1,8,32 --batch-cases 32 --batch-variants "floor;asymspec" \
    --reps 1 --warmup 1 --max-new-tokens 32 --title "GPU: batched decoding, Qwen3-VL-2B + Qwen3-32B shapes (random weights)" \
    2>&1 | tee -a "$LOG"
  echo "phase 2 rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

# Phase 2b: ~3 min, the same sweep on static slots with CUDA-graph forwards (issue 28; NOT YET RUN ON A GPU). The
# warm-up compiles one graph per (B, tokens) shape; B = 1 is the sequential loop on the pipeline's engines.
if [ "$(left)" -gt 150 ]; then
  timeout $(( $(left) < 220 ? $(left) - 20 : 200 )) "$PY" -m asymspec_mm.bench --preset real-shapes-32b "${COMMON[@]}" --stem bench-gpu-32b-static-rows \
    "${STATIC_ROWS[@]}" --title "GPU: batched decoding on static slots + CUDA graphs, Qwen3-VL-2B + Qwen3-32B shapes (random weights)" \
    2>&1 | tee -a "$LOG"
  echo "phase 2b rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

# Phase 3: ~2 min, static caches + CUDA-graph decode (UNTESTED ON GPU so far).
if [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 70 )) "$PY" -m asymspec_mm.bench --preset real-shapes-32b "${COMMON[@]}" --stem bench-gpu-32b-static-compile \
    --engine static-compile --variants "floor;asymspec" --reps 3 --warmup 2 --max-new-tokens 48 --lengths "" --k-values "" \
    --no-probe --title "GPU: 2B + 32B shapes, static caches + compiled one-token decode" 2>&1 | tee -a "$LOG"
  echo "phase 3 rc=${PIPESTATUS[0]} ($(left)s left)" | tee -a "$LOG"
fi

# Phase 4: whatever is left: the 0.6B-verifier pair of the CPU tables.
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) "$PY" -m asymspec_mm.bench --preset real-shapes "${COMMON[@]}" --stem bench-gpu-0.6b \
    --variants "floor;drafter;sd;asymspec" --reps 3 --warmup 1 --max-new-tokens 32 --lengths 256 --k-values "" --no-probe \
    --title "GPU: Qwen3-VL-2B + Qwen3-0.6B shapes (random weights)" 2>&1 | tee -a "$LOG"
  echo "phase 4 rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
echo "== done in $(( $(date +%s) - T0 ))s; outputs in $OUTDIR" | tee -a "$LOG"
ls -la "$OUTDIR" | tee -a "$LOG"
