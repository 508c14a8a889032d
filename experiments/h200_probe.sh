#!/usr/bin/env bash
# The tuning probes of sessions 3, 4 and 6 on an H200 (on the device machine, from the repository root,
# .whl/ carried: tools/device_env.sh says what it holds): what new template strategies and knob
# variants do at the seed problems' large shapes, before a full tools/h200_measure.sh run. Everything
# lands in one tar. The results of stages 1-8 were in benchmarks/results/h200/probe3/ and probe4/,
# removed from the tree after d69481f (benchmarks/results/RESULTS.md, "Earlier measurements").
#
#   bash experiments/h200_probe.sh [1|2|3|4|6|7|8|9|conv]   # writes $OUT/probe-STAGE.tgz (the JSON reports and logs)
#
# 1: the first call (probe3/); 2: the second, after it: where the
# materialized attention's time goes, softmax split_row with prefetch; 3: attention's presplit P V;
# conv: the conv strategies; 4 (session 4, one GPU): attention's 16-bit tiles, conv's tf32x3 dots; 6:
# conv's prepacked weights, attention's host time at fp16; 7: attention's short16; 8: short16 with P
# rounded once; 9 (session 6): softmax's deferred strategy. (Stage 5 measured fuse16, a knob since removed: see probe4/README.md at d69481f.)
# Stages 1-3 use two GPUs (kind nvidia-h200-x2).
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
. tools/device_env.sh || exit 1  # kb into /tmp/kb, .whl/ into /tmp/site, PYTHONPATH
W=$(mktemp -d)
P=benchmarks/problems

if [ "${1:-1}" = 2 ]; then
  (
    export CUDA_VISIBLE_DEVICES=0
    M='"strategy": "materialized"'
    timeout 200 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 0 --out "$W/attn_breakdown.json" \
      --knobs "{$M, \"block_m\": 128, \"block_n\": 64, \"num_warps\": 8, \"num_stages\": 3, \"pv32\": \"tf32x3\"}" \
      --knobs "{$M, \"block_m\": 128, \"block_n\": 64, \"num_warps\": 8, \"num_stages\": 3, \"pv32\": \"ieee\"}" \
      --knobs "{$M, \"block_m\": 64, \"block_n\": 64, \"block_d\": 32, \"num_warps\": 4, \"num_stages\": 2}" \
      > "$W/attn_breakdown.log" 2>&1
    timeout 120 python3 tools/kernel_breakdown.py $P/softmax.py --shape 0 --out "$W/softmax_breakdown.json" \
      --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8}' \
      > "$W/softmax_breakdown.log" 2>&1
    timeout 150 python3 tools/gpu_template_check.py $P/softmax.py --no-round0 --out "$W/softmax.json" \
      --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8}' \
      --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 2, "num_warps": 8, "prefetch": true}' \
      --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 3, "num_warps": 8, "prefetch": true}' \
      --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 2, "num_warps": 16, "prefetch": true}' \
      --knobs '{"strategy": "split_row", "block_n": 16384, "ctas_per_sm": 1, "num_warps": 16, "prefetch": true}' \
      --knobs '{"strategy": "split_row", "block_n": 16384, "ctas_per_sm": 2, "num_warps": 8}' \
      > "$W/softmax.log" 2>&1
  ) &
  wait
  tar -czf "$OUT/probe-${1:-1}.tgz" -C "$W" .
  tail -n 30 "$W/attn_breakdown.log" "$W/softmax_breakdown.log"
  tail -n 12 "$W/softmax.log"
  exit 0
fi
if [ "${1:-1}" = 3 ]; then
  # materialized attention with presplit P V: per-kernel split, then accuracy and speed at every shape
  M='"strategy": "materialized", "pv32": "presplit"'
  K=(--knobs "{$M}" --knobs "{$M, \"block_k\": 64, \"num_stages\": 2}"
     --knobs "{$M, \"block_dv\": 256, \"block_k\": 32, \"num_stages\": 2}"
     --knobs "{$M, \"block_m\": 64, \"block_k\": 64, \"num_warps\": 4}")
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 0 \
    --out "$W/attn_breakdown.json" "${K[@]}" > "$W/attn_breakdown.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 400 python3 tools/attn_check.py --out "$W/attn.json" --reps 5 --no-controls \
    "${K[@]/--knobs/--extra}" > "$W/attn.log" 2>&1 &
  wait
  tar -czf "$OUT/probe-${1:-1}.tgz" -C "$W" .
  grep -v Warn "$W/attn_breakdown.log" | tail -n 30
  grep -E "^(32x32|2x32|4x32|2x2x512)" "$W/attn.log" | cut -c1-60,150-210
  tail -n 3 "$W/attn.log"
  exit 0
