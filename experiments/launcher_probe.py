"""What a Triton kernel's first call costs in a process whose cache holds its compiled kernel but not
the host-side launcher (as a gate child's cache is filled for each candidate): does this Triton build a
C launcher per kernel signature, and how long does that take?

    python3 experiments/launcher_probe.py [DRIVER_COPY]   # on the GPU machine; prints one JSON line
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
    """A fresh process's first call of a kernel (Triton reads a kernel's source from its file)."""
    script = cache.parent / "probe_kernel.py"
    script.write_text(_CALL)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the probe's kernel failed: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import inspect

    import triton
    import triton.backends.nvidia.driver as driver

    cache = Path(tempfile.mkdtemp()) / "cache"
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
        if len(sys.argv) > 1:  # where to keep this Triton's launcher code, to read
            Path(sys.argv[1]).write_text(inspect.getsource(driver))
    finally:
        shutil.rmtree(cache.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
