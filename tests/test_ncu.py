"""Nsight Compute output, as recorded on the H200, parsed into kb's metrics and bottleneck labels."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import ncu_labels
from kernelbrain.core.nsight import METRICS, NcuError, command, parse

FIXTURES = Path(__file__).parent / "fixtures"


def test_recorded_softmax_profile():
    metrics, kernels = parse((FIXTURES / "ncu_softmax.csv").read_text())
    assert kernels == 1
    assert set(METRICS) <= set(metrics)
    assert metrics["dram_throughput_pct"] == pytest.approx(84.92)
    assert metrics["registers_per_thread"] == 38
    assert metrics["duration_ns"] == pytest.approx(4724864)
    assert metrics["sectors_per_request"] == pytest.approx(16.0)
    assert ncu_labels(metrics) == ["memory-bound near peak"]


def test_recorded_rmsnorm_profile():
    metrics, _ = parse((FIXTURES / "ncu_rmsnorm.csv").read_text())
    assert metrics["achieved_occupancy_pct"] == pytest.approx(23.98)
    assert metrics["registers_per_thread"] == 116
    assert metrics["local_load_sectors"] == 0 and metrics["local_store_sectors"] == 0
    assert ncu_labels(metrics) == ["memory-bound near peak"]


def _two_kernels() -> str:
    """The recorded softmax rows twice over, as kernel 0 (4.72 ms) and kernel 1 (a 1 ms copy)."""
    text = (FIXTURES / "ncu_softmax.csv").read_text()
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"') :])))
    header, first = rows[0], rows[1:]
    changes = {
        "gpu__time_duration.sum": "1,000,000",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "10",
        "launch__registers_per_thread": "200",
    }  # ncu prints thousands separators
    second = [["1", *r[1:-1], changes.get(r[-3], r[-1])] for r in first]
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows([header, *first, *second])
    return out.getvalue()


def test_several_kernels_are_combined_by_duration():
    metrics, kernels = parse(_two_kernels())
    assert kernels == 2
    assert metrics["duration_ns"] == pytest.approx(4724864 + 1_000_000)
    expected = (84.92 * 4724864 + 10 * 1_000_000) / (4724864 + 1_000_000)
    assert metrics["dram_throughput_pct"] == pytest.approx(expected)
    assert metrics["registers_per_thread"] == 200  # the worst kernel's


def test_ncu_refusing_is_a_clear_error():
    out = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"
    with pytest.raises(NcuError, match="ERR_NVGPUCTRPERM"):
        parse(out)
    with pytest.raises(NcuError, match="no metrics"):
        parse("==PROF== Disconnected\n")


@pytest.mark.parametrize(
    ("metrics", "labels"),
    [
        ({"duration_ns": 5e6, "dram_throughput_pct": 40, "compute_throughput_pct": 85}, ["compute-bound"]),
        (
            {"duration_ns": 5e6, "dram_throughput_pct": 30, "compute_throughput_pct": 20},
            ["latency or occupancy-limited"],
        ),
        (
            {"duration_ns": 5e3, "dram_throughput_pct": 5, "compute_throughput_pct": 3},
            ["launch-bound", "latency or occupancy-limited"],
        ),
        (
            {
                "duration_ns": 5e6,
                "dram_throughput_pct": 50,
                "compute_throughput_pct": 10,
                "local_load_sectors": 64,
            },
            ["register spills", "latency or occupancy-limited"],
        ),
        (
            {
                "duration_ns": 5e6,
                "dram_throughput_pct": 50,
                "compute_throughput_pct": 10,
                "sectors_per_request": 32,
            },
            ["memory-bound with poor coalescing"],
        ),
    ],
)
def test_labels_from_metrics(metrics, labels):
    assert ncu_labels(metrics) == labels


def test_the_command_keeps_clocks_and_profiles_one_forward():
    cmd = command("python3", "p.py", "c.py")
    assert cmd[:2] == ["ncu", "--csv"]
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[-5:] == ["python3", "-m", "kernelbrain.child.ncu_target", "p.py", "c.py"]


TARGET = """
import sys, time
from pathlib import Path
from kernelbrain.core.nsight import ready
print("warm", time.time(), flush=True)
ready(Path.cwd())
print("profiled", time.time())
"""


def test_the_profiled_range_waits_for_go_and_the_rest_does_not(tmp_path: Path, monkeypatch) -> None:
    """ncu's target says ready once warm and goes on only when its child, having asked its worker for the
    GPU alone (child/marks.py), says go: a worker's answer that takes 3 s holds the profiled range
    back 3 s, and the seconds it waited do not count against the timeout."""
    import sys
    import time

    from kernelbrain.child import marks, profile

    asked: list[float] = []

    def worker_answers() -> None:  # the worker's side: the GPU is had alone 3 s later
        asked.append(time.time())
        time.sleep(3.0)

    monkeypatch.setattr(marks, "ready", worker_answers)
    code, out, err = profile.run_ready([sys.executable, "-c", TARGET], tmp_path, timeout_s=2.5)
    assert code == 0, err
    (_, warm), (_, profiled) = (line.split() for line in out.splitlines())
    assert len(asked) == 1 and float(warm) <= asked[0] and float(profiled) >= asked[0] + 3.0
    assert (tmp_path / "ready").exists() and (tmp_path / "go").exists()


DEVICE_TARGET = """
import sys, time
from pathlib import Path
from kernelbrain.core.nsight import reaches_device, ready
print("imported", time.time(), flush=True)
reaches_device(Path.cwd())
print("on", time.time(), flush=True)
ready(Path.cwd())
print("profiled", time.time())
"""


def test_the_target_reaches_the_device_only_once_its_worker_holds_the_lock(
    tmp_path: Path, monkeypatch
) -> None:
    """ncu and the target's imports start holding nothing; the target says where it reaches the device and
    waits for its child, who asks the worker for the lock (shared) first, then alone at `ready`."""
    import sys
    import time

    from kernelbrain.child import marks, profile

    asked: list[tuple[str, float]] = []

    def answers(label: str, wait: float):  # the worker's side
        def answer() -> None:
            asked.append((label, time.time()))
            time.sleep(wait)

        return answer

    monkeypatch.setattr(marks, "reach_device", answers("device", 1.0))
    monkeypatch.setattr(marks, "ready", answers("ready", 0.0))
    code, out, err = profile.run_ready([sys.executable, "-c", DEVICE_TARGET], tmp_path, timeout_s=2.5)
    assert code == 0, err
    (_, imported), (_, on), (_, profiled) = (line.split() for line in out.splitlines())
    assert [label for label, _ in asked] == ["device", "ready"]
    assert (
        float(imported) <= asked[0][1] and float(on) >= asked[0][1] + 1.0 and float(profiled) >= asked[1][1]
    )
