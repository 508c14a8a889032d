"""What a Triton kernel's first call costs in a process whose cache holds its compiled kernel but not
the host-side launcher (as a gate child's cache is filled for each candidate): does this Triton build a
C launcher per kernel signature, and how long does that take?

    python3 tools/launcher_probe.py        # on the GPU machine; prints one JSON line
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CALL = """
import time, torch, triton, triton.language as tl
t0 = time.perf_counter()
@triton.jit
def add_one(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)
x = torch.ones(4096, device="cuda")
y = torch.empty_like(x)
torch.cuda.synchronize()
t1 = time.perf_counter()
add_one[(4,)](x, y, 4096, BLOCK=1024)
torch.cuda.synchronize()
print(time.perf_counter() - t1)
"""


def first_call(cache: Path) -> float:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", _CALL], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import inspect

    import triton
    import triton.backends.nvidia.driver as driver

    cache = Path(tempfile.mkdtemp())
    try:
        cold = first_call(cache)  # compiles the kernel, and the launcher where there is one
        warm = first_call(cache)  # everything cached
        launchers = [p.parent for p in cache.rglob("*launcher*.so")]
        for d in launchers:
            shutil.rmtree(d)
        started = time.perf_counter()
        no_launcher = first_call(cache)  # the kernel cached, its launcher built again
        print(
            json.dumps(
                {
                    "triton": triton.__version__,
                    "make_launcher_in_driver": "make_launcher" in inspect.getsource(driver),
                    "launcher_files": len(launchers),
                    "cold_first_call_s": round(cold, 3),
                    "warm_first_call_s": round(warm, 3),
                    "no_launcher_first_call_s": round(no_launcher, 3),
                    "no_launcher_process_s": round(time.perf_counter() - started, 3),
                }
            )
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
