"""The rmsnorm family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator): one kernel and one launcher per strategy.

The input is viewed as (N, C, S), the reduced dim C in the middle; a program takes a tile of BLOCK_S
contiguous positions of one n and reduces over their channels, every load a row of BLOCK_S contiguous
elements. `registers` holds all channels of the tile (one read of x); `looped` walks them in chunks of
BLOCK_C, summing squares and then reading each chunk again to normalise it (two reads).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_registers_kernel(x_ptr, y_ptr, C, S, n_tiles, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    pid = tl.program_id(0)
    n = (pid // n_tiles).to(tl.int64)
    s = (pid % n_tiles) * BLOCK_S + tl.arange(0, BLOCK_S)
    c = tl.arange(0, BLOCK_C)
    mask = (c[:, None] < C) & (s[None, :] < S)
    # rows of BLOCK_S contiguous positions, one row per channel: coalesced loads, reduction across rows
    offs = n * C * S + c[:, None].to(tl.int64) * S + s[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    tl.store(y_ptr + offs, (x / rms[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def _launch_registers(x, y, n_outer, C, S, eps, block_s, max_block, num_warps):
    """y = rmsnorm(x) over C, all C channels of a tile of up to `block_s` positions in registers."""
    block_c = triton.next_power_of_2(C)
    if block_c > max_block:
        raise ValueError(f"registers holds all {C} channels of a tile: more than {max_block}")
    block_s = max(1, min(block_s, triton.next_power_of_2(S), max_block // block_c))
    n_tiles = triton.cdiv(S, block_s)
    _rmsnorm_registers_kernel[(n_outer * n_tiles,)](
        x, y, C, S, n_tiles, eps, BLOCK_C=block_c, BLOCK_S=block_s, num_warps=num_warps
    )


@triton.jit
def _rmsnorm_looped_kernel(x_ptr, y_ptr, C, S, n_tiles, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    pid = tl.program_id(0)
    n = (pid // n_tiles).to(tl.int64)
    s = (pid % n_tiles) * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s[None, :] < S
    cc = tl.arange(0, BLOCK_C)
    x_tile = x_ptr + n * C * S + s[None, :]
    y_tile = y_ptr + n * C * S + s[None, :]
    # pass 1: sum of squares over channel chunks, reduced across the chunk rows once at the end
    acc = tl.zeros([BLOCK_C, BLOCK_S], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + cc
        mask = (c[:, None] < C) & s_mask
        x = tl.load(x_tile + c[:, None].to(tl.int64) * S, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rms = tl.sqrt(tl.sum(acc, axis=0) / C + eps)
    # pass 2: read each chunk again and normalise it
    for c0 in range(0, C, BLOCK_C):
        c = c0 + cc
        mask = (c[:, None] < C) & s_mask
        offs = c[:, None].to(tl.int64) * S
        x = tl.load(x_tile + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_tile + offs, (x / rms[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def _launch_looped(x, y, n_outer, C, S, eps, block_c, block_s, num_warps):
    """y = rmsnorm(x) over C, walked in chunks of `block_c` channels by tiles of `block_s` positions."""
    block_c = min(block_c, triton.next_power_of_2(C))
    block_s = min(block_s, triton.next_power_of_2(S))
    n_tiles = triton.cdiv(S, block_s)
    _rmsnorm_looped_kernel[(n_outer * n_tiles,)](
        x, y, C, S, n_tiles, eps, BLOCK_C=block_c, BLOCK_S=block_s, num_warps=num_warps
    )
