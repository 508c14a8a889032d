"""Admission by memory on one device, among the processes of one host. What prepares and times a problem on
the device (a rung, a duel) reserves the problem's estimated footprint (`ProblemAnalysed.footprint`) for as
long as it runs, a gate the footprint at the gate's shapes (`gate_footprint`), a profile one run at the
primary shape (`profile_footprint`), and waits while the reservations held beside its own would pass the
share of the device's memory kb fills (`ADMIT_SHARE`), the CUDA contexts of the host's sandbox children
counted among them (`counted`). A request alone on the device is always admitted: a problem too big even
alone was refused at its analysis. Among those waiting the largest goes first (then the earliest), so that
a stream of small problems never starves a large one; one that fits goes before it only while the largest
does not fit, and has waited less than OVERTAKE_S unless the one is small (SMALL_SHARE: a fitted gate), and
the largest goes beside small ones as if alone (up to the card's whole memory, the contexts counted).

Without it two of the pool's benchmarkers could each prepare a problem of 40 GB on an 80 GB card, and one
would run out of memory (kb's fault, retried, but a wasted preparation).

The reservations live in a JSON file beside the device's lock (`gpu_lock.folder()`), changed under
flock; an entry whose process is gone (a SIGKILLed worker) is dropped by the next reader.

Work on the device takes both through `on_device`, room first: a process that waited for room while it
held the lock shared would deadlock every timing (one that holds room and goes alone waits for that
shared hold, and everyone else queues behind it at the lock's turnstile)."""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from kernelbrain.runtime import gpu_lock
from kernelbrain.runtime.gpu_lock import Hold

# a problem is admitted where a timed task's estimated footprint is at most this share of the device's
# memory, less the children's CUDA contexts (`counted`): the rest is the estimate's error
ADMIT_SHARE = 0.9


class Process(Protocol):
    """What `counted` needs of a child's process (a Popen)."""

    pid: int


P = TypeVar("P", bound=Process)
KINDS = ("held", "waiting")  # the reservations admitted, and those waiting to be
# what a sandbox child with a CUDA context holds on its device whatever it runs: the context and what it
# keeps loaded (the H100 sweep's pool: 27 processes, median 738 MiB, 13-21 GiB in all, more than the
# 10% ADMIT_SHARE leaves); counted against what two problems may reserve side by side
CONTEXT_BYTES = 0.75 * 2**30
OVERTAKE_S = 10.0  # how long the largest waiting request lets others that fit go before it
SMALL_SHARE = 0.02  # a request this share of the memory or less (a fitted gate) goes whenever it fits


class Need(BaseModel):
    """What a request reserves: its problem's footprint, against the memory kb fills on the device."""

    model_config = ConfigDict(frozen=True)

    bytes: float
    capacity: float


def admitted_memory(measured: float) -> float:
    """The device memory admission holds a problem up against: KB_DEVICE_MEMORY_GIB where set (a share of
    a card, or a made-up small one), else what the analysis' child measured."""
    text = os.environ.get("KB_DEVICE_MEMORY_GIB", "").strip()
    return float(text) * 2**30 if text else measured


def need(footprint: float, device_memory: float) -> Need | None:
    """A problem's need against the device memory its analysis recorded (`admitted_memory`'s), or None
    where either is unknown (nothing is reserved)."""
    capacity = ADMIT_SHARE * device_memory
    return Need(bytes=footprint, capacity=capacity) if footprint > 0 and capacity > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def change(device: str, edit: Callable[[dict[str, Any]], bool]) -> bool:
    """`edit` applied to the device's reservations (held, waiting, contexts) under the file's lock, the
    entries of dead processes dropped first; its answer."""
    folder = gpu_lock.folder()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"gpu-{device}.room", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        room: dict[str, Any] = json.loads(text) if text.strip() else {}
        room = {
            k: {t: e for t, e in room.get(k, {}).items() if _alive(e["pid"])} for k in (*KINDS, "contexts")
        }
        answer = edit(room)
        if (after := json.dumps(room)) != text:  # a waiter's poll that changed nothing writes nothing
            f.seek(0)
            f.truncate()
            f.write(after)
        return answer


def counted(proc: P, device: str, gpu: int | None) -> P:
    """`proc`, a sandbox child just started on `device`, counted among its device's CUDA contexts while
    it lives (a CPU has none)."""
    if device == "cuda":

        def add(room: dict[str, Any]) -> bool:
            room["contexts"][str(proc.pid)] = {"pid": proc.pid, "bytes": CONTEXT_BYTES}
            return True

        change(gpu_lock.device_name(device, gpu), add)
    return proc


