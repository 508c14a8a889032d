"""The gemm_epilogue family's Triton parts (copied into a candidate by `templates.render`, never imported
by the generator): y = epilogue(x @ W^T + b) for x (M, K) and W (N, K) row-major.

`_gemm_kernel`: a tl.dot over BLOCK_M x BLOCK_N output tiles, K in BLOCK_K steps, programs in GROUP_M
swizzled order. Three constexprs choose its code, each resolved when Triton compiles it:
- PRECISION: "ieee" (one exact fp32 dot) or "tf32x3" (three TF32 dots of the hi/lo split operands into a
  fresh accumulator a K tile) for fp32 inputs (SPLIT); fp16/bf16 inputs take a plain dot either way.
- EPILOGUE_1, EPILOGUE_2: the elementwise ops after the bias, in the reference's order: "relu", "div"
  (by the `divisor` argument) or "none".
The knobs reach `_gemm_launch` as arguments from the candidate's ModelNew.forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _epilogue_op(acc, divisor, OP: tl.constexpr):
    """One epilogue op on the fp32 tile: "relu", "div" or "none" (inlined: only the chosen op is code)."""
    if OP == "relu":
        acc = tl.maximum(acc, 0.0)
    elif OP == "div":
        acc = acc / divisor
    return acc


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, divisor,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
                 EPILOGUE_1: tl.constexpr, EPILOGUE_2: tl.constexpr):  # fmt: skip
    # GROUP_M row blocks walk the column blocks together: the W tiles they share stay in L2
    pid = tl.program_id(0)
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
    # x (M, K) and W (N, K) are row-major, K contiguous; the W tile is read as W^T: [BLOCK_K, BLOCK_N]
    x_tile = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_tile = w_ptr + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]
    m_mask = rm[:, None] < M
    n_mask = rn[None, :] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0
        a = tl.load(x_tile, mask=m_mask & (rk[None, :] < k_left), other=0.0)
        b = tl.load(w_tile, mask=(rk[:, None] < k_left) & n_mask, other=0.0)
        if SPLIT:
            if PRECISION == "tf32x3":
                # low 13 of fp32's 23 mantissa bits cleared (-8192 == 0xFFFFE000): the value is exact in TF32
                a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
                b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
                a_lo = a - a_hi
                b_lo = b - b_hi
                # a fresh tensor-core accumulator per K tile, added into acc with ordinary fp32 adds:
                # tensor cores accumulate with truncation, which over a long K drifts past 1e-4
                part = tl.dot(a_lo, b_hi, input_precision="tf32")
                part = tl.dot(a_hi, b_lo, part, input_precision="tf32")
                acc += tl.dot(a_hi, b_hi, part, input_precision="tf32")
            else:
                acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            # fp16/bf16 inputs: input_precision only concerns fp32; a plain dot accumulating in fp32
            acc = tl.dot(a, b, acc)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = _epilogue_op(acc, divisor, EPILOGUE_1)
    acc = _epilogue_op(acc, divisor, EPILOGUE_2)
    y = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_mask & n_mask)


def _gemm_launch(x2, weight, bias, y2, divisor, precision, epilogue, block_m, block_n, block_k, group_m,
                 num_warps, num_stages):  # fmt: skip
    """y2 = epilogue(x2 @ weight^T + bias): x2 (M, K), weight (N, K) row-major; `epilogue` the ops, at
    most two, in order; the knobs as the candidate sets them."""
    M, K = x2.shape
    N = weight.shape[0]
    bm = min(block_m, max(16, triton.next_power_of_2(M)))
    bn = min(block_n, max(16, triton.next_power_of_2(N)))
    bk = min(block_k, max(16, triton.next_power_of_2(K)))
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    if len(epilogue) > 2:
        raise ValueError(f"the kernel applies at most two epilogue ops, not {epilogue}")
    first, second = [*epilogue, "none", "none"][:2]
    _gemm_kernel[grid](x2, weight, bias if bias is not None else weight, y2, M, N, K, x2.stride(0),
                       weight.stride(0), y2.stride(0), divisor, HAS_BIAS=bias is not None,
                       SPLIT=x2.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m,
                       PRECISION=precision, EPILOGUE_1=first, EPILOGUE_2=second, num_warps=num_warps,
                       num_stages=num_stages)  # fmt: skip
