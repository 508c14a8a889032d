#!/usr/bin/env bash
# The KernelBench sweep (tools/kernelbench_sweep.py) on the GPU device machine, one call at a time. Its
# state, .sweep/ (the runs' database and the results so far), is carried in and comes back as one
# archive, $OUT/sweep.tgz: unpack it into .sweep/ before the next call. The KernelBench files are
# carried too (KB_DIR, a copy of ../shared/kernelbench that git ignores).
#   OUT=... [KB_DIR=.kernelbench] [LEVELS=1,2] [JOBS=4] [LIMIT=450] [RESERVE=150] bash tools/kernelbench_sweep.sh
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap
. tools/device_env.sh || exit 1
mkdir -p .sweep
python3 tools/kernelbench_sweep.py --kernelbench "${KB_DIR:-.kernelbench}" --levels "${LEVELS:-1,2}" \
  --db .sweep/sweep.db --out .sweep/out --jobs "${JOBS:-4}" --time-limit-s "${LIMIT:-450}" \
  --timing-reserve-s "${RESERVE:-150}" 2>&1 | tail -150
tar -czf "$OUT/sweep.tgz" -C .sweep .
