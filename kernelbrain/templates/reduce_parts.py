"""The reduction family's Triton parts (copied into a candidate by `templates.render`, never imported by
the generator). The candidate's module defines `_prologue(v0, v1, v2, v3)` (the elementwise chain
before the reduction, over its inputs) and `_epilogue(v0, v1, v2, v3)` (the chain after it, on the
reduced value v0); the kernels here reduce along R of an [outer, R, inner] view, in fp32.

`OP` combines (0 sum, 1 max, 2 min, 3 prod, 4 argmax, 5 argmin, 6 logsumexp: a running max and a
sum of exponentials under it, a lane's own, merged at the end); `PRE` maps each element after the
prologue (0 as is, 1 abs, 2 square: the L1 and L2 norms); `POST` finishes the combined value (0 as is,
1 divided by R: a mean, 2 its square root: the L2 norm). A split reduction writes fp32 partials of R's
chunks, and a second launch combines them (the first of an argmax's ties: smallest index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _prologue(v0, v1, v2, v3):  # replaced by the candidate's own
    return v0


@triton.jit
def _epilogue(v0, v1, v2, v3):  # replaced by the candidate's own
    return v0


@triton.jit
def _identity(OP: tl.constexpr):
    if OP == 1 or OP == 4 or OP == 6:
        return -float("inf")
    if OP == 2 or OP == 5:
        return float("inf")
    if OP == 3:
        return 1.0
    return 0.0


@triton.jit
def _finish(acc, idx, tot, n, OP: tl.constexpr, POST: tl.constexpr):
    """The combined value of each row of the [BLOCK_K, BLOCK_R] accumulators (an index for OP 4, 5; for
    OP 6 acc holds each lane's max and tot its sum of exp(x - that max))."""
    if OP == 6:
        top = tl.max(acc, axis=1)
        shift = tl.where(_infinite(top), 0.0, top)
        out = shift + tl.log(tl.sum(tot * tl.exp(acc - shift[:, None]), axis=1))
    elif OP == 0:
        out = tl.sum(acc, axis=1)
    elif OP == 1:
        out = tl.max(acc, axis=1)
    elif OP == 2:
        out = tl.min(acc, axis=1)
    elif OP == 3:
        out = tl.reduce(acc, 1, _times)
    else:
        best = tl.max(acc, axis=1) if OP == 4 else tl.min(acc, axis=1)
        hit = acc == best[:, None]
        out = tl.min(tl.where(hit, idx, 2147483647), axis=1).to(tl.float32)
    if POST == 1:
        out = out / n
    if POST == 2:
        out = tl.sqrt(out)
    return out


@triton.jit
def _times(a, b):
    return a * b


@triton.jit
def _infinite(x):
    return (x == float("inf")) | (x == -float("inf"))


@triton.jit
def _reduce_kernel(
    out_ptr, x0, x1, x2, x3, K, R, inner, chunk, n_total,
    N_IN: tl.constexpr, OP: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, PROLOGUE: tl.constexpr,
    FINAL: tl.constexpr, COLS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Programs (k block, chunk of R). FINAL: the chunk is all of R, and the program writes the result
    (post, epilogue, the output's dtype); else it writes its chunk's fp32 partial at [split, k].
    PROLOGUE: the loaded values go through it (not a split's partials, combined by a second launch).
    COLS: a k block is BLOCK_K neighbouring inner positions of one outer index, so the compiler sees
    each row of the tile contiguous (coalesced, vector loads where inner allows) and no lane divides."""
    split = tl.program_id(1)
    if COLS:
        blocks = tl.cdiv(inner, BLOCK_K)
        outer = (tl.program_id(0) // blocks).to(tl.int64)
        i = (tl.program_id(0) % blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = i < inner
        base = outer * R * inner + i
        k = outer * inner + i
    else:
        k = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = k < K
        base = (k // inner) * R * inner + (k % inner)
    acc = tl.full([BLOCK_K, BLOCK_R], _identity(OP), tl.float32)
    idx = tl.zeros([BLOCK_K, BLOCK_R], tl.int32)
    tot = tl.zeros([BLOCK_K, BLOCK_R], tl.float32)
    start = split * chunk
    for r0 in range(start, tl.minimum(start + chunk, R), BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        mask = kmask[:, None] & (r < tl.minimum(start + chunk, R))[None, :]
        offs = base[:, None] + r[None, :].to(tl.int64) * inner
        v0 = tl.load(x0 + offs, mask=mask, other=0.0).to(tl.float32)
        v1 = v0
        v2 = v0
        v3 = v0
        if N_IN > 1:
            v1 = tl.load(x1 + offs, mask=mask, other=0.0).to(tl.float32)
        if N_IN > 2:
            v2 = tl.load(x2 + offs, mask=mask, other=0.0).to(tl.float32)
        if N_IN > 3:
            v3 = tl.load(x3 + offs, mask=mask, other=0.0).to(tl.float32)
        v = v0
        if PROLOGUE:
            v = _prologue(v0, v1, v2, v3)
        if PRE == 1:
            v = tl.abs(v)
        if PRE == 2:
            v = v * v
        v = tl.where(mask, v, _identity(OP))
        if OP == 0:
            acc += v
        elif OP == 1:
            acc = tl.maximum(acc, v)
        elif OP == 2:
            acc = tl.minimum(acc, v)
        elif OP == 3:
            acc *= v
        elif OP == 6:  # a lane with nothing yet (max -inf) adds exp(-inf) = 0, never -inf - -inf
            top = tl.maximum(acc, v)
            shift = tl.where(_infinite(top), 0.0, top)
            tot = tot * tl.exp(acc - shift) + tl.exp(v - shift)
            acc = top
        else:
            better = v > acc if OP == 4 else v < acc  # strict: a lane keeps its first occurrence
            idx = tl.where(better, r[None, :] + tl.zeros([BLOCK_K, BLOCK_R], tl.int32), idx)
            acc = tl.where(better, v, acc)
    if FINAL:
        out = _finish(acc, idx, tot, n_total, OP, POST)
        out = _epilogue(out, out, out, out)
        tl.store(out_ptr + k, out.to(out_ptr.dtype.element_ty), mask=kmask)
    else:
        tl.store(out_ptr + split * K + k, _finish(acc, idx, tot, n_total, OP, 0), mask=kmask)


def _prod(sizes):
    out = 1
    for s in sizes:
        out *= s
    return out


def _reduce_launch(
    xs, dims, keepdim, out_dtype, op, pre, post, block_k, block_r, split, num_warps, divisor=0
):  # fmt: skip
    """The reduction of xs's prologue over `dims` (None or empty: all), shaped as torch shapes it; a sum
    divided by `divisor` where one is given (a size the reference divided by)."""
    x = xs[0]
    shape = list(torch.broadcast_shapes(*(t.shape for t in xs)))
    nd = len(shape)
    dims = sorted({d % max(nd, 1) for d in dims}) if dims else list(range(nd))
    kept = [d for d in range(nd) if d not in dims]
    out_shape = [1 if d in dims else s for d, s in enumerate(shape)] if keepdim else [shape[d] for d in kept]
    y = torch.empty(out_shape, dtype=out_dtype, device=x.device)
    n = _prod(shape[d] for d in dims)
    total, post = (divisor, 1) if divisor else (n, post)
    if y.numel() == 0:
        return y
    if not dims or dims == list(range(dims[0], dims[-1] + 1)):
        xs = [t.expand(shape).contiguous() for t in xs]
        inner = _prod(shape[dims[-1] + 1 :]) if dims else 1
    else:  # reduced dims apart: moved last
        xs = [t.expand(shape).permute(kept + dims).contiguous() for t in xs]
        inner = 1
    k_all = y.numel()
    cols = inner > 1
    if cols:  # neighbouring kept positions are neighbours in memory: tile them, R across the tile's rows
        tile = block_k * block_r
        block_k = min(block_r, triton.next_power_of_2(inner))
        block_r = max(1, tile // block_k)
    block_r = min(block_r, triton.next_power_of_2(max(n, 1)))
    n_in = len(xs)
    pad = xs + [xs[0]] * (4 - n_in)
    common = {"N_IN": n_in, "OP": op, "PRE": pre, "BLOCK_K": block_k, "BLOCK_R": block_r}
    common["num_warps"] = num_warps
    programs = k_all // inner * triton.cdiv(inner, block_k) if cols else triton.cdiv(k_all, block_k)
    if op >= 4 or split <= 1 or n < 2 * block_r * split:  # one launch, each program all of R
        grid = (programs, 1)
        args = (y, *pad, k_all, n, inner, n, total)
        _reduce_kernel[grid](*args, POST=post, PROLOGUE=True, FINAL=True, COLS=cols, **common)
        return y
    chunk = triton.cdiv(triton.cdiv(n, split), block_r) * block_r
    split = triton.cdiv(n, chunk)
    part = torch.empty((split, k_all), dtype=torch.float32, device=x.device)
    grid = (programs, split)
    args = (part, *pad, k_all, n, inner, chunk, n)
    _reduce_kernel[grid](*args, POST=0, PROLOGUE=True, FINAL=False, COLS=cols, **common)
    # the partials combined by the same kernel, read in place as columns of [split, K] (a norm's or a
    # mean's parts summed): no transposing copy
    rows = min(16, triton.next_power_of_2(split))
    second = {"N_IN": 1, "OP": op, "PRE": 0, "BLOCK_K": 128, "BLOCK_R": rows}
    grid = (triton.cdiv(k_all, 128), 1)
    args = (y, part, part, part, part, k_all, split, k_all, split, total)
    _reduce_kernel[grid](*args, POST=post, PROLOGUE=False, FINAL=True, COLS=True, num_warps=4, **second)
    return y
