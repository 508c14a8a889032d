#!/usr/bin/env bash
# An A/B of the KernelBench sweep on one card in one device call: the sweep from scratch at a base commit,
# then at the working tree, LIMIT seconds of runs each, each side's waits and GPU-alone share by
# tools/timed_spans.py. Timings compare only within one call (one card, one machine).
#   here:   bash tools/sweep_ab.sh pack BASE     # .ab/base.tgz, git-ignored: carry .ab, .whl, .kernelbench
#   device: OUT=$OUT [LIMIT=165] [LEVELS=1,2] bash tools/sweep_ab.sh run
# Give the call about 2 * (LIMIT + 100) seconds: each side installs kb, stops its runs and archives.
set -uo pipefail
case "${1:-}" in
  pack)
    : "${2:?name the base commit}"
    mkdir -p .ab && git archive --format=tar.gz -o .ab/base.tgz "$2" -- . ':!benchmarks/results' ':!tests' &&
      git rev-parse "$2" > .ab/base.commit && echo "packed $(cat .ab/base.commit) into .ab/base.tgz"
    ;;
  run)
    : "${OUT:?set OUT to the folder the results go to}"
    [ -f .ab/base.tgz ] || { echo "sweep_ab: no .ab/base.tgz: run \`bash tools/sweep_ab.sh pack BASE\` and carry .ab" >&2; exit 2; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    rm -rf /tmp/ab-base && mkdir -p /tmp/ab-base && tar -xzf .ab/base.tgz -C /tmp/ab-base &&
      cp -r .whl .kernelbench /tmp/ab-base/ || exit 1
    for side in base tree; do
      dir=$PWD
      [ $side = base ] && dir=/tmp/ab-base
      mkdir -p "$OUT/$side"
      nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > "$OUT/$side/smi.log" &
      smi=$!
      t0=$(date +%s)
      (cd "$dir" && OUT="$OUT/$side" STATE="/tmp/ab-$side" LIMIT="${LIMIT:-165}" RESERVE=30 LEVELS="${LEVELS:-1,2}" \
        bash tools/kernelbench_sweep.sh > "$OUT/$side/sweep_tail.log" 2>&1)
      kill $smi
      echo "== $side ($([ $side = base ] && cat .ab/base.commit || echo 'working tree')): $(( $(date +%s) - t0 )) s"
      (cd "$dir" && . tools/device_env.sh > /dev/null 2>&1 &&
        python3 tools/timed_spans.py "/tmp/ab-$side/sweep.db" --json > "$OUT/$side/spans.json";
        python3 tools/timed_spans.py "/tmp/ab-$side/sweep.db" | head -30)
    done
    ;;
  *) echo "usage: bash tools/sweep_ab.sh pack BASE | run" >&2; exit 2 ;;
esac
