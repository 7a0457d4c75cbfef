#!/usr/bin/env bash
# A 30-problem slice of the paper's MathVista protocol (issue #22) end to end with the real pair, on one GPU,
# within a time budget (prepared on CPU; NOT YET RUN ON A GPU).
#
#   scripts/gpu_paper_slice.sh [--images-dir DIR] [--text-dir DIR] [--limit 30] [--budget 480] [--batch-size 10]
#                              [--max-new-tokens 1024] [--methods drafter,floor,sd,asymspec] [--dry-run] [--print-command]
#
# Models (HF_HUB_OFFLINE=1: the device machine reaches no network, so they must be in its Hugging Face cache, or
# be local folders given with --drafter/--verifier/--sd-drafter): Qwen/Qwen3-VL-2B-Instruct drafter, Qwen/Qwen3-32B
# verifier (bf16, ~70 GB of GPU memory), and for SD the paper's Qwen/Qwen3-1.7B text drafter when this checkout's
# eval has --sd-drafter. Problems: MathVista testmini GPS + VQA + FQA with a Bard caption (the paper's 587-problem
# subset), the first --limit by pid; K=4, beta=1, gamma=0.5, CDA (the library's defaults). Images: the Hugging Face dataset (cached), or
# --images-dir (the folder holding testmini's images/; the problems then come from the text dir's testmini.json).
#
# Time: eval runs under `timeout --signal=INT` for --budget seconds; it appends a record per finished
# (variant, problem) pair, so when the budget ends the finished problems are kept: `eval report` scores them and
# the summary gives each variant's count. Rerunning with the same $OUT resumes (--resume).
# Outputs under $OUT/paper-slice (or runs/gpu-paper-slice/paper-slice): records.jsonl, scores, report.md,
# slice_summary.md, paper_slice.log.
#   --dry-run        no GPU, no model: eval's own --dry-run prints the selection (checks the flags and the text data)
#   --print-command  print the eval command line and exit
set -uo pipefail
cd "$(dirname "$0")/.."

LIMIT=30 BUDGET=480 BATCH=10 MAX_NEW=1024 METHODS="drafter,floor,sd,asymspec"
DRAFTER=Qwen/Qwen3-VL-2B-Instruct VERIFIER=Qwen/Qwen3-32B SD_DRAFTER=Qwen/Qwen3-1.7B
IMAGES_DIR="" TEXT_DIR="" DRY=0 PRINT=0
usage() { sed -n '5,6p' "$0" | sed 's/^# *//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --images-dir) IMAGES_DIR="$2"; shift 2 ;;
    --text-dir) TEXT_DIR="$2"; shift 2 ;;
    --limit) LIMIT="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --batch-size) BATCH="$2"; shift 2 ;;
    --max-new-tokens) MAX_NEW="$2"; shift 2 ;;
    --methods) METHODS="$2"; shift 2 ;;
    --drafter) DRAFTER="$2"; shift 2 ;;
    --verifier) VERIFIER="$2"; shift 2 ;;
    --sd-drafter) SD_DRAFTER="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --print-command) PRINT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_paper_slice.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$LIMIT" "$BUDGET" "$BATCH" "$MAX_NEW"; do
  case "$n" in ''|*[!0-9]*) echo "gpu_paper_slice.sh: '$n' is not a whole number (--limit/--budget/--batch-size/--max-new-tokens)" >&2; exit 2 ;; esac
done

