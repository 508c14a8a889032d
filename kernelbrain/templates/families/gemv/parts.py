"""The gemv family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator): y = A @ x for A (B, M, K) row-major and x (B, K, N), N a few columns.

`_gemv_kernel`: a program takes BLOCK_M rows of A and a range of K, in [BLOCK_M, BLOCK_K] fp32 lanes
folded into the row totals every CHUNK tiles. One K range (`split_k` 1) writes y directly; more write
fp32 partial sums that `_sum_splits_kernel` adds in a fixed order (no atomics). The knobs reach
`_matvec` as arguments from the candidate's ModelNew.forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["grid_m"])  # a count of blocks: M's gate and rung sizes share one compile
def _gemv_kernel(a_ptr, b_ptr, out_ptr, M, K, k_per_split, grid_m, stride_ab, stride_am, stride_bb, stride_bk,
                 stride_bn, stride_ob, stride_om, stride_on, stride_os, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # axis 0 runs over (batch, row block): the batch never meets axis 1/2's 65535 limit
    batch = (tl.program_id(0) // grid_m).to(tl.int64)
    pid_m = tl.program_id(0) % grid_m
    split = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + batch * stride_ab + rows.to(tl.int64)[:, None] * stride_am
    b_col = b_ptr + batch * stride_bb + n * stride_bn
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # every lane keeps its own short chain; a tree reduction over BLOCK_K sums the lanes,
    # and every CHUNK tiles the lanes are summed into the row totals: no chain is longer than
    # CHUNK + K / (BLOCK_K * CHUNK) additions
    total = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(k_start, k_end, BLOCK_K * CHUNK):
        c_end = tl.minimum(c0 + BLOCK_K * CHUNK, k_end)
        acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for k0 in range(c0, c_end, BLOCK_K):
            k = k0 + cols
            k_mask = k < c_end
            x = tl.load(b_col + k.to(tl.int64) * stride_bk, mask=k_mask, other=0.0).to(tl.float32)
            a = tl.load(a_rows + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            acc += a.to(tl.float32) * x[None, :]
        total += tl.sum(acc, axis=1)
    out = out_ptr + split.to(tl.int64) * stride_os + batch * stride_ob + n * stride_on
    out += rows.to(tl.int64) * stride_om
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit(do_not_specialize=["grid_r"])
def _sum_splits_kernel(part_ptr, y_ptr, M, n_splits, grid_r, stride_ps, stride_pb, stride_pn, stride_yb,
                       stride_ym, stride_yn, BLOCK_R: tl.constexpr, SPLITS: tl.constexpr):  # fmt: skip
    batch = (tl.program_id(0) // grid_r).to(tl.int64)
    pid = tl.program_id(0) % grid_r
    n = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    s = tl.arange(0, SPLITS)
    mask = (s[:, None] < n_splits) & (rows[None, :] < M)
    part = part_ptr + batch * stride_pb + n * stride_pn
    p = tl.load(part + s[:, None].to(tl.int64) * stride_ps + rows[None, :], mask=mask, other=0.0)
    total = tl.sum(p, axis=0)
    tl.store(y_ptr + batch * stride_yb + n * stride_yn + rows.to(tl.int64) * stride_ym,
             total.to(y_ptr.dtype.element_ty), mask=rows < M)  # fmt: skip


def _gemv_launch(a, b, y, block_m, block_k, split_k, chunk, num_warps):
    """a (B, M, K) contiguous, b (B, K, N), y (B, M, N); the knobs as the candidate sets them."""
    n_batch, M, K = a.shape
    N = b.shape[2]
    block_m = min(block_m, triton.next_power_of_2(M))
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    grid_m = triton.cdiv(M, block_m)
    # split K into ranges of whole tiles; never more ranges than tiles
    split = max(1, min(split_k, triton.cdiv(K, block_k)))
    k_per_split = max(1, triton.cdiv(triton.cdiv(K, split), block_k)) * block_k
    split = max(1, triton.cdiv(K, k_per_split))
    grid = (n_batch * grid_m, split, N)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2))
    if split == 1:
        _gemv_kernel[grid](a, b, y, M, K, k_per_split, grid_m, *strides, *y.stride(), 0, BLOCK_M=block_m,
                           BLOCK_K=block_k, CHUNK=chunk, num_warps=num_warps)  # fmt: skip
        return
    part = torch.empty((split, n_batch, N, M), dtype=torch.float32, device=a.device)
    _gemv_kernel[grid](a, b, part, M, K, k_per_split, grid_m, *strides, part.stride(1), part.stride(3),
                       part.stride(2), part.stride(0), BLOCK_M=block_m, BLOCK_K=block_k, CHUNK=chunk,
                       num_warps=num_warps)  # fmt: skip
    # a block of rows that follows no size (one compile for every M), shorter where the splits are many
    block_r = 256
    splits = triton.next_power_of_2(split)
    while splits * block_r > 8192 and block_r > 16:
        block_r //= 2
    grid_r = triton.cdiv(M, block_r)
    _sum_splits_kernel[(n_batch * grid_r, N)](part, y, M, split, grid_r, part.stride(0), part.stride(1),
                                              part.stride(2), y.stride(0), y.stride(1), y.stride(2),
                                              BLOCK_R=block_r, SPLITS=splits, num_warps=4)  # fmt: skip


def _matvec(A, x, block_m, block_k, split_k, chunk, num_warps):
    """A @ x for A (M, K) or (B, M, K) and x (K,), (K, N) or (B, K, N), computed by the kernels."""
    vector = x.dim() == 1
    b = x.unsqueeze(-1) if vector else x
    if A.dim() not in (2, 3) or b.dim() not in (2, 3) or A.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemv wants A (M, K) or (B, M, K) and x (K,), (K, N) or (B, K, N): got "
                         f"{tuple(A.shape)}, {tuple(x.shape)}")  # fmt: skip
    if b.dim() == 3:
        if A.dim() == 3 and A.shape[0] != b.shape[0]:
            raise ValueError(f"gemv wants as many batches in A as in x: {tuple(A.shape)}, {tuple(x.shape)}")
        # one A for every batch of x: a zero batch stride, no copy
        a3 = A.contiguous() if A.dim() == 3 else A.contiguous().unsqueeze(0).expand(b.shape[0], -1, -1)
        b3 = b
    else:
        # one x for every row of A, batched or not: A is a single (rows, K) matrix
        a3 = A.contiguous().view(1, -1, A.shape[-1])
        b3 = b.unsqueeze(0)
    y = torch.empty((a3.shape[0], a3.shape[1], b3.shape[2]), dtype=A.dtype, device=A.device)
    if y.numel():
        _gemv_launch(a3, b3, y, block_m, block_k, split_k, chunk, num_warps)
    y = y.view(*(A.shape[:-1] if b.dim() == 2 else a3.shape[:-1]), b.shape[-1])
    return y.squeeze(-1) if vector else y
