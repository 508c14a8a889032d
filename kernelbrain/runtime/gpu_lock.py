"""One device's lock, among the processes of one host: requests that time or profile (a rung, a duel, a
roofline, ncu) hold it alone, every other request on the device (a gate's trial, an analysis) holds it
shared with the others. Without it a worker's gate ran its candidate's kernels, or compiled, while
another worker timed a rung on the same GPU, and the reference timed beside a candidate looked slowed
(an honest matvec candidate failed as `policy`, 2.9x, on the H200). A CPU is a device too: the
interpreter's timings are slowed by a gate beside them as a GPU's are.

Timing goes first: a request that times waits for the shared holders of the moment, not for those that
come after it. Linux's flock grants a shared lock whenever no exclusive one is *held*, so a pool of
gatekeepers, one gate always running, would keep the benchmarker waiting for ever; every request
passes a turnstile first, which a timing request holds while it waits.

`held` yields the wall-clock moments the lock was taken and let go (`Hold`): a timed task records them,
so the log shows when each device was held alone, and that no two timings ever overlapped. A rung, a
duel, a roofline or an ncu profile prepares shared (its child builds the modules, draws the inputs,
loads the kernels) and goes alone when its child is ready to time (`Hold.go_alone`): another task's
timing runs while it prepares.

A gate holds the lock only while it works on the device (`held(..., lazy=True)`): its children say when
with marks (child/marks.py `on_device`), and the compiles, imports, loads and launcher builds between
them run with the lock let go, so a timing waits for a gate's device work of the moment, not for its
whole request. What the worker pins (`Hold.pinned`: a request of a child that ran code from outside)
stays held whatever the child marks."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


def folder() -> Path:
    """Where the lock files live: KB_LOCKS (a folder every user of a shared machine can write, so that
    their runs exclude each other too), else ~/.cache/kernelbrain/locks."""
    return Path(os.environ.get("KB_LOCKS") or Path.home() / ".cache" / "kernelbrain" / "locks")


def gpu_name(gpu: int | None) -> str:
    """The GPU a child on `gpu` (None: the first the environment shows) uses, as the lock file names it."""
    if gpu is not None:
        return str(gpu)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def device_name(device: str, gpu: int | None) -> str:
    """The lock a child on `device` takes: its GPU's, or the host's CPU's."""
    return gpu_name(gpu) if device == "cuda" else "cpu"


@dataclass
class Hold:
    """When the lock was taken and let go (time.time(); `to` is 0 while it is held); where a shared hold
    went alone, `since` is when it did. `lock_s`: the seconds spent waiting for the lock (taking it, and
    going alone); `room_s`: for the device's memory before it (runtime/device_room.on_device). A lazy
    hold (a gate's) is taken and let go as its work reaches the device and leaves it (`take`,
    `let_go`); any other is pinned from the start. `held_s` sums the seconds it held the lock."""

    device: str
    alone: bool
    since: float = 0.0
    to: float = 0.0
    lock_s: float = 0.0
    room_s: float = 0.0
    held: bool = False
    held_s: float = 0.0
    pins: int = 0
    lazy: bool = False
    _alone: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    _take: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    _let_go: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def go_alone(self) -> None:
        """Hold the device alone from now until the hold ends: the shared lock is let go, then the
        exclusive one taken through the turnstile (a no-op where it is held alone already)."""
        if not self.alone and self._alone is not None:
            self._alone()

    def take(self) -> None:
        """Hold the lock (shared) from now: a no-op where it is held."""
        if not self.held and self._take is not None:
            self._take()

    def let_go(self) -> None:
        """Let the lock go until the next `take`, unless it is pinned or alone (those hold to the end)."""
        if self.held and not self.pins and not self.alone and self._let_go is not None:
            self._let_go()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """The lock held for the body, whatever `let_go` is asked meanwhile; let go after where it was
        not held before."""
        before = self.held
        self.take()
        self.pins += 1
        try:
            yield
        finally:
            self.pins -= 1
            if not before:
                self.let_go()


@contextmanager
def held(device: str, *, alone: bool, lazy: bool = False) -> Iterator[Hold]:
    """The lock of `device`, exclusive where `alone`, shared otherwise, for the body's duration; where
    `lazy` (shared only), not taken until the hold's `take`."""
    locks = folder()
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"gpu-{device}.turnstile", "a+") as gate, open(locks / f"gpu-{device}.lock", "a+") as f:
        taken = 0.0  # when the hold was last taken (monotonic)

        def go_alone() -> None:
            nonlocal taken
            if hold.held:  # the shared hold ends here: its wait to go alone is no hold
                fcntl.flock(f, fcntl.LOCK_UN)
                hold.held_s += time.monotonic() - taken
            hold.lock_s += _take(gate, f, alone=True)  # (a lazy hold may go alone untaken: a profile's)
            taken, hold.held = time.monotonic(), True
            hold.alone, hold.since = True, time.time()

        def take() -> None:
            nonlocal taken
            hold.lock_s += _take(gate, f, alone=hold.alone)
            taken, hold.held = time.monotonic(), True
            hold.since = hold.since or time.time()

        def let_go() -> None:
            fcntl.flock(f, fcntl.LOCK_UN)
            hold.held_s += time.monotonic() - taken
            hold.held = False

        hold = Hold(device, alone, lazy=lazy and not alone, _alone=go_alone, _take=take, _let_go=let_go)
        if alone or not lazy:  # held to the end, whatever its child marks
            take()
            hold.pins = 1
        try:
            yield hold
        finally:
            hold.to = time.time()
            if hold.held:
                let_go()


def _take(gate: IO[str], f: IO[str], *, alone: bool) -> float:
    """Take the lock through the turnstile; the seconds it waited."""
    t0 = time.monotonic()
    fcntl.flock(gate, fcntl.LOCK_EX)  # a timing request waiting holds this: later ones queue here
    try:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)
    return time.monotonic() - t0
