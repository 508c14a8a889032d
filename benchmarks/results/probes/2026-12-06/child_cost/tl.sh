#!/usr/bin/env bash
# Where an untrusted kb check --bench spends its 25 s on the GPU: its output lines and its processes, timed.
. tools/device_env.sh >/dev/null 2>&1 || exit 1
export KB_BWRAP=/tmp/bw/usr/bin/bwrap KB_SANDBOX=bwrap
python3 - <<'PY' > $OUT/check_timeline.txt 2>&1
import subprocess, time, os, threading
t0 = time.time()
p = subprocess.Popen(["python3", "-m", "kernelbrain", "check", "tests/problems/softmax_small.py", "tests/candidates/good_softmax.py", "--device", "cuda", "--bench"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
seen = {}
def watch():
    while p.poll() is None:
        out = subprocess.run(["ps", "-eo", "pid,etimes,args"], capture_output=True, text=True).stdout
        for line in out.splitlines()[1:]:
            pid, _, args = line.strip().split(None, 2)
            if "kernelbrain" in args and pid not in seen and "ps -eo" not in args:
                seen[pid] = time.time() - t0
                print(f"{seen[pid]:6.2f} start {pid} {args[:110]}", flush=True)
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
for line in p.stdout:
    print(f"{time.time()-t0:6.2f} out {line.rstrip()[:150]}", flush=True)
p.wait(); print(f"{time.time()-t0:6.2f} exit {p.returncode}")
PY
cat $OUT/check_timeline.txt | cut -c1-170
