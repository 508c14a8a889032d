#!/usr/bin/env bash
# The KernelBench sweep (tools/kernelbench_sweep.py) on the GPU device machine, one call at a time. Its
# state, STATE (the runs' database and the results so far, committed in benchmarks/results/kernelbench/GPU),
# travels with the working tree and comes back as one archive, $OUT/sweep.tgz: unpack it over STATE
# before the next call. The KernelBench files are carried (KB_DIR, a copy of ../shared/kernelbench that
# git ignores). A committed state keeps its database gzipped (STATE/sweep.db.gz, benchmarks/results stays
# under 5 MB): it is unpacked here where STATE has no sweep.db. The whole log is kept as it is written
# ($OUT/sweep_full.log), and the database copied each minute (below): a call cut before the end still
# says what ran. Give the call LIMIT + 60 s: the runs' stop and the archive come after the limit.
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
# a copy of the runs' database every minute (SQLite's backup: consistent while kb writes): a call cut
# before the end still brings back what its runs recorded, in $OUT/sweep_snapshot.db
( while sleep 60; do
    [ -f "$state/sweep.db" ] && python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
      "$state/sweep.db" "$OUT/sweep_snapshot.db" 2>/dev/null
  done ) &
snapshots=$!
python3 tools/kernelbench_sweep.py --kernelbench "${KB_DIR:-.kernelbench}" --levels "${LEVELS:-1,2}" \
  --db "$state/sweep.db" --out "$state" --time-limit-s "${LIMIT:-450}" \
  --timing-reserve-s "${RESERVE:-150}" ${FRESH:+--fresh "$FRESH"} ${MAXC:+--max-candidates "$MAXC"} \
  ${ONLY:+--only "$ONLY"} ${REDO:+--redo-unmatched} 2>&1 | tee "$OUT/sweep_full.log" | tail -150
kill $snapshots 2>/dev/null; rm -f "$OUT/sweep_snapshot.db"
# the archive holds the database once, unpacked (the committed .gz is rewritten from it)
tar -czf "$OUT/sweep.tgz" -C "$state" --exclude ./sweep.db.gz .
