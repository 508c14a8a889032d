#!/usr/bin/env bash
# Issue 35: where kb's cgroups sit on the GPU host, their cap, and that none is left after a run.
. tools/device_env.sh >/dev/null 2>&1 || { echo "device_env failed"; exit 1; }
rm -rf /tmp/bw && mkdir -p /tmp/bw && dpkg -x .whl/bubblewrap.deb /tmp/bw; export KB_BWRAP=/tmp/bw/usr/bin/bwrap
echo "before: $(find /sys/fs/cgroup -maxdepth 3 -type d -name 'kb-*' | wc -l) kb cgroups" | tee $OUT/cg2.txt
( python3 -m kernelbrain run tests/problems/softmax_small.py --device cuda --max-candidates 3 --db /tmp/c.db --quiet > $OUT/run.txt 2>&1; echo "rc=$?" >> $OUT/run.txt ) &
p=$!
for i in 1 2 3 4 5 6 7 8; do sleep 4; for d in $(find /sys/fs/cgroup -maxdepth 3 -type d -name 'kb-*'); do echo "t=$((i*4)) $d max=$(cat $d/memory.max) swap=$(cat $d/memory.swap.max) procs=$(cat $d/cgroup.procs | wc -l) peak=$(cat $d/memory.peak 2>/dev/null)"; done >> $OUT/cg2.txt; kill -0 $p 2>/dev/null || break; done
wait $p; tail -2 $OUT/run.txt | cut -c1-160
echo "after: $(find /sys/fs/cgroup -maxdepth 3 -type d -name 'kb-*' | wc -l) kb cgroups" | tee -a $OUT/cg2.txt
timeout 100 python3 -m pytest -o addopts="" -p no:cacheprovider -q tests/test_launches.py -k gpu 2>&1 | tail -2