fi
if [ "${1:-1}" = 4 ]; then
  # session 4, one GPU: attention's 16-bit tiles (overrides on the first materialized round-0 set; the
  # fp16 rung runs materialized, the bf16 one full_d), then conv's tf32x3 dots
  M='"strategy": "materialized"'
  T16=('"block_m16": 128, "block_n16": 128, "block_d16": 64, "block_k16": 64, "num_warps16": 8, "num_stages16": 3'
       '"block_m16": 128, "block_n16": 64, "block_d16": 64, "block_k16": 64, "num_warps16": 8, "num_stages16": 3'
       '"block_m16": 64, "block_n16": 64, "block_d16": 64, "block_k16": 64, "num_warps16": 4, "num_stages16": 3'
       '"block_m16": 128, "block_n16": 64, "block_d16": 64, "block_k16": 32, "num_warps16": 4, "num_stages16": 3'
       '"block_m16": 64, "block_n16": 64, "block_d16": 128, "block_k16": 64, "num_warps16": 4, "num_stages16": 2'
       '"block_m16": 128, "block_n16": 128, "block_d16": 32, "block_k16": 64, "num_warps16": 8, "num_stages16": 4'
       '"block_m16": 64, "block_n16": 32, "block_d16": 64, "block_k16": 64, "num_warps16": 4, "num_stages16": 3')
  X=()
  for t in "${T16[@]}"; do X+=(--extra "{$M, $t}"); done
  timeout 330 python3 tools/attn_check.py --out "$W/attn.json" --reps 5 --no-controls "${X[@]}" \
    > "$W/attn.log" 2>&1
  timeout 60 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 1 --out "$W/attn16_breakdown.json" \
    --knobs "{$M}" --knobs "{$M, ${T16[1]}}" > "$W/attn16_breakdown.log" 2>&1
  D='"strategy": "rows_dense", "block_c": 16, "block_k": 8'
  timeout 150 python3 tools/gpu_template_check.py $P/group_conv.py --no-round0 --out "$W/conv.json" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2}" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2, \"fp32_dot\": \"tf32x3\"}" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 4, \"fp32_dot\": \"tf32x3\"}" \
    --knobs "{$D, \"block_p\": 256, \"num_warps\": 4, \"fp32_dot\": \"tf32x3\"}" \
    --knobs "{$D, \"block_p\": 512, \"num_warps\": 4, \"fp32_dot\": \"tf32x3\"}" \
    --knobs "{$D, \"block_p\": 512, \"num_warps\": 8, \"fp32_dot\": \"tf32x3\"}" \
    --knobs '{"strategy": "phase_dot", "block_p": 64, "block_c": 16, "block_k": 16, "num_warps": 4, "fp32_dot": "tf32x3"}' \
    --knobs '{"strategy": "phase_dot", "block_p": 128, "block_c": 16, "block_k": 16, "num_warps": 4, "fp32_dot": "tf32x3"}' \
    > "$W/conv.log" 2>&1
  nvidia-smi --query-gpu=name,driver_version --format=csv > "$W/gpu.txt" 2>&1
  tar -czf "$OUT/probe-4.tgz" -C "$W" .
  grep -E "^(2x32|4x32|32x32)" "$W/attn.log" | cut -c1-16,46-60,100-125,170-215
  tail -n 3 "$W/attn.log"
  grep -v Warn "$W/attn16_breakdown.log" | tail -n 20
  grep -v Warn "$W/conv.log" | tail -n 24
  exit 0
