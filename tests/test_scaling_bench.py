"""tools/scaling_bench.py's dry run on CPU: the same search driven by workers placed on "GPUs" 1 and 2
(interpreter workers, `--gpu i` passed), its figures read back from the log and checked against it, and
the timing-noise part timing the winner with a neighbour idle and busy."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kernelbrain.store import open_store

from tests.invariants import check_run
from tests.kbcli import ROOT, SOFTMAX, kb, kb_env
from tools.scaling_bench import PER_GPU, ScalingResult

TOOL = ROOT / "tools" / "scaling_bench.py"
QUICK = ["--device", "cpu", "--max-candidates", "3", "--ladder", "smallest:3:1,primary:3:1"]


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, env=kb_env(), timeout=timeout
    )


def test_dry_run_on_two_gpus_measures_what_the_log_says(tmp_path) -> None:
    out = tmp_path / "scaling"
    r = bench(
        str(SOFTMAX), "--gpus", "1,2", *QUICK, "--out", str(out), "--timing-noise", "--noise-repeats", "2"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    result = ScalingResult.model_validate_json((out / "scaling.json").read_text())
    table = (out / "scaling.md").read_text()
    assert result.dry_run and "DRY RUN" in table and result.command in table
    assert "--gpus 1,2" in result.command
    assert [run.n for run in result.runs] == [1, 2]
    assert result.same_stream and len(result.runs[0].candidates) == 3  # round 0 is fixed: one stream

    for run in result.runs:
        db = out / f"scaling-n{run.n}.db"
        check_run(db, run.run_id)  # finished, every candidate terminal, one effect each, replay agrees
        replay = kb("replay", run.run_id, "--db", str(db))
        assert replay.returncode == 0 and "agree with policy" in replay.stdout, replay.stderr
        assert run.replay_agrees and run.exit_code == 0 and run.winner is not None
        # one gatekeeper, benchmarker and profiler per GPU index, one generator (GPU 0), one scheduler
        placed = sorted((w.role, w.gpu) for w in run.workers if w.role in PER_GPU)
        assert placed == sorted((role, g) for role in PER_GPU for g in range(run.n))
        assert [g.gpu for g in run.gpus] == list(range(run.n))
        for g in run.gpus:  # every GPU index's workers did tasks, and their busy time is counted
            assert sum(load.tasks for load in g.roles.values()) > 0, (run.n, g)
            assert g.busy_share > 0
        pids = {w.pid for w in run.workers}
        with open_store(db, create=False, readonly=True) as store:
            events = store.read(run_id=run.run_id)
        # every claim in the log came from a worker this tool placed (its owner id names its pid)
        claimers = {int(e.actor.rsplit(":", 2)[1]) for e in events if e.type == "TaskClaimed"}
        assert claimers <= pids
        # the throughputs are the log's counts over its wall time, RunStarted to RunFinished
        wall = next(e.ts for e in events if e.type == "RunFinished") - events[0].ts
        gated = sum(e.type in ("GatePassed", "GateFailed") for e in events)
        rungs = sum(e.type == "RungBenchmarked" for e in events)
        assert run.gated == gated > 0 and run.rungs == rungs > 0
        assert run.gate_per_min == pytest.approx(gated / wall * 60)
        assert run.rungs_per_min == pytest.approx(rungs / wall * 60)
        assert run.claim_latency["benchmarker"].n >= rungs and run.decision_latency.n > 0
        assert run.decision_latency.median_s is not None and run.decision_latency.median_s >= 0

    one, two = result.runs
    assert one.efficiency_gate == pytest.approx(1.0) and one.efficiency_rungs == pytest.approx(1.0)
    assert two.efficiency_gate == pytest.approx(two.gate_per_min / (2 * one.gate_per_min))
    assert two.efficiency_rungs == pytest.approx(two.rungs_per_min / (2 * one.rungs_per_min))

    noise = result.noise
    assert noise is not None and noise.error is None, noise
    assert noise.candidate == one.winner and noise.loaded_gpus == [1] and noise.shapes
    for s in noise.shapes:
        assert len(s.idle.samples_s) == len(s.busy.samples_s) == 2
        assert s.shift == pytest.approx(s.busy.median_s / s.idle.median_s - 1)
        assert s.moved == (abs(s.shift) > s.noise)

    again = bench(str(SOFTMAX), "--gpus", "1", *QUICK, "--out", str(out), timeout=120)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "scaling-n1.db exists: each N needs a fresh store" in again.stderr


def test_bad_gpu_counts_are_one_line() -> None:
    r = bench(str(SOFTMAX), "--gpus", "1,two", "--device", "cpu", timeout=120)
    assert (
        r.returncode == 2
        and r.stderr == "scaling_bench: --gpus '1,two': write GPU counts as a comma list, e.g. 1,2,4\n"
    )
