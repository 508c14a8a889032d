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

from kernelbrain.templates.families.pointwise.parts import chain_stub

# a candidate holds its own copy of the plan (reduce.PLAN)
from kernelbrain.templates.families.reduce.planner import plan_reduction

# the candidate's own chains replace these (render.chain)
_prologue = _epilogue = chain_stub


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
    out_ptr, x0, x1, x2, x3,
    s0o, s0h, s0r, s0i, s1o, s1h, s1r, s1i, s2o, s2h, s2r, s2i, s3o, s3h, s3r, s3i,
    K, R, inner, blocks, chunks, chunk, n_total,
    N_IN: tl.constexpr, OP: tl.constexpr, PRE: tl.constexpr, POST: tl.constexpr, PROLOGUE: tl.constexpr,
    FINAL: tl.constexpr, COLS: tl.constexpr, WIDE: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Programs (k block, high index, chunk of R), the k block fastest, over the [outer, high, R, inner]
    view (reduce_plan), each input through its own strides (sNo, sNh, sNr, sNi). FINAL: the program's
    chunk is all of R and there is no high axis: it writes the result (post, epilogue, the output's
    dtype); else its fp32 partial at [high * chunks + chunk, k]. PROLOGUE: the loaded values go through
    it (not a split's partials, combined by a second launch). COLS: a k block is BLOCK_K neighbouring
    inner positions of one outer index, so the compiler sees each row of the tile contiguous (coalesced,
    vector loads where inner allows) and no lane divides. WIDE: offsets in int64 (some exceed int32)."""
    pid = tl.program_id(0)
    kb = pid % blocks
    part = pid // blocks
    if WIDE:
        kb = kb.to(tl.int64)
        part = part.to(tl.int64)
    h = part // chunks
    if COLS:
        per = tl.cdiv(inner, BLOCK_K)
        o = kb // per
        i = (kb % per) * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = i < inner
        k = o * inner + i
    else:
        o = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        i = 0
        kmask = o < K
        k = o
    # each input's offset of each row of the tile (inline: the interpreter pays for every jit call)
    b0 = o * s0o + h * s0h + i * s0i
    if N_IN > 1:
        b1 = o * s1o + h * s1h + i * s1i
    if N_IN > 2:
        b2 = o * s2o + h * s2h + i * s2i
    if N_IN > 3:
        b3 = o * s3o + h * s3h + i * s3i
    acc = tl.full([BLOCK_K, BLOCK_R], _identity(OP), tl.float32)
    idx = tl.zeros([BLOCK_K, BLOCK_R], tl.int32)
    tot = tl.zeros([BLOCK_K, BLOCK_R], tl.float32)
    start = (part % chunks) * chunk
    end = tl.minimum(start + chunk, R)
    for r0 in range(start, end, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        mask = kmask[:, None] & (r < end)[None, :]
        rw = r
        if WIDE:
            rw = r.to(tl.int64)
        v0 = tl.load(x0 + (b0[:, None] + (rw * s0r)[None, :]), mask=mask, other=0.0).to(tl.float32)
        v1 = v0
        v2 = v0
        v3 = v0
        if N_IN > 1:
            v1 = tl.load(x1 + (b1[:, None] + (rw * s1r)[None, :]), mask=mask, other=0.0).to(tl.float32)
        if N_IN > 2:
            v2 = tl.load(x2 + (b2[:, None] + (rw * s2r)[None, :]), mask=mask, other=0.0).to(tl.float32)
        if N_IN > 3:
            v3 = tl.load(x3 + (b3[:, None] + (rw * s3r)[None, :]), mask=mask, other=0.0).to(tl.float32)
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
        tl.store(out_ptr + part * K + k, _finish(acc, idx, tot, n_total, OP, 0), mask=kmask)


def _prod(sizes):
    out = 1
    for s in sizes:
        out *= s
    return out


def _reduce_launch(
    xs, dims, keepdim, out_dtype, op, pre, post, block_k, block_r, split, num_warps, divisor=0
):  # fmt: skip
    """The reduction of xs's prologue over `dims` (None or empty: all), shaped as torch shapes it; a sum
    divided by `divisor` where one is given (a size the reference divided by). The layout, the split and
    the tiles are plan_reduction's (templates/reduce_plan.py, copied beside this)."""
    x = xs[0]
    shape = list(torch.broadcast_shapes(*(t.shape for t in xs)))
    nd = len(shape)
    dims = sorted({d % max(nd, 1) for d in dims}) if dims else list(range(nd))
    kept = [d for d in range(nd) if d not in dims]
    out_shape = [1 if d in dims else s for d, s in enumerate(shape)] if keepdim else [shape[d] for d in kept]
    y = torch.empty(out_shape, dtype=out_dtype, device=x.device)
    if y.numel() == 0:
        return y
    views = [t.expand(shape) for t in xs]  # a broadcast axis at stride 0, nothing copied
    plan = plan_reduction(shape, dims, [list(v.stride()) for v in views], block_k, block_r, split, op)
    views = [
        v.permute(plan["order"]).contiguous() if c else v for v, c in zip(views, plan["copy"], strict=True)
    ]
    n_in = len(xs)
    pad = views + [views[0]] * (4 - n_in)
    strides = [s for four in plan["strides"] + [plan["strides"][0]] * (4 - n_in) for s in four]
    k_all, parts = plan["K"], plan["parts"]
    total, post = (divisor, 1) if divisor else (plan["n"], post)
    common = {"N_IN": n_in, "OP": op, "PRE": pre, "COLS": plan["cols"], "WIDE": plan["wide"]}
    common.update(BLOCK_K=plan["block_k"], BLOCK_R=plan["block_r"], num_warps=num_warps)
    shape_args = (k_all, plan["R"], plan["inner"], plan["blocks"], plan["chunks"], plan["chunk"], total)
    grid = (plan["blocks"] * parts,)
    if parts == 1:  # one launch, each program all of R
        _reduce_kernel[grid](y, *pad, *strides, *shape_args, POST=post, PROLOGUE=True, FINAL=True, **common)
        return y
    part = torch.empty((parts, k_all), dtype=torch.float32, device=x.device)
    _reduce_kernel[grid](part, *pad, *strides, *shape_args, POST=0, PROLOGUE=True, FINAL=False, **common)
    # the partials combined by the same kernel, read in place as columns of [parts, K] (a norm's or a
    # mean's parts summed): no transposing copy
    block_k2, block_r2 = plan["block_k2"], plan["block_r2"]
    blocks = triton.cdiv(k_all, block_k2)
    second = {"N_IN": 1, "OP": op, "PRE": 0, "BLOCK_K": block_k2, "BLOCK_R": block_r2, "WIDE": plan["wide"]}
    args = (y, part, part, part, part, *((0, 0, k_all, 1) * 4), k_all, parts, k_all, blocks, 1, parts, total)
    _reduce_kernel[(blocks,)](
        *args, POST=post, PROLOGUE=False, FINAL=True, COLS=k_all > 1, num_warps=4, **second
    )
    return y
