"""Where each timed batch starts and ends, told to the worker as it happens: a small frame on the
protocol pipe before and after each batch of the bench and the duel (child/timing.py). The worker stamps
them with its own clock, outside this process, and holds the times the child reports against them
(runtime/wall_clock.py): code in this process can fake its clocks or edit the samples, not the worker's
clock."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from kernelbrain.core.protocol import HEADER

# the protocol pipe's writer, given by the child's entry point before any candidate's code loads (kb's
# snapshot of its own code sees it replaced)
_write: Callable[[bytes], object] | None = None


def channel(write: Callable[[bytes], object]) -> None:
    global _write
    _write = write


def mark(label: str) -> None:
    """A batch of `label` starts (`label`) or ends (`/label`): one frame now."""
    if _write is not None:
        frame = orjson.dumps({"mark": label})
        _write(HEADER.pack(len(frame)) + frame)
