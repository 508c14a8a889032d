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
