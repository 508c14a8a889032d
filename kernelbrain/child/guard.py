"""What the gate watches while a candidate's forward runs (inside the sandboxed child only).

KernelBench's list of exploits is the floor: doing the core work with torch (or the reference
itself) behind a decoy kernel, leaving output elements unwritten, caching results across calls,
working on a side stream or thread, mutating inputs, and patching timers or synchronisation.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import os
import secrets
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kernelbrain.child import interpreted, own_code
from kernelbrain.core import torch_ops

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
# calls that hand a tensor's values to numpy or Python, where the dispatcher no longer sees what is done
HOST_ESCAPES = {"numpy", "tolist", "__array__"}

# The ATen ops a candidate's forward may run outside its Triton kernels, whatever Python name reached
# them (torch.softmax, torch._softmax and torch.ops.aten._softmax all dispatch `_softmax`): allocation,
# views, copies and casts, which compute nothing a result could be made of
ATEN_GLUE = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full
    full_like new_zeros new_ones new_full fill fill_ zero_ scalar_tensor lift_fresh arange
    view _unsafe_view view_as reshape _reshape_alias as_strided expand expand_as permute transpose t
    unsqueeze squeeze slice select narrow split split_with_sizes chunk unbind unflatten alias
    detach clone copy_ _to_copy to contiguous resize_ set_ is_same_size
    """.split()  # noqa: SIM905 - a word list reads better than quoted strings
)


# the ATen op every read of a tensor's value into Python dispatches to (`.item()`, `float(t)`, `int(t)`,
# `bool(t)` of an `if`, formatting): refused in forward outside launches, whatever Python name reached it
SCALAR_READ = "_local_scalar_dense"


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
                    # nor seen by the dispatch recorder: the interpreter makes thousands of them a launch
                    with _disable_current_modes():
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


def dynamo_free(cls: type[TorchDispatchMode]) -> type[TorchDispatchMode]:
    """A TorchDispatchMode subclass whose hook runs as written. TorchDispatchMode wraps a subclass's hook
    to disable dynamo, importing torch._dynamo on its first call: 1.5-3 s a child, and the import
    replaces torch.manual_seed and others as it loads."""
    hook = cls.__dict__["__torch_dispatch__"]
    cls.__torch_dispatch__ = getattr(hook, "__wrapped__", hook)  # type: ignore[method-assign]
    return cls


@dynamo_free
class _AtenRecorder(TorchDispatchMode):
    """The ATen ops a forward runs outside Triton's own launches, by name (`aten._softmax` -> `_softmax`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not _Launches.depth:
            self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def timer_identities() -> dict[str, Any]:
    """The clocks and synchronisation points a timing depends on, to check nobody replaced them."""
    ids: dict[str, Any] = {
        "time.perf_counter": time.perf_counter,
        "time.time": time.time,
        "time.monotonic": time.monotonic,
        "secrets.randbelow": secrets.randbelow,  # picks the timed calls whose outputs are checked
        "os.urandom": os.urandom,
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


# torch's namespaces whose functions a reference calls: a candidate that replaces one (torch.softmax
# slowed down, F.layer_norm returning zeros) changes the reference it is compared and timed against
NAMESPACES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft", "torch.Tensor")


def torch_identities() -> dict[str, Any]:
    """Every public attribute of torch's namespaces, and each torch.nn module's forward."""
    import importlib

    found: dict[str, Any] = {}
    for name in NAMESPACES:
        space = torch.Tensor if name == "torch.Tensor" else importlib.import_module(name)
        for attr in dir(space):
            if not attr.startswith("__"):
                found[f"{name}.{attr}"] = getattr(space, attr, None)
    for attr in dir(torch.nn):
        cls = getattr(torch.nn, attr)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            found[f"torch.nn.{attr}.forward"] = cls.forward
    return found


def problem_identities(module: Any) -> dict[str, Any]:
    """A problem module's functions, classes and modules, and everything its Model class defines (its
    size constants change with each shape, so they are not among them)."""
    found = {
        f"problem.{k}": v
        for k, v in vars(module).items()
        if not k.startswith("__") and (callable(v) or isinstance(v, types.ModuleType))
    }
    model = getattr(module, "Model", None)
    if isinstance(model, type):
        found.update({f"Model.{k}": v for k, v in vars(model).items() if k != "__weakref__"})
    return found


def dispatch_tables(packets: frozenset[str]) -> dict[str, str]:
    """The dispatcher's kernel table of each overload of these ATen ops: a candidate that registers its
    own kernel for an op it may run (torch.library) would run its own torch compute inside that op, where
    the dispatch recorder does not look."""
    found = {}
    for name in sorted(packets):
        packet = getattr(torch.ops.aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            qualified = f"aten::{name}" + ("" if overload == "default" else f".{overload}")
            try:
                found[qualified] = torch._C._dispatch_dump_table(qualified)
            except RuntimeError:
                continue
    return found


_PRISTINE_TORCH: dict[str, Any] = {}
_PRISTINE_TABLES: dict[str, str] = {}  # the dispatch tables of every op a class of torch_ops admits
_PRISTINE_CODE: dict[str, tuple[Any, Any]] = {}  # kb's own code and its libraries (own_code)


@contextlib.contextmanager
def own_imports() -> Iterator[None]:
    """Around kb's own calls into torch that may import torch._dynamo for the first time (arithmetic on
    the meta device does, as do some meta kernels): that import replaces torch.manual_seed and others as
    it loads, and the checks would take it for the candidate's doing. What changed while the call ran,
    where dynamo was imported by it, the name held its pristine object before and the new one wraps it,
    is torch's doing: the new object becomes the pristine one. A name a candidate had replaced before,
    or one replaced by anything but a wrapper of the pristine object, stays caught."""
    if not _PRISTINE_TORCH or "torch._dynamo" in sys.modules:
        yield
        return
    before = torch_identities()
    try:
        yield
    finally:
        if "torch._dynamo" in sys.modules:
            for k, v in torch_identities().items():
                was = before.get(k)
                if was is not v and k in _PRISTINE_TORCH and was is _PRISTINE_TORCH[k] and _wraps(v, was):
                    _PRISTINE_TORCH[k] = v


def _wraps(new: Any, old: Any) -> bool:
    """Whether `new` is a wrapper of `old` (dynamo's import wraps torch.manual_seed to disable itself in
    it): only such a replacement is torch's own; anything else changed in the window stays caught."""
    try:
        return new is not old and inspect.unwrap(new) is old
    except ValueError:  # a cycle of __wrapped__
        return False


