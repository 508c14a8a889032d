"""Whether the profiler's launch checks slow a process's later CUDA work: a cuBLAS matrix-vector product
(matvec's reference) timed as kb's bench times it, before any profiler session and after each of N
sessions of `launches.record_kernels`, in this process; and what one session costs.

    python3 experiments/cupti_drift.py [--sessions 10]   (TEARDOWN_CUPTI=1 in the environment to compare)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from kernelbrain.child.guard import prepare_profiler
from kernelbrain.child.launches import record_kernels
from kernelbrain.child.timing import Timer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--prepare", action="store_true", help="start the profiler once first, as guard.install")
    args = ap.parse_args()
    a = torch.randn(256, 131072, device="cuda")
    x = torch.randn(131072, 1, device="cuda")
    timer = Timer("cuda")

    def timed() -> float:
        for _ in range(3):
            a @ x
        return statistics.median(timer(lambda: a @ x, 4) for _ in range(20))

    rows = {"teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "prepare": args.prepare}
    rows["clean_us"] = timed() * 1e6
    if args.prepare:
        t = time.perf_counter()
        prepare_profiler()
        rows["prepare_s"] = time.perf_counter() - t
        rows["after_prepare_us"] = timed() * 1e6
    after, cost = [], []
    for _ in range(args.sessions):
        t = time.perf_counter()
        record_kernels(lambda: a @ x)
        cost.append(time.perf_counter() - t)
        after.append(round(timed() * 1e6, 1))
    rows["after_each_session_us"] = after
    rows["session_s"] = [round(c, 4) for c in cost]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
