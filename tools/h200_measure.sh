#!/usr/bin/env bash
# Issue 5's measurement on an H200 machine. Run it on the device machine from the repository root,
# with .whl/ (kb's dependency wheels: tools/device_env.sh says which and how to make them) carried:
#   bash tools/h200_measure.sh search [BUDGET_GPU_S]   ceilings, then the ladder arm on GPU 0 and the
#                                                      flat arm on GPU 1, side by side
#   bash tools/h200_measure.sh compare [WORK.tgz]      winners vs eager vs torch.compile (problems split
#                                                      over the GPUs), then the report
#   bash tools/h200_measure.sh all [BUDGET_GPU_S]      both phases in one call, no tar in between
# A phase leaves $OUT/work.tgz (databases, JSON, logs) and, for compare, $OUT/results (h200.json,
# RESULTS.md); compare reads the search phase's work.tgz. The extra checks of GPU-only paths
# (tools/attn_check.py, gpu_template_check.py, gpu_cli_check.py) run after the timed work, never beside
# it on the same GPU; EXTRA_CHECKS=0 skips them
# (when device time is short: they are not part of the measurement). PROBLEMS (comma-separated seed
# problems, default all six) and ARMS ("ladder flat" by default; "ladder" alone needs one GPU) narrow
# a run; with one GPU the compare phase runs every problem on it. MAX_CANDIDATES (default 12) caps each
# run's candidates; KB_RUN_TIMEOUT_S (default 100) bounds each run's wall time.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
# kb installed from this checkout into /tmp/kb, its dependencies from .whl/ (skipped on a dry run,
# whose venv has them), and PYTHONPATH to match
. tools/device_env.sh || exit 1
# MEASURE_DEVICE=cpu (with TRITON_INTERPRET=1): a dry run of the script's plumbing on a machine without a GPU
M="python3 tools/h200_measure.py"
dev="--device ${MEASURE_DEVICE:-cuda}"
W=/tmp/kb-work
phase=${1:-search}
extra=${EXTRA_CHECKS:-1}
arms=${ARMS:-ladder flat}
all=softmax,rmsnorm,matvec,linear_relu_div,sdp_attn,group_conv
problems=${PROBLEMS:-$all}
# the search budget (GPU s a run); the compare phase's report names it: pass it there as SEARCH_BUDGET
budget=${SEARCH_BUDGET:-60}
[ "$phase" = compare ] || budget=${2:-$budget}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -ge 1 ] || gpus=1
[ "${MEASURE_DEVICE:-cuda}" = cuda ] || extra=0  # the extra checks are GPU-only

do_search() {
  rm -rf "$W"; mkdir -p "$W"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$W/machine.txt"
  $M ceilings $dev --out "$W" 2>&1 | tee "$W/ceilings.log"
  to="--timeout-s ${KB_RUN_TIMEOUT_S:-100}"
  gpu=0
  for arm in $arms; do
    ( $M search $dev --out "$W" --arm "$arm" --gpu $gpu --budget-gpu-s "$budget" --problems "$problems" $to \
        --max-candidates "${MAX_CANDIDATES:-12}" > "$W/search_$arm.log" 2>&1
      if [ "$arm" = flat ] && [ "$extra" != 0 ]; then
        CUDA_VISIBLE_DEVICES=$gpu timeout 200 python3 tools/attn_check.py --out "$W/attn_check.json" > "$W/attn_check.log" 2>&1
      fi ) &
    [ "$gpus" -gt 1 ] && gpu=$((gpu + 1)) || wait
  done
  wait
  cat "$W"/search_*.log; [ -f "$W/attn_check.log" ] && tail -40 "$W/attn_check.log"
}

do_compare() {
  if [ "$gpus" -gt 1 ]; then  # the slow compiles (GEMM, attention) on GPU 1, the rest on GPU 0
    first=$(echo "$problems" | tr , '\n' | grep -v -x -e linear_relu_div -e sdp_attn | paste -sd,)
    second=$(echo "$problems" | tr , '\n' | grep -x -e linear_relu_div -e sdp_attn | paste -sd,)
    [ -n "$first" ] && CUDA_VISIBLE_DEVICES=0 $M compare $dev --out "$W" --problems "$first" > "$W/compare0.log" 2>&1 &
    [ -n "$second" ] && CUDA_VISIBLE_DEVICES=1 $M compare $dev --out "$W" --problems "$second" > "$W/compare1.log" 2>&1 &
    wait
  else
    CUDA_VISIBLE_DEVICES=0 $M compare $dev --out "$W" --problems "$problems" > "$W/compare0.log" 2>&1
  fi
  cat "$W"/compare*.log | grep -v -i warn
  mkdir -p "$OUT/results"
  env_text="${EXTRA_CHECKS:+EXTRA_CHECKS=$EXTRA_CHECKS }${PROBLEMS:+PROBLEMS=$PROBLEMS }${ARMS:+ARMS=\"$ARMS\" }"
  env_text+="${MAX_CANDIDATES:+MAX_CANDIDATES=$MAX_CANDIDATES }${KB_RUN_TIMEOUT_S:+KB_RUN_TIMEOUT_S=$KB_RUN_TIMEOUT_S }"
  $M report --out "$W" --results "$OUT/results" --problems "$problems" \
    --command "${env_text}bash tools/h200_measure.sh all $budget"
  if [ "$extra" != 0 ]; then  # side by side on two GPUs; one after the other on one (both time kernels)
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 tools/gpu_template_check.py --out "$W/template_check.json" > "$W/template_check.log" 2>&1 &
    [ "$gpus" -gt 1 ] || wait
    CUDA_VISIBLE_DEVICES=$((gpus - 1)) timeout 400 python3 tools/gpu_cli_check.py --out "$W/gpu_cli_check.json" > "$W/gpu_cli_check.log" 2>&1 &
    wait
    tail -n 15 "$W/template_check.log" "$W/gpu_cli_check.log"
  fi
}

case "$phase" in
search) do_search ;;
compare)
  rm -rf "$W"; mkdir -p "$W"
  tar -xzf "${2:?name the work.tgz of the search phase}" -C "$W" --strip-components=1
  do_compare ;;
all) do_search; do_compare ;;
*) echo "usage: $0 search [BUDGET_GPU_S] | compare WORK.tgz | all [BUDGET_GPU_S]"; exit 2 ;;
esac
# one file back: the device tool returns only a few files per call
tar -czf "$OUT/work.tgz" -C /tmp kb-work
