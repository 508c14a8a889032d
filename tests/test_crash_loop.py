"""Crashes at random moments never lose or duplicate work.

20 runs whose whole `kb run` process group is SIGKILLed at a random moment and then finished with
`kb resume` (five lanes of four runs, each lane its own test and database, so that pytest-xdist runs
them side by side); single workers SIGKILLed in the middle of a task; SIGTERM and SIGINT stopping a run
that then resumes. After each: every candidate terminal, one effect per identity, no completed
benchmark executed again (the sandbox children log every execution), and `kb replay` agrees with the
log.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from kernelbrain.events import decode
from kernelbrain.state import RunState
from store import EventStore
from tests.invariants import check_run, read_exec_log
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start

CRASHES = 20
LANES = 5
# one seeded draw of all the kill moments, the same whichever lane runs crash i
_rng = random.Random(20261129)
KILL_AFTER_S = [_rng.uniform(0.2, 7.0) for _ in range(CRASHES)]


def _finish(db, run_id, env) -> None:
    r = kb("resume", run_id, "--db", str(db), "--quiet", env=env)
    if r.returncode != 0:
        assert "already finished" in r.stderr, r.stderr
    else:
        assert f"run {run_id} finished" in r.stdout


@pytest.mark.parametrize("lane", range(LANES))
def test_kill_the_whole_run_at_random_moments_then_resume(tmp_path, lane):
    crashes = range(lane, CRASHES, LANES)  # lanes interleave, spreading the short and long kill moments
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    interrupted = 0
    for i in crashes:
        proc, run_id = kb_start(
            [
                "run",
                str(SOFTMAX),
                "--db",
                str(db),
                "--max-candidates",
                "4",
                "--seed",
                str(i),
                "--device",
                "cpu",
                "--quiet",
            ],
            env,
        )
        time.sleep(KILL_AFTER_S[i])
        still_running = proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        interrupted += still_running
        _finish(db, run_id, env)
        check_run(db, run_id, log)
    # at least three in four killed mid-flight in every lane, so at least 15 of the 20 in all
    assert 4 * interrupted >= 3 * len(crashes), (
        f"only {interrupted} of {len(crashes)} runs were killed mid-flight"
    )
    with EventStore(db, create=False) as store:
        assert len(store.run_ids()) == len(crashes)


def _wait_for_claim(db, run_id, kind: str, timeout: float = 60.0):
    """The first claim of a task of this kind whose result is not in the log yet."""
    deadline = time.monotonic() + timeout
    with EventStore(db, create=False) as store:
        while time.monotonic() < deadline:
            events = store.read(run_id=run_id)
            done = {e.key for e in events}
            for raw in events:
                if raw.type == "TaskClaimed":
                    claim = decode(raw)
                    if f"/{kind}/" in claim.task and claim.task not in done:
                        return claim
            time.sleep(0.02)
    raise AssertionError(f"no {kind} task was claimed within {timeout} s")


@pytest.mark.parametrize("kind", ["gate", "bench", "profile"])
def test_kill_one_worker_mid_task(tmp_path, kind):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "4", "--device", "cpu", "--quiet"], env
    )
    claim = _wait_for_claim(db, run_id, kind)
    pid = int(claim.worker.split("@")[1].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "worker exited with -9; restarting it" in err
    state = check_run(db, run_id, log)
    with EventStore(db, create=False) as store:
        expired = [decode(e) for e in store.read(run_id=run_id, types=["LeaseExpired"])]
        results = [e for e in store.read(run_id=run_id) if e.key == claim.task]
    assert [(e.task, e.worker) for e in expired] == [(claim.task, claim.worker)]
    assert expired[0].taken_by != claim.worker
    assert len(results) == 1, "the task killed in flight was done again exactly once"
    assert state.finished is not None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_leaves_a_resumable_run(tmp_path, sig):
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--db", str(db), "--max-candidates", "4", "--device", "cpu", "--quiet"], env
    )
    _wait_for_claim(db, run_id, "bench")
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what Ctrl-C in a terminal does: the whole foreground group
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"kb resume {run_id}" in err
    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
    assert state.finished is None
    bench_done = {e for _, e, op in read_exec_log(log) if op == "bench"}
    _finish(db, run_id, env)
    check_run(db, run_id, log)
    assert bench_done, "the run was stopped before it measured anything"


def test_ctrl_c_stops_an_inprocess_run_resumably(tmp_path):
    """--inprocess steps the workers in kb's own process: Ctrl-C there must end like the supervised run
    (the task in flight finished and recorded, exit 130, `kb resume` named), not as an abort mid-task."""
    db, log = tmp_path / "kb.db", tmp_path / "exec.log"
    env = kb_env(KB_EXEC_LOG=str(log))
    args = ["--db", str(db), "--quiet", "--inprocess"]
    one = ["--max-candidates", "1", "--device", "cpu", "--ladder", "smallest:1:0"]  # quick: one rung
    proc, run_id = kb_start(["run", str(SOFTMAX), *one, *args], env)
    claim = _wait_for_claim(db, run_id, "gate")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        f"kb: run {run_id} interrupted; everything recorded is kept. Continue with: kb resume {run_id}"
    )
    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
        assert store.is_done(claim.task), "the gate task in flight was abandoned, not finished"
    assert state.finished is None
    r = kb("resume", run_id, *args, env=env)
    assert r.returncode == 0, r.stderr
    assert f"run {run_id} finished" in r.stdout
    check_run(db, run_id, log)
