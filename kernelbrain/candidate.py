"""kb's candidate API: what a candidate module may use beyond kb's candidate subset (core/subset.py),
imported as `from kernelbrain import candidate`. kb's templates use it, and so may an LLM's kernels.

The subset refuses what reaches past the gate's view (Triton's driver and compiled-kernel objects,
`data_ptr`, os.environ, module-level dicts that persist between calls); what a fast kernel legitimately
needs of those is here, answering numbers only and holding no tensors:

- `INTERPRETED`: whether kernels run through Triton's interpreter (`TRITON_INTERPRET=1`);
- `sm_count(device)`: a CUDA device's streaming multiprocessors (4 elsewhere), for persistent grids;
- `device_properties(device)`: Triton's view of the device (registers, shared memory, ...), as ints;
- `programs_per_sm(kernel, *args, cap=..., **meta)`: how many programs of a kernel, compiled for those
  arguments, one SM holds at once (a kernel whose programs wait for each other must fit the grid), by
  `programs_fitting`'s arithmetic;
- `LaunchCache()`: launch configurations by a key of shapes and dtypes, numbers only;
- `aligned(tensor, n)`: whether a tensor's data starts at a multiple of n bytes.

Each answer is remembered per device or key, so a call on the hot path costs a dict lookup. `kb export`
copies this module into an exported file, which then needs torch and triton only.
"""

from __future__ import annotations

import os
from typing import Any

import torch

INTERPRETED: bool = os.environ.get("TRITON_INTERPRET") == "1"
_OFF_CUDA_SMS = 4  # a grid of a few programs where there is no SM to fill (the interpreter, the CPU)
_SMS: dict[int, int] = {}
_PROPERTIES: dict[int, dict[str, int]] = {}
_RESIDENT: dict[tuple[Any, ...], int] = {}
_PLAIN = (int, float, bool, str, type(None), torch.dtype)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA device; 4 on any other device."""
    if device.type != "cuda":
        return _OFF_CUDA_SMS
    i = _index(device)
    if i not in _SMS:
        _SMS[i] = int(torch.cuda.get_device_properties(i).multi_processor_count)
    return _SMS[i]


def device_properties(device: torch.device) -> dict[str, int]:
    """Triton's properties of a CUDA device (max_num_regs, max_shared_mem, multiprocessor_count,
    warpSize, ...), a copy of ints; {} on any other device."""
    if device.type != "cuda":
        return {}
    i = _index(device)
    if i not in _PROPERTIES:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(i)
        _PROPERTIES[i] = {k: int(v) for k, v in props.items() if isinstance(v, int)}
    return dict(_PROPERTIES[i])


def aligned(t: torch.Tensor, n: int = 16) -> bool:
    """Whether t's data starts at a multiple of n bytes (Triton specialises kernels on 16)."""
    return t.data_ptr() % n == 0


def _specialisation(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments as Triton specialises a kernel on them: a tensor by dtype and 16-byte alignment, an
    integer by divisibility by 16, equality to 1 and width, anything else by value."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.dtype, aligned(a)))
        elif isinstance(a, int) and not isinstance(a, bool):
            out.append((a % 16 == 0, a == 1, a >= 2**31))
        else:
            out.append(a)
    return tuple(out)


def programs_fitting(n_regs: int, shared: int, num_warps: int, max_regs: int, max_shared: int) -> int:
    """Programs of a kernel (n_regs registers a thread, `shared` bytes of shared memory, num_warps) one
    SM holds at once: registers go out by warp in blocks of 256 from each of the SM's 4 quarters; each
    program takes 1 KiB of shared memory beyond its own (max_shared, the most one program may have, is
    the SM's less that KiB); at most 2048 threads and 32 programs."""
    per_warp = -(-n_regs * 32 // 256) * 256
    by_regs = max_regs // 4 // max(per_warp, 1) * 4 // num_warps
    by_shared = (max_shared + 1024) // (shared + 1024)
    return min(by_regs, by_shared, 2048 // (32 * num_warps), 32)


def programs_per_sm(kernel: Any, *args: Any, cap: int, **meta: Any) -> int:
    """How many programs of `kernel` (a @triton.jit function), compiled for `args` and `meta` (its
    constexprs and num_warps), one SM holds at once, at most `cap` and at least 1; `cap` off CUDA.
    Compiled once per specialisation (its registers depend on the Triton and ptxas versions and on the
    arguments' alignment), then remembered: a program waiting on one that never started would spin."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if device is None or device.type != "cuda" or INTERPRETED:
        return cap
    key = (_index(device), id(kernel), cap, _specialisation(args), tuple(sorted(meta.items())))
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), **meta)
        compiled._init_handles()
        props = device_properties(device)
        fit = programs_fitting(
            compiled.n_regs,
            compiled.metadata.shared,
            meta.get("num_warps", 4),
            props["max_num_regs"],
            props["max_shared_mem"],
        )
        _RESIDENT[key] = max(1, min(cap, fit))
    return _RESIDENT[key]


class LaunchCache:
    """Launch configurations by key: keys and values are numbers, strings, booleans, None, dtypes and
    tuples of them (a shape, a block size, a grid), never tensors; so nothing computed from an input's
    contents can pass from one call to the next through it."""

    def __init__(self) -> None:
        self._held: dict[Any, Any] = {}

    @staticmethod
    def _plain(value: Any) -> bool:
        if isinstance(value, tuple):
            return all(LaunchCache._plain(v) for v in value)
        return isinstance(value, (_PLAIN, torch.Size))

    def get(self, key: Any, default: Any = None) -> Any:
        """The configuration held for key, else default."""
        return self._held.get(key, default)

    def remember(self, key: Any, value: Any) -> Any:
        """Hold value for key and return it; TypeError for a key or value that is not plain data."""
        if not (self._plain(key) and self._plain(value)):
            raise TypeError("LaunchCache holds numbers, strings, dtypes and tuples of them, never tensors")
        self._held[key] = value
        return value
