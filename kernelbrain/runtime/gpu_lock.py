"""One GPU's lock, among the processes of one host: requests that time or profile (a rung, a duel, a
roofline, ncu) hold it alone, every other request on the GPU (a gate's trial, an analysis) holds it
shared with the others. Without it a worker's gate ran its candidate's kernels, or compiled, while
another worker timed a rung on the same GPU, and the reference timed beside a candidate looked slowed
(an honest matvec candidate failed as `policy`, 2.9x, on the H200)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCKS = Path.home() / ".cache" / "kernelbrain" / "locks"


def gpu_name(gpu: int | None) -> str:
    """The GPU a child on `gpu` (None: the first the environment shows) uses, as the lock file names it."""
    if gpu is not None:
        return str(gpu)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


@contextmanager
def held(gpu: str, *, alone: bool) -> Iterator[None]:
    """The lock of `gpu`, exclusive where `alone`, shared otherwise, for the body's duration."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with open(LOCKS / f"gpu-{gpu}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