PY="${PYTHON:-}"
if [ -z "$PY" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 MPLBACKEND=Agg

# The MathVista text data (query.json, captions_bard.json, ocrs_easyocr.json, testmini.json): the copy shipped
# with the package unless --text-dir or $ASYMSPEC_MATHVISTA_DIR names another.
if [ -z "$TEXT_DIR" ]; then
  for d in "${ASYMSPEC_MATHVISTA_DIR:-}" asymspec_mm/eval/mathvista/data; do
    if [ -n "$d" ] && [ -f "$d/captions_bard.json" ]; then TEXT_DIR="$d"; break; fi
  done
fi
if [ -z "$TEXT_DIR" ] || [ ! -f "$TEXT_DIR/captions_bard.json" ]; then
  echo "gpu_paper_slice.sh: no MathVista text data (captions_bard.json): pass --text-dir DIR or set ASYMSPEC_MATHVISTA_DIR" >&2
  exit 2
fi

if ! HELP="$("$PY" -m asymspec_mm.cli eval mathvista --help 2>&1)"; then
  echo "gpu_paper_slice.sh: $PY cannot run asymspec-mm eval ($(tail -n 1 <<<"$HELP")); set PYTHON to the project's interpreter" >&2
  exit 2
fi
OUTDIR="${OUT:-runs/gpu-paper-slice}/paper-slice"
# A dry run loads no model and reaches no network: CPU, and the problems from the text dir's testmini.json
# (the same pids as the Hugging Face dataset's testmini) unless --images-dir names a local copy anyway.
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
CMD=("$PY" -m asymspec_mm.cli eval mathvista --protocol paper --dataset mathvista --tasks GPS,VQA,FQA --require-caption
  --limit "$LIMIT" --methods "$METHODS" --max-new-tokens "$MAX_NEW"
  --drafter "$DRAFTER" --verifier "$VERIFIER" --device "$DEVICE" --dtype bf16 --text-dir "$TEXT_DIR"
  --batch-size "$BATCH" --out "$OUTDIR" --resume --no-progress --no-chart)
if [ -n "$IMAGES_DIR" ]; then
  CMD+=(--source local --data-dir "$TEXT_DIR/testmini.json" --images-dir "$IMAGES_DIR")
elif [ "$DRY" = 1 ]; then
  CMD+=(--source local --data-dir "$TEXT_DIR/testmini.json")
else
  CMD+=(--source hf)
fi
SD_NOTE="SD: the VL drafter on the compressed view (this eval has no --sd-drafter)"
if grep -q -- "--sd-drafter" <<<"$HELP"; then CMD+=(--sd-drafter "$SD_DRAFTER"); SD_NOTE="SD: text drafter $SD_DRAFTER"; fi
if grep -qE -- "--extract \{[^}]*paper" <<<"$HELP"; then CMD+=(--extract paper); fi

if [ "$PRINT" = 1 ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
if ! grep -q -- "--protocol" <<<"$HELP"; then
  echo "gpu_paper_slice.sh: this checkout's 'asymspec-mm eval mathvista' has no --protocol (issue #22 item 1): nothing to run" >&2
  exit 2
fi

if [ "$DRY" = 1 ]; then
  echo "dry run: $SD_NOTE; budget ${BUDGET}s; outputs would go to $OUTDIR"
  "${CMD[@]}" --dry-run
  exit $?
fi

mkdir -p "$OUTDIR"
LOG="$OUTDIR/paper_slice.log"
T0=$(date +%s)
{
  echo "== gpu_paper_slice.sh $(date -u +%FT%TZ): $LIMIT problems, budget ${BUDGET}s, batch $BATCH, $SD_NOTE"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
} 2>&1 | tee "$LOG"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || { echo "no CUDA device: stop" | tee -a "$LOG"; exit 2; }
# Fail in seconds, not after loading 64 GB, when a model is neither a local folder nor in the cache.
"$PY" - "$DRAFTER" "$VERIFIER" $(grep -q -- "--sd-drafter" <<<"$HELP" && [[ ",$METHODS," == *",sd,"* ]] && echo "$SD_DRAFTER") <<'PY' 2>&1 | tee -a "$LOG"
import os, sys
from huggingface_hub import try_to_load_from_cache
missing = [m for m in sys.argv[1:] if not os.path.isdir(m) and not isinstance(try_to_load_from_cache(m, "config.json"), str)]
if missing:
    print(f"not in the local Hugging Face cache (and no network here): {', '.join(missing)}; "
          "download them where there is a network, or pass local folders with --drafter/--verifier/--sd-drafter")
    sys.exit(3)
PY
[ "${PIPESTATUS[0]}" = 0 ] || exit 3

timeout --signal=INT --kill-after=30 "$BUDGET" "${CMD[@]}" 2>&1 | tee -a "$LOG"
RC=${PIPESTATUS[0]}
case "$RC" in
  0) echo "eval finished in $(( $(date +%s) - T0 ))s" | tee -a "$LOG" ;;
  124|130) echo "budget of ${BUDGET}s reached: scoring the problems that finished (rerun to resume)" | tee -a "$LOG"
     [ -f "$OUTDIR/records.jsonl" ] && "$PY" -m asymspec_mm.cli eval report "$OUTDIR" --no-chart >>"$LOG" 2>&1 ;;
  *) echo "eval failed (rc=$RC): see $LOG" | tee -a "$LOG" ;;
esac
echo "== paper slice ($SD_NOTE; $(( $(date +%s) - T0 ))s): accuracy % (correct/finished)" | tee -a "$LOG"
"$PY" -m asymspec_mm.bench.paper_slice "$OUTDIR" 2>&1 | tee -a "$LOG"
exit "$RC"
