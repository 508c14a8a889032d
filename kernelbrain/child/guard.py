"""What the gate watches while a candidate's forward runs (inside the sandboxed child only).

KernelBench's list of exploits is the floor: doing the core work with torch (or the reference
itself) behind a decoy kernel, leaving output elements unwritten, caching results across calls,
working on a side stream or thread, mutating inputs, and patching timers or synchronisation.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Calls that move, view or allocate data but compute nothing a reference could be made of
GLUE = frozenset(
    """
    empty empty_like empty_strided new_empty zeros zeros_like ones ones_like full new_zeros new_full
    view reshape contiguous movedim permute transpose t flatten unflatten unsqueeze squeeze expand
    expand_as view_as reshape_as as_strided narrow chunk split size stride dim numel data_ptr
    is_contiguous storage_offset untyped_storage element_size nbytes itemsize shape dtype device layout
    is_cuda is_floating_point to float half bfloat16 double type cpu cuda numpy item clone copy_ detach
    fill_ zero_ requires_grad_ __get__ __set__ __getitem__ __setitem__ __len__ __eq__ __hash__ __repr__
    __format__
    """.split()  # noqa: SIM905 - a word list reads better than 70 quoted strings
)

ALLOCATORS = {"empty", "empty_like", "empty_strided", "new_empty"}


class Violation(Exception):
    """A candidate broke a rule of the gate; the message says which."""


class _Launches:
    """Counts Triton launches (compiled or interpreted) and knows when one is running."""

    count = 0
    depth = 0

    @classmethod
    def install(cls) -> None:
        from triton.runtime import interpreter, jit

        for kernel_cls in (jit.JITFunction, interpreter.InterpretedFunction):
            if getattr(kernel_cls.run, "_kb_counted", False):
                continue
            original = kernel_cls.run

            def run(self: Any, *args: Any, _original: Callable = original, **kwargs: Any) -> Any:
                cls.count += 1
                cls.depth += 1  # torch calls Triton makes itself are not the candidate's
                try:
                    return _original(self, *args, **kwargs)
                finally:
                    cls.depth -= 1

            run._kb_counted = True  # type: ignore[attr-defined]
            kernel_cls.run = run


class _Recorder(TorchFunctionMode):
    def __init__(self, poison: bool) -> None:
        super().__init__()
        self.poison = poison
        self.calls: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if _Launches.depth:
            return out
        name = getattr(func, "__name__", str(func))
        self.calls.add(name)
        # fresh allocations start as NaN: an output element the kernels never write shows up
        if self.poison and name in ALLOCATORS and isinstance(out, torch.Tensor) and out.is_floating_point():
            out.fill_(math.nan)
        return out


def timer_identities() -> dict[str, Any]:
    """The clocks and synchronisation points a timing depends on, to check nobody replaced them."""
    ids: dict[str, Any] = {
        "time.perf_counter": time.perf_counter,
        "time.time": time.time,
        "time.monotonic": time.monotonic,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
    }
    try:
        import triton.testing

        ids["triton.testing.do_bench"] = triton.testing.do_bench
    except ImportError:
        pass
    return ids


def check_timers(before: dict[str, Any]) -> None:
    changed = [k for k, v in timer_identities().items() if before.get(k) is not v]
    if changed:
        raise Violation(
            f"the candidate replaced {', '.join(changed)}: timers and synchronisation are off limits"
        )


class _Streams:
    created = 0

    @classmethod
    def install(cls) -> None:
        base = torch.cuda.Stream
        if getattr(base, "_kb_counted", False):
            return

        class CountingStream(base):  # type: ignore[misc, valid-type]
            _kb_counted = True

            def __new__(klass, *args: Any, **kwargs: Any) -> Any:
                if "stream_id" not in kwargs:  # current_stream() wraps an existing stream: not a new one
                    cls.created += 1
                return super().__new__(klass, *args, **kwargs)

        torch.cuda.Stream = CountingStream  # type: ignore[misc]
        torch.cuda.streams.Stream = CountingStream  # type: ignore[misc]


def install() -> None:
    """Hooks that must be in place before a candidate module is imported."""
    _Launches.install()
    _Streams.install()


class Watch:
    """Run one forward under observation; `check()` raises Violation for anything off limits."""

    def __init__(self, forbidden_ops: set[str], reference_cls: type, device: str) -> None:
        self.forbidden = forbidden_ops
        self.reference_cls = reference_cls
        self.device = device
        self.recorder = _Recorder(poison=True)
        self.reference_calls = 0

    def __enter__(self) -> Watch:
        self.launches = _Launches.count
        self.streams = _Streams.created
        self.threads = set(threading.enumerate())
        self.stream = torch.cuda.current_stream() if self.device == "cuda" else None
        self.original_forward = self.reference_cls.forward
        watch = self

        def forward(model: Any, *args: Any, **kwargs: Any) -> Any:
            watch.reference_calls += 1
            return watch.original_forward(model, *args, **kwargs)

        self.reference_cls.forward = forward
        self.recorder.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.recorder.__exit__(*exc)
        self.reference_cls.forward = self.original_forward

    def check(self) -> None:
        if self.reference_calls:
            raise Violation(
                "forward called the reference Model: the work must be done by the candidate's kernels"
            )
        used = sorted(self.recorder.calls & self.forbidden)
        if used:
            raise Violation(f"forward computes with torch ({', '.join(used)}), the reference's own ops")
        if _Launches.count == self.launches:
            raise Violation(
                "forward launched no Triton kernel; the work must be done by the candidate's kernels"
            )
        if _Streams.created != self.streams or (
            self.stream is not None and torch.cuda.current_stream() != self.stream
        ):
            raise Violation("forward used a side stream: the timing would not see its work")
        started = [t for t in threading.enumerate() if t not in self.threads]
        if started:
            raise Violation(f"forward left {len(started)} thread(s) running: work off the caller's thread")


def forbidden_ops(reference_calls: list[dict]) -> set[str]:
    return {c["op"] for c in reference_calls} - GLUE
