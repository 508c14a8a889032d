"""A SQLite database whose files turn read-only under an open store (chattr +i, as the tests run as root):
one line instead of a SIGBUS."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kernelbrain.store import EventStore, open_store

from tests.kbcli import kb_env

QUICK = ["--device", "cpu", "--max-candidates", "3", "--ladder", "smallest:2:0,primary:2:0", "--quiet"]


def wait_for(
    db: str, run_id: str, types: tuple[str, ...], proc: subprocess.Popen, timeout: float = 240
) -> None:
    """Until the run's log holds an event of `types` (the run must still be going)."""
    deadline = time.monotonic() + timeout
    with open_store(db, readonly=True) as store:
        while not any(store.count(run_id=run_id, type=t) for t in types):
            assert proc.poll() is None, f"kb ended ({proc.returncode}) before {types}: {proc.communicate()}"
            assert time.monotonic() < deadline, f"no {types} within {timeout} s"
            time.sleep(0.1)


def chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True, capture_output=True)


def test_a_store_closed_after_its_files_turned_immutable_does_not_sigbus(tmp_path: Path) -> None:
    """SQLite's last connection to close checkpoints, writing the -shm file it maps; once that file is
    immutable, that write is a SIGBUS (the issue's `kb run`, rc -7). A write is refused with one line
    before SQLite touches anything, and the close leaves the WAL as it is."""
    script = (
        "import sys\n"
        "from kernelbrain.store import EventStore, NewEvent, StoreError\n"
        "ev = lambda k: NewEvent('r', 'T', 1, k, {}, 'a')\n"
        "s, t = EventStore(sys.argv[1]), EventStore(sys.argv[1])\n"
        "s.append([ev('one')])\n"
        "print('ready', flush=True)\n"
        "input()\n"  # the test makes the files immutable here
        "try:\n"
        "    s.append([ev('two')])\n"
        "except StoreError as e:\n"
        "    print(e)\n"
        "print(t.count())\n"
        "s.close(); t.close()\n"
        "print('closed')\n"
    )
    db = tmp_path / "kb.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kb_env(),
    )
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "ready\n", proc.communicate()
        chattr("+i", *files)
        out, err = proc.communicate("\n", timeout=60)
    finally:
        chattr("-i", *files)
    assert proc.returncode == 0, (proc.returncode, out, err)
    said = out.splitlines()
    why = "is read-only (a read-only mount, an immutable file or its mode); make it writable"
    assert said[0] == f"{db} cannot be written: {db} {why}"
    assert said[1:] == ["1", "closed"]
    with EventStore(db) as store:
        assert [e.key for e in store.read()] == ["one"]
