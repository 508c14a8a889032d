"""tools/kernelbench_sweep.py on a small KernelBench-format folder, on CPU: a file kb has a template for
(its sweep stopped by SIGTERM once the run's gate began, then resumed by the next sweep to a timed
winner), one it has none for, and one kb refuses; each gets its JSON (the winner's timing, run out of
memory by injection, is kb's fault: tried again, then left to the next sweep), the table counts
fast_0/fast_1 per level and names every miss, and a sweep started again redoes nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernelbrain.store import EventStore

from tests.kbcli import kb_env
from tools import kernelbench_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tools" / "kernelbench_sweep.py"

SOFTMAX = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

batch_size = 8
dim = 96

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
"""

# dropout before the sort: refused as constructed (training mode), run again with --eval
SORT = SOFTMAX.replace(
    "torch.softmax(x, dim=1)", "torch.sort(torch.nn.functional.dropout(x, 0.25, self.training), dim=1).values"
)
NO_INPUTS = SOFTMAX.replace("def get_inputs():", "def make_inputs():")


def _command(kernelbench: Path, tmp: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, str(SWEEP), "--kernelbench", str(kernelbench), "--levels", "1"]
    cmd += ["--db", str(tmp / "sweep.db"), "--out", str(tmp / "out"), "--device", "cpu", "--repeats", "3"]
    return [*cmd, "--max-candidates", "2", "--budget-gpu-s", "600", *extra]


