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

from kernelbrain.runtime import limits

Isolation = Literal["bwrap", "unshare", "none"]
LEVELS: tuple[Isolation, ...] = ("bwrap", "unshare", "none")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# what of /etc a child sees: what Python, torch, Triton and CUDA read (the dynamic linker's cache and
# configuration, name lookup, the time zone, the alternatives' links), where readable by anyone; its
# passwd and group are its own (one user). Nothing root-only, no keys, no host configuration beside
ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "os-release",
    "mime.types",
)
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
        probe = limits.chosen("cpu", "bwrap", limits.UID_BASE - 1 if limits.own_uid("bwrap") else None)
        return binary is not None and _works(
            [*bwrap_command(binary, Path("/tmp"), "cpu", limit=probe), "true"]
        )
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


def etc_entries() -> list[str]:
    """The entries of the host's /etc a child sees (ETC, those that exist and anyone may read)."""
    shown = []
    for name in ETC:
        path = Path("/etc") / name
        try:
            mode = path.stat().st_mode  # a link's target (localtime, os-release)
        except OSError:
            continue
        if mode & 0o004 and (not path.is_dir() or mode & 0o001):
            shown.append(str(path))
    for found in sorted(glob.glob("/etc/python3*")):  # Debian's sitecustomize links here
        if os.stat(found).st_mode & 0o005 == 0o005:
            shown.append(found)
    return shown


@functools.cache
def bwrap_sizes() -> bool:
    """Whether this bwrap takes `--size` for a tmpfs (0.8 does; older ones do not)."""
    binary = bwrap_binary()
    if binary is None:
        return False
    try:
        text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in text


def bwrap_command(
    binary: str,
    tmp: Path,
    device: str,
    writable: tuple[str, ...] = (),
    readable: tuple[str, ...] = (),
    limit: limits.Limits | None = None,
) -> list[str]:
    """bubblewrap's command line for a child: `limit.uid` set (kb is root), no user namespace (it would
    map the child onto root) and only CAP_SETUID and CAP_SETGID, which the child's first act drops with
    root itself (kernelbrain/child/limits.py); else a user namespace of the worker's own uid."""
    cmd = [binary, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if limit is not None and limit.uid is not None:
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-all"]
    # a fresh /tmp first: what is bound below may live under the host's /tmp (a --target install)
    if limit is not None and limit.uid is not None:
        cmd += ["--perms", "1777"]  # made by root: open to the child's own uid, as a /tmp is
    if limit is not None and limit.folder_bytes and bwrap_sizes():
        cmd += ["--size", str(limit.folder_bytes)]
    cmd += ["--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"]
    made = {"/", "/tmp", "/dev", "/proc"}

    def bind(how: str, source: str, dest: str) -> None:
        # the folders above it made readable by all (bubblewrap makes them root's alone, 0700: a child
        # of its own uid could not reach what is bound below them)
        for parent in reversed(Path(dest).parents):
            if str(parent) not in made:
                made.add(str(parent))
                cmd.extend(["--dir", str(parent)])
        made.add(dest)
        cmd.extend([how, source, dest])

    for root in _readable_roots():
        bind("--ro-bind", root, root)
    for link in SYSTEM_DIRS:  # /bin -> usr/bin and the like, where /usr is merged
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
    for entry in etc_entries():
        bind("--ro-bind", entry, entry)
    for name in ("passwd", "group"):  # one user, the sandbox's own, in place of the host's
        if (tmp / ".etc" / name).exists():
            bind("--ro-bind", str(tmp / ".etc" / name), f"/etc/{name}")
    if device == "cuda":
        for node in sorted({n for pattern in GPU_NODES for n in glob.glob(pattern)}):
            bind("--dev-bind", node, node)
        bind("--ro-bind", "/sys", "/sys")  # the driver reads the GPU's PCI topology there
    bind("--bind", str(tmp), str(tmp))
    if limit is None or limit.uid is None:  # else its folder is its uid's alone: it goes there once that
        cmd += ["--chdir", str(tmp)]
    for path in writable:
        bind("--bind", path, path)
    for path in readable:
        bind("--ro-bind", path, path)
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
    files kb itself has it write, such as the tests' execution log, and folders, such as the judge's
    draws; `readable`: folders it may read, such as the trial's outputs). Under `unshare` and `none` every
    path stays as the host has it. The child's limits (runtime/limits.py) travel as `--limits JSON`
    after argv; where it gets a uid of its own, its folders become that uid's."""
    limit = limits.chosen(device, level, limits.worker_uid() if limits.own_uid(level) else None)
    limits.started(tmp, limit)
    argv = [*argv, "--limits", limit.model_dump_json(), str(tmp)]
    if level == "bwrap":
        binary = bwrap_binary()
        assert binary is not None
        uid = limit.uid if limit.uid is not None else os.getuid()
        gid = limit.uid if limit.uid is not None else os.getgid()
        (tmp / ".etc").mkdir(exist_ok=True)
        (tmp / ".etc" / "passwd").write_text(f"kb:x:{uid}:{gid}:kb:{tmp}:/usr/sbin/nologin\n")
        (tmp / ".etc" / "group").write_text(f"kb:x:{gid}:\n")
        if limit.uid is not None:
            _hand_over(limit.uid, tmp, writable)
        return [*bwrap_command(binary, tmp, device, writable, readable, limit), "--", *argv]
    if level == "unshare":
        return [*unshare_command(), *argv]
    return argv


def _hand_over(uid: int, tmp: Path, writable: tuple[str, ...]) -> None:
    """The folders a child of its own uid writes become its own (the worker, root, still reads and removes
    them; one worker's children share its uid); a file kb has the children of several workers append to
    (the tests' execution log) is left writable by all."""
    for path in (str(tmp), *writable):
        if os.path.isdir(path):
            os.chown(path, uid, uid, follow_symlinks=False)
        elif os.path.isfile(path):
            os.chmod(path, 0o666)


def exit_signal(level: Isolation, code: int) -> int | None:
    """The signal that killed the child, from the wrapper's exit status (bwrap exits 128 + signal)."""
    if code < 0:
        return -code
    if level != "none" and code > 128:
        return code - 128
    return None
