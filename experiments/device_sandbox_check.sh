#!/usr/bin/env bash
# Issue 14's device check: the sandbox's namespaces and CUDA together, on the GPU machine (which cannot
# install packages: bubblewrap travels as .whl/bubblewrap.deb, unpacked with dpkg -x). Runs one short
# search under bubblewrap and one under no isolation, on the same problem, and keeps both databases:
#   bash experiments/device_sandbox_check.sh [PROBLEM] [BUDGET_GPU_S]
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
. tools/device_env.sh || exit 1
problem=${1:-benchmarks/problems/softmax.py}
budget=${2:-40}
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap
"$KB_BWRAP" --version
python3 -m kernelbrain doctor --json > "$OUT/doctor.json"; python3 -m kernelbrain doctor
for level in bwrap none; do
  db="$OUT/sandbox_$level.db"
  KB_SANDBOX=$level timeout 280 python3 -m kernelbrain run "$problem" --db "$db" --device cuda --quiet \
    --budget-gpu-s "$budget" --max-candidates 4 > "$OUT/run_$level.log" 2>&1
  echo "== $level: exit $?"; tail -5 "$OUT/run_$level.log"
  rid=$(python3 -m kernelbrain ls --db "$db" --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['run_id'])")
  python3 -m kernelbrain status "$rid" --db "$db"
  python3 -m kernelbrain events "$rid" --db "$db" --json --all > "$OUT/events_$level.jsonl"
  grep -c '"ProfileCaptured"' "$OUT/events_$level.jsonl"
  grep '"ProfileCaptured"' "$OUT/events_$level.jsonl" | head -c 600; echo
done
