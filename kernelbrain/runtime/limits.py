"""What a sandboxed child may use: the uid it runs as, its memory, its processes, the bytes it may write.

- **uid.** Where kb runs as root, a child under bubblewrap runs as a uid of its own, unprivileged and in
  no user's name (`UID_BASE` + the worker's pid: a worker's children share it). bubblewrap starts it as
  root with only CAP_SETUID and CAP_SETGID, and the child's first act (before torch, before any
  candidate) drops to it (`kernelbrain/child/limits.py`). A user namespace would not do: bubblewrap
  maps its sandbox uid onto the caller's, so `--uid 1000` under root is root on every file the sandbox
  shows. Where kb is not root, the child is already the worker's own, unprivileged uid.
- **memory.** Where the machine has a writable cgroup v2 hierarchy with the memory controller (the H100
  hosts: root in a container whose cgroup namespace root delegates it), each child runs in a cgroup of
  its own with `memory.max` (and no swap): it counts everything the child's pages cost, page cache and
  shared memory included, and a child past it is killed by the kernel (`oom_killed` says so). Everywhere
  RLIMIT_DATA also holds: the private writable memory the child maps (heap, arenas, tensors). Not
  RLIMIT_AS, which counts address space: CUDA reserves tens of GiB of it, and torch's CUDA init fails
  under any cap on it. On cgroup v1 (the development machine), or without a v2 parent the worker may
  create cgroups in, the rlimit is the only cap. The cgroups are named `kb-PID-START-N` after their
  worker; `sweep_cgroups` removes those of workers that are gone (every kb command runs it).
  `MEMORY` per device: the CPU children check and time shapes fitted to 256 KiB (a child that gated one
  holds 0.25 GiB), a GPU child copies full-size outputs to the host.
- **processes.** RLIMIT_NPROC of the children's own uid (threads count: torch starts one a core; a
  gate's judge and candidate child count together). Only where the child has a uid of its own: otherwise
  it would count every process of the worker's user.
- **folder.** The sandbox's /tmp is a tmpfs of `folder_bytes`; the child's own folder (its HOME and
  TMPDIR, on the host's disk, where its Triton cache is kept) is measured after each request
  (`over_folder`); files are capped at `FILE_CAP` (the judge writes a full-size problem's inputs).

`KB_SANDBOX_MEMORY_GIB`, `KB_SANDBOX_PROCESSES` and `KB_SANDBOX_FOLDER_GIB` change them; 0 lifts one.
`KB_SANDBOX_OWN_UID=0` keeps a root worker's children root (`kb doctor` warns).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import time
from pathlib import Path

from pydantic import BaseModel

from kernelbrain.runtime import processes

GIB = 1 << 30
UID_BASE = 100_000_000  # far above any account's uid, below the 2^31 some tools choke on
MEMORY = {"cpu": 4 * GIB, "cuda": 64 * GIB}  # at most half the machine's memory
FOLDER = {"cpu": 1 * GIB, "cuda": 16 * GIB}
# the largest file a child may write: the judge writes a problem's drawn inputs, one file a tensor set,
# and a trial its outputs; KernelBench's reach 8.6 GB a tensor. Still a bound on a candidate that writes
# without end (set before the child starts: runtime/child_process.py)
FILE_CAP = 64 << 30

_BY_FOLDER: dict[str, Limits] = {}  # each started child's limits, by its own folder
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = re.compile(r"^kb-(\d+)-(\d+)-\d+$")
_cgroup_numbers = itertools.count()


class Limits(BaseModel):
    """A child's limits, as `kb doctor` names them and `RunStarted.hardware["limits"]` records them."""

    uid: int | None  # the uid the child drops to; None: the worker's own (kb is not root)
    memory_bytes: int | None  # RLIMIT_DATA; None: none
    processes: int | None  # RLIMIT_NPROC of its own uid; None: none (no uid of its own)
    folder_bytes: int | None  # its /tmp tmpfs, and its own folder after each request; None: none
    file_bytes: int = FILE_CAP  # RLIMIT_FSIZE
    memory_by: str = "RLIMIT_DATA"  # or "cgroup v2 memory.max and RLIMIT_DATA"
    cgroup: str = ""  # the machine's cgroup version, for the record
    uid_per_worker: bool = False  # recorded for a run: `uid` is UID_BASE, each worker's is UID_BASE + its pid


