"""Which details of a streaming elementwise Triton kernel move its time at KernelBench's sizes, on the GPU:
offsets in int32 or int64, a mask or none, eviction and cache hints, elements a thread, a persistent
grid; beside eager PyTorch and torch.compile, in one process on the same fresh input.

    python3 experiments/pointwise_variants.py [--rows 4096] [--cols 393216] [--reps 20] [--out FILE.json]

The op is leaky_relu (KernelBench level 1's 20). An experiment for the pointwise family's parts, not
kb's measurement: it prints and writes median milliseconds, their spread, and GB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _leaky(
    y_ptr,
    x_ptr,
    n,
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,
    MASKED: tl.constexpr,
    EVICT: tl.constexpr,
    PERSISTENT: tl.constexpr,
):
    start = tl.program_id(0)
    step = tl.num_programs(0) if PERSISTENT else 1
    stop = tl.cdiv(n, BLOCK) if PERSISTENT else start + 1
    for tile in range(start, stop, step):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        if WIDE:
            offs = tl.cast(tile, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        if MASKED:
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)
        else:
            mask = None
            x = tl.load(x_ptr + offs, eviction_policy=EVICT)
        tl.store(y_ptr + offs, tl.where(x > 0.0, x, x * 0.01), mask=mask, eviction_policy=EVICT)


def _median_ms(fn: Callable[[], object], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=393216)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    x = torch.randn(args.rows, args.cols, device="cuda")
    n = x.numel()
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def variant(block: int, warps: int, wide: bool, masked: bool, evict: str, ctas_per_sm: int = 0):
        grid = (sms * ctas_per_sm,) if ctas_per_sm else (triton.cdiv(n, block),)
        return lambda: _leaky[grid](
            y, x, n, BLOCK=block, WIDE=wide, MASKED=masked, EVICT=evict, PERSISTENT=bool(ctas_per_sm),
            num_warps=warps,
        )  # fmt: skip

    variants: dict[str, Callable[[], object]] = {}
    for block, warps in ((1024, 4), (2048, 4), (4096, 8), (8192, 8), (8192, 16)):
        variants[f"b{block} w{warps} int64 masked (as kb)"] = variant(block, warps, True, True, "")
        variants[f"b{block} w{warps} int32 masked"] = variant(block, warps, False, True, "")
        if n % block == 0:
            variants[f"b{block} w{warps} int32 unmasked"] = variant(block, warps, False, False, "")
        evict = variant(block, warps, False, True, "evict_first")
        variants[f"b{block} w{warps} int32 masked evict_first"] = evict
    for ctas in (2, 4, 8):
        variants[f"persistent x{ctas} b2048 w8 int64"] = variant(2048, 8, True, True, "", ctas)
        variants[f"persistent x{ctas} b4096 w8 int32"] = variant(4096, 8, False, True, "", ctas)
    compiled = torch.compile(lambda t: F.leaky_relu(t, 0.01))
    variants["torch.compile"] = lambda: compiled(x)
    want = F.leaky_relu(x, 0.01)
    for name, fn in variants.items():  # correctness and warm-up (compilation) before any timing
        y.zero_()
        out = fn()
        got = out if isinstance(out, torch.Tensor) else y
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    del want
    eager: list[float] = []
    rows = []
    for name, fn in variants.items():  # interleaved: eager again beside each variant
        eager += _median_ms(lambda: F.leaky_relu(x, 0.01), args.reps)
        times = _median_ms(fn, args.reps)
        rows.append({"variant": name, "median_ms": statistics.median(times), "min_ms": min(times),
                     "max_ms": max(times)})  # fmt: skip
    eager_ms = statistics.median(eager)
    gbytes = 2 * n * x.element_size() / 1e9
    print(f"eager {eager_ms:.3f} ms ({gbytes / eager_ms * 1e3:.0f} GB/s), {args.rows}x{args.cols} fp32")
    for row in rows:
        row["vs_eager"] = eager_ms / row["median_ms"]
        row["gb_per_s"] = gbytes / row["median_ms"] * 1e3
        print(f"{row['vs_eager']:.3f}x  {row['median_ms']:.3f} ms [{row['min_ms']:.3f}, {row['max_ms']:.3f}]"
              f"  {row['gb_per_s']:.0f} GB/s  {row['variant']}")  # fmt: skip
    if args.out:
        result = {"shape": [args.rows, args.cols], "eager_ms": eager_ms, "eager_spread_ms": [min(eager),
                  max(eager)], "device": torch.cuda.get_device_name(), "variants": rows}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
