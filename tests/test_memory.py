"""The device's memory: admission refuses a problem a made-up small card cannot hold even alone (its
batch neighbours run on); an out-of-memory error under load is kb's fault, tried again and charged to
neither the candidate nor the problem; the estimate itself (the reference's peak, on the meta device)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from kernelbrain.store import open_store

from kernelbrain.child import memory
from tests.kbcli import ROOT, kb, kb_env

PROBLEMS = ROOT / "tests" / "problems"
RUN = ["--device", "cpu", "--max-candidates", "1", "--ladder", "smallest:1:0,primary:1:0"]


def _events(db: Path, run_id: str) -> list[dict]:
    r = kb("events", run_id, "--db", str(db), "--json", "--all")
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_admission_refuses_what_the_card_cannot_hold_and_runs_the_rest(tmp_path: Path) -> None:
    """A 32 KiB card (KB_DEVICE_MEMORY_GIB) holds layernorm_small's timed runs (about 22 KiB) but not
    softmax_small's (44 KiB: five copies of its input, its output twice): the batch refuses that one in
    one line, as the problem's (exit 4), and finishes the other."""
    folder, db = tmp_path / "p", tmp_path / "kb.db"
    folder.mkdir()
    for name in ("softmax_small", "layernorm_small"):
        shutil.copy(PROBLEMS / f"{name}.py", folder / f"{name}.py")
    env = kb_env(TRITON_INTERPRET="1", KB_DEVICE_MEMORY_GIB=str(32 / 2**20))
    r = kb("run", str(folder), "--db", str(db), *RUN, "--quiet", env=env)
    assert r.returncode == 0, r.stdout + r.stderr  # both ended: one with a kernel, one refused by admission
    table = r.stdout[r.stdout.index("problem ") :]
    row = next(line for line in table.splitlines() if line.startswith("softmax_small.py"))
    assert "too big for this device even alone" in row and "holds 3.05e-05 GiB" in row, row
    assert "winner:" in next(line for line in table.splitlines() if line.startswith("layernorm_small.py"))
    with open_store(str(db), readonly=True) as store:
        refused = next(
            rid for rid in store.run_ids() if "softmax" in store.read(run_id=rid)[0].payload["problem_name"]
        )
    analysed = next(e for e in _events(db, refused) if e["type"] == "ProblemAnalysed")["payload"]
    assert analysed["footprint"] == 5 * 6400 + 6400 + 6400 and analysed["device_memory"] == 32 * 2**10
    assert analysed["gate_footprint"] == analysed["footprint"]  # on a CPU the gate runs the rung's shape
    assert analysed["profile_footprint"] == 6400 + 2 * (6400 + 6400)  # its input once, its writes twice
    assert not [e for e in _events(db, refused) if e["type"] == "CandidateProposed"]  # nothing charged


def test_an_out_of_memory_error_under_load_is_tried_again_and_charged_to_no_one(tmp_path: Path) -> None:
    db, inject = tmp_path / "kb.db", tmp_path / "oom"
    inject.write_text("1")  # the first bench request finds the device's memory taken by others
    env = kb_env(TRITON_INTERPRET="1", KB_INJECT_OOM=str(inject))
    r = kb("run", str(PROBLEMS / "softmax_small.py"), "--db", str(db), *RUN, "--quiet", env=env)
    assert r.returncode == 0 and "winner" in r.stdout, r.stdout + r.stderr
    assert inject.read_text() == "0"
    events = _events(db, r.stdout.split()[1])
    faults = [e["payload"] for e in events if e["type"] == "TaskFaulted"]
    assert len(faults) == 1 and "DeviceBusy" in faults[0]["error"] and "/bench/" in faults[0]["task"]
    assert not [e for e in events if e["type"] in ("BenchmarkFailed", "GateFailed", "ProblemFailed")]
    rungs = [e["payload"]["rung"] for e in events if e["type"] == "RungBenchmarked"]
    assert rungs == [0, 1]  # the candidate measured at both rungs in the end, the failed try redone


