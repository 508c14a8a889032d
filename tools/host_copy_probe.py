"""What keeping a large timed call's output costs on this GPU: a 6 GiB float32 output (KernelBench's
softmax at its own size) copied to the host as `child/timing.keep` does (a new pageable tensor), into
pinned memory (new, then reused), and back to the device, each timed with the device synchronised.

    python3 tools/host_copy_probe.py [--gib 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del out
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=6.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = int(args.gib * 2**30 / 4)
    x = torch.randn(n, device="cuda")
    pinned = torch.empty(n, pin_memory=True)
    keys = ("d2h_pageable_new", "pin_alloc", "d2h_pinned_new", "d2h_pinned_reused")
    keys += ("h2d_pageable", "h2d_pinned")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(args.repeats):
        rows["d2h_pageable_new"].append(timed(lambda: x.to("cpu", copy=True)))
        rows["pin_alloc"].append(timed(lambda: torch.empty(n, pin_memory=True)))
        rows["d2h_pinned_new"].append(timed(lambda: torch.empty(n, pin_memory=True).copy_(x)))
        rows["d2h_pinned_reused"].append(timed(lambda: pinned.copy_(x)))
        host = x.to("cpu")
        rows["h2d_pageable"].append(timed(lambda h=host: h.to("cuda")))
        rows["h2d_pinned"].append(timed(lambda: pinned.to("cuda")))
        del host
    gib = n * 4 / 2**30
    print(json.dumps({"gib": gib, "gpu": torch.cuda.get_device_name(), "seconds": rows}))
    for k, v in rows.items():
        print(f"{k:20s} median {sorted(v)[len(v) // 2]:.3f} s  ({gib / sorted(v)[len(v) // 2]:.1f} GiB/s)")


if __name__ == "__main__":
    main()
