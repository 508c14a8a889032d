"""The scratch folders SIGKILLed kb processes leave (a sandbox child's folder, the gate's draws and its
outbox in /dev/shm): swept by the next kb command, a live process's kept; with real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernelbrain.runtime import processes, scratch
from tests.kbcli import SOFTMAX, kb, kb_env, kb_start
from tests.test_faults import QUICK, wait_for


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
