"""Where each timed batch starts and ends, told to the worker as it happens: a small frame on the
protocol pipe before and after each batch of the bench and the duel (child/timing.py). The worker stamps
them with its own clock, outside this process, and holds the times the child reports against them
(runtime/wall_clock.py): code in this process can fake its clocks or edit the samples, not the worker's
clock.

`ready` and `device` are the marks the worker answers. `ready`: what is timed next is built, loaded and
warmed, and the child waits for the worker to hold the device alone before its first timed batch (a rung,
a duel or a roofline prepares while another task times). `device` / `/device` (`on_device`): a gate's
work reaches the device and leaves it; the worker holds the device's lock shared in between
(runtime/gpu_lock.py) and the child waits for it at `device`. A Triton compile inside such a section
leaves the device while it compiles (`compiles_off_device`): a timing need not wait for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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


def _answered(label: str) -> None:
    """Mark `label` and wait for the worker's answer (a no-op outside a worker's child)."""
    global _waited
    if _write is None or _read is None:
        return
    t0 = _clock()
    mark(label)
    header = _read(HEADER.size)
    if not header or _read(HEADER.unpack(header)[0]) != GO:
        raise RuntimeError(f"the worker did not answer `{label}`: the protocol pipe is out of step")
    _waited += _clock() - t0  # the device's lock, held by others: no part of this request's busy time


_clock = time.perf_counter  # kb's, taken before any candidate's code loads
_sync: Callable[[], None] | None = None  # torch.cuda.synchronize where the child uses CUDA (below)
_depth = 0  # the `on_device` sections open now
_released = False  # a Triton compile in a section let the device go and has not taken it back
_waited = 0.0  # seconds waited for the worker's answers (`device`, `ready`) since `waited()` last read them


def _let_go(quiet: bool = False) -> None:
    """Mark `/device` once the device has run what was queued (kernels launch asynchronously). `quiet`:
    where that fails (a faulted context), hold on and raise nothing: the worker lets go as the request
    ends, and the body's own error stands."""
    try:
        if _sync is not None:
            _sync()
    except Exception:
        if quiet:
            return
        raise
    mark("/device")


@contextmanager
def on_device() -> Iterator[None]:
    """The body works on the device: the worker holds the device's lock (shared) from the `device` mark,
    answered once it does, to the `/device` mark after. Nested sections mark once."""
    global _depth, _released
    if _depth == 0:
        _released = False
        _answered("device")
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and not _released:
            _let_go(quiet=True)


def retake() -> None:
    """Inside a section, hold the device again where a compile let it go and never took it back (a
    compile that raised, caught by the code that called it): before each step that runs on it."""
    global _released
    if _depth and _released:
        _released = False
        _answered("device")


def compile_starts(**_: Any) -> bool:
    """Triton's jit_cache_hook: a kernel is compiled next; inside an `on_device` section the device is
    let go while it compiles. False: Triton compiles it."""
    global _released
    if _depth and not _released:
        _let_go()
        _released = True
    return False


def compile_ends(**_: Any) -> None:
    """Triton's jit_post_compile_hook: the compile is done; the section takes the device back (a compile
    that raised never gets here: `retake`)."""
    retake()


def waited() -> float:
    """The seconds this child waited for `device` answers since the last call (not its own work)."""
    global _waited
    out, _waited = _waited, 0.0
    return out


def compiles_off_device() -> None:
    """Triton's compiles leave the device from now on (kb's own hooks, where this Triton has them), and
    `/device` waits for the device to finish what was launched: before any candidate's code."""
    global _sync
    import torch
    import triton

    if torch.cuda.is_available():
        synchronize, initialized = torch.cuda.synchronize, torch.cuda.is_initialized

        def sync() -> None:
            if initialized():  # type: ignore[no-untyped-call]
                synchronize()

        _sync = sync
    runtime: Any = getattr(getattr(triton, "knobs", None), "runtime", None)
    if all(hasattr(runtime, hook) for hook in ("jit_cache_hook", "jit_post_compile_hook")):
        runtime.jit_cache_hook = compile_starts
        runtime.jit_post_compile_hook = compile_ends


def reach_device() -> None:
    """The request's work reaches the device from now to its end, or to `ready` (a profile's target, in a
    process of its own, marks no `/device`): the worker holds the device's lock shared from its answer."""
    _answered("device")


def ready() -> None:
    """What is timed next is built, loaded and warmed: the worker takes the device alone (it prepared
    sharing it, runtime/gpu_lock.py) and answers; returns once it has. A no-op outside a worker's child
    (no channel); once the device is held alone the worker answers at once."""
    _answered("ready")
