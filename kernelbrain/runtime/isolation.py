"""How far a sandboxed child is confined, and the command line that confines it.

- `bwrap` (bubblewrap): its own user, network, PID, IPC, UTS and mount namespaces; a file system
  that shows only what a Python child needs (the system's libraries, the interpreter, kb's own
  packages), read-only but its temporary folder; a /proc of its own namespace only; the GPU's
  device nodes bound in; every capability dropped; every descendant killed with it.
- `unshare` (util-linux): network, PID and mount namespaces with a fresh /proc, so no other process
  and no listener on the host is reachable; the file system stays as it is (read-write).
- `none`: a process session of its own, a scrubbed environment and resource limits only.

The best that works here is chosen once per process (each is tried with a real command); KB_SANDBOX
names one instead, and KB_BWRAP a bwrap binary off the PATH (one unpacked with `dpkg -x`).
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

Isolation = Literal["bwrap", "unshare", "none"]
LEVELS: tuple[Isolation, ...] = ("bwrap", "unshare", "none")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# masked inside the sandbox: the host's users and their password hashes
MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")


class IsolationError(Exception):
    """KB_SANDBOX asks for a confinement this machine cannot give."""


def bwrap_binary() -> str | None:
    return os.environ.get("KB_BWRAP") or shutil.which("bwrap")


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def usable(level: Isolation) -> bool:
    """Whether `level` confines a real command on this machine (a namespace can be refused)."""
    if level == "none":
        return True
    if level == "bwrap":
        binary = bwrap_binary()
        return binary is not None and _works([*bwrap_command(binary, Path("/tmp"), "cpu"), "true"])
    return shutil.which("unshare") is not None and _works([*unshare_command(), "true"])


def chosen() -> Isolation:
    """KB_SANDBOX's level (refused if unusable), else the strongest usable one."""
    wanted = os.environ.get("KB_SANDBOX", "").strip()
    if wanted:
        if wanted not in LEVELS:
            raise IsolationError(f"KB_SANDBOX={wanted!r}: use one of {', '.join(LEVELS)}")
        if not usable(wanted):
            raise IsolationError(
                f"KB_SANDBOX={wanted} does not work on this machine (try `kb doctor`); unset it to use "
                "the strongest isolation available"
            )
        return wanted
    return next(level for level in LEVELS if usable(level))


def describe(level: Isolation) -> str:
    return {
        "bwrap": "bubblewrap: own network, PID and mount namespaces, read-only file system",
        "unshare": "unshare: own network, PID and mount namespaces; the file system is not read-only",
        "none": "none: candidates run with the worker's view of the network, processes and files",
    }[level]


def _readable_roots() -> list[str]:
    """What a Python child reads: system folders, the interpreter, its site-packages, kb's packages."""
    import kernelbrain
    import kernelbrain.store

    roots = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    roots += [sys.base_prefix, sys.prefix]
    roots += [str(Path(kernelbrain.__file__).parent), str(Path(kernelbrain.store.__file__).parent)]
    # site-packages and PYTHONPATH entries, but never a whole checkout: a folder holding kb's source
    # may hold the run's database too
    # the working folder too (`python -m` puts it on sys.path), where a run's database usually is
    hidden = {os.path.realpath(Path(kernelbrain.__file__).parent.parent), os.path.realpath(os.getcwd())}
    for entry in sys.path:
        if entry and os.path.isdir(entry) and os.path.realpath(entry) not in hidden:
            roots.append(entry)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var) and os.path.isdir(os.environ[var]):
            roots.append(os.environ[var])
    if ncu := shutil.which("ncu"):
        roots.append(str(Path(ncu).resolve().parent))
    kept: list[str] = []
    for r in sorted({os.path.realpath(r) for r in roots}, key=len):
        if not any(r == k or r.startswith(k + os.sep) for k in kept):
            kept.append(r)
    return kept


def bwrap_command(
    binary: str, tmp: Path, device: str, writable: tuple[str, ...] = (), readable: tuple[str, ...] = ()
) -> list[str]:
    cmd = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # a fresh /tmp first: what is bound below may live under the host's /tmp (a --target install)
    cmd += ["--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"]
    for root in _readable_roots():
        cmd += ["--ro-bind", root, root]
    for link in SYSTEM_DIRS:  # /bin -> usr/bin and the like, where /usr is merged
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
    for masked in MASKED:
        if os.path.exists(masked):
            cmd += ["--ro-bind", "/dev/null", masked]
    for name in ("passwd", "group"):  # one user, the sandbox's own, in place of the host's
        if (tmp / ".etc" / name).exists():
            cmd += ["--ro-bind", str(tmp / ".etc" / name), f"/etc/{name}"]
    if device == "cuda":
        for node in sorted({n for pattern in GPU_NODES for n in glob.glob(pattern)}):
            cmd += ["--dev-bind", node, node]
        cmd += ["--ro-bind", "/sys", "/sys"]  # the driver reads the GPU's PCI topology there
    cmd += ["--bind", str(tmp), str(tmp), "--chdir", str(tmp)]
    for path in writable:
        cmd += ["--bind", path, path]
    for path in readable:
        cmd += ["--ro-bind", path, path]
    return cmd


def unshare_command() -> list[str]:
    # --kill-child: the namespace's descendants die with it; root mapped so no privilege is needed
    return [
        "unshare",
        *("--user", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"),
    ]


def wrap(
    level: Isolation,
    argv: list[str],
    tmp: Path,
    device: str,
    writable: tuple[str, ...] = (),
    readable: tuple[str, ...] = (),
) -> list[str]:
    """argv confined at `level`; `tmp` is the folder the child may write (with `writable`: existing
    files kb itself has it write, such as the tests' execution log; `readable`: folders it may read,
    such as the judge's draws). Under `unshare` and `none` every path stays as the host has it."""
    if level == "bwrap":
        binary = bwrap_binary()
        assert binary is not None
        (tmp / ".etc").mkdir(exist_ok=True)
        user = f"kb:x:{os.getuid()}:{os.getgid()}:kb:{tmp}:/usr/sbin/nologin\n"
        (tmp / ".etc" / "passwd").write_text(user)
        (tmp / ".etc" / "group").write_text(f"kb:x:{os.getgid()}:\n")
        return [*bwrap_command(binary, tmp, device, writable, readable), "--", *argv]
    if level == "unshare":
        return [*unshare_command(), *argv]
    return argv


def exit_signal(level: Isolation, code: int) -> int | None:
    """The signal that killed the child, from the wrapper's exit status (bwrap exits 128 + signal)."""
    if code < 0:
        return -code
    if level != "none" and code > 128:
        return code - 128
    return None
