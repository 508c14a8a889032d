"""The contraction family's Triton parts (copied into a candidate by `templates.render`, never imported by
the generator): y[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n], e1, e2, e3) over up to three batch
dims, every operand read through its strides (a transposed or broadcast operand is never copied).

`_contraction_kernel`: BLOCK_M x BLOCK_N output tiles (GROUP_M swizzled), K in BLOCK_K steps, the batch on
the grid's second axis. PRECISION ("ieee" or "tf32x3") chooses the fp32 dot (SPLIT: fp32 operands);
fp16/bf16 operands take a plain dot accumulating in fp32. The candidate's `_epilogue` (the traced chain,
emitted by `render.chain`) runs on the fp32 tile with the extra tensors loaded by their strides.
`_contraction_launch` lays the operands out from their sources (plans the family computed from the trace).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _dot_tile(a, b, acc, SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ b in fp32: exact ("ieee"), three TF32 dots of the hi/lo split ("tf32x3"; a fresh
    accumulator each tile, added in fp32: tensor cores truncate), or a plain dot of fp16/bf16."""
    if SPLIT:
        if PRECISION == "tf32x3":
            # low 13 of fp32's 23 mantissa bits cleared (-8192 == 0xFFFFE000): exact in TF32
            a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            part = tl.dot(a - a_hi, b_hi, input_precision="tf32")
            part = tl.dot(a_hi, b - b_hi, part, input_precision="tf32")
            acc += tl.dot(a_hi, b_hi, part, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _extra(ptr, b0, b1, b2, rm, rn, s_b0, s_b1, s_b2, s_m, s_n, mask):
    """An epilogue tensor's values at the tile, in fp32 (strides 0 where it broadcasts)."""
    base = ptr + b0 * s_b0 + b1 * s_b1 + b2 * s_b2
    offs = rm.to(tl.int64)[:, None] * s_m + rn.to(tl.int64)[None, :] * s_n
    return tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _contraction_kernel(a_ptr, b_ptr, y_ptr, e1_ptr, e2_ptr, e3_ptr, M, N, K, B1, B2,
                        sa_b0, sa_b1, sa_b2, sa_m, sa_k, sb_b0, sb_b1, sb_b2, sb_k, sb_n,
                        sy_b0, sy_b1, sy_b2, sy_m, sy_n,
                        s1_b0, s1_b1, s1_b2, s1_m, s1_n, s2_b0, s2_b1, s2_b2, s2_m, s2_n,
                        s3_b0, s3_b1, s3_b2, s3_m, s3_n,
                        EXTRAS: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):  # fmt: skip
    # GROUP_M row blocks walk the column blocks together: the B tiles they share stay in L2
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    b2 = batch % B2
    b1 = (batch // B2) % B1
    b0 = batch // (B2 * B1)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + b0 * sa_b0 + b1 * sa_b1 + b2 * sa_b2
    a_tile += rm.to(tl.int64)[:, None] * sa_m + rk.to(tl.int64)[None, :] * sa_k
    b_tile = b_ptr + b0 * sb_b0 + b1 * sb_b1 + b2 * sb_b2
    b_tile += rk.to(tl.int64)[:, None] * sb_k + rn.to(tl.int64)[None, :] * sb_n
    m_mask = rm[:, None] < M
    n_mask = rn[None, :] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0
        a = tl.load(a_tile, mask=m_mask & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_tile, mask=(rk[:, None] < k_left) & n_mask, other=0.0)
        acc = _dot_tile(a, b, acc, SPLIT, PRECISION)
        a_tile += BLOCK_K * sa_k
        b_tile += BLOCK_K * sb_k
    mask = m_mask & n_mask
    v1 = acc
    v2 = acc
    v3 = acc
    if EXTRAS >= 1:
        v1 = _extra(e1_ptr, b0, b1, b2, rm, rn, s1_b0, s1_b1, s1_b2, s1_m, s1_n, mask)
    if EXTRAS >= 2:
        v2 = _extra(e2_ptr, b0, b1, b2, rm, rn, s2_b0, s2_b1, s2_b2, s2_m, s2_n, mask)
    if EXTRAS >= 3:
        v3 = _extra(e3_ptr, b0, b1, b2, rm, rn, s3_b0, s3_b1, s3_b2, s3_m, s3_n, mask)
    out = _epilogue(acc, v1, v2, v3)  # noqa: F821 - the candidate's traced chain, rendered beside this
    y = y_ptr + b0 * sy_b0 + b1 * sy_b1 + b2 * sy_b2
    y += rm.to(tl.int64)[:, None] * sy_m + rn.to(tl.int64)[None, :] * sy_n
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask)


def _operand(srcs, plan):
    """An operand as a [pieces..., rows, cols] view of its source and the strides the kernel reads it
    by: plan = (source, order, groups), each group the source dims one logical dim merges (None: a
    batch piece the operand broadcasts over, stride 0). A copy only where the merged dims do not
    flatten by their strides."""
    src, order, groups = plan
    t = srcs[src].permute(order)
    sizes = [1 if g is None else math.prod(srcs[src].shape[d] for d in g) for g in groups]
    t = t.reshape(sizes)
    strides = [0 if g is None else s for g, s in zip(groups, t.stride(), strict=True)]
    return t, sizes, strides


def _size(srcs, atoms):
    return math.prod(srcs[s].shape[d] for s, d in atoms)


def _padded(strides, pieces):
    """Strides of [b0, b1, b2, m, n]: the batch pieces padded in front to three."""
    return [0] * (3 - pieces) + list(strides)


def _contraction_launch(srcs, a_plan, b_plan, out_axes, extras, dtype, precision, block_m, block_n,
                        block_k, group_m, num_warps, num_stages):  # fmt: skip
    """y = epilogue(A @ B, extras...) from the sources: plans as `_operand` reads them, `out_axes` the
    output's axes as (source, dim) atoms, `extras` (tensor, axes of the shape it meets the chain at)."""
    a, a_sizes, a_strides = _operand(srcs, a_plan)
    b, b_sizes, b_strides = _operand(srcs, b_plan)
    pieces = len(a_sizes) - 2
    batch = [max(x, y) for x, y in zip(a_sizes[:pieces], b_sizes[:pieces], strict=True)]
    M, K = a_sizes[-2:]
    N = b_sizes[-1]
    if dtype is None:
        dtype = a.dtype if a.dtype == b.dtype else torch.float32
    y = torch.empty([_size(srcs, axis) for axis in out_axes], dtype=dtype, device=a.device)
    if y.numel() == 0:
        return y
    logical = [*batch, M, N]
    y_l = y.view(logical)
    tensors, strides = [], []
    for t, axes in extras:
        e = t.expand([_size(srcs, axis) for axis in axes]).reshape(logical)
        tensors.append(e)
        strides += _padded(e.stride(), pieces)
    while len(tensors) < 3:
        tensors.append(y_l)
        strides += [0] * 5
    bm = min(block_m, max(16, triton.next_power_of_2(M)))
    bn = min(block_n, max(16, triton.next_power_of_2(N)))
    bk = min(block_k, max(16, triton.next_power_of_2(K)))
    full = [1, 1, 1, *batch][-3:]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), full[0] * full[1] * full[2])
    _contraction_kernel[grid](a, b, y_l, *tensors, M, N, K, full[1], full[2],
                              *_padded(a_strides, pieces), *_padded(b_strides, pieces),
                              *_padded(y_l.stride(), pieces), *strides, EXTRAS=len(extras),
                              SPLIT=a.dtype == torch.float32, PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn,
                              BLOCK_K=bk, GROUP_M=group_m, num_warps=num_warps,
                              num_stages=num_stages)  # fmt: skip
    return y
