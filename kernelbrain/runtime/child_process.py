"""A sandboxed child as a process: what it starts with (its preexec limits), what the worker holds of
it once started, and how it ends."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kernelbrain.runtime import isolation, limits, scratch
from kernelbrain.runtime.limits import FILE_CAP


def child_limits() -> None:
    """What every child starts with (a subprocess's preexec_fn): no SIGINT, no core dumps, files no larger
    than FILE_CAP, and death with its worker."""
    # ignored across exec: a SIGINT to the child's group (a terminal's Ctrl-C) must not stop a request
    # in a wrapper (bwrap) before the child itself ignores it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_CAP, FILE_CAP))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def end_process(proc: subprocess.Popen[bytes], stderr: IO[bytes] | None) -> None:
    """Kill a child's process group and close its pipes and log."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)
    for f in (proc.stdin, proc.stdout, stderr):
        with contextlib.suppress(Exception):
            if f is not None:
                f.close()


@dataclass
class Started:
    """A started child process and what it was started with (the spare, before it is taken)."""

    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    tmp: Path
    level: isolation.Isolation
    bound: tuple[str, ...]
    channel: socket.socket  # the worker's end of its descriptors' socket (core/descriptors.py)
    cgroup: Path | None  # its own cgroup with its memory cap, where there is one (runtime/limits.py)

    def end(self) -> None:
        end_process(self.proc, self.stderr)
        self.channel.close()
        limits.remove_cgroup(self.cgroup)
        scratch.remove(self.tmp)


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def died(
    proc: subprocess.Popen[bytes], chosen: isolation.Isolation, stderr: IO[bytes] | None, mark: int
) -> str:
    """How a child that closed its pipe ended (waiting for its exit), with the last line it wrote to its
    log since `mark` (its current request's)."""
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "the child closed its pipe but did not exit"
    sig = isolation.exit_signal(chosen, code)
    how = f"was killed by {signal_name(-sig)}" if sig is not None else f"exited with status {code}"
    return f"the child {how}{_stderr_tail(stderr, mark)}"


def _stderr_tail(stderr: IO[bytes] | None, mark: int) -> str:
    """The last line the child wrote to its log since `mark`, read through this worker's own descriptor:
    by its name the log may now be the child's link to any file here, or a FIFO."""
    if stderr is None or stderr.closed:
        return ""
    try:
        with open(f"/proc/self/fd/{stderr.fileno()}", "rb") as f:
            f.seek(mark)
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""
