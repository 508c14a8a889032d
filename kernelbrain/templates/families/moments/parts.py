"""The moments family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator): normalisation by statistics of the batch, three launches.

The statistics: the input read as [A, K, L], one mean and variance per k over its A x L elements (batch
norm: [N, C, spatial], a channel's over the batch; group norm: [1, N x G, C / G x spatial], a group's
contiguous run; instance norm: [1, N x C, spatial]). Programs (k, part) sum their share's distances from
the statistic's first element in fp32 (a shift that keeps the variance from cancelling), and a second
launch combines the parts into mean and 1/sqrt(var + eps), updating the running statistics the way
torch's batch norm does (unbiased variance, momentum) and counting the batch. The map, over [N, C, S]:
`y = (x - mean[stat]) * rstd[stat] * w[c] + b[c]`, stat = n x SN + c // CG.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _moments_kernel(x_ptr, part_ptr, A, K, L, a_chunk, l_chunk, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr):
    """Programs (k block, a part, l part): BLOCK_K statistics a program, so that a short run (a group of
    one channel, an instance of a few pixels) is not a program of its own."""
    k = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = k < K
    pa = tl.program_id(1)
    pl = tl.program_id(2)
    shift = tl.load(x_ptr + k * L, mask=kmask, other=0.0).to(tl.float32)
    s1 = tl.zeros([BLOCK_K, BLOCK_L], tl.float32)
    s2 = tl.zeros([BLOCK_K, BLOCK_L], tl.float32)
    l_end = tl.minimum(pl * l_chunk + l_chunk, L)
    for a in range(pa * a_chunk, tl.minimum(pa * a_chunk + a_chunk, A)):
        row = x_ptr + (a * K + k[:, None]) * L
        for l0 in range(pl * l_chunk, l_end, BLOCK_L):
            offs = l0 + tl.arange(0, BLOCK_L)
            mask = kmask[:, None] & (offs < l_end)[None, :]
            v = tl.load(row + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, v - shift[:, None], 0.0)
            s1 += d
            s2 += d * d
    parts = tl.num_programs(1) * tl.num_programs(2)
    at = (k * parts + pa * tl.num_programs(2) + pl) * 2
    tl.store(part_ptr + at, tl.sum(s1, axis=1), mask=kmask)
    tl.store(part_ptr + at + 1, tl.sum(s2, axis=1), mask=kmask)


@triton.jit
def _moments_finish(
    x_ptr, part_ptr, mean_ptr, rstd_ptr, rm_ptr, rv_ptr, count_ptr, K, L, parts, n, eps, momentum,
    RUNNING: tl.constexpr, COUNT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = k < K
    p = tl.arange(0, BLOCK_P)
    at = (k[:, None].to(tl.int64) * parts + p[None, :]) * 2
    pmask = kmask[:, None] & (p < parts)[None, :]
    s1 = tl.sum(tl.load(part_ptr + at, mask=pmask, other=0.0), axis=1)
    s2 = tl.sum(tl.load(part_ptr + at + 1, mask=pmask, other=0.0), axis=1)
    shift = tl.load(x_ptr + k.to(tl.int64) * L, mask=kmask, other=0.0).to(tl.float32)
    mean_d = s1 / n
    var = tl.maximum(s2 / n - mean_d * mean_d, 0.0)
    mean = shift + mean_d
    tl.store(mean_ptr + k, mean, mask=kmask)
    tl.store(rstd_ptr + k, 1.0 / tl.sqrt(var + eps), mask=kmask)
    if RUNNING:
        rm = tl.load(rm_ptr + k, mask=kmask, other=0.0)
        rv = tl.load(rv_ptr + k, mask=kmask, other=0.0)
        unbiased = var * (n / tl.maximum(n - 1.0, 1.0))
        rm = (1.0 - momentum) * rm + momentum * mean
        rv = (1.0 - momentum) * rv + momentum * unbiased
        tl.store(rm_ptr + k, rm.to(rm_ptr.dtype.element_ty), mask=kmask)
        tl.store(rv_ptr + k, rv.to(rv_ptr.dtype.element_ty), mask=kmask)
    if COUNT and tl.program_id(0) == 0:  # the batch counted once
        tl.store(count_ptr, tl.load(count_ptr) + 1)


@triton.jit
def _moments_map(
    x_ptr, y_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, R, C, S, SN, CG, eps,
    VAR: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """A [ROWS, BLOCK] tile of x as [N x C, S]: rows are (n, c). VAR: rstd_ptr holds variances (the
    running ones of a batch norm in eval mode)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    c = rows % C
    stat = (rows // C) * SN + c // CG
    mean = tl.load(mean_ptr + stat, mask=rmask, other=0.0).to(tl.float32)
    scale = tl.load(rstd_ptr + stat, mask=rmask, other=1.0).to(tl.float32)
    if VAR:
        scale = 1.0 / tl.sqrt(scale + eps)
    if HAS_W:
        scale = scale * tl.load(w_ptr + c, mask=rmask, other=1.0).to(tl.float32)
    shift = tl.zeros([ROWS], tl.float32)
    if HAS_B:
        shift = tl.load(b_ptr + c, mask=rmask, other=0.0).to(tl.float32)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = rmask[:, None] & (offs < S)[None, :]
    at = rows[:, None] * S + offs[None, :]
    v = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    # the distance from the mean first: exact where x is its statistic's mean (a group of one element)
    y = (v - mean[:, None]) * scale[:, None] + shift[:, None]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=mask)


