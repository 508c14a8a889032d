"""Faults around the processes that drive a run, each with real `kb` processes and real signals: a second
live `kb resume` of a run (refused through the run's lease, on SQLite and PostgreSQL; a dead holder's
lease does not block), `kb resume` of a finished run (exit 0), the scratch folders SIGKILLed processes
leave (swept by the next kb command, a live process's kept), and Ctrl-C while `kb run` is piped through
tee (exit 130, the resume hint kept)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kernelbrain.store import EventStore, open_store

from kernelbrain.runtime import processes, scratch
from kernelbrain.views.ending import EXIT_BUSY, EXIT_INTERRUPTED
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start
from tests.test_faults import FIXTURE, QUICK, wait_for

IDLE = ["--device", "cpu", "--external-workers", "--quiet"]  # holds the run, starts nothing


def resumed(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`kb resume ...` started in its own process group, once it says it resumed the run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbrain", "resume", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert " resumed at event #" in first, (first, proc.stderr.read() if proc.stderr else "")
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Send `sig` to the process group; its exit code and stderr."""
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_a_second_live_resume_is_refused_and_a_dead_holder_does_not_block(
    request: pytest.FixtureRequest, tmp_path: Path, where: str
) -> None:
    """The run's lease: while `kb run` drives the run, `kb resume` of it is one line and exit 7, naming
    the holder; SIGKILLed (its zombie not yet reaped), the holder blocks nothing; the resume that took the
    run refuses a second resume in turn, and lets go when Ctrl-C stops it."""
    db = request.getfixturevalue("pg_url") if where == "postgres" else str(tmp_path / "kb.db")
    env = kb_env(KB_DB=db)
    holder, run_id = kb_start(["run", str(SOFTMAX), *IDLE], env)
    try:
        r = kb("resume", run_id, env=env)  # (kb run claims the run's lease before it prints its id)
        assert r.returncode == EXIT_BUSY, (r.stdout, r.stderr)
        assert r.stdout == ""
        (line,) = r.stderr.splitlines()
        assert line.startswith(
            f"Error: run {run_id} is being driven already, by `kb run` (pid {holder.pid} on "
        )
        assert line.endswith(f"then `kb resume {run_id}`"), line
        holder.kill()  # SIGKILL: its lease stays, held by a dead process (a zombie until reaped)
        time.sleep(0.2)
        first = resumed([run_id, "--quiet"], env)
        try:
            r = kb("resume", run_id, env=env)
            assert r.returncode == EXIT_BUSY, (r.stdout, r.stderr)
            assert f"by `kb resume` (pid {first.pid} on " in r.stderr, r.stderr
        finally:
            code, err = stop(first)
        assert code == EXIT_INTERRUPTED, err
        with open_store(db, readonly=True) as store:
            assert store.count(run_id=run_id, type="RunResumed") == 1  # the refused ones recorded nothing
            lease = store.lease(run_id)
        assert lease is not None and lease.deadline == 0  # released: the next resume takes it at once
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_resuming_a_finished_run_exits_0_saying_so(tmp_path: Path, as_json: bool) -> None:
    db = tmp_path / "kb.db"
    shutil.copyfile(FIXTURE, db)
    with EventStore(db, readonly=True) as store:
        (run_id,) = store.run_ids()
        events = store.count()
    r = kb("resume", run_id, "--db", str(db), *(["--json"] if as_json else []))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stderr == ""
    (line,) = r.stdout.splitlines()
    if as_json:
        assert '"finished":true' in line.replace(" ", "") and run_id in line, line
    else:
        assert line.startswith(f"run {run_id} finished already: ") and line.endswith("Nothing to resume"), (
            line
        )
    with EventStore(db, readonly=True) as store:
        assert store.count() == events  # no RunResumed, nothing else