fi
if [ "${1:-1}" = 6 ]; then
  # session 4, one GPU: conv's prepacked weight tiles; attention's host time a call at fp16
  D='"strategy": "rows_dense", "block_c": 16, "block_k": 8'
  timeout 150 python3 tools/gpu_template_check.py $P/group_conv.py --no-round0 --out "$W/conv.json" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2, \"fp32_dot\": \"tf32x3\"}" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2, \"fp32_dot\": \"tf32x3\", \"prepack\": true}" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2, \"prepack\": true}" \
    --knobs "{$D, \"block_p\": 256, \"num_warps\": 4, \"prepack\": true}" \
    --knobs "{$D, \"block_p\": 256, \"num_warps\": 4, \"fp32_dot\": \"tf32x3\", \"prepack\": true}" \
    --knobs "{$D, \"block_p\": 512, \"num_warps\": 4, \"fp32_dot\": \"tf32x3\", \"prepack\": true}" \
    --knobs "{$D, \"block_p\": 64, \"num_warps\": 1, \"fp32_dot\": \"tf32x3\", \"prepack\": true}" \
    > "$W/conv.log" 2>&1
  timeout 60 python3 tools/kernel_breakdown.py $P/group_conv.py --shape 0 --out "$W/conv_breakdown.json" \
    --knobs "{$D, \"block_p\": 128, \"num_warps\": 2, \"fp32_dot\": \"tf32x3\", \"prepack\": true}" \
    > "$W/conv_breakdown.log" 2>&1
  M='"strategy": "materialized"'
  timeout 90 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 1 --host --out "$W/attn16_host.json" \
    --knobs "{$M}" > "$W/attn16_host.log" 2>&1
  tar -czf "$OUT/probe-6.tgz" -C "$W" .
  grep -v Warn "$W/conv.log" | grep -E "PASS|FAIL|passed" | cut -c1-30,45-250
  grep -v Warn "$W/conv_breakdown.log" | tail -n 8
  grep -v -e Warn -e _warn "$W/attn16_host.log" | tail -n 70
  exit 0
fi
if [ "${1:-1}" = 7 ]; then
  # session 4, one GPU: attention's short16 (one kernel for 16-bit wide heads with short key ranges)
  # under kb's benchmark timer at every shape, and its host time a call at fp16
  M='"strategy": "materialized"'
  S="$M, \"short16\": true"
  timeout 300 python3 tools/gpu_template_check.py $P/sdp_attn.py --no-round0 --which all --out "$W/attn.json" \
    --knobs "{$M}" \
    --knobs "{$S, \"wide16_m\": 64, \"wide16_d\": 64, \"wide16_warps\": 8, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 32, \"wide16_d\": 64, \"wide16_warps\": 4, \"wide16_stages\": 3}" \
    --knobs "{$S, \"wide16_m\": 64, \"wide16_d\": 128, \"wide16_warps\": 8, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 32, \"wide16_d\": 128, \"wide16_warps\": 4, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 16, \"wide16_d\": 64, \"wide16_warps\": 4, \"wide16_stages\": 3}" \
    > "$W/attn.log" 2>&1
  timeout 90 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 1 --host --out "$W/attn16_host.json" \
    --knobs "{$S, \"wide16_m\": 64, \"wide16_d\": 64, \"wide16_warps\": 8, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 32, \"wide16_d\": 64, \"wide16_warps\": 4, \"wide16_stages\": 3}" \
    > "$W/attn16_host.log" 2>&1
  tar -czf "$OUT/probe-7.tgz" -C "$W" .
  grep -v Warn "$W/attn.log" | grep -E "PASS|FAIL|passed|skipped" | sed -e 's/"block_m".*"p16": "split", //'
  grep -v -e Warn -e _warn "$W/attn16_host.log" | grep -E "ms a call|us a call|  [0-9.]+ ms"
  exit 0
fi
if [ "${1:-1}" = 8 ]; then
  # session 4, one GPU: short16's GPU and host time a call at fp16 once P is rounded before the output
  # chunks (stage 7's first two sets again, and two with 128-wide head steps)
  S='"strategy": "materialized", "short16": true'
  timeout 120 python3 tools/kernel_breakdown.py $P/sdp_attn.py --shape 1 --host --out "$W/attn16_host.json" \
    --knobs "{$S, \"wide16_m\": 64, \"wide16_d\": 64, \"wide16_warps\": 8, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 32, \"wide16_d\": 64, \"wide16_warps\": 4, \"wide16_stages\": 3}" \
    --knobs "{$S, \"wide16_m\": 32, \"wide16_d\": 128, \"wide16_warps\": 4, \"wide16_stages\": 2}" \
    --knobs "{$S, \"wide16_m\": 64, \"wide16_d\": 128, \"wide16_warps\": 8, \"wide16_stages\": 2}" \
    > "$W/attn16_host.log" 2>&1
  tar -czf "$OUT/probe-8.tgz" -C "$W" .
  grep -v -e Warn -e _warn "$W/attn16_host.log" | grep -E "ms a call|us a call|  [0-9.]+ ms" | sed -e 's/"block_m".*"p16": "split", //'
  exit 0
