#!/usr/bin/env bash
# Issue 5's measurement on a two-GPU H200 machine (see DEVELOPERS.md, "GPU work"); carry .whl.
#   bash tools/h200_measure.sh search [BUDGET_GPU_S]   ceilings, then the ladder arm on GPU 0 and the
#                                                      flat arm on GPU 1, side by side
#   bash tools/h200_measure.sh compare [WORK.tgz]      winners vs eager vs torch.compile (problems split
#                                                      over the two GPUs), then the report
# A phase leaves $OUT/work.tgz (databases, JSON, logs) and, for compare, $OUT/results (h200.json,
# RESULTS.md); compare reads the search phase's work.tgz. Extra checks the tools/ scripts make on
# GPU-only paths run after the timed work, never beside it on the same GPU; EXTRA_CHECKS=0 skips them
# (when device time is short: they are not part of the measurement).
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
M="python3 tools/h200_measure.py"
W=/tmp/kb-work
phase=${1:-search}
extra=${EXTRA_CHECKS:-1}
case "$phase" in
search)
  rm -rf "$W"; mkdir -p "$W"
  budget=${2:-60}  # compare's report names it: pass the same as SEARCH_BUDGET there
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$W/machine.txt"
  $M ceilings --out "$W" 2>&1 | tee "$W/ceilings.log"
  to="--timeout-s ${KB_RUN_TIMEOUT_S:-100}"
  $M search --out "$W" --arm ladder --gpu 0 --budget-gpu-s "$budget" $to > "$W/search_ladder.log" 2>&1 &
  ( $M search --out "$W" --arm flat --gpu 1 --budget-gpu-s "$budget" $to > "$W/search_flat.log" 2>&1
    [ "$extra" = 0 ] ||
      CUDA_VISIBLE_DEVICES=1 timeout 200 python3 tools/attn_check.py --out "$W/attn_check.json" > "$W/attn_check.log" 2>&1 ) &
  wait
  cat "$W"/search_*.log; [ "$extra" = 0 ] || tail -40 "$W/attn_check.log"
  ;;
compare)
  rm -rf "$W"; mkdir -p "$W"
  tar -xzf "${2:?name the work.tgz of the search phase}" -C "$W" --strip-components=1
  CUDA_VISIBLE_DEVICES=0 $M compare --out "$W" --problems softmax,rmsnorm,matvec,group_conv > "$W/compare0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 $M compare --out "$W" --problems linear_relu_div,sdp_attn > "$W/compare1.log" 2>&1 &
  wait
  cat "$W"/compare*.log | grep -v -i warn
  mkdir -p "$OUT/results"
  $M report --out "$W" --results "$OUT/results" --command "${EXTRA_CHECKS:+EXTRA_CHECKS=$EXTRA_CHECKS }bash tools/h200_measure.sh search ${SEARCH_BUDGET:-60}; bash tools/h200_measure.sh compare work.tgz"
  if [ "$extra" != 0 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 tools/gpu_template_check.py --out "$W/row_norm_check.json" > "$W/row_norm_check.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 timeout 400 python3 tools/gpu_cli_check.py --out "$W/gpu_cli_check.json" > "$W/gpu_cli_check.log" 2>&1 &
    wait
    tail -n 15 "$W/row_norm_check.log" "$W/gpu_cli_check.log"
  fi
  ;;
*) echo "usage: $0 search [BUDGET_GPU_S] | compare WORK.tgz"; exit 2 ;;
esac
# one file back: the device tool returns only a few files per call
tar -czf "$OUT/work.tgz" -C /tmp kb-work
