#!/usr/bin/env bash
# What one candidate from outside costs on the GPU: `kb check PROBLEM CANDIDATE --device cuda --bench`
# (the subset check, then a fresh child for the gate and for each rung), whole-command wall seconds,
# under bubblewrap. With BEFORE=DIR (a checkout of an earlier commit, carried), the same command under
# that commit's code first, alternating, so that the figures are side by side in one call.
#   OUT=... [BEFORE=.pre] [REPEATS=2] bash tools/untrusted_cost.sh [PROBLEM CANDIDATE]
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
problem=${1:-tests/problems/softmax_small.py}
candidate=${2:-tests/candidates/good_softmax.py}
here=$PWD
logs=/tmp/kb-untrusted-logs  # each run's output; $OUT gets the table and the last lines
rm -rf "$logs" && mkdir -p "$logs"
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap KB_SANDBOX=bwrap
once() {  # label: one timed kb check, its last line, appended to $OUT/untrusted.tsv
  local t0 t1 rc
  t0=$(date +%s%N)
  python3 -m kernelbrain check "$here/$problem" "$here/$candidate" --device cuda --bench > "$logs/$1_$2.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$rc" "$(( (t1 - t0) / 1000000 ))" "$(tail -1 "$logs/$1_$2.log")" \
    | tee -a "$OUT/untrusted.tsv"
}
printf 'commit\trepeat\texit\twall_ms\tlast line\n' > "$OUT/untrusted.tsv"
for r in $(seq "${REPEATS:-2}"); do
  if [ -n "${BEFORE:-}" ]; then
    ( cd "$BEFORE" && ln -sfn "$here/.whl" .whl && . tools/device_env.sh && once before "$r" ) || exit 1
  fi
  ( . tools/device_env.sh && once after "$r" ) || exit 1
done
