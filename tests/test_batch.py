"""`kb run` over several problems: one run each in one database, one pool of workers, `kb resume BATCH`.

Three small problems and a file kb refuses, in one folder. The pool is SIGKILLed as a whole once the
first rung was measured, then `kb resume BATCH` finishes every run; each run then holds what any run
must after a crash and replays on its own, the pool's processes served several runs, and no two timed
tasks ever held the device lock at once (read from the log's BudgetCharged spans)."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernelbrain.store import EventStore, open_store

from kernelbrain.core.events import BudgetCharged, RunFinished, TaskClaimed
from kernelbrain.core.state import RunState
from kernelbrain.runtime import device_room
from kernelbrain.runtime.batch import batch_runs, problem_paths
from kernelbrain.views.batch import alone_spans
from tests.invariants import check_run
from tests.kbcli import ROOT, kb, kb_env
from tests.runs import RUN as SYNTHETIC_RUN
from tests.runs import SyntheticRun
from tools import timed_spans

PROBLEMS = ROOT / "tests" / "problems"
RUN = ["--device", "cpu", "--max-candidates", "2", "--ladder", "smallest:2:0,primary:2:0"]


def _folder(tmp: Path) -> Path:
    folder = tmp / "problems"
    folder.mkdir()
    for i, name in enumerate(("softmax_small", "layernorm_small", "l2norm_small"), start=1):
        shutil.copy(PROBLEMS / f"{name}.py", folder / f"{i}_{name}.py")
    (folder / "10_broken.py").write_text("import torch\n\nclass Model:\n    pass\n")
    return folder


def _wait_for(db: Path, kind: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"kb ended ({proc.returncode}) before any {kind}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {kind} within {timeout} s"
        if db.exists():
            with open_store(str(db), readonly=True) as store:
                if store.count(type=kind):
                    return
        time.sleep(0.01)


def test_a_folder_runs_as_one_batch_killed_and_resumed(tmp_path: Path) -> None:
    folder, db = _folder(tmp_path), tmp_path / "kb.db"
    log = tmp_path / "exec.log"
    env = kb_env(TRITON_INTERPRET="1", KB_EXEC_LOG=str(log))
    cmd = [sys.executable, "-m", "kernelbrain", "run", str(folder), "--db", str(db), *RUN]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[:1] == ["batch"] and "2_layernorm_small" not in first, first
    batch = first[1].rstrip(":")
    assert "3 runs, 1 files refused" in " ".join(first), first
    _wait_for(db, "RungBenchmarked", proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the batch's kb run and its whole pool at once
    proc.wait()
    with open_store(str(db), readonly=True) as store:
        runs = batch_runs(store, batch)
        assert len(runs) == 3
        unfinished = [r for r in runs if store.fold(RunState(r), run_id=r).finished is None]
    assert unfinished, "the kill came after every run had finished: nothing was resumed"

    r = kb("resume", batch, "--db", str(db), env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(unfinished)} of 3 runs unfinished" in r.stdout, r.stdout
    table = r.stdout[r.stdout.index("problem ") :]
    for name in ("1_softmax_small.py", "2_layernorm_small.py", "3_l2norm_small.py"):
        assert name in table, table
    assert "device held alone for timing: cpu" in r.stdout, r.stdout
    assert kb("resume", batch, "--db", str(db), env=env).returncode == 0  # finished: nothing to do
    status = kb("status", batch, "--db", str(db), env=env)
    assert status.returncode == 0 and f"batch {batch}: 3 of 3 runs ended" in status.stdout, status.stdout
    assert status.stdout.count("winner:") == 3 and "device held alone for timing: cpu" in status.stdout
    # the rungs reserved their problems' memory on the device, and the SIGKILLed pool's reservations
    # hold nothing: the next reader drops them
    assert (Path(os.environ["KB_LOCKS"]) / "gpu-cpu.room").exists()
    assert device_room.reservations("cpu") == {"held": [], "waiting": []}

    workers_of: dict[str, set[str]] = {}
    with open_store(str(db), readonly=True) as store:
        for rid in runs:
            check_run(db, rid, log)  # one effect per identity, no finished bench run again, replay agrees
            assert kb("replay", rid, "--db", str(db), env=env).returncode == 0
            for raw in store.read(run_id=rid, types=["TaskClaimed"]):
                workers_of.setdefault(raw.payload["worker"].split("@")[1], set()).add(rid)
        spans = alone_spans(store.read(types=["BudgetCharged"]))
    assert any(len(served) > 1 for served in workers_of.values()), workers_of  # one pool, not a run each
    cpu = spans["cpu"]
    assert len(cpu) >= 6, cpu  # two rungs of two candidates each, three runs (some lost to the kill)
    for (_, end, task), (begin, _, later) in itertools.pairwise(cpu):
        assert end <= begin, f"{task} and {later} held the device alone at once"
    summed = timed_spans.spans(db)  # the tool that reads where a sweep's GPU time went agrees
    assert summed["overlaps"] == 0 and summed["by_kind_s"]["rung"] > 0 and 0 < summed["alone_share"] < 1
    assert abs(summed["alone_s"] - sum(b - a for a, b, _ in cpu)) < 1e-6
    with open_store(str(db), readonly=True) as store:
        assert timed_spans.open_tasks(store.read()) == []  # every run ended: nothing left claimed


def test_the_tasks_claimed_and_never_done_are_named() -> None:
    """What a stalled or cut-off pool was doing: a claim with no charge, fault or parking after it."""
    with EventStore(":memory:") as store:
        run = SyntheticRun(store)
        for cid in ("a", "b"):
            run.propose(cid)
            gate = f"{SYNTHETIC_RUN}/gate/{cid}"
            run.add(TaskClaimed(task=gate, worker=f"w{cid}@h:1:1", token=1, deadline=0), cid)
        charge = BudgetCharged(action=f"{SYNTHETIC_RUN}/gate/a", role="gatekeeper", gpu_s=0.1, wall_s=0.1)
        run.add(charge, "charge")
        (still,) = timed_spans.open_tasks(store.read())
        assert still[:2] == (f"{SYNTHETIC_RUN}/gate/b", "wb@h:1:1") and still[2] >= 0
        run.add(RunFinished(basis=0, reason="test", winner=None, winner_rung=None, winner_score=None), "end")
        assert timed_spans.open_tasks(store.read()) == []  # a finished run's leftovers are not open


def test_a_batch_of_only_refused_files_exits_as_the_problems_fault(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("def (:\n")
    r = kb("run", str(tmp_path / "a.py"), str(tmp_path / "b.py"), "--db", str(tmp_path / "kb.db"), *RUN)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "0 runs, 2 files refused" in r.stdout and "b.py: refused: problem file" in r.stdout, r.stdout


def test_problem_paths_take_a_folders_files_in_kernelbench_order(tmp_path: Path) -> None:
    for name in ("10_b.py", "2_a.py", "x.py", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "1_c.py").write_text("")
    found = problem_paths((str(tmp_path), str(tmp_path / "2_a.py")))
    assert [p.name for p in found] == ["2_a.py", "10_b.py", "x.py"]


def test_the_batch_view_says_where_the_batch_stands_every_30_s(capsys) -> None:
    from kernelbrain.store import EventStore

    from kernelbrain.views.batch import BatchView
    from tests.runs import SyntheticRun

    now = [0.0]
    view = BatchView(2, clock=lambda: now[0])
    with EventStore(":memory:") as store:
        run = SyntheticRun(store, max_candidates=2)
        run.propose("a")
        run.gate("a")
        run.bench("a", 0, 2.0)
        run.charge(4.0, action="bench/a/0")  # before this session: not its share
        view(run.state())
        run.charge(6.0, action="bench/a/1")
        now[0] = 29.0
        view(run.state())
        assert "batch:" not in capsys.readouterr().out  # not yet 30 s
        now[0] = 31.0
        view(run.state())
    out = capsys.readouterr().out
    assert (
        "batch: 0 of 2 runs ended, 1 live (1 measured); device held alone for timing 6 s of 31 s (19%)" in out
    )


def test_a_batch_in_json_names_its_runs_first_and_ends_with_a_result_each(tmp_path: Path) -> None:
    import json

    shutil.copy(PROBLEMS / "softmax_small.py", tmp_path / "a.py")
    (tmp_path / "b.py").write_text("x = 1\n")
    args = ["--device", "cpu", "--max-candidates", "1", "--ladder", "smallest:1:0", "--json"]
    env = kb_env(TRITON_INTERPRET="1")
    r = kb(
        "run", str(tmp_path / "a.py"), str(tmp_path / "b.py"), "--db", str(tmp_path / "kb.db"), *args, env=env
    )
    assert r.returncode == 4, r.stdout + r.stderr  # a file refused; the other ran
    first, *rest = (json.loads(line) for line in r.stdout.splitlines())
    assert first["kind"] == "batch" and len(first["runs"]) == 1 and first["refused"][0]["problem"] == "b.py"
    assert [x["run_id"] for x in rest] == first["runs"] and rest[0]["kind"] == "result" and rest[0]["winner"]


def test_a_gpu_pool_spreads_gates_and_preparations_over_the_cores() -> None:
    from kernelbrain.runtime.roles import pool_processes

    roles = pool_processes("cuda", "offline", 16)
    assert roles.count("gatekeeper") == 8 and roles.count("benchmarker") == 4
    assert roles.count("profiler") == roles.count("scheduler") == 1
    assert pool_processes("cuda", "offline", 2).count("benchmarker") == 2
    assert pool_processes("cpu", "offline", 2) == ["all", "all"]


def test_a_pool_worker_serves_its_last_run_then_the_runs_furthest_along(tmp_path: Path) -> None:
    """One task a step, taken from the run this worker served last, then from the runs nearest their end
    (a rung measured, then candidates gated), then in the batch's order: a pool finishes runs instead of
    moving a hundred of them a step at a time."""
    from kernelbrain.runtime.worker import Worker

    states = {}
    for name, progress in (("fresh", 0), ("gated", 1), ("measured", 2), ("also_fresh", 0)):
        with EventStore(tmp_path / f"{name}.db", create=True) as store:
            run = SyntheticRun(store)
            for cid in ("c1", "c2"):
                run.propose(cid)
            if progress:
                run.gate("c1")
            if progress > 1:
                run.bench("c1", 0, 1.0)
            state = run.state()
        state.run_id = name
        states[name] = state
    EventStore(tmp_path / "kb.db", create=True).close()
    worker = Worker(str(tmp_path / "kb.db"), "benchmarker", batch="b")
    try:
        worker.batch_ids = ["also_fresh", "fresh", "gated", "measured"]
        order = worker.ordered(list(states.values()))
        assert [s.run_id for s in order] == ["measured", "gated", "also_fresh", "fresh"]
        worker.last = "fresh"  # its judge or its child holds that problem's draws
        assert [s.run_id for s in worker.ordered(list(states.values()))][:2] == ["fresh", "measured"]
    finally:
        worker.close()