fi
if [ "${1:-1}" = 9 ]; then
  # session 6, one GPU: softmax's deferred strategy (no rounds; the earlier chunk re-read from L2)
  # against round 0, twice over to see the run-to-run spread
  D='"strategy": "deferred"'
  for pass in 1 2; do
    timeout 250 python3 tools/gpu_template_check.py $P/softmax.py --out "$W/softmax$pass.json" \
      --knobs "{$D}" --knobs "{$D, \"depth\": 2}" \
      --knobs "{$D, \"block_n\": 4096, \"ctas_per_sm\": 8, \"num_warps\": 4}" \
      --knobs "{$D, \"block_n\": 4096, \"ctas_per_sm\": 4, \"num_warps\": 8, \"depth\": 2}" \
      --knobs "{$D, \"block_n\": 8192, \"ctas_per_sm\": 2, \"num_warps\": 16}" \
      --knobs "{$D, \"block_n\": 8192, \"ctas_per_sm\": 3, \"num_warps\": 8}" \
      --knobs "{$D, \"block_n\": 16384, \"ctas_per_sm\": 2, \"num_warps\": 16}" \
      --knobs "{$D, \"block_n\": 2048, \"ctas_per_sm\": 8, \"num_warps\": 4, \"depth\": 2}" \
      > "$W/softmax$pass.log" 2>&1
    tar -czf "$OUT/probe-9.tgz" -C "$W" .  # after each pass: a call cut short keeps the first
  done
  grep -v Warn "$W/softmax1.log" "$W/softmax2.log" | grep -E "PASS|FAIL|skipped" | cut -c1-250
  exit 0
fi
if [ "${1:-1}" = conv ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 tools/gpu_conv_probe.py --out "$W/conv.json" > "$W/conv.log" 2>&1
  tar -czf "$OUT/probe-${1:-1}.tgz" -C "$W" .
  tail -n 60 "$W/conv.log"
  exit 0
fi

# GPU 0: attention, every round-0 render and tuning variants at the gate and ladder shapes
CUDA_VISIBLE_DEVICES=0 timeout 420 python3 tools/attn_check.py --out "$W/attn.json" --reps 5 \
  --extra '{"strategy": "materialized", "block_m": 64, "block_n": 64, "block_d": 32, "num_warps": 4, "num_stages": 2}' \
  --extra '{"strategy": "materialized", "block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3, "pv32": "tf32x3"}' \
  --extra '{"strategy": "materialized", "block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2}' \
  --extra '{"strategy": "materialized", "block_dv": 256, "num_warps": 8}' \
  --extra '{"strategy": "full_d", "block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}' \
  --extra '{"strategy": "full_d", "block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2}' \
  > "$W/attn.log" 2>&1 &

# GPU 1: RMSNorm and softmax knob variants, then the conv strategies
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 tools/gpu_template_check.py $P/rmsnorm.py --out "$W/rmsnorm.json" \
    --knobs '{"strategy": "registers", "block_s": 256, "num_warps": 4}' \
    --knobs '{"strategy": "registers", "block_s": 256, "num_warps": 8}' \
    --knobs '{"strategy": "registers", "block_s": 512, "num_warps": 8}' \
    --knobs '{"strategy": "registers", "block_s": 512, "num_warps": 16}' \
    --knobs '{"strategy": "registers", "block_s": 1024, "num_warps": 16}' \
    > "$W/rmsnorm.log" 2>&1
  timeout 150 python3 tools/gpu_template_check.py $P/softmax.py --out "$W/softmax.json" \
    --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 3, "num_warps": 8}' \
    --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 4}' \
    --knobs '{"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8}' \
    --knobs '{"strategy": "split_row", "block_n": 16384, "ctas_per_sm": 2, "num_warps": 8}' \
    --knobs '{"strategy": "online", "block_n": 16384, "num_warps": 16}' \
    > "$W/softmax.log" 2>&1
  if [ -f tools/gpu_conv_probe.py ]; then
    timeout 240 python3 tools/gpu_conv_probe.py --out "$W/conv.json" > "$W/conv.log" 2>&1
  fi
) &
wait
nvidia-smi --query-gpu=name,driver_version --format=csv > "$W/gpu.txt" 2>&1
tar -czf "$OUT/probe-${1:-1}.tgz" -C "$W" .
tail -n 40 "$W/attn.log"
tail -n 12 "$W/rmsnorm.log" "$W/softmax.log"
[ -f "$W/conv.log" ] && tail -n 40 "$W/conv.log"
exit 0
