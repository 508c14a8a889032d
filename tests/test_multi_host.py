"""Workers anywhere, on a real PostgreSQL server: a run started with --external-workers and driven by
standalone `kb worker` processes (as on other hosts), through the server's restart and through 16
workers SIGKILLed at random. After each: every candidate terminal, one effect per identity, no finished
benchmark executed again, and `kb replay` agreeing with the log."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from kernelbrain.store import StoreError, StoreUnavailable, open_store

from kernelbrain.runtime.worker import MAX_TASK_FAULTS
from tests.invariants import check_run
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start

QUICK = ["--device", "cpu", "--ladder", "smallest:3:1,primary:3:1", "--quiet"]


def start_worker(role: str, run_id: str, env: dict[str, str], gpu: int | None = None) -> subprocess.Popen:
    """`kb worker ROLE` as a user starts one on another host: the URL from KB_DB, its own session."""
    gpu_args = [] if gpu is None else ["--gpu", str(gpu)]
    return subprocess.Popen(
        [sys.executable, "-m", "kernelbrain", "worker", role, "--run", run_id, *gpu_args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # killpg takes its sandboxed child with it
    )


def wait_for(url: str, run_id: str, types: tuple[str, ...], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    with open_store(url, readonly=True) as store:
        while not any(store.count(run_id=run_id, type=t) for t in types):
            assert time.monotonic() < deadline, f"no {types} within {timeout} s"
            time.sleep(0.1)


def lease_holders(url: str, run_id: str) -> dict[int, int]:
    """The pids of the workers holding a lease on an unfinished task (its owner: role@host:pid:start),
    each with the number of that task's earlier holders that died on it."""
    with open_store(url, readonly=True) as store:
        tasks = {e.payload["task"] for e in store.read(run_id=run_id, types=["TaskClaimed"])}
        died = Counter(e.payload["task"] for e in store.read(run_id=run_id, types=["LeaseExpired"]))
        leases = [store.lease(task) for task in tasks if not store.is_done(task)]
    return {
        int(lease.owner.rsplit(":", 2)[1]): died[lease.task]
        for lease in leases
        if lease is not None and lease.deadline > 0
    }


def stop_all(workers: list[subprocess.Popen]) -> list[int]:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    return [w.wait(timeout=120) for w in workers]


def exit_codes(workers: list[subprocess.Popen], timeout: float = 120) -> list[int | None]:
    """The workers' own exit codes (None: still running after `timeout` s). A worker serving one run exits
    by itself once the run has finished; a SIGTERM sent while it is already exiting could land after
    Python has put the default handlers back, and say nothing about the worker."""
    deadline = time.monotonic() + timeout
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.wait(timeout=max(0.0, deadline - time.monotonic()))
    return [w.poll() for w in workers]


