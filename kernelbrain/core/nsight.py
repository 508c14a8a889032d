"""Nsight Compute: the command kb runs, the parser of its `--csv` output, and the metrics it keeps.

One fixed metric set, so profiles of different candidates compare. The CSV has one row per
(kernel launch, metric); a forward may launch several kernels, so the metrics are combined over
them: durations summed, throughputs and rates weighted by duration, registers the maximum, spills
summed.
"""

from __future__ import annotations

import csv
import io
import time
from collections import defaultdict
from pathlib import Path

# our name -> Nsight Compute metric
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "compute_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "registers_per_thread": "launch__registers_per_thread",
    "local_load_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
    "local_store_sectors": "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "global_load_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "global_load_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "stall_long_scoreboard": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "stall_barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "stall_math_pipe_throttle": "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "stall_mio_throttle": "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "stall_lg_throttle": "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "stall_short_scoreboard": "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "stall_wait": "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
}
SUMMED = {
    "duration_ns",
    "local_load_sectors",
    "local_store_sectors",
    "global_load_sectors",
    "global_load_requests",
}
MAXED = {"registers_per_thread"}


class NcuError(Exception):
    """ncu could not profile (absent, no permission for the counters, or no kernel in range)."""


def command(python: str, problem_file: str, candidate_file: str) -> list[str]:
    return [
        "ncu", "--csv", "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
        "--print-units", "base", "--metrics", ",".join(METRICS.values()),
        python, "-m", "kernelbrain.child.ncu_target", problem_file, candidate_file,
    ]  # fmt: skip


READY, GO = "ready", "go"  # the target's handshake with the child that runs ncu: files in ncu's folder
DEVICE, ON = "device", "on"  # its first: it reaches the device next; on, the worker holds the lock


def reaches_device(folder: Path, poll_s: float = 0.005) -> None:
    """The target's side: imported and loaded, its work reaches the device next; wait for the child's `on`
    (the worker holds the GPU's lock shared from then, child/profile.py: ncu and the imports held none)."""
    (folder / DEVICE).touch()
    while not (folder / ON).exists():
        time.sleep(poll_s)


def ready(folder: Path, poll_s: float = 0.005) -> None:
    """The target's side: what is profiled next is warm; wait for the child's `go` (the worker holds the
    GPU alone from then, child/profile.py)."""
    (folder / READY).touch()
    while not (folder / GO).exists():
        time.sleep(poll_s)


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text in {"", "n/a", "N/A"}:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse(output: str) -> tuple[dict[str, float], int]:
    """Combined metrics over every kernel in the CSV, and how many kernels there were."""
    start = output.find('"ID"')
    if start < 0:
        first = next((line for line in output.splitlines() if line.startswith("==ERROR==")), "")
        raise NcuError(first or "ncu printed no metrics (was any kernel launched in the profiled range?)")
    by_kernel: dict[str, dict[str, float]] = defaultdict(dict)
    wanted = {v: k for k, v in METRICS.items()}
    for row in csv.DictReader(io.StringIO(output[start:])):
        name = wanted.get(row.get("Metric Name", ""))
        value = _number(row.get("Metric Value", ""))
        if name is not None and value is not None:
            by_kernel[row["ID"]][name] = value
    if not by_kernel:
        raise NcuError("ncu's CSV held none of kb's metrics")
    kernels = list(by_kernel.values())
    durations = [k.get("duration_ns", 0.0) for k in kernels]
    total = sum(durations) or 1.0
    combined: dict[str, float] = {}
    for name in METRICS:
        values = [(k[name], d) for k, d in zip(kernels, durations, strict=True) if name in k]
        if not values:
            continue
        if name in SUMMED:
            combined[name] = sum(v for v, _ in values)
        elif name in MAXED:
            combined[name] = max(v for v, _ in values)
        else:
            combined[name] = sum(v * d for v, d in values) / total
    if combined.get("global_load_requests"):
        combined["sectors_per_request"] = combined["global_load_sectors"] / combined["global_load_requests"]
    return combined, len(kernels)
