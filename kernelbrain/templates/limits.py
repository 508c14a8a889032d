"""The one table of device limits the families size their knob sets against, by compute capability.

`feasible` runs in the generator, which never sees the GPU: a family judges a knob set against the
device kb's templates are measured on (TARGET, the H100/H200's sm_90), not the one a run may land on; a
set past a smaller part's limits fails that part's gate at run time (wasted budget, not a wrong result).
Kernels that size themselves at run time (row_softmax's resident grid, pointwise's persistent one) read
the device's own properties instead.

The figures are NVIDIA's (CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability"): shared memory a block may opt in to and an SM holds, 32-bit registers an SM holds and one
thread may address, and the grid's second axis. `sms`, the multiprocessors, is the one figure a product
sets rather than its compute capability: the named data-centre part's.
"""

from __future__ import annotations

from typing import NamedTuple


class Limits(NamedTuple):
    smem_per_block: int  # bytes of shared memory one block may use (the opt-in maximum)
    smem_per_sm: int  # bytes of shared memory one SM holds
    regs_per_sm: int  # 32-bit registers one SM holds
    regs_per_thread: int  # 32-bit registers one thread may address
    grid_y: int  # programs along the grid's second axis
    sms: int  # streaming multiprocessors of the part named in LIMITS


KIB = 1024
LIMITS: dict[tuple[int, int], Limits] = {
    (8, 0): Limits(163 * KIB, 164 * KIB, 65536, 255, 65535, 108),  # A100 SXM
    (8, 6): Limits(99 * KIB, 100 * KIB, 65536, 255, 65535, 84),  # A40 (and the RTX 30s)
    (8, 9): Limits(99 * KIB, 100 * KIB, 65536, 255, 65535, 142),  # L40S (and the RTX 40s)
    (9, 0): Limits(227 * KIB, 228 * KIB, 65536, 255, 65535, 132),  # H100 SXM, H200
    (10, 0): Limits(227 * KIB, 228 * KIB, 65536, 255, 65535, 148),  # B200
}
TARGET = LIMITS[(9, 0)]  # what feasible() judges knob sets against: the H100/H200 kb is measured on

# register budgets a thread keeps for one family's tiles, below TARGET.regs_per_thread's 255 so that
# addresses, masks and loop state fit beside them (past them the compiler spills)
ACC_PER_THREAD = 128  # fp32 accumulator (and operand tile) elements of a dot family
TILE_PER_THREAD = 64  # elements of a row tile, its fp32 copy and the weights beside it


def of(capability: tuple[int, int]) -> Limits:
    """The limits of a compute capability: its own row, else the nearest older one of its major (a
    consumer part of the same generation), else TARGET's."""
    if capability in LIMITS:
        return LIMITS[capability]
    older = [c for c in LIMITS if c[0] == capability[0] and c < capability]
    return LIMITS[max(older)] if older else TARGET
