#!/usr/bin/env bash
# One GPU session's worth of kb runs, made on the device machine: from the repository root, with .whl/
# (kb's dependency wheels: tools/device_env.sh says which and how to make them) carried, run
# `bash experiments/gpu_run.sh PROBLEM...`. It made benchmarks/results/gpu_pipeline/ (removed from the
# tree after d69481f: see benchmarks/results/RESULTS.md, "Earlier measurements").
# Writes into $OUT: the run database (vacuumed into one file), the runs' output, and per run the
# status, events, audit and replay text.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
. tools/device_env.sh || exit 1  # kb into /tmp/kb, .whl/ into /tmp/site, PYTHONPATH
DB=/tmp/kb-gpu.db
kb() { python3 -m kernelbrain "$@"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  command -v ncu && ncu --version | tail -1
} > "$OUT/machine.txt" 2>&1
for problem in "${@:-benchmarks/problems/softmax.py}"; do
  timeout "${KB_GPU_RUN_TIMEOUT:-400}" python3 -m kernelbrain run "$problem" --db "$DB" --device cuda \
    --max-candidates "${KB_MAX_CANDIDATES:-6}" 2>&1 | tee -a "$OUT/runs.log"
done
for rid in $(kb ls --db "$DB" --json | python3 -c "import json,sys; print(' '.join(r['run_id'] for r in json.load(sys.stdin)))"); do
  {
    echo "== kb status $rid"; kb status "$rid" --db "$DB"
    echo; echo "== kb replay $rid"; kb replay "$rid" --db "$DB"
    echo; echo "== kb audit $rid"; kb audit "$rid" --db "$DB"
    echo; echo "== kb events $rid"; kb events "$rid" --db "$DB"
  } >> "$OUT/report.txt" 2>&1
done
python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute(\"VACUUM INTO '\" + sys.argv[2] + \"'\")" \
  "$DB" "$OUT/gpu.db"
