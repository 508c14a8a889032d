#!/usr/bin/env bash
# What the gate and rung 0 cost per candidate on the GPU, for the seed problems: each problem's round 0
# gated and measured once (one rung, no promotions), under each sandbox level. With BEFORE=DIR (a
# checkout of an earlier commit, carried), the same runs first under that commit's code, so the
# figures are side by side in one call (the before-runs at LEVELS too, where it is set; else none).
# Summarise with `python3 tools/gate_cost.py OUT_DIR`.
# With PHASES=1, tools/gate_phases.py --bench splits each after-run's first 4 candidates into $OUT.
#   OUT=... [BEFORE=.before] [PROBLEMS=softmax,rmsnorm] [LEVELS="bwrap none"] [PHASES=1] bash tools/gate_cost.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
problems=${PROBLEMS:-softmax,rmsnorm,matvec,linear_relu_div,sdp_attn,group_conv}
here=$PWD
work=/tmp/kb-gate-cost  # the databases; $OUT gets the summary and one archive of them
rm -rf "$work" && mkdir -p "$work"
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap

runs() {  # label levels: every problem's round 0 through the gate and rung 0
  for p in ${problems//,/ }; do
    for level in $2; do
      db="$work/$1_${level}_$p.db"
      KB_SANDBOX=$level timeout 240 python3 -m kernelbrain run "$here/benchmarks/problems/$p.py" --db "$db" \
        --device cuda --quiet --ladder smallest:10:3 --max-candidates 8 --budget-gpu-s 300 \
        > "$work/$1_${level}_$p.log" 2>&1
      echo "$1 $level $p: exit $? $(tail -1 "$work/$1_${level}_$p.log")"
      if [ -n "${PHASES:-}" ] && [ "$1" = after ]; then  # where each step's seconds go, 4 candidates
        timeout 150 python3 "$here/tools/gate_phases.py" "$db" --limit 4 --bench > "$OUT/phases_${level}_$p.jsonl" 2>&1
      fi
      # summarised after every run: a call cut short by its time limit still returns what it made
      python3 "$here/tools/gate_cost.py" "$work" > /dev/null && cp "$work"/gate_cost.* "$OUT"/
    done
  done
}

if [ -n "${BEFORE:-}" ]; then
  ( cd "$BEFORE" && ln -sfn "$here/.whl" .whl && . tools/device_env.sh && runs before "${LEVELS:-none}" ) || exit 1
fi
. tools/device_env.sh || exit 1
runs after "${LEVELS:-bwrap none}"
python3 tools/gate_cost.py "$work"
cp "$work"/gate_cost.* "$OUT"/ && { [ -n "${PHASES:-}" ] || tar -czf "$OUT/runs.tgz" -C "$work" .; }