def contexts(device: str) -> float:
    """The bytes the live sandbox children's CUDA contexts hold on `device` (`counted`)."""
    return sum(_read(device, ("contexts",))["contexts"])


def reservations(device: str) -> dict[str, list[float]]:
    """The bytes held and waiting on `device` now, by live processes."""
    return _read(device, KINDS)


def _read(device: str, kinds: tuple[str, ...]) -> dict[str, list[float]]:
    """The bytes of each entry of `kinds` on `device` now, by live processes."""
    seen: dict[str, list[float]] = {}

    def read(room: dict[str, Any]) -> bool:
        seen.update({k: [e["bytes"] for e in room[k].values()] for k in kinds})
        return True

    change(device, read)
    return seen


def _admits(room: dict[str, Any], token: str, want: Need) -> bool:
    """Whether the waiting request `token`, of `want`, goes now (module docstring)."""
    held = room["held"]
    first, ahead = min(room["waiting"].items(), key=lambda te: (-te[1]["bytes"], te[1]["since"], te[0]))
    small = SMALL_SHARE * want.capacity
    taken = sum(e["bytes"] for e in held.values()) + sum(e["bytes"] for e in room["contexts"].values())
    # beside small ones only (gates) a request goes as if alone, so they never starve a large one: up to
    # the card's whole memory, the children's contexts counted (a 56 GiB bench went beside 17 GiB of them
    # and gates, past the card, on an H100); alone it goes whatever it needs
    beside_small = all(e["bytes"] <= small for e in held.values())
    limit = want.capacity / ADMIT_SHARE if beside_small else want.capacity
    fits = not held or taken + want.bytes <= limit
    # one behind the first goes where it fits now and the first does not: a small one always (in the H100
    # sweep gates of a few MiB waited 1610 s of their 2875 s behind a 40 GiB bench waiting for the device
    # to empty), another until the first has waited OVERTAKE_S
    stuck = not beside_small and taken + ahead["bytes"] > want.capacity
    overtakes = stuck and (want.bytes <= small or time.time() - ahead["since"] < OVERTAKE_S)
    return fits and (first == token or overtakes)


def fits_now(device: str, want: Need | None) -> bool:
    """Whether a request of `want` asked for now would be admitted at once (`reserved`): a worker takes
    the tasks that would first, rather than wait for room while others could run (in the H100 sweep four
    benchmarkers waited on 42 GiB benches while 80 problems' first rungs waited for a benchmarker)."""
    if want is None:
        return True

    def probe(room: dict[str, Any]) -> bool:
        entry = {"pid": os.getpid(), "bytes": want.bytes, "since": time.time()}
        return _admits({**room, "waiting": {**room["waiting"], "probe": entry}}, "probe", want)

    return change(device, probe)


@contextmanager
def reserved(device: str, want: Need | None, poll_s: float = 0.05) -> Iterator[float]:
    """The body runs with `want` reserved on `device`, once admitted (module docstring); yields the
    seconds it waited. None: nothing to reserve."""
    if want is None:
        yield 0.0
        return
    token = uuid.uuid4().hex
    entry = {"pid": os.getpid(), "bytes": want.bytes, "since": time.time()}

    def wait(room: dict[str, Any]) -> bool:
        room["waiting"][token] = entry
        return False

    def admit(room: dict[str, Any]) -> bool:
        if not _admits(room, token, want):
            return False
        room["held"][token] = room["waiting"].pop(token)
        return True

    def leave(room: dict[str, Any]) -> bool:
        room["held"].pop(token, None)
        room["waiting"].pop(token, None)
        return True

    t0 = time.monotonic()
    try:
        change(device, wait)
        while not change(device, admit):
            time.sleep(poll_s)
        yield time.monotonic() - t0
    finally:
        change(device, leave)


@contextmanager
def on_device(device: str, want: Need | None, *, alone: bool, lazy: bool = False) -> Iterator[Hold]:
    """The body runs with `want` reserved on `device` (`reserved`) and then its lock held, alone or shared
    (`gpu_lock.held`; where `lazy`, from the hold's `take`); yields the hold. The one order every user of
    both takes (module docstring)."""
    with reserved(device, want) as waited, gpu_lock.held(device, alone=alone, lazy=lazy) as hold:
        hold.room_s = waited
        yield hold