def test_workers_ride_out_a_server_restart(pg_server, pg_url: str, tmp_path) -> None:
    """`pg_ctl restart` in the middle of a run: every worker and the watcher lose their connections,
    retry with backoff, reconnect, and the run finishes as if nothing happened."""
    log = tmp_path / "exec.log"
    env = kb_env(KB_DB=pg_url, KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(["run", str(SOFTMAX), "--max-candidates", "3", "--external-workers", *QUICK], env)
    roles = ["generator", "gatekeeper", "benchmarker", "benchmarker", "profiler", "scheduler"]
    workers = [start_worker(role, run_id, env, gpu=i) for i, role in enumerate(roles)]
    try:
        wait_for(pg_url, run_id, ("GatePassed", "GateFailed"))
        pg_server.restart()  # every connection to the server is cut
        with open_store(pg_url, readonly=True) as store:
            assert not store.count(run_id=run_id, type="RunFinished"), "the run finished before the restart"
        proc.wait(timeout=600)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        codes = exit_codes(workers)
    finally:
        stop_all(workers)
        if proc.poll() is None:
            proc.kill()
    assert codes == [0] * len(roles), [w.stderr.read()[-2000:] for w in workers if w.stderr]
    check_run(pg_url, run_id, log)
    said = "".join(w.stderr.read() for w in workers if w.stderr)
    # they lost their connections: a call retried by the worker, or a connection its pool made again
    assert "the database is unavailable" in said or "error connecting" in said, said[-2000:]
    assert pg_server.password not in said
    replay = kb("replay", run_id, env=env)
    assert replay.returncode == 0 and "agree with policy" in replay.stdout, replay.stderr


ROLES_16 = ["generator"] + ["gatekeeper"] * 3 + ["benchmarker"] * 8 + ["profiler"] * 2 + ["scheduler"] * 2


@pytest.mark.long
def test_sixteen_workers_sigkilled_at_random_finish_the_run_once(pg_url: str, tmp_path) -> None:
    """16 worker processes on one run; every couple of seconds one of them (with its sandboxed child) is
    SIGKILLed and another of its role started, as a cluster's supervisor would. Concurrent claims never
    hand a task to two workers at once, and no result is recorded twice."""
    log = tmp_path / "exec.log"
    env = kb_env(KB_DB=pg_url, KB_EXEC_LOG=str(log))
    proc, run_id = kb_start(
        ["run", str(SOFTMAX), "--max-candidates", "4", "--external-workers", "--seed", "7", *QUICK], env
    )
    assert len(ROLES_16) == 16
    workers = [start_worker(role, run_id, env) for role in ROLES_16]
    rng = random.Random(19)
    kills = 0
    try:
        while proc.poll() is None and kills < 12:
            time.sleep(rng.uniform(1.0, 3.0))
            holders = lease_holders(pg_url, run_id)
            # a task whose workers died on it MAX_TASK_FAULTS times is parked (a poison task, exit 5):
            # a kill never lands on the last worker a task may lose
            spared = {pid for pid, died in holders.items() if died >= MAX_TASK_FAULTS - 1}
            busy = [i for i, w in enumerate(workers) if w.pid in holders and w.pid not in spared]
            others = [i for i, w in enumerate(workers) if w.pid not in spared]
            # every other kill lands on a worker in the middle of a task, when one is
            i = rng.choice(busy) if busy and kills % 2 == 0 else rng.choice(others)
            if workers[i].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(workers[i].pid, signal.SIGKILL)
                workers[i].wait()
                kills += 1
            workers[i] = start_worker(ROLES_16[i], run_id, env)
        proc.wait(timeout=900)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        stop_all(workers)
        if proc.poll() is None:
            proc.kill()
    assert kills >= 3, f"only {kills} kills landed before the run finished"
    check_run(pg_url, run_id, log)
    with open_store(pg_url, readonly=True) as store:
        events = store.read(run_id=run_id)
    claims = [e for e in events if e.type == "TaskClaimed"]
    taken = [e for e in events if e.type == "LeaseExpired"]
    print(f"{kills} workers SIGKILLed; {len(claims)} claims, {len(taken)} leases taken from a dead worker")
    assert taken, "no kill landed on a worker in the middle of a task"
    tokens = [(e.payload["task"], e.payload["token"]) for e in claims]
    assert len(tokens) == len(set(tokens)), "one lease token handed out twice"
    replay = kb("replay", run_id, env=env)
    assert replay.returncode == 0 and "agree with policy" in replay.stdout, replay.stderr


def test_a_worker_with_a_bad_database_url_says_so_in_one_line(pg_server, pg_url: str) -> None:
    """Unreachable, a wrong password, a URL with no database: one line, exit 1, the password masked; a
    refused login is no passing fault (not retried), an unreachable server is (StoreUnavailable)."""
    from tests.pg_server import free_port

    closed = f"postgresql://kb:s3cret-pw@127.0.0.1:{free_port()}/kb"
    wrong = pg_url.replace(pg_server.password, "s3cret-pw")
    no_db = pg_server.url().rsplit("/", 1)[0]  # libpq then takes the user's name, kb: no such database
    for url, said in (
        (closed, "cannot reach the PostgreSQL server at postgresql://kb:***@127.0.0.1"),
        (wrong, "cannot reach the PostgreSQL server at postgresql://kb:***@127.0.0.1"),
        (no_db, "no database at postgresql://kb:***@127.0.0.1"),
    ):
        r = kb("worker", "scheduler", "--db", url, env=kb_env(PGPASSWORD="s3cret-pw"), timeout=60)
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith("Error: " + said) and r.stderr.count("\n") == 1, r.stderr
        assert "s3cret-pw" not in r.stdout + r.stderr and pg_server.password not in r.stdout + r.stderr
    with pytest.raises(StoreUnavailable):
        open_store(closed)
    with pytest.raises(StoreError) as refused:
        open_store(wrong)
    assert not isinstance(refused.value, StoreUnavailable)
