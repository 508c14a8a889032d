#!/usr/bin/env bash
# Issue 36's decision-quality check on the GPU device machine: six KernelBench files, chosen before any
# run, as one pool (the sweep, MODE=pool: runs, then each winner timed) or one `kb run` after another
# (MODE=serial: runs only), same settings as the sweep's, into $OUT. Carry .whl and .kernelbench.
# Then, on this machine: `python3 tools/timed_spans.py DB` for where the GPU time went, and
# `python3 tools/cross_duel.py POOL_DB RUN SERIAL_DB RUN` on the device for a winner that differs.
#   OUT=... MODE=pool|serial [LIMIT=470] [RESERVE=130] bash tools/pool_vs_serial.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
six='^(23_Softmax|94_MSELoss|82_conv_depthwise|12_Gemm_Multiply|40_Matmul_Scaling|88_Gemm_GroupNorm)'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$(date +%s)
if [ "${MODE:?pool or serial}" = pool ]; then
  OUT=$OUT STATE=$OUT/pool LIMIT=${LIMIT:-470} RESERVE=${RESERVE:-130} ONLY=$six \
    bash tools/kernelbench_sweep.sh > "$OUT/pool.log" 2>&1
  tail -20 "$OUT/pool.log"
  PYTHONPATH=/tmp/kb:/tmp/site python3 tools/timed_spans.py "$OUT/pool/sweep.db"  # kb as the sweep installed it
else
  rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
  export KB_BWRAP=/tmp/bw/usr/bin/bwrap
  . tools/device_env.sh || exit 1
  end=$(( start + ${LIMIT:-540} ))
  for f in $(ls .kernelbench/level1/*.py .kernelbench/level2/*.py | grep -E "/${six#^}"); do
    left=$(( end - $(date +%s) )); [ $left -lt 30 ] && { echo "out of time before $f"; break; }
    timeout -s INT $left python3 -m kernelbrain run "$f" --db "$OUT/serial.db" --quiet --budget-gpu-s 60 \
      --max-candidates 8 --max-profiles 1 --device cuda
  done
  python3 tools/timed_spans.py "$OUT/serial.db"
fi
echo "wall $(( $(date +%s) - start )) s"
