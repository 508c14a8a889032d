"""tools/h200_measure.py's report phase over the recorded session-4 H200 run (benchmarks/results/h200/
session4): the verdicts it writes, and the ablation's GPU seconds and what they paid for, from the real
databases and compare files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "h200" / "session4"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[dict, str]:
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
    return json.loads((out / "h200.json").read_text()), (out / "RESULTS.md").read_text()


def _verdict(doc: dict, problem: str, start: str) -> dict:
    return next(v for v in doc["problems"][problem]["verdicts"] if v["target"].startswith(start))


def test_compile_targets_are_judged_against_torch_compile_default_with_the_stricter_reading_beside(report):
    doc, md = report
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
    doc, _ = report
    speedups = [e["compare"]["shapes"][0]["kb_vs_eager"] for e in doc["problems"].values()]
    assert len(speedups) == 6
    geo = math.exp(sum(math.log(x) for x in speedups) / 6)
    assert doc["geomean_vs_eager"]["value"] == pytest.approx(geo) and doc["geomean_vs_eager"]["over"] == 6


def test_ablation_splits_the_gpu_seconds_to_the_winner_by_task(report):
    doc, md = report
    for name, entry in doc["problems"].items():
        for arm in ("ladder", "flat"):
            a = entry[arm]["ablation"]
            tasks = a["gpu_s_to_winner_first_by_task"]
            # every charge up to and including the winner's first measurement, by what it paid for
            assert sum(tasks.values()) == pytest.approx(a["gpu_s_to_winner_first_measured"]), (name, arm)
            assert set(tasks) <= {"gen", "gate", "bench", "profile"} and "gate" in tasks, (name, arm, tasks)
        assert f"| {name} | ladder |" in md and f"| {name} | flat |" in md
