#!/usr/bin/env bash
# The zygote branch against its base, one untrusted kb check --bench each, alternating, on the GPU.
set -u
top=$PWD
cd .zyg && ln -sfn "$top/.whl" .whl
OUT=$OUT BEFORE=$top/.zbase REPEATS=${REPEATS:-2} bash "$top/tools/untrusted_cost.sh"
rc=$?
mkdir -p $OUT/logs && cp /tmp/kb-untrusted-logs/* $OUT/logs/ 2>/dev/null
grep -il zygote $OUT/logs/* ; echo "rc=$rc"
# The zygote's own tests on the GPU host, under bubblewrap (cgroup v2 there).
cd "$top/.zyg" && . tools/device_env.sh >/dev/null 2>&1 && export KB_BWRAP=/tmp/bw/usr/bin/bwrap && \
  timeout 200 python3 -m pytest -o addopts="" -p no:cacheprovider -q -rs tests/test_zygote.py 2>&1 | tail -15 | tee $OUT/zygote_pytest.txt