def _gib(name: str) -> int | None:
    """A GiB variable's bytes; None where it is 0 (lifted); -1 where unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return -1
    value = float(raw)
    return None if value <= 0 else int(value * GIB)


def _physical() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_version() -> str:
    return "v2" if (CGROUP_ROOT / "cgroup.controllers").exists() else "v1"


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 folder, where the hierarchy is v2."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_ROOT / line[3:].lstrip("/")
    except OSError:
        pass
    return None


@functools.cache
def cgroup_parent() -> Path | None:
    """Where this worker may make a child's cgroup with a memory cap: the nearest ancestor of its own
    cgroup (its own holds processes, so it may not delegate controllers) that delegates the memory
    controller and that it may write; None on cgroup v1, or where none does (KB_SANDBOX_CGROUP=0: none)."""
    if os.environ.get("KB_SANDBOX_CGROUP", "1").strip() == "0" or cgroup_version() != "v2":
        return None
    own = _own_cgroup()
    if own is None:
        return None
    for folder in own.parents:
        if not folder.is_relative_to(CGROUP_ROOT):
            break
        try:
            delegated = (folder / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if "memory" in delegated and os.access(folder, os.W_OK):
            probe = folder / f"kb-{os.getpid()}-probe"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError:
                continue
            return folder
    return None


def make_cgroup(limit: Limits) -> Path | None:
    """A new cgroup for one child, capped at the limit's memory (no swap), named after this worker; None
    where cgroups are not to be had or the limit has no memory cap."""
    parent = cgroup_parent()
    if parent is None or limit.memory_bytes is None:
        return None
    pid, start = processes.me()
    folder = parent / f"kb-{pid}-{start}-{next(_cgroup_numbers)}"
    try:
        folder.mkdir()
        (folder / "memory.max").write_text(str(limit.memory_bytes))
        with contextlib.suppress(OSError):  # absent without swap accounting
            (folder / "memory.swap.max").write_text("0")
    except OSError:
        remove_cgroup(folder)
        return None
    return folder


def enter_cgroup(folder: Path) -> None:
    """Move the calling process into `folder` (a child's preexec, before it execs: all it starts stays
    there). A refusal is not raised here (a preexec cannot report it): `holds` tells afterwards."""
    with contextlib.suppress(OSError):
        (folder / "cgroup.procs").write_text("0")


def holds(folder: Path, pid: int) -> bool:
    """Whether process `pid` sits in the cgroup `folder` (it entered before its exec)."""
    try:
        return str(pid) in (folder / "cgroup.procs").read_text().split()
    except OSError:
        return False


def oom_killed(folder: Path | None) -> bool:
    """Whether the kernel killed a process of this cgroup for passing its memory.max."""
    if folder is None:
        return False
    try:
        for line in (folder / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
    except (OSError, ValueError):
        pass
    return False


def remove_cgroup(folder: Path | None) -> None:
    """Remove a child's cgroup once its processes are gone (a killed process leaves it within moments)."""
    if folder is None:
        return
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def sweep_cgroups() -> list[Path]:
    """Remove the children's cgroups of workers that are gone (a SIGKILLed worker removes nothing)."""
    parent = cgroup_parent()
    if parent is None:
        return []
    removed = []
    with contextlib.suppress(OSError):
        for folder in parent.iterdir():
            m = CGROUP_NAME.match(folder.name)
            if m and not processes.alive(int(m.group(1)), m.group(2)):
                with contextlib.suppress(OSError):
                    folder.rmdir()
                    removed.append(folder)
    return removed


def own_uid(isolation: str) -> bool:
    """Whether a child at this isolation runs as a uid of its own (kb is root, under bubblewrap, and
    KB_SANDBOX_OWN_UID is not 0: Nsight Compute's counters want root where the driver restricts them)."""
    wanted = os.environ.get("KB_SANDBOX_OWN_UID", "1").strip() != "0"
    return wanted and isolation == "bwrap" and os.geteuid() == 0


