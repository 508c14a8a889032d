"""Where each timed batch starts and ends, told to the worker as it happens: a small frame on the
protocol pipe before and after each batch of the bench and the duel (child/timing.py). The worker stamps
them with its own clock, outside this process, and holds the times the child reports against them
(runtime/wall_clock.py): code in this process can fake its clocks or edit the samples, not the worker's
clock.

`ready` is the one mark the worker answers: what is timed next is built, loaded and warmed, and the
child waits for the worker to hold the device alone before its first timed batch (a rung, a duel or a
roofline prepares while another task times)."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from kernelbrain.core.protocol import GO, HEADER

# the protocol pipe's writer and reader, given by the child's entry point before any candidate's code
# loads (kb's snapshot of its own code sees them replaced)
_write: Callable[[bytes], object] | None = None
_read: Callable[[int], bytes] | None = None


def channel(write: Callable[[bytes], object], read: Callable[[int], bytes] | None = None) -> None:
    global _write, _read
    _write, _read = write, read


def mark(label: str) -> None:
    """A batch of `label` starts (`label`) or ends (`/label`): one frame now."""
    if _write is not None:
        frame = orjson.dumps({"mark": label})
        _write(HEADER.pack(len(frame)) + frame)


def ready() -> None:
    """What is timed next is built, loaded and warmed: the worker takes the device alone (it prepared
    sharing it, runtime/gpu_lock.py) and answers; returns once it has. A no-op outside a worker's child
    (no channel); once the device is held alone the worker answers at once."""
    if _write is None or _read is None:
        return
    mark("ready")
    header = _read(HEADER.size)
    if not header or _read(HEADER.unpack(header)[0]) != GO:
        raise RuntimeError("the worker did not answer `ready`: the protocol pipe is out of step")
