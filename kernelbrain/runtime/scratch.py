"""kb's scratch folders: a sandbox child's own folder (`kb-sandbox-*`) and the gate's draws (`kb-draws-*`)
in the temporary folder, and the gate's outbox (`kb-outbox-*`) in /dev/shm, where a full-size shape's
outputs sit in memory.

A folder's name carries its owner, `kb-KIND-PID-START-XXXXXXXX` (the worker's pid and start time), and
the owner holds an flock on it while it lives. A process killed with SIGKILL removes nothing, so
`sweep()`, which every kb command runs as it starts, removes the folders whose owner is gone: its pid
no longer runs with that start time and no process holds the lock (which also covers an owner in
another PID namespace sharing the folder). A live process's folder is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

from kernelbrain.runtime import processes

KINDS = ("sandbox", "draws", "outbox")
NAME = re.compile(r"^kb-(sandbox|draws|outbox)-(\d+)-(\d+)-")
SHM = Path("/dev/shm")

_locks: dict[str, int] = {}  # folder -> the descriptor whose flock says its owner lives


def memory_folder() -> str | None:
    """Where the gate's outputs go: a memory file system where there is one (a trial's outputs at a
    full-size shape are gigabytes, written and read once a candidate), else the temporary folder."""
    return str(SHM) if SHM.is_dir() and os.access(SHM, os.W_OK) else None


def make(kind: str, where: str | None = None) -> Path:
    """A new folder of `kind` in `where` (default: the temporary folder), named and locked as this
    process's."""
    assert kind in KINDS, kind
    pid, start = processes.me()
    folder = Path(tempfile.mkdtemp(prefix=f"kb-{kind}-{pid}-{start}-", dir=where))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: nobody else holds it
    _locks[str(folder)] = fd
    return folder


def remove(folder: Path) -> None:
    """Remove a folder `make` made, and drop its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    fd = _locks.pop(str(folder), None)
    if fd is not None:
        os.close(fd)


def _orphaned(folder: Path, pid: int, start: str) -> bool:
    """Whether the folder's owner is gone: not running, and no process holds the folder's lock."""
    if processes.alive(pid, start):
        return False
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # gone already, or not ours to open
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live process holds it
    finally:
        os.close(fd)
    return True


def sweep(places: tuple[str | None, ...] | None = None) -> list[Path]:
    """Remove the scratch folders of processes that are gone, in `places` (default: the temporary
    folder and /dev/shm); the folders removed."""
    removed = []
    where = places if places is not None else (tempfile.gettempdir(), memory_folder())
    for place in dict.fromkeys(p for p in where if p):
        with contextlib.suppress(OSError):
            for entry in os.scandir(place):
                m = NAME.match(entry.name)
                if m is None or not entry.is_dir(follow_symlinks=False):
                    continue
                folder = Path(entry.path)
                if _orphaned(folder, int(m.group(2)), m.group(3)):
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
    return removed


def empty(folder: Path) -> None:
    """Remove what a folder holds, keeping the folder (an outbox: children are started with it bound)."""
    for left in folder.iterdir():
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left)
        else:
            left.unlink()
