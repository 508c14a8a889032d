"""The kernels a candidate's call launched on the GPU, read from the profiler (CUPTI kernel records).

The dispatcher check in `guard` sees only what passes through ATen. A cuBLAS call made another way
(ctypes, a CUDA graph captured in __init__, another module's Triton kernel) is seen here: every kernel,
memcpy and memset the device ran while the call ran, whoever launched it. Only the candidate's own Triton
kernels and the allocation, fill and copy kernels in `GLUE_KERNELS` may run; anything else is a policy
fault.

Import this module before any candidate code runs: it keeps the synchronisation it uses from then.
Kernel names are what CUPTI reports, not identities: a kernel built outside Triton (a cubin loaded with
ctypes) may take any name, an allowed one included.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelbrain.child.guard import Violation, dynamo_free

_SYNC = torch.cuda.synchronize  # as it was before a candidate could replace it

# Triton names a kernel after its function (the last part of its __qualname__), with no suffix in
# Triton 3.x, and accepts only these identifiers
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Names a candidate's Triton kernel may not take, although they are identifiers: cuBLAS's, cuDNN's and
# CUTLASS's untemplated kernels (sm90_xmma_gemm_..., nvjet_tst_..., ampere_sgemm_..., fmha_cutlassF_...)
# and Inductor's (triton_poi_fused_...). A decoy named like the kernel torch.matmul picks would otherwise
# let that kernel pass as the candidate's own.
LIBRARY_NAME = re.compile(
    r"sm\d+_|nvjet|ampere_|volta_|turing_|maxwell_|hopper_|blackwell_|cutlass|cublas|cudnn|fmha_|xmma"
    r"|triton_(?:poi|per|red|tem|for)_",
    re.IGNORECASE,
)

# An ATen elementwise kernel's name up to its functor: `void at::native::vectorized_elementwise_kernel<4,
# at::native::FillFunctor<float>, ...>(...)`, or through gpu_kernel_impl's lambda for strided tensors
# (`elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<FUNCTOR>(...)::{lambda(int)#1}>`).
# Matched from the start, so the kernel's first functor decides, not a word further on.
_ELEMENTWISE = (
    r"(?:void )?at::native::(?:vectorized_templated_|vectorized_|unrolled_)?elementwise_kernel"
    r"(?:_with_index)?<(?:(?:\d+|int|long), )*(?:at::native::gpu_kernel_impl(?:_nocast)?<)?"
    r"at::native::(?:\(anonymous namespace\)::)?"
)

# What may run besides the candidate's Triton kernels: what guard.ATEN_GLUE's ops launch, and nothing
# that computes values a result could be made of
GLUE_KERNELS = (
    # cudaMemcpy and cudaMemset, as kineto names them ("Memcpy HtoD (Pageable -> Device)",
    # "Memset (Device)"): copies of whole buffers (.to, .clone, .item), zeroing
    re.compile(r"Memcpy [A-Za-z]+ \([A-Za-z ]+ -> [A-Za-z ]+\)\Z"),
    re.compile(r"Memset \([A-Za-z ]+\)\Z"),
    # fill_/zero_ (torch.zeros, ones, full, new_full, the timer's L2 flush): one value everywhere
    re.compile(_ELEMENTWISE + r"FillFunctor<"),
    # copy_/clone/contiguous/to(dtype): copies, with a cast or a change of strides
    re.compile(_ELEMENTWISE + r"(?:direct|float8|float16|bfloat16)_copy_kernel_cuda\("),
    # arange, which guard.ATEN_GLUE allows too: indices, not values of the inputs
    # (torch 2.11 on an H200: `void (anonymous namespace)::elementwise_kernel_with_index<int,
    # at::native::arange_cuda_out(...)::...`)
    re.compile(
        r"(?:void )?\(anonymous namespace\)::elementwise_kernel_with_index<(?:int|long), "
        r"at::native::arange_cuda_out\("
    ),
    # Not allowed (guard.ATEN_GLUE refuses these ops too): CatArrayBatchedCopy (cat), index, gather,
    # scatter, masked_fill, where; every reduction, softmax, norm, matmul and pointwise compute kernel.
)

# Kineto records on the device that are not work the device did
_NOT_WORK = {"gpu_user_annotation", "cuda_profiler_range", "cuda_sync"}

_KINDS = (  # for the message only: what an offending kernel most likely is
    ("cuDNN", re.compile(r"cudnn", re.IGNORECASE)),
    ("flash attention", re.compile(r"flash|fmha", re.IGNORECASE)),
    ("cuBLAS", re.compile(r"cublas|gemm|gemv|xmma|nvjet|cutlass", re.IGNORECASE)),
    ("ATen compute", re.compile(r"at::|^(?:void )?\(anonymous namespace\)::")),
    ("another module's Triton kernel", re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")),
)


def _kernel(obj: Any) -> Any:
    """The JITFunction (or the interpreter's twin) behind obj, through autotune/heuristics wrappers."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for _ in range(16):  # a chain of wrappers, never a cycle
        if isinstance(obj, JITFunction | InterpretedFunction):
            return obj
        if not isinstance(obj, Autotuner | Heuristics):
            return None
        obj = obj.fn
    return None


def triton_kernel_names(module: ModuleType) -> set[str]:
    """The kernel names of the Triton functions module defines: at its top level, or in a class it
    defines. A kernel imported from another module is not the candidate's own."""
    owners: list[Any] = [module]
    owners += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    names = set()
    for owner in owners:
        for value in list(vars(owner).values()):
            kernel = _kernel(value.__func__ if isinstance(value, staticmethod) else value)
            fn = getattr(kernel, "fn", None)
            if fn is None or getattr(fn, "__module__", None) != module.__name__:
                continue
            name = fn.__qualname__.rsplit(".", 1)[-1]
            if IDENTIFIER.fullmatch(name):
                names.add(name)
    return names


def _field(event: Any, attr: str, default: Any = None) -> Any:
    value = getattr(event, attr, default)
    return value() if callable(value) else value


def _work(events: Any) -> Iterator[Any]:
    """The profiler's records of work on the GPU (kernels, copies), not annotations or host ranges."""
    from torch.profiler import DeviceType

    for e in events:
        if _field(e, "device_type") != DeviceType.CUDA:
            continue
        if _field(e, "activity_type") in _NOT_WORK or _field(e, "is_user_annotation", False):
            continue
        yield e


def record_kernels(fn: Callable[[], Any]) -> list[str]:
    """Run fn() once under the profiler on CUDA; the names of the kernels, memcpys and memsets the device
    ran, in start order. A device record of a kind not known to be bookkeeping is kept: a kernel is never
    dropped for being of a kind this code did not expect."""
    from torch.profiler import ProfilerActivity, profile

    _SYNC()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _SYNC()  # inside: a kernel still running when the profiler stops may never be flushed to it
    # the raw records: prof.events() drops a few names (aten::is_leaf ...) a demangled kernel could take
    results = getattr(prof.profiler, "kineto_results", None)
    events = results.events() if results is not None else prof.events()
    found = []
    for e in _work(events):
        start = _field(e, "start_ns", None)
        found.append((start if start is not None else _field(e, "start_us", 0) * 1000, _field(e, "name")))
    return [name for _, name in sorted(found, key=lambda x: x[0])]


@dynamo_free
class _Bracket(TorchDispatchMode):
    """Each call of an allowed ATen op inside a profiler range of a secret name, so that the kernels it
    launches (cuDNN's, cuBLAS's, the bias add of a convolution) are known for its own: a candidate cannot
    name a range it does not know."""

    def __init__(self, allowed_aten: frozenset[str], secret: str) -> None:
        super().__init__()
        self.allowed, self.secret = allowed_aten, secret

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.overloadpacket.__name__ not in self.allowed:
            return func(*args, **(kwargs or {}))
        from torch.profiler import record_function

        with record_function(self.secret):
            return func(*args, **(kwargs or {}))


def attribute(events: list[Any], secret: str) -> list[tuple[str, bool]]:
    """The device's work records in start order, each with whether the host op that launched it (its
    linked correlation) ran inside a range named `secret` on the same thread. A record whose launching op
    is not found is outside."""
    from torch.profiler import DeviceType

    host = {}
    ranges: dict[Any, list[tuple[int, int]]] = {}
    for e in events:
        if _field(e, "device_type") == DeviceType.CUDA:
            continue
        span = (_field(e, "start_ns", 0), _field(e, "end_ns", 0))
        host[_field(e, "correlation_id", 0)] = (_field(e, "start_thread_id", 0), span)
        if _field(e, "name") == secret:
            ranges.setdefault(_field(e, "start_thread_id", 0), []).append(span)
    found = []
    for e in _work(events):
        launched = host.get(_field(e, "linked_correlation_id", 0))
        inside = launched is not None and any(
            a <= launched[1][0] and launched[1][1] <= b for a, b in ranges.get(launched[0], [])
        )
        found.append((_field(e, "start_ns", 0), _field(e, "name"), inside))
    return [(name, inside) for _, name, inside in sorted(found, key=lambda x: x[0])]


def record_attributed(fn: Callable[[], Any], allowed_aten: frozenset[str]) -> list[tuple[str, bool]]:
    """Run fn() once under the profiler (host and device) on CUDA, each allowed ATen op bracketed; each
    kernel, memcpy and memset the device ran, and whether an allowed op launched it."""
    from torch.profiler import ProfilerActivity, profile

    secret = f"kb_allowed_{secrets.token_hex(16)}"
    _SYNC()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with _Bracket(allowed_aten, secret):
            fn()
        _SYNC()
    results = getattr(prof.profiler, "kineto_results", None)
    return attribute(results.events() if results is not None else prof.events(), secret)


def allowed(name: str, allowed_triton: set[str]) -> bool:
    if name in allowed_triton and IDENTIFIER.fullmatch(name) and not LIBRARY_NAME.match(name):
        return True
    return any(p.match(name) for p in GLUE_KERNELS)


def classify(names: list[str], allowed_triton: set[str]) -> list[str]:
    """The names that break the rule, each once, in the order they first ran."""
    return list(dict.fromkeys(n for n in names if not allowed(n, allowed_triton)))


def short(name: str, limit: int = 90) -> str:
    """A kernel name for a message: no `void `, no argument list, at most limit characters."""
    name = name.removeprefix("void ")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i] if i else name
                break
    name = name.rstrip()
    return name if len(name) <= limit else name[: limit - 3] + "..."


