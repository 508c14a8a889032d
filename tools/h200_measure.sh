#!/usr/bin/env bash
# Issue 5's measurement on a two-GPU H200 machine (see DEVELOPERS.md, "GPU work"); carry .whl.
#   bash tools/h200_measure.sh search [BUDGET_GPU_S]   ceilings, then the ladder arm on GPU 0 and the
#                                                      flat arm on GPU 1, side by side
#   bash tools/h200_measure.sh compare [WORK]          winners vs eager vs torch.compile (problems split
#                                                      over the two GPUs), then the report
# Everything lands in $OUT/work (databases, JSON) and $OUT/results (h200.json, RESULTS.md); a later
# phase reads an earlier one's work folder from WORK (default: $OUT/work).
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
M="python3 tools/h200_measure.py"
phase=${1:-search}
case "$phase" in
search)
  W=$OUT/work; mkdir -p "$W"
  budget=${2:-60}
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$W/machine.txt"
  $M ceilings --out "$W" 2>&1 | tee "$W/ceilings.log"
  $M search --out "$W" --arm ladder --gpu 0 --budget-gpu-s "$budget" --timeout-s "${KB_RUN_TIMEOUT_S:-85}" > "$W/search_ladder.log" 2>&1 &
  $M search --out "$W" --arm flat --gpu 1 --budget-gpu-s "$budget" --timeout-s "${KB_RUN_TIMEOUT_S:-85}" > "$W/search_flat.log" 2>&1 &
  wait
  cat "$W"/search_*.log
  ;;
compare)
  W=${2:-$OUT/work}
  [ "$W" = "$OUT/work" ] || { mkdir -p "$OUT/work" && cp -r "$W"/. "$OUT/work/" && W=$OUT/work; }
  CUDA_VISIBLE_DEVICES=0 $M compare --out "$W" --problems softmax,rmsnorm,matvec > "$W/compare0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 $M compare --out "$W" --problems linear_relu_div,sdp_attn,group_conv > "$W/compare1.log" 2>&1 &
  wait
  cat "$W"/compare*.log | grep -v Warning
  mkdir -p "$OUT/results"
  $M report --out "$W" --results "$OUT/results" --command "bash tools/h200_measure.sh search; bash tools/h200_measure.sh compare"
  ;;
*) echo "usage: $0 search [BUDGET_GPU_S] | compare [WORK]"; exit 2 ;;
esac