def _group(pgid: int) -> list[int]:
    """The pids of a process group's members."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry))
    return pids


def _scratch_of(pids: list[int], places: list[Path]) -> list[Path]:
    return sorted(
        p
        for place in places
        for p in place.iterdir()
        for pid in pids
        if p.name.startswith("kb-") and f"-{pid}-" in p.name
    )


def test_the_next_kb_command_sweeps_what_sigkilled_processes_left(tmp_path: Path) -> None:
    """`kb run` SIGKILLed with its workers mid-gate leaves its sandbox, draws and outbox folders; the next
    kb command (`kb status`) removes them, and leaves alone those of a process that is still alive, which
    are swept in turn once it has gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = kb_env(TMPDIR=str(tmp))
    db = str(tmp_path / "kb.db")
    proc, run_id = kb_start(["run", str(SOFTMAX), "--db", db, *QUICK], env)
    live = subprocess.Popen(  # a live owner: folders made as a worker makes them, then it waits
        [
            sys.executable,
            "-c",
            "from kernelbrain.runtime import scratch\n"
            "for k, w in (('sandbox', None), ('draws', None), ('outbox', scratch.memory_folder())):\n"
            "    print(scratch.make(k, w), flush=True)\n"
            "input()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert live.stdout is not None
    kept = [Path(live.stdout.readline().strip()) for _ in range(3)]
    try:
        wait_for(db, run_id, ("TaskClaimed",), proc)
        wait_for(db, run_id, ("GatePassed", "GateFailed"), proc)
        pids = _group(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    places = [tmp, scratch.SHM]
    left = _scratch_of(pids, places)
    kinds = {p.name.split("-")[1] for p in left}
    assert kinds == {"sandbox", "draws", "outbox"}, left
    deadline = time.monotonic() + 30
    while any(processes.start_time(pid) for pid in pids):  # sandboxed children die with them
        assert time.monotonic() < deadline
        time.sleep(0.1)
    r = kb("status", run_id, "--db", db, env=env)
    assert r.returncode == 0, r.stderr
    assert _scratch_of(pids, places) == []
    assert all(p.is_dir() for p in kept), "a live process's folder was removed"
    live.communicate("\n", timeout=30)
    assert all(p.is_dir() for p in kept)  # its process is gone: no clean exit removed them
    kb("ls", "--db", db, env=env)
    assert not any(p.exists() for p in kept)


def test_ctrl_c_while_piped_through_tee_exits_130_with_the_resume_hint(tmp_path: Path) -> None:
    """`kb run ... | tee log` and a Ctrl-C (SIGINT to the whole group: tee stops at once, stdout's reader
    gone): kb still stops its workers, says how to resume on stderr, and exits 130."""
    db = tmp_path / "kb.db"
    kb_cmd = " ".join(
        [sys.executable, "-m", "kernelbrain", "run", str(SOFTMAX), "--db", str(db), *QUICK[:-1]]
    )
    script = f'{kb_cmd} 2> {tmp_path}/err | tee {tmp_path}/log; echo "${{PIPESTATUS[0]}}" > {tmp_path}/code'
    shell = subprocess.Popen(
        ["bash", "-c", script], env=kb_env(), start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "log").exists() or " gate passed " not in (tmp_path / "log").read_text():
            assert shell.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            time.sleep(0.1)
        os.killpg(shell.pid, signal.SIGINT)
        shell.wait(timeout=120)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "code").read_text().strip() == str(EXIT_INTERRUPTED), err
    run_id = (tmp_path / "log").read_text().split()[1]
    assert err.strip().splitlines()[-1] == (
        f"kb: run {run_id} interrupted; everything recorded is kept. Continue with: kb resume {run_id}"
    ), err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


HOLD_LOCK = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print(flush=True)\n"
    "input()\n"
)


def test_sweep_keeps_folders_it_cannot_place(tmp_path: Path) -> None:
    """Folders of the old naming (no owner in the name), of another program, or of a live process that
    holds their lock under a pid that is not its own (another PID namespace) are left alone."""
    old = tmp_path / "kb-sandbox-abc123"
    other = tmp_path / "kb-outbox-12-34"
    for folder in (old, other):
        folder.mkdir()
    locked = tmp_path / f"kb-draws-{2**22 + 1}-1-xyz"  # a pid that runs nothing here
    locked.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(locked)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    try:
        assert scratch.sweep((str(tmp_path),)) == []
    finally:
        holder.communicate("\n", timeout=30)
    assert scratch.sweep((str(tmp_path),)) == [locked]  # its holder has gone
    assert old.is_dir() and other.is_dir()