def moved(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The names whose object is not the one `before` held (replaced or removed), in its order."""
    return [k for k, v in before.items() if now.get(k) is not v]


def replaced(problem_module: Any, pristine_problem: dict[str, Any]) -> list[str]:
    """What was replaced since the child started (torch) or the problem was first loaded (None: a
    child that holds no problem, only torch)."""
    now = {**torch_identities(), **(problem_identities(problem_module) if problem_module else {})}
    return moved({**_PRISTINE_TORCH, **pristine_problem}, now) + own_code.changed(_PRISTINE_CODE)


def check_untouched(problem_module: Any, pristine_problem: dict[str, Any]) -> None:
    names = replaced(problem_module, pristine_problem)
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise Violation(
            f"the candidate replaced {shown}: the reference, torch and kb's own checks are off limits "
            "(it would be compared or timed against a changed reference, or checked by changed code)"
        )


def torch_tampered() -> bool:
    """Whether anything in torch's namespaces, or of kb's own code, was replaced since the first
    candidate was loaded."""
    return bool(moved(_PRISTINE_TORCH, torch_identities()) or own_code.changed(_PRISTINE_CODE))


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


def prepare_profiler() -> None:
    """Start the profiler once, before any candidate code runs: its first start imports torch._dynamo,
    which replaces torch.manual_seed and others as it loads (this module would take that for the
    candidate's doing), and initialises CUPTI (seconds, outside any timed or checked call)."""
    from torch.profiler import ProfilerActivity, profile

    for activity in (ProfilerActivity.CPU, ProfilerActivity.CUDA):
        with profile(activities=[activity]):
            torch.cuda.synchronize()


def install() -> None:
    """Hooks that must be in place before a candidate module is imported, and torch as it was then."""
    _Launches.install()
    interpreted.fast_interpreter()
    _Streams.install()
    if not _PRISTINE_TORCH:
        if torch.cuda.is_available():
            prepare_profiler()  # torch as the profiler leaves it: its first start replaces torch.manual_seed
        _PRISTINE_TORCH.update(torch_identities())
        _PRISTINE_CODE.update(own_code.snapshot())
        _PRISTINE_TABLES.update(dispatch_tables(torch_ops.aten_ops(torch_ops.CLASSES)))
        _LEFTOVERS.append(Leftovers())


_TIMERS = {"real": signal.ITIMER_REAL, "virtual": signal.ITIMER_VIRTUAL, "profiling": signal.ITIMER_PROF}
_UNCAUGHT = (signal.SIGKILL, signal.SIGSTOP)  # take no handler


def _children() -> list[str]:
    """This process's live and unreaped children, by pid."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            found += Path(f"/proc/self/task/{task}/children").read_text().split()
        except OSError:
            continue
    return found


def _namespace_pids() -> set[str] | None:
    """Every process this one can see, where it is among the first of its own PID namespace (bubblewrap,
    unshare): an orphan a candidate double-forked is seen there too. None on the host's namespace."""
    if os.getpid() > 4:
        return None
    return {p for p in os.listdir("/proc") if p.isdigit()}


class Leftovers:
    """What runs code after a candidate's call has returned, which the thread check does not see: a
    process it started, a signal handler or interval timer it set, a garbage-collector callback. Taken
    before the candidate loads; `found()` names what is new."""

    def __init__(self) -> None:
        self.handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in _UNCAUGHT}
        self.callbacks = list(gc.callbacks)
        self.pids = _namespace_pids()

    def found(self) -> list[str]:
        out = []
        now = _namespace_pids()
        if _children() or (self.pids is not None and now is not None and now - self.pids):
            out.append("a process it started is still there")
        out += [f"an interval timer ({name})" for name, w in _TIMERS.items() if signal.getitimer(w) != (0, 0)]
        out += [f"a handler of signal {int(s)}" for s, h in self.handlers.items() if signal.getsignal(s) != h]
        if gc.callbacks != self.callbacks:
            out.append("a garbage-collector callback")
        return out


_LEFTOVERS: list[Leftovers] = []  # as the child was before its first candidate loaded


def check_leftovers() -> None:
    """Violation for anything a candidate left that runs code after its call: it could rewrite the
    outputs the judge is about to read, or act between timed calls."""
    found = _LEFTOVERS[0].found() if _LEFTOVERS else []
    if found:
        raise Violation(f"it left code to run after its call: {', '.join(found)}")


def left_behind() -> bool:
    return bool(_LEFTOVERS and _LEFTOVERS[0].found())


def tables_changed() -> bool:
    """Whether a kernel was registered for an op of any class since the child started."""
    return (
        bool(_PRISTINE_TABLES) and dispatch_tables(torch_ops.aten_ops(torch_ops.CLASSES)) != _PRISTINE_TABLES
    )


def check_tables(classes: list[str]) -> None:
    """Violation where a kernel of an op these classes admit was registered since the child started."""
    now = dispatch_tables(torch_ops.aten_ops(classes))
    changed = [k for k, v in now.items() if _PRISTINE_TABLES.get(k, v) != v]
    if changed:
        raise Violation(
            f"the candidate registered its own kernel for {', '.join(changed[:3])}: an op it may keep in "
            "torch must be torch's own"
        )


class Watch:
    """Run one forward under observation; `check()` raises Violation for anything off limits. A candidate
    labelled with classes of torch ops (core/torch_ops.py, `kb run --allow-torch`) may also run exactly
    their ATen ops; their Python names are not forbidden to it."""

    def __init__(self, forbidden_ops: set[str], device: str, torch_classes: list[str] | None = None) -> None:
        self.classes = list(torch_classes or [])
        self.allowed = torch_ops.aten_ops(self.classes)
        self.forbidden = set(forbidden_ops) - torch_ops.functions(self.classes)
        self.device = device
        self.recorder = _Recorder(poison=True)
        self.aten = _AtenRecorder()

    def __enter__(self) -> Watch:
        self.launches = _Launches.count
        self.streams = _Streams.created
        self.threads = set(threading.enumerate())
        self.stream = torch.cuda.current_stream() if self.device == "cuda" else None
        self.aten.__enter__()
        self.recorder.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.recorder.__exit__(*exc)
        self.aten.__exit__(*exc)

    def check(self) -> None:
        used = sorted(self.recorder.calls & self.forbidden)
        if used:
            raise Violation(f"forward computes with torch ({', '.join(used)}), the reference's own ops")
        host = sorted(self.recorder.calls & HOST_ESCAPES)
        if host:
            raise Violation(
                f"forward moved data out of torch ({', '.join(host)}): computing on the host with numpy or "
                "Python is not the candidate's kernels doing the work"
            )
        if SCALAR_READ in self.aten.ops - self.allowed:
            raise Violation(
                "forward read tensor values into Python (.item(), float(t), int(t), `if t`): computing on "
                "the host is not the candidate's kernels doing the work"
            )
        computed = sorted(self.aten.ops - ATEN_GLUE - self.allowed)
        if computed and self.classes:
            raise Violation(
                f"forward computes with torch (ATen {', '.join(computed)}) beyond what it is labelled to "
                f"keep in torch ({', '.join(self.classes)}): outside its Triton kernels it may only run "
                "those ops, allocate, view and copy"
            )
        if computed:
            raise Violation(
                f"forward computes with torch (ATen {', '.join(computed)}): outside its Triton kernels a "
                "candidate may only allocate, view and copy"
            )
        if self.classes:
            check_tables(self.classes)
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


def check_outputs(outputs: list[torch.Tensor], inputs: list[Any]) -> None:
    """Outputs are plain dense tensors of their own: not a subclass that computes when read, not a
    view of an input's memory."""
    taken = [
        (x.untyped_storage().data_ptr(), x.untyped_storage().nbytes())
        for x in inputs
        if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes()
    ]
    for i, o in enumerate(outputs):
        if type(o) is not torch.Tensor or o.layout != torch.strided:
            what = f"{type(o).__name__} ({o.layout})"
            raise Violation(f"output {i} is a {what}, not a plain dense torch.Tensor")
        start, size = o.untyped_storage().data_ptr(), o.untyped_storage().nbytes()
        if size and any(start < p + n and p < start + size for p, n in taken):
            raise Violation(f"output {i} shares memory with an input: outputs must be written to their own")


def forbidden_ops(reference_calls: list[dict]) -> set[str]:
    return {c["op"] for c in reference_calls} - GLUE
