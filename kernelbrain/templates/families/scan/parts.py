"""The scan family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator). The candidate's module defines `_prologue(v0, v1, v2, v3)` (the elementwise chain before the
scan, over its inputs) and `_epilogue(v0, v1, v2, v3)` (the chain after it, on the scanned value v0).

The input is read as an [outer, L, inner] view, L along the scan. The flips, slices and constant fills
the reference wrote around its scan are two affine maps along that axis: scan position p reads the
input at `src = B + p` (or `B - p`, FLIP_IN), FILL where src is outside [LO, HI) (a constant
concatenated before the scan); and is written at output position `o = p - B2` (or `B2 - p`, FLIP_OUT)
when p is in [LO2, HI2), the output positions outside [O_LO, O_HI) being FILL_OUT (a constant
concatenated after it). Each program takes BLOCK_K rows (neighbouring kept positions where inner > 1)
and walks the scan in BLOCK_R chunks: `tl.cumsum` or `tl.cumprod` within a chunk (Triton's own combine
functions: the interpreter runs them as numpy's cumsum and cumprod, a scan with a combine function of our
own element by element in Python, 20 times slower), the running total of the chunks before it carried
in. `OP`: 0 sum, 1 product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelbrain.templates.families.pointwise.parts import chain_stub

# the candidate's own chains replace these (render.chain)
_prologue = _epilogue = chain_stub


@triton.jit
def _scan_kernel(
    out_ptr, x0, x1, x2, x3, K, L, inner, n_scan, n_out, B, LO, HI, fill, B2, LO2, HI2, O_LO, O_HI,
    fill_out, N_IN: tl.constexpr, OP: tl.constexpr, FLIP_IN: tl.constexpr, FLIP_OUT: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = k < K
    base_in = (k // inner) * L * inner + (k % inner)
    base_out = (k // inner) * n_out * inner + (k % inner)
    identity = 1.0 if OP == 1 else 0.0
    carry = tl.full([BLOCK_K], identity, tl.float32)
    for p0 in range(0, n_scan, BLOCK_R):
        p = p0 + tl.arange(0, BLOCK_R)
        src = (B - p) if FLIP_IN else (B + p)
        valid = kmask[:, None] & ((src >= LO) & (src < HI) & (p < n_scan))[None, :]
        offs = base_in[:, None] + src[None, :].to(tl.int64) * inner
        v0 = tl.load(x0 + offs, mask=valid, other=0.0).to(tl.float32)
        v1 = v0
        v2 = v0
        v3 = v0
        if N_IN > 1:
            v1 = tl.load(x1 + offs, mask=valid, other=0.0).to(tl.float32)
        if N_IN > 2:
            v2 = tl.load(x2 + offs, mask=valid, other=0.0).to(tl.float32)
        if N_IN > 3:
            v3 = tl.load(x3 + offs, mask=valid, other=0.0).to(tl.float32)
        v = tl.where(valid, _prologue(v0, v1, v2, v3), fill)  # a constant concatenated before the scan
        v = tl.where((p < n_scan)[None, :], v, identity)
        if OP == 1:
            scanned = tl.cumprod(v, 1)
            out = carry[:, None] * scanned
            # the chunk's product: its scan's last column (positions past the scan hold the identity)
            last = (tl.arange(0, BLOCK_R) == BLOCK_R - 1)[None, :]
            carry = carry * tl.sum(tl.where(last, scanned, 0.0), axis=1)
        else:
            out = carry[:, None] + tl.cumsum(v, 1)
            carry = carry + tl.sum(v, axis=1)
        out = _epilogue(out, out, out, out)
        o = (B2 - p) if FLIP_OUT else (p - B2)
        where = base_out[:, None] + o[None, :].to(tl.int64) * inner
        keep = kmask[:, None] & ((p >= LO2) & (p < HI2) & (p < n_scan))[None, :]
        tl.store(out_ptr + where, out.to(out_ptr.dtype.element_ty), mask=keep)
    # the output positions no scan position reaches: a constant concatenated after the scan
    filled = tl.full([BLOCK_K, BLOCK_R], fill_out, tl.float32).to(out_ptr.dtype.element_ty)
    for f0 in range(0, O_LO, BLOCK_R):
        o = f0 + tl.arange(0, BLOCK_R)
        where = base_out[:, None] + o[None, :].to(tl.int64) * inner
        tl.store(out_ptr + where, filled, mask=kmask[:, None] & (o < O_LO)[None, :])
    for f0 in range(O_HI, n_out, BLOCK_R):
        o = f0 + tl.arange(0, BLOCK_R)
        where = base_out[:, None] + o[None, :].to(tl.int64) * inner
        tl.store(out_ptr + where, filled, mask=kmask[:, None] & (o < n_out)[None, :])


def _at(pos, size):
    """A traced slice bound, (0, v): v itself, (1, v): the size plus v."""
    return pos[1] + (size if pos[0] else 0)


def _back(ops, length):
    """The affine map from the last tensor of `ops` (each a layout op along the scanned axis, in the order
    the reference ran them, on a tensor `length` long there) back to the first: index a * i + b, valid
    in [lo, hi); and the last tensor's length and the fill of a concatenation, if any."""
    sizes, fill = [length], 0.0
    for op in ops:
        if op[0] == "slice":
            sizes.append(max(0, _at(op[2], sizes[-1]) - _at(op[1], sizes[-1])))
        elif op[0] == "cat":
            sizes.append(sizes[-1] + op[1])
            fill = op[2]
        else:
            sizes.append(sizes[-1])
    a, b, lo, hi = 1, 0, 0, sizes[-1]
    for op, size in zip(reversed(ops), reversed(sizes[:-1]), strict=True):
        if op[0] == "flip":
            a, b, lo, hi = -a, size - 1 - b, size - hi, size - lo
        elif op[0] == "slice":
            start = _at(op[1], size)
            b, lo, hi = b + start, lo + start, hi + start
        elif op[3]:  # a fill of op[1] in front
            b, lo, hi = b - op[1], max(lo, op[1]) - op[1], min(hi, op[1] + size) - op[1]
        else:
            lo, hi = max(lo, 0), min(hi, size)
    return a, b, lo, hi, sizes[-1], fill


