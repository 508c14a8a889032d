"""A worker that dies again and again on one task parks that task and the run goes on without it.

The gatekeeper process is SIGKILLed (a real signal, aimed by watching the log) each time it claims the
first candidate's gate: after MAX_TASK_FAULTS deaths the next claimant records TaskParked instead of
running it, the other candidates are gated and measured, and the run stops unfinished (exit 5) with a
line naming the parked task; `kb resume` gates it and finishes the run.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from kernelbrain.store import EventStore

from kernelbrain.core.events import RunResumed, TaskFaulted, TaskParked, decode
from kernelbrain.core.policy import stalled
from kernelbrain.core.state import RunState
from kernelbrain.runtime.worker import MAX_TASK_FAULTS, Worker
from tests.invariants import check_run
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start
from tests.runs import RUN, SyntheticRun


def _kill_gate_claims(db, run_id: str, proc, times: int, timeout: float = 240.0) -> str:
    """SIGKILL the worker that claims the first candidate's gate, `times` times; that candidate."""
    victim, kills, after = None, 0, 0
    deadline = time.monotonic() + timeout
    with EventStore(db, create=False, readonly=True) as store:
        while kills < times:
            assert proc.poll() is None, f"kb exited ({proc.returncode}): {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"{kills} of {times} kills in {timeout} s"
            for raw in store.read(after, run_id=run_id):
                after = raw.seq
                e = decode(raw)
                if victim is None and raw.type == "CandidateProposed":
                    victim = e.candidate
                if raw.type == "TaskClaimed" and victim and e.task == f"{run_id}/gate/{victim}":
                    pid = int(e.worker.rsplit(":", 2)[1])
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
                    assert not store.is_done(e.task), "the gate finished before the kill landed"
            time.sleep(0.01)
    assert victim is not None
    return victim


def test_a_task_its_worker_keeps_dying_on_is_parked_and_resumed(tmp_path):
    db = tmp_path / "kb.db"
    env = kb_env(KB_LEASE_TTL="30")
    args = ["--db", str(db), "--max-candidates", "3", "--device", "cpu", "--ladder", "smallest:2:1,all:2:1"]
    proc, run_id = kb_start(["run", str(SOFTMAX), *args], env)
    victim = _kill_gate_claims(db, run_id, proc, MAX_TASK_FAULTS)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 5, (out[-2000:], err[-3000:])
    last = out.strip().splitlines()[-1]
    assert f"gate/{victim}" in last and "died" in last and f"kb resume {run_id}" in last, last

    with EventStore(db, create=False, readonly=True) as store:
        events = [decode(raw) for raw in store.read(run_id=run_id)]
    types = [type(e).__name__ for e in events]
    assert "RunFinished" not in types
    parked = [e for e in events if type(e).__name__ == "TaskParked"]
    assert len(parked) == 1 and parked[0].candidate == victim and parked[0].role == "gatekeeper"
    assert parked[0].faults == MAX_TASK_FAULTS, parked[0]
    expired = [e for e in events if type(e).__name__ == "LeaseExpired" and e.task.endswith(victim)]
    assert len(expired) == MAX_TASK_FAULTS
    # the rest of the run went on: the others were gated and measured up the ladder, the victim never
    gated = {e.candidate for e in events if type(e).__name__ in ("GatePassed", "GateFailed")}
    assert victim not in gated and len(gated) == 2
    assert any(type(e).__name__ == "ProfileCaptured" for e in events)

    shown = kb("events", run_id, "--db", str(db), env=env).stdout
    assert f"parked {run_id}/gate/{victim} for this session after {MAX_TASK_FAULTS} faults" in shown, shown

    r = kb("resume", run_id, "--db", str(db), "--quiet", env=env)
    assert r.returncode in (0, 3), (r.stdout, r.stderr)
    with EventStore(db, create=False, readonly=True) as store:
        events = [decode(raw) for raw in store.read(run_id=run_id)]
    assert any(type(e).__name__ == "GatePassed" and e.candidate == victim for e in events)
    assert sum(type(e).__name__ == "RunFinished" for e in events) == 1
    check_run(db, run_id)


def test_a_task_that_raises_in_kb_is_said_then_parked(tmp_path):
    """kb's own exception in a task: the worker records TaskFaulted and dies (re-raises); the worker
    after the last allowed fault parks the task, and the state stops offering it, this session only."""
    db = str(tmp_path / "kb.db")
    with EventStore(db, create=True) as store:
        run = SyntheticRun(store, max_candidates=2)
        run.propose("a")
        run.propose("b")
        run.gen_done(proposed=("a", "b"))
    for attempt in range(MAX_TASK_FAULTS + 1):
        worker = Worker(db, "gatekeeper", RUN)
        worker.warmed = True  # no child: the task fails before it would ask one

        def broken(task, state, attempt=attempt):
            raise RuntimeError(f"kb bug {attempt}\nsecond line")

        worker.role.execute = broken
        try:
            if attempt < MAX_TASK_FAULTS:
                with pytest.raises(RuntimeError):
                    worker.step()
            else:
                assert worker.step()
        finally:
            worker.close()
    with EventStore(db, create=False) as store:
        events = [decode(raw) for raw in store.read(run_id=RUN)]
        state = store.fold(RunState(RUN), run_id=RUN)
        resumed = RunResumed(attempt=1, hardware={}).to_new(RUN, f"{RUN}/resumed/1", "cli")
        store.append([resumed])
        after_resume = store.fold(RunState(RUN), run_id=RUN)
    faults = [e for e in events if isinstance(e, TaskFaulted)]
    assert [f.error for f in faults] == [f"RuntimeError: kb bug {i}" for i in range(MAX_TASK_FAULTS)]
    assert all(f.task == f"{RUN}/gate/a" for f in faults)
    (parked,) = [e for e in events if isinstance(e, TaskParked)]
    assert (parked.candidate, parked.role, parked.faults) == ("a", "gatekeeper", MAX_TASK_FAULTS)
    assert parked.error == "RuntimeError: kb bug 2"
    assert [c.id for c in state.gate_tasks()] == ["b"]  # a is set aside; b is still to gate
    assert not stalled(state)  # b's gate is work left
    assert [c.id for c in after_resume.gate_tasks()] == ["a", "b"]  # parked for the session only
    assert after_resume.faults(f"{RUN}/gate/a") == []