def _moments_tile(n: int, block: int) -> tuple[int, int]:
    """(rows, columns) of a tile of `block` elements over rows of n: as wide as a row needs, the rest of
    the block in rows."""
    cols = min(block, triton.next_power_of_2(n))
    return max(1, block // cols), cols


def _moments_map_launch(
    x: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor | None,
    b: torch.Tensor | None, c_: int, s_: int, sn: int, cg: int, eps: float, var: bool, block: int,
    num_warps: int,
) -> None:  # fmt: skip
    rows, cols = _moments_tile(s_, block)
    r_ = x.numel() // max(s_, 1)
    _moments_map[(triton.cdiv(r_, rows), triton.cdiv(s_, cols))](
        x, y, mean, rstd, w if w is not None else mean, b if b is not None else mean, r_, c_, s_, sn, cg,
        eps, VAR=var, HAS_W=w is not None, HAS_B=b is not None, ROWS=rows, BLOCK=cols, num_warps=num_warps,
    )  # fmt: skip


def _moments_launch(x, mode, group, w, b, rm, rv, count, eps, momentum, block, split, num_warps):
    """x normalised by its batch statistics: mode "batch" (per channel), "group" (`group` groups of
    channels per sample) or "instance" (per sample and channel); or "running": by the running ones."""
    x = x.contiguous()
    n_, c_ = x.shape[0], x.shape[1]
    s_ = x.numel() // max(n_ * c_, 1)
    if mode == "batch":
        a_, k_, l_, sn, cg = n_, c_, s_, 0, 1
    elif mode == "group":
        a_, k_, l_, sn, cg = 1, n_ * group, (c_ // group) * s_, group, c_ // group
    else:
        a_, k_, l_, sn, cg = 1, n_ * c_, s_, c_, 1
    y = torch.empty_like(x)
    if x.numel() == 0:
        return y
    if mode == "running":  # eval mode: the running statistics, per channel
        _moments_map_launch(x, y, rm, rv, w, b, c_, s_, 0, 1, eps, True, block, num_warps)
        return y
    block_k, block_l = _moments_tile(l_, block)  # runs shorter than a block: several statistics a program
    split = max(1, min(split, 8192 // triton.cdiv(k_, block_k)))  # enough programs to fill the GPU, no more
    split_a = min(split, a_)
    split_l = max(1, split // split_a) if block_k == 1 else 1
    a_chunk = triton.cdiv(a_, split_a)
    l_chunk = triton.cdiv(triton.cdiv(l_, split_l), block_l) * block_l
    split_a, split_l = triton.cdiv(a_, a_chunk), triton.cdiv(l_, l_chunk)
    part = torch.empty((k_, split_a * split_l, 2), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(k_, block_k), split_a, split_l)
    _moments_kernel[grid](
        x, part, a_, k_, l_, a_chunk, l_chunk, BLOCK_K=block_k, BLOCK_L=block_l, num_warps=num_warps
    )
    mean = torch.empty(k_, dtype=torch.float32, device=x.device)
    rstd = torch.empty(k_, dtype=torch.float32, device=x.device)
    running = rm is not None and rv is not None
    parts = split_a * split_l
    _moments_finish[(triton.cdiv(k_, 16),)](
        x, part, mean, rstd, rm if running else mean, rv if running else mean,
        count if count is not None else mean,
        k_, l_, parts, float(a_ * l_), eps, momentum, RUNNING=running,
        COUNT=count is not None, BLOCK_K=16, BLOCK_P=triton.next_power_of_2(parts),
    )  # fmt: skip
    _moments_map_launch(x, y, mean, rstd, w, b, c_, s_, sn, cg, eps, False, block, num_warps)
    return y
