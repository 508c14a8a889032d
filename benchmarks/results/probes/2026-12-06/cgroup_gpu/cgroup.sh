#!/usr/bin/env bash
# Issue 35: the cgroup v2 cap on a GPU host.
set -u
. tools/device_env.sh >/dev/null 2>&1 || { echo "device_env failed"; exit 1; }
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw
export KB_BWRAP=/tmp/bw/usr/bin/bwrap
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
echo "self cgroup: $(cat /proc/self/cgroup)" | tee -a $OUT/cgroup_run.txt
python3 -m kernelbrain doctor 2>&1 | tee $OUT/doctor.txt | grep -i -E "limit|sandbox|memory"
timeout 240 python3 -m pytest -o addopts="" -p no:cacheprovider -q -rs tests/red_team/test_limits_cheats.py -k "resource or unprivileged" 2>&1 | tail -25 | tee $OUT/limits_pytest.txt
( python3 -m kernelbrain run benchmarks/problems/softmax.py --device cuda --db /tmp/s.db --quiet > $OUT/softmax_run.txt 2>&1; echo "rc=$?" >> $OUT/softmax_run.txt ) &
runpid=$!
for i in 1 2 3 4 5 6; do
  sleep 7
  echo "--- t=$((i*7))s" >> $OUT/cgroup_run.txt
  for p in $(pgrep -f "kernelbrain|bwrap"); do
    printf '%s %s | %s\n' "$p" "$(cat /proc/$p/cgroup 2>/dev/null | tr '\n' ' ')" "$(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -c1-110)" >> $OUT/cgroup_run.txt
  done
  ls /sys/fs/cgroup | grep "^kb-" | while read c; do echo "cg $c max=$(cat /sys/fs/cgroup/$c/memory.max) procs=$(cat /sys/fs/cgroup/$c/cgroup.procs | tr '\n' ' ')"; done >> $OUT/cgroup_run.txt
done
wait $runpid
tail -5 $OUT/softmax_run.txt
echo "leftover kb cgroups: $(ls /sys/fs/cgroup | grep -c '^kb-')" | tee -a $OUT/cgroup_run.txt
grep -c "" $OUT/cgroup_run.txt