def test_the_peak_counts_what_is_live_at_once_on_the_meta_device() -> None:
    x = torch.empty(1024, 1024, device="meta")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
    peak = memory.Peak()
    with torch.no_grad(), peak:
        model.to("meta")(x)
    # the first layer's and the ReLU's outputs (16 MiB each) live together, then the 4 MiB output
    assert peak.peak == (16 + 16 + 4) << 20


def test_an_out_of_memory_error_on_the_host_is_the_pools() -> None:
    assert not torch.cuda.is_initialized()
    busy = memory.verdict(torch.OutOfMemoryError("no room"), "forward")
    assert isinstance(busy, memory.DeviceBusy) and "forward: out of memory on the host" in str(busy)


@pytest.mark.parametrize("count", ["0", ""])
def test_no_injection_without_a_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: str) -> None:
    path = tmp_path / "oom"
    path.write_text(count)
    monkeypatch.setenv("KB_INJECT_OOM", str(path))
    memory.injected()  # raises nothing
    path.write_text("1")
    with pytest.raises(torch.OutOfMemoryError):
        memory.injected()
    assert path.read_text() == "0"


HOLDER = """
import sys
from kernelbrain.runtime import device_room
with device_room.reserved("cpu", device_room.Need(bytes=float(sys.argv[1]), capacity=float(sys.argv[2]))):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_worker_runs_what_fits_while_another_problem_waits_for_room(tmp_path: Path) -> None:
    """One worker process (one core) and a 64 KiB card of which another process holds 20 KiB: softmax_small
    (about 44 KiB) comes first in the batch but cannot have its memory now; layernorm_small (22 KiB) can,
    and runs to its end meanwhile, rather than its worker waiting on the first for room. Once the holder
    goes, softmax_small runs too."""
    import subprocess
    import sys
    import time

    folder, db = tmp_path / "p", tmp_path / "kb.db"
    folder.mkdir()
    shutil.copy(PROBLEMS / "softmax_small.py", folder / "1_softmax.py")
    shutil.copy(PROBLEMS / "layernorm_small.py", folder / "2_layernorm.py")
    card = 64 * 2**10
    locks = str(tmp_path / "locks")
    env = kb_env(TRITON_INTERPRET="1", KB_DEVICE_MEMORY_GIB=str(card / 2**30), KB_LOCKS=locks)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(20 * 2**10), str(0.9 * card)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    run = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        run = subprocess.Popen(
            [sys.executable, "-m", "kernelbrain", "run", str(folder), "--db", str(db), *RUN, "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),  # one crew
        )
        deadline = time.monotonic() + 150
        ended: dict[str, str] = {}
        while "2_layernorm" not in ended:
            assert run.poll() is None and time.monotonic() < deadline, "layernorm waited for the holder"
            time.sleep(0.5)
            if db.exists():
                ended = _ended(db)
        assert "1_softmax" not in ended  # it waits for the room the holder has
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        out, err = run.communicate(timeout=240)
        assert run.returncode == 0, out + err
        assert set(_ended(db)) == {"1_softmax", "2_layernorm"}
        # each task's charge says how long it held the device's lock: a gate only while its work was on
        # the device (not while its children started and its candidate imported), a bench throughout
        with open_store(str(db), readonly=True) as store:
            charges = [e.payload for e in store.read(types=["BudgetCharged"])]
        for stage in ("gate", "bench"):
            held = [(c["lock_held_s"], c["wall_s"]) for c in charges if c["action"].split("/")[1] == stage]
            assert held and all(0 < h <= w for h, w in held), (stage, held)
    finally:
        holder.kill()
        if run is not None and run.poll() is None:
            run.kill()


def _ended(db: Path) -> dict[str, str]:
    """The problems of the runs that ended in `db`, with their ends' reasons."""
    with open_store(str(db), readonly=True) as store:
        started = {e.run_id: e.payload["problem_name"] for e in store.read(types=["RunStarted"])}
        return {started[e.run_id]: e.payload["reason"] for e in store.read(types=["RunFinished"])}
