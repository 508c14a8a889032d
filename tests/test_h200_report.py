"""tools/h200_measure.py's report phase over the recorded session-4 and session-5 H200 runs
(tests/fixtures/h200/session4, session5-b50, session5-b80: the databases, compare files and ceilings
as measured; session5-b80 is the run benchmarks/results/RESULTS.md reports):
the verdicts it writes, the ablation's GPU seconds and what they paid for, and where the GPU's idle
time went, from the real databases and compare files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "fixtures" / "h200"


@pytest.fixture(scope="module", params=["session4", "session5-b50", "session5-b80"])
def report(request, tmp_path_factory) -> tuple[dict, str, str]:
    RUN = RECORDED / request.param
    out = tmp_path_factory.mktemp("report")
    before = {p: p.stat().st_mtime_ns for p in RUN.rglob("*.db")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "h200_measure.py"),
            "report",
            "--out",
            str(RUN),
            "--results",
            str(out),
            "--command",
            "the command",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in RUN.rglob("*.db")} == before  # read-only
    return json.loads((out / "h200.json").read_text()), (out / "RESULTS.md").read_text(), request.param


def _verdict(doc: dict, problem: str, start: str) -> dict:
    return next(v for v in doc["problems"][problem]["verdicts"] if v["target"].startswith(start))


def test_compile_targets_are_judged_against_torch_compile_default_with_the_stricter_reading_beside(report):
    doc, md, _ = report
    shape = doc["problems"]["rmsnorm"]["compare"]["shapes"][0]
    t = shape["times"]
    default = t["compile_default"]["median_s"] / t["kb_ladder"]["median_s"]
    best = (
        min(t["compile_default"]["median_s"], t["compile_max-autotune-no-cudagraphs"]["median_s"])
        / t["kb_ladder"]["median_s"]
    )
    assert shape["kb_vs_compile_default"] == pytest.approx(default) and shape[
        "kb_vs_best_compile"
    ] == pytest.approx(best)
    got = _verdict(doc, "rmsnorm", ">= 1.05x torch.compile (default)")
    assert got["got"] == pytest.approx(default) and got["met"] is (default >= 1.05)
    stricter = _verdict(doc, "rmsnorm", ">= 1.05x best compile mode")
    assert stricter["got"] == pytest.approx(best) and stricter["met"] is (best >= 1.05)
    assert "| kb vs compile | kb vs best compile |" in md


def test_geomean_is_over_the_six_large_shapes(report):
    doc, _, _ = report
    speedups = [e["compare"]["shapes"][0]["kb_vs_eager"] for e in doc["problems"].values()]
    assert len(speedups) == 6
    geo = math.exp(sum(math.log(x) for x in speedups) / 6)
    assert doc["geomean_vs_eager"]["value"] == pytest.approx(geo) and doc["geomean_vs_eager"]["over"] == 6


def test_ablation_splits_the_gpu_seconds_to_the_winner_by_task(report):
    doc, md, _ = report
    for name, entry in doc["problems"].items():
        for arm in ("ladder", "flat"):
            a = entry[arm]["ablation"]
            tasks = a["gpu_s_to_winner_first_by_task"]
            # every charge up to and including the winner's first measurement, by what it paid for
            assert sum(tasks.values()) == pytest.approx(a["gpu_s_to_winner_first_measured"]), (name, arm)
            assert set(tasks) <= {"gen", "gate", "bench", "profile"} and "gate" in tasks, (name, arm, tasks)
        assert f"| {name} | ladder |" in md and f"| {name} | flat |" in md


def test_idle_time_is_split_into_start_between_and_end(report):
    doc, md, _ = report
    for name, entry in doc["problems"].items():
        for arm in ("ladder", "flat"):
            b = entry[arm]["busy"]
            idle = b["idle_s"]
            assert idle["start"] + idle["between"] + idle["end"] + b["gpu_busy_s"] == pytest.approx(
                b["wall_s"]
            )
            # workers start, the problem is analysed and round 0 proposed before any GPU task
            assert idle["start"] > 0.5, (name, arm, idle)
            assert f"{b['busy_fraction'] * 100:.0f}% ({idle['start']:.1f} / " in md


def test_the_ablation_target_is_judged_per_problem(report):
    doc, md, session = report
    for name, entry in doc["problems"].items():
        v = entry["ablation_verdict"]
        first = {arm: entry[arm]["ablation"]["gpu_s_to_winner_first_measured"] for arm in ("ladder", "flat")}
        assert v["ratio"] == pytest.approx(first["ladder"] / first["flat"])
        t = entry["compare"]["shapes"][0]["times"]
        a, b = sorted((t["kb_ladder"], t["kb_flat"]), key=lambda x: x["median_s"])
        overlap = a["median_s"] + a["iqr_s"] / 2 >= b["median_s"] - b["iqr_s"] / 2
        same = entry["ladder"]["ablation"]["winner"] == entry["flat"]["ablation"]["winner"]
        assert v["same_winner"] is same and v["equal_within_noise"] is (same or overlap)
        assert v["met"] is (v["ratio"] <= 0.5 and v["equal_within_noise"])
        assert f"| {name} | {v['ratio'] * 100:.0f}% |" in md
    # as recorded: session 4 met it on sdp_attn alone; session 5 (budget 50 and budget 80) on rmsnorm,
    # matvec and sdp_attn
    met = {name for name, e in doc["problems"].items() if e["ablation_verdict"]["met"]}
    assert (
        met
        == {
            "session4": {"sdp_attn"},
            "session5-b50": {"rmsnorm", "matvec", "sdp_attn"},
            "session5-b80": {"rmsnorm", "matvec", "sdp_attn"},
        }[session]
    )


def test_each_winners_profile_gives_the_figures_behind_its_label(report):
    doc, md, _ = report
    for name, entry in doc["problems"].items():
        m = entry["ladder"]["winner_profile"]["metrics"]
        line = next(x for x in md.splitlines() if x.startswith(f"- {name}: "))
        assert f"DRAM {m['dram_throughput_pct']:.0f}%" in line, line
        assert f"{m['registers_per_thread']:.0f} registers a thread" in line, line
        stalls = {k: v for k, v in m.items() if k.startswith("stall_")}
        assert f"top stall {max(stalls, key=stalls.get).removeprefix('stall_')}" in line, line