def _scan_launch(xs, slices, dim, before, after, op, out_dtype, block_k, block_r, num_warps):
    """The scan of xs's prologue along `dim`, after `slices` ((dim, start, end) views of the other axes),
    with the layout ops the reference ran before and after it along `dim` (`before`, `after`)."""
    shape = list(torch.broadcast_shapes(*(x.shape for x in xs)))
    xs = [x.expand(shape) for x in xs]
    for d, start, end in slices:
        size = xs[0].shape[d]
        lo = _at(start, size)
        xs = [x.narrow(d, lo, max(0, _at(end, size) - lo)) for x in xs]
    xs = [x.contiguous() for x in xs]
    shape = list(xs[0].shape)
    dim = dim % len(shape)
    inner = 1
    for s in shape[dim + 1 :]:
        inner *= s
    a, b, lo, hi, n_scan, fill = _back(before, shape[dim])
    a2, b2, lo2, hi2, n_out, fill_out = _back(after, n_scan)
    o_lo, o_hi = (lo2 - b2, hi2 - b2) if a2 > 0 else (b2 - hi2 + 1, b2 - lo2 + 1)
    o_lo, o_hi = min(max(o_lo, 0), n_out), min(max(o_hi, 0), n_out)
    y = torch.empty([*shape[:dim], n_out, *shape[dim + 1 :]], dtype=out_dtype, device=xs[0].device)
    if y.numel() == 0:
        return y
    k_all = y.numel() // n_out
    if inner > 1:  # neighbouring kept positions are neighbours in memory: tile them, not the scan
        block_k, block_r = block_r, block_k
    block_r = min(block_r, triton.next_power_of_2(max(n_scan, n_out, 1)))
    pads = xs + [xs[0]] * (4 - len(xs))
    grid = (triton.cdiv(k_all, block_k),)
    _scan_kernel[grid](
        y, *pads, k_all, shape[dim], inner, n_scan, n_out, b, lo, hi, fill, b2, lo2, hi2, o_lo, o_hi,
        fill_out, N_IN=len(xs), OP=op, FLIP_IN=a < 0, FLIP_OUT=a2 < 0, BLOCK_K=block_k,
        BLOCK_R=block_r, num_warps=num_warps,
    )  # fmt: skip
    return y
