"""Processes on this host named by pid and start time (/proc/PID/stat), so that a pid the kernel has
handed to another process since, or a zombie waiting for its parent, never counts as the one named."""

from __future__ import annotations

import os


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # field 3, the state: a zombie holds nothing
        return None
    return fields[19]  # field 22


def me() -> tuple[int, str]:
    """This process's pid and start time."""
    pid = os.getpid()
    return pid, start_time(pid) or "0"


def alive(pid: int, start: str) -> bool:
    """Whether the process `pid` that started at `start` still runs."""
    return start_time(pid) == start
