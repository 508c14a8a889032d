#!/usr/bin/env bash
# Issue 14's GPU checks after the tolerance rule, the mixed timed inputs and the profiler's launch check
# (one device call, under ten minutes):
#   1. tools/gpu_launch_check.py: the launch rule against real CUPTI records, outside the sandbox;
#   2. round 0 of softmax and rmsnorm gated and benchmarked under bubblewrap (the launch check inside
#      the sandbox, every timed call on fresh contents);
#   3. sdp_attn: round 0 (or none, with ATTN_ROUND0=0), and materialized and d_tiled with one rounded P
#      (p16 single) and float32 Q K^T (qk32 ieee, tf32x3), gated at every dtype and benchmarked at
#      every ladder shape (full_d cannot take the primary shape's head of 1024).
#   [STEPS="launch norms attn"] [ATTN_ROUND0=1] bash experiments/gpu_trust_check.sh   (OUT set: what comes back)
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
. tools/device_env.sh || exit 1
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap KB_SANDBOX=bwrap
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null || true
steps=" ${STEPS:-launch norms attn} "
round0=(); [ "${ATTN_ROUND0:-1}" = 0 ] && round0=(--no-round0)
t0=$(date +%s)
[[ $steps == *" launch "* ]] && timeout 150 python3 tools/gpu_launch_check.py > "$OUT/launch_check.txt" 2>&1
echo "== launch check: exit $? ($(( $(date +%s) - t0 )) s)"; tail -3 "$OUT/launch_check.txt"
t0=$(date +%s)
[[ $steps == *" norms "* ]] && timeout 150 python3 tools/gpu_template_check.py benchmarks/problems/softmax.py benchmarks/problems/rmsnorm.py \
  --which smallest --out "$OUT/norms_check.json" 2>&1 | tee "$OUT/norms_check.txt"
echo "== softmax, rmsnorm: exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s)"
t0=$(date +%s)
[[ $steps == *" attn "* ]] && timeout 330 python3 tools/gpu_template_check.py benchmarks/problems/sdp_attn.py \
  --which all "${round0[@]}" \
  --knobs '{"strategy": "materialized", "p16": "single"}' \
  --knobs '{"strategy": "materialized", "qk32": "ieee"}' \
  --knobs '{"strategy": "materialized", "qk32": "tf32x3"}' \
  --knobs '{"strategy": "d_tiled", "p16": "single"}' \
  --knobs '{"strategy": "d_tiled", "qk32": "tf32x3"}' \
  --out "$OUT/attn_check.json" 2>&1 | tee "$OUT/attn_check.txt"
echo "== sdp_attn: exit ${PIPESTATUS[0]} ($(( $(date +%s) - t0 )) s)"
