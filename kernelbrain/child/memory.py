"""The device's memory, as a child sees it: whether an out-of-memory error was the request's own (the
device was all but free for it) or the pool's (other processes held part of it: kb's fault, the task
is tried again, never charged to the candidate or the problem); and what a problem needs at a shape
(`Peak`: the reference's live bytes at their most, counted on the meta device without memory).

KB_INJECT_OOM names a file holding a count: while it is above zero, each bench request takes one off
and raises an out-of-memory error first (the tests' stand-in for a pool's neighbours on a CPU)."""

from __future__ import annotations

import fcntl
import os
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelbrain.child.guard import dynamo_free
from kernelbrain.child.loading import CandidateFault

# an out-of-memory error with at least this share of the device free for the request is its own
ALONE_SHARE = 0.9


class DeviceBusy(Exception):
    """The device ran out of memory while other processes held part of it: kb's fault (the pool's)."""


def out_of_memory(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError)


def verdict(e: BaseException, where: str) -> Exception:
    """What an out-of-memory error `where` stands for: DeviceBusy when other processes held more than a
    tenth of the device (on a CPU: always, the host's memory being every process's), else the
    candidate's own fault (it needs more than the whole device)."""
    line = (str(e).splitlines() or [type(e).__name__])[0][:200]
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return DeviceBusy(f"{where}: out of memory on the host ({line})")
    free, total = torch.cuda.mem_get_info()
    mine = torch.cuda.memory_reserved()
    if free + mine >= ALONE_SHARE * total:
        return CandidateFault(
            "runtime",
            f"{where}: out of memory with the device to itself ({total / 2**30:.0f} GiB; {line})",
        )
    others = (total - free - mine) / 2**30
    return DeviceBusy(f"{where}: out of memory while other processes held {others:.1f} GiB of the device")


def injected(variable: str = "KB_INJECT_OOM") -> None:
    """Raise an out-of-memory error where the count in the file `variable` names is above zero (taking
    one off)."""
    path = os.environ.get(variable)
    if not path:
        return
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        left = int(f.read().strip() or 0)
        if left <= 0:
            return
        f.seek(0)
        f.truncate()
        f.write(str(left - 1))
    raise torch.OutOfMemoryError(f"out of memory (injected by {variable})")


@dynamo_free
class Peak(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The most bytes the tensors made under it held at once (each storage once, until its tensor is
    collected): the reference's working memory at a shape, its outputs included. On the meta device
    nothing is allocated, so a 60 GB problem is measured in a millisecond."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, list | tuple) else [out]:
            if isinstance(t, torch.Tensor):
                self._made(t)
        return out

    def _made(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.seen:
            return
        self.seen.add(key)
        size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._freed, key, size)

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self.seen.discard(key)