def chosen(device: str, isolation: str, uid: int | None = None) -> Limits:
    """The limits a child on `device` at `isolation` starts with (`uid`: the one allocated for it)."""
    kind = "cuda" if device == "cuda" else "cpu"
    memory = _gib("KB_SANDBOX_MEMORY_GIB")
    if memory == -1:
        memory = min(MEMORY[kind], _physical() // 2)
    folder = _gib("KB_SANDBOX_FOLDER_GIB")
    if folder == -1:
        folder = FOLDER[kind]
    nproc: int | None = None
    if own_uid(isolation):
        raw = os.environ.get("KB_SANDBOX_PROCESSES", "").strip()
        nproc = (int(raw) if raw else 4 * (os.cpu_count() or 1) + 128) or None
    by_cgroup = memory is not None and cgroup_parent() is not None
    return Limits(
        uid=uid if own_uid(isolation) else None,
        memory_bytes=memory,
        processes=nproc,
        folder_bytes=folder if isolation == "bwrap" else None,
        memory_by="cgroup v2 memory.max and RLIMIT_DATA" if by_cgroup else "RLIMIT_DATA",
        cgroup=cgroup_version(),
    )


def recorded(device: str, isolation: str) -> Limits:
    """The limits a run's children start with, as `RunStarted.hardware["limits"]` records them."""
    own = own_uid(isolation)
    return chosen(device, isolation, UID_BASE if own else None).model_copy(update={"uid_per_worker": own})


def worker_uid() -> int:
    """The uid of this worker's children: one a worker (its gate's judge and candidate child share the
    folders a test has both write; each sees only what is bound into its own sandbox), no other live
    worker's (pids stay below 2^22), and outside every account."""
    return UID_BASE + os.getpid() % (1 << 22)


def describe(limits: Limits) -> str:
    """One line naming each limit."""

    def size(n: int | None) -> str:
        return "none" if n is None else f"{n / GIB:g} GiB"

    uid = f"uid {limits.uid}" if limits.uid is not None else "the worker's own uid (kb is not root)"
    if limits.uid_per_worker:
        uid = f"uid {limits.uid} + the worker's pid"
    if limits.uid is None and os.geteuid() == 0:
        uid = "uid 0 (kb is root, and so are its children: no bubblewrap, or KB_SANDBOX_OWN_UID=0)"
    procs = (
        f"{limits.processes} processes and threads (RLIMIT_NPROC of its uid)"
        if limits.processes
        else "no process cap (RLIMIT_NPROC would count the worker's own user)"
    )
    folder = (
        f"folder {size(limits.folder_bytes)} (/tmp a tmpfs, its own folder checked after each request)"
        if limits.folder_bytes
        else "no folder cap"
    )
    return (
        f"{uid}; memory {size(limits.memory_bytes)} ({limits.memory_by}, cgroup {limits.cgroup}); {procs}; "
        f"{folder}; files {size(limits.file_bytes)}; /etc reduced"
    )


def folder_bytes(folder: Path) -> int:
    """The bytes the files under `folder` hold (links not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def started(folder: Path, limits: Limits) -> None:
    """Note the limits of the child whose own folder this is (`over_folder` reads them)."""
    _BY_FOLDER[str(folder)] = limits


def of(folder: Path) -> Limits | None:
    """The limits the child whose own folder this is started with."""
    return _BY_FOLDER.get(str(folder))


def over_folder(folder: Path | None) -> str | None:
    """Why a child's own folder is past its cap (a candidate's fault: the child is stopped and the folder
    removed with it), or None."""
    limits = _BY_FOLDER.get(str(folder)) if folder is not None else None
    if folder is None or limits is None or limits.folder_bytes is None:
        return None
    used = folder_bytes(folder)
    if used <= limits.folder_bytes:
        return None
    return (
        f"it wrote {used / GIB:.2f} GiB into its folder, past the sandbox's cap of "
        f"{limits.folder_bytes / GIB:g} GiB"
    )
