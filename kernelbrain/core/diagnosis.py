"""Bottleneck labels derived from profiler metrics; the generator's mutation tables key on these."""

from __future__ import annotations

LABELS = (
    "memory-bound near peak",
    "memory-bound with poor coalescing",
    "latency or occupancy-limited",
    "compute-bound",
    "launch-bound",
    "register spills",
)

LAUNCH_BOUND_S = 20e-6  # below this a kernel's time is mostly launch and tail
NEAR_PEAK = 0.7
# global-load sectors per request: 4 is a coalesced fp32 warp, 16 a fully vectorised one; more is waste
POOR_COALESCING = 16


def roofline_labels(m: dict[str, float]) -> list[str]:
    """Labels from an analytical roofline: where the kernel sits against the measured ceilings."""
    labels = []
    if m["time_s"] < LAUNCH_BOUND_S:
        labels.append("launch-bound")
    if m["arith_intensity"] >= m["ridge_intensity"]:
        labels.append("compute-bound" if m["compute_frac"] >= NEAR_PEAK else "latency or occupancy-limited")
    else:
        labels.append(
            "memory-bound near peak" if m["dram_frac"] >= NEAR_PEAK else "latency or occupancy-limited"
        )
    return labels


def ncu_labels(m: dict[str, float]) -> list[str]:
    """Labels from Nsight Compute's metrics (percentages of peak as ncu reports them)."""
    labels = []
    if m.get("duration_ns", float("inf")) < LAUNCH_BOUND_S * 1e9:
        labels.append("launch-bound")
    if m.get("local_load_sectors", 0) + m.get("local_store_sectors", 0) > 0:
        labels.append("register spills")
    dram, compute = m.get("dram_throughput_pct", 0.0), m.get("compute_throughput_pct", 0.0)
    if dram >= NEAR_PEAK * 100:
        labels.append("memory-bound near peak")
    elif compute >= NEAR_PEAK * 100:
        labels.append("compute-bound")
    elif m.get("sectors_per_request", 0.0) > POOR_COALESCING and dram >= compute:
        labels.append("memory-bound with poor coalescing")
    else:
        labels.append("latency or occupancy-limited")
    return labels
