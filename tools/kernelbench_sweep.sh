#!/usr/bin/env bash
# The KernelBench sweep (tools/kernelbench_sweep.py) on the GPU device machine, one call at a time. Its
# state, STATE (the runs' database and the results so far, committed in benchmarks/results/kernelbench/GPU),
# travels with the working tree and comes back as one archive, $OUT/sweep.tgz: unpack it over STATE
# before the next call. The KernelBench files are carried (KB_DIR, a copy of ../shared/kernelbench that
# git ignores). A committed state keeps its database gzipped (STATE/sweep.db.gz, benchmarks/results stays
# under 5 MB): it is unpacked here where STATE has no sweep.db.
#   OUT=... [KB_DIR=.kernelbench] [LEVELS=1,2] [LIMIT=450] [RESERVE=150] [FRESH=REGEX] [MAXC=8]
#   [ONLY=REGEX] [REDO=1 (--redo-unmatched)] [STATE=DIR] bash tools/kernelbench_sweep.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap
. tools/device_env.sh || exit 1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-|-$//g')
state=${STATE:-benchmarks/results/kernelbench/${card:-unknown}}
mkdir -p "$state"
[ -f "$state/sweep.db" ] || [ ! -f "$state/sweep.db.gz" ] || gunzip -k "$state/sweep.db.gz" || exit 1
python3 tools/kernelbench_sweep.py --kernelbench "${KB_DIR:-.kernelbench}" --levels "${LEVELS:-1,2}" \
  --db "$state/sweep.db" --out "$state" --time-limit-s "${LIMIT:-450}" \
  --timing-reserve-s "${RESERVE:-150}" ${FRESH:+--fresh "$FRESH"} ${MAXC:+--max-candidates "$MAXC"} \
  ${ONLY:+--only "$ONLY"} ${REDO:+--redo-unmatched} 2>&1 | tail -150
tar -czf "$OUT/sweep.tgz" -C "$state" .