def kind(name: str) -> str:
    return next((label for label, p in _KINDS if p.search(name)), "other")


def check_launches(
    fn: Callable[[], Any],
    allowed_triton: set[str],
    require_own: bool = True,
    allowed_aten: frozenset[str] = frozenset(),
) -> None:
    """Run fn() once under the profiler; Violation if it launched a kernel that is not the candidate's own
    Triton kernel nor an allocation/copy kernel, nor (a candidate labelled with classes of torch ops)
    launched by one of `allowed_aten`'s ops; or (require_own) none of its Triton kernels at all."""
    if allowed_aten:
        records = record_attributed(fn, allowed_aten)
        names = [n for n, _ in records]
        bad = classify([n for n, inside in records if not inside], allowed_triton)
    else:
        names = record_kernels(fn)
        bad = classify(names, allowed_triton)
    if bad:
        kinds = ", ".join(dict.fromkeys(kind(n) for n in bad))
        shown = ", ".join(short(n) for n in bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        renamed = (
            " (a Triton kernel may not take a library's kernel name)"
            if any(n in allowed_triton for n in bad)
            else ""
        )
        raise Violation(
            f"forward launched kernels that are not its own Triton kernels ({kinds}): {shown}{renamed}; "
            "only its Triton kernels and allocation/copy kernels may run"
            + (", and those of the torch ops it is labelled to keep" if allowed_aten else "")
        )
    if require_own and not any(n in allowed_triton for n in names):
        raise Violation(
            "forward ran none of its own Triton kernels on the device; the work must be done by them"
        )
