"""The pooling family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator). The candidate's module defines `_prologue(v0)` (the elementwise chain before the pooling, on
each element read) and `_epilogue(v0)` (the chain after it, on each window's result).

The input is read as [planes, D, H, W] (planes: every axis before the pooled ones; 1-D and 2-D pooling
have D = H = 1 and a window of 1 there). Each program computes BLOCK neighbouring outputs of one output
row (no division a position), visiting the window's KD x KH x KW taps as unrolled loads (neighbouring
outputs share most of their taps, which the caches serve). `MAX`: the largest tap (padding never wins);
else the average, divided as torch divides it: by `DIVISOR` when set, else by the window's taps inside
the padded input (COUNT_PAD) or inside the input itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _prologue(v0):  # replaced by the candidate's own
    return v0


@triton.jit
def _epilogue(v0):  # replaced by the candidate's own
    return v0


@triton.jit
def _pool_kernel(
    y_ptr, x_ptr, D, H, W, OD, OH, OW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, MAX: tl.constexpr, COUNT_PAD: tl.constexpr,
    DIVISOR: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Programs (output row, block of the row): the row's plane, od and oh are scalars, worked out once a
    program; only the positions along the row are a vector."""
    row = tl.program_id(0).to(tl.int64)
    oh = row % OH
    od = (row // OH) % OD
    plane = row // (OH * OD)
    ow = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = ow < OW
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    base = plane * D * H * W
    acc = tl.full([BLOCK], -float("inf") if MAX else 0.0, tl.float32)
    for kd in tl.static_range(KD):
        d = d0 + kd * DD
        for kh in tl.static_range(KH):
            h = h0 + kh * DH
            # the row's width where the tap's input row exists, else 0 (a scalar, compared as a vector)
            width = tl.where((d >= 0) & (d < D) & (h >= 0) & (h < H), W, 0)
            for kw in tl.static_range(KW):
                w = w0 + kw * DW
                inside = live & (w >= 0) & (w < width)
                v = tl.load(x_ptr + base + (d * H + h) * W + w, mask=inside, other=0.0).to(tl.float32)
                v = _prologue(v)
                if MAX:
                    acc = tl.maximum(acc, tl.where(inside, v, -float("inf")))
                else:
                    acc += tl.where(inside, v, 0.0)
    if not MAX:
        if DIVISOR > 0:
            acc = acc / DIVISOR
        else:
            # the window's extent, clipped to the padded input (COUNT_PAD) or to the input
            d1 = tl.minimum(d0 + KD, D + PD)
            h1 = tl.minimum(h0 + KH, H + PH)
            w1 = tl.minimum(w0 + KW, W + PW)
            if COUNT_PAD:
                n = (d1 - d0) * (h1 - h0) * (w1 - w0)
            else:
                n = (tl.minimum(d1, D) - tl.maximum(d0, 0)) * (tl.minimum(h1, H) - tl.maximum(h0, 0))
                n = n * (tl.minimum(w1, W) - tl.maximum(w0, 0))
            acc = acc / tl.maximum(n, 1).to(tl.float32)
    tl.store(y_ptr + row * OW + ow, _epilogue(acc).to(y_ptr.dtype.element_ty), mask=live)


def _out_size(size, k, s, p, dil, ceil):
    span = size + 2 * p - dil * (k - 1) - 1
    out = (span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:  # the last window starts in the right padding: dropped
        out -= 1
    return out


def _pool_launch(x, pre, post, spatial, kernel, stride, padding, dilation, ceil, pool_max, count_pad, divisor,
                 out_dtype, block, num_warps):  # fmt: skip
    """The pooling of x over its last `spatial` axes (after the view ops `pre`; `post` after it)."""
    for op, d in pre:
        x = x.unsqueeze(d) if op == "unsqueeze" else x.squeeze(d)
    x = x.contiguous()
    lead, sizes = list(x.shape[: x.dim() - spatial]), list(x.shape[x.dim() - spatial :])
    pad = 3 - spatial
    dims = [1] * pad + sizes
    k, s, dl = ([1] * pad + list(v) for v in (kernel, stride, dilation))
    p = [0] * pad + list(padding)
    outs = [_out_size(dims[i], k[i], s[i], p[i], dl[i], ceil) for i in range(3)]
    y = torch.empty(lead + outs[pad:], dtype=out_dtype, device=x.device)
    if y.numel():
        block = min(block, max(triton.next_power_of_2(outs[2]), 32 * num_warps))
        grid = (y.numel() // outs[2], triton.cdiv(outs[2], block))
        _pool_kernel[grid](
            y, x, *dims, *outs, *s, *p, *dl, KD=k[0], KH=k[1], KW=k[2], MAX=pool_max, COUNT_PAD=count_pad,
            DIVISOR=divisor or 0, BLOCK=block, num_warps=num_warps,
        )  # fmt: skip
    for op, d in post:
        y = y.unsqueeze(d) if op == "unsqueeze" else y.squeeze(d)
    return y