def _sweep(kernelbench: Path, tmp: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    cmd = _command(kernelbench, tmp, *extra)
    env = kb_env(TRITON_INTERPRET="1", **env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _stopped_once_gating(kernelbench: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    """The sweep, sent SIGTERM as soon as its run's log holds a claimed gate task (not at a wall-clock
    moment, so the run is mid-way on any machine)."""
    proc = subprocess.Popen(
        _command(kernelbench, tmp, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kb_env(TRITON_INTERPRET="1"),
    )
    db, deadline = tmp / "sweep.db", time.monotonic() + 300
    while not _gate_claimed(db):
        assert proc.poll() is None, f"the sweep ended before any gate: {proc.communicate()}"
        assert time.monotonic() < deadline, "no gate task claimed within 300 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _gate_claimed(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        with EventStore(str(db), create=False, readonly=True) as store:
            return any("/gate/" in raw.payload.get("task", "") for raw in store.read(types=["TaskClaimed"]))
    except Exception:  # the file exists but kb has not made its tables yet
        return False


def test_the_sweep_resumes_times_winners_and_names_every_miss(tmp_path):
    kernelbench = tmp_path / "kernelbench"
    (kernelbench / "level1").mkdir(parents=True)
    (kernelbench / "level1" / "1_Softmax.py").write_text(SOFTMAX)
    (kernelbench / "level1" / "2_Sort.py").write_text(SORT)
    (kernelbench / "level1" / "3_NoInputs.py").write_text(NO_INPUTS)
    out = tmp_path / "out"

    # SIGTERM to the sweep stops the softmax run mid-way: no result for it, its run left resumable
    r = _stopped_once_gating(kernelbench, tmp_path, "--only", "Softmax")
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert "1_Softmax.py: stopped, resumable" in r.stdout and "stopped by a signal" in r.stdout, r.stdout
    assert not (out / "level1" / "1_Softmax.json").exists()
    with EventStore(str(tmp_path / "sweep.db"), create=False, readonly=True) as store:
        (first,) = store.run_ids()
        assert not store.count(run_id=first, type="RunFinished")

    # the winner's timing runs out of memory on every attempt (injected: the pool's neighbours on a GPU):
    # kb's fault, so the file gets no result, and the next sweep times it without running it again
    oom = tmp_path / "timing-ooms"
    oom.write_text("3")
    r = _sweep(kernelbench, tmp_path, KB_INJECT_TIMING_OOM=str(oom))
    assert r.returncode == 0, r.stderr
    said = "level1/1_Softmax.py: timing: out of memory on the host (out of memory (injected by"
    assert said in r.stdout and "3 attempts (kb's fault); timed by the next sweep" in r.stdout, r.stdout
    assert not (out / "level1" / "1_Softmax.json").exists() and oom.read_text() == "0"
    assert (out / "level1" / "2_Sort.json").exists()
    # two out-of-memory errors, then the third attempt times it
    oom.write_text("2")
    r = _sweep(kernelbench, tmp_path, KB_INJECT_TIMING_OOM=str(oom))
    assert r.returncode == 0, r.stderr
    assert "2 done earlier, 1 to go" in r.stdout, r.stdout
    soft = json.loads((out / "level1" / "1_Softmax.json").read_text())
    assert soft["timing"]["attempts"] == 3 and oom.read_text() == "0", soft["timing"]
    assert soft["run_id"] == first, "the stopped run was resumed, not started again"
    assert soft["gpu"] == {"name": "cpu", "driver": ""} and len(soft["code"]) == 16
    assert soft["speedup"]["best_baseline"] in ("eager", "compile") and soft["speedup"]["vs_best"] > 0
    assert soft["winner"] and soft["winner_family"] == "row_softmax" and soft["gate_passed"] >= 1
    times = soft["timing"]["times"]
    assert {"eager", "kb"} <= set(times) and times["kb"]["max_abs_err_vs_eager"] < 1e-4
    assert soft["speedup"]["vs_eager"] == times["eager"]["median_s"] / times["kb"]["median_s"]
    # the winner's timing held the device alone (kb's lock), and the piece counts that span as timed
    since, to = soft["timing"]["alone"]
    piece = json.loads((out / "pieces.json").read_text())["pieces"][-1]
    assert piece["began"] < since < to and piece["timed_alone_s"] >= to - since
    unmatched = json.loads((out / "level1" / "2_Sort.json").read_text())
    assert unmatched["winner"] is None and unmatched["miss"] == "no offline template", unmatched
    assert unmatched["mode"] == "eval" and soft["mode"] == "training", (unmatched, soft)
    refused = json.loads((out / "level1" / "3_NoInputs.json").read_text())
    assert refused["miss"].startswith("kb refused the file") and "get_inputs" in refused["miss"], refused

    table = (out / "README.md").read_text()
    assert "| 1 | 1/3 |" in table, table  # one correct kernel of three files
    assert "no offline template (1)" in table and "kb refused the file (1)" in table
    assert "| level1/2_Sort.py | - [eval] | 0 / 0 |" in table
    assert "Run with `--eval`, marked [eval] below: 1," in table
    # kb's GPU seconds: what the budget counted (the device held alone) beside its children's busy time
    assert 0 < soft["device_s"] < soft["gpu_s"], soft
    assert f"| {soft['device_s']:.1f} / {soft['gpu_s']:.1f} |" in table, table

    again = _sweep(kernelbench, tmp_path)
    assert "3 done earlier, 0 to go" in again.stdout, again.stdout
    with EventStore(str(tmp_path / "sweep.db"), create=False, readonly=True) as store:
        # softmax and sort, that one twice (refused in training mode, then --eval); kb refused the third
        # before any run
        assert len(store.run_ids()) == 3

    # --redo-unmatched: the files whose result found no family run again (a new run, not the old one
    # resumed), their old results kept until replaced; the matched softmax is left alone
    before = unmatched["run_id"]
    redo = _sweep(kernelbench, tmp_path, "--redo-unmatched")
    assert redo.returncode == 0, redo.stderr
    assert "1 done earlier, 2 to go" in redo.stdout, redo.stdout
    with EventStore(str(tmp_path / "sweep.db"), create=False, readonly=True) as store:
        assert len(store.run_ids()) == 4  # the sort's new run in eval mode at once
    again_sort = json.loads((out / "level1" / "2_Sort.json").read_text())
    assert again_sort["run_id"] != before and again_sort["miss"] == "no offline template"
    assert again_sort["mode"] == "eval"
    assert json.loads((out / "level1" / "1_Softmax.json").read_text())["run_id"] == first

    # a result decided by kb code that changed since (its hash differs) runs again; the rest stay
    stale = json.loads((out / "level1" / "3_NoInputs.json").read_text())
    (out / "level1" / "3_NoInputs.json").write_text(json.dumps({**stale, "code": "0" * 16}))
    r = _sweep(kernelbench, tmp_path)
    assert "2 done earlier, 1 to go (1 decided by kb code changed since)" in r.stdout, r.stdout
    assert json.loads((out / "level1" / "3_NoInputs.json").read_text())["code"] == stale["code"]
    assert json.loads((out / "level1" / "1_Softmax.json").read_text())["run_id"] == first
    pieces = json.loads((out / "pieces.json").read_text())["pieces"]
    assert len(pieces) == 6 and all(p["wall_s"] > 0 for p in pieces)
    # the line a sweep prints each minute while its runs go on, counted from the database
    with EventStore(str(tmp_path / "sweep.db"), create=False, readonly=True) as store:
        ended, rungs = store.count(type="RunFinished"), store.count(type="RungBenchmarked")
        runs = len(store.run_ids())
        charged = [e.payload for e in store.read(types=["BudgetCharged"])]
    lock = sum(c["lock_wait_s"] for c in charged)
    line = kernelbench_sweep.progress(tmp_path / "sweep.db", 0.0)
    assert f"rungs {rungs}; runs ended {ended};" in line and rungs >= 1 and ended == runs, line
    assert f"{lock:.0f} s for the lock" in line and all("room_wait_s" in c for c in charged), line
    assert "The sweep took" in (out / "README.md").read_text()
