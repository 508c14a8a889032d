"""The limits a sandboxed child sets on itself before anything else runs in it (kernelbrain/runtime/
limits.py chooses them and passes them as `--limits JSON` on its command line): RLIMIT_DATA and
RLIMIT_NPROC, hard and soft (an unprivileged process cannot raise them again), then, where it was started
as root with only CAP_SETUID and CAP_SETGID (bubblewrap under a root worker), its own unprivileged uid
and gid, no supplementary groups, and no capabilities left."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def apply(argv: list[str]) -> None:
    """Apply the `--limits JSON FOLDER` among argv, if any, and go to FOLDER, the child's own. Raises where
    the uid cannot be dropped: a child that would run candidates as root must not start."""
    if "--limits" not in argv:
        return
    at = argv.index("--limits")
    limits, folder = json.loads(argv[at + 1]), argv[at + 2]
    for name, key in (("RLIMIT_DATA", "memory_bytes"), ("RLIMIT_NPROC", "processes")):
        if limits.get(key):
            value = int(limits[key])
            resource.setrlimit(getattr(resource, name), (value, value))
    uid = limits.get("uid")
    if uid is None:
        return
    os.chdir("/")  # its folder is its uid's alone: entered once it is that uid
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from root to another uid: every capability goes with it
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()) != (uid, uid, uid, uid, []):
        raise SystemExit(f"kb's sandboxed child could not drop to uid {uid}")
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by the uid change
        libc.prctl(PR_SET_DUMPABLE, 1)  # so that its own /proc/self files stay its own to read
    os.chdir(folder)
