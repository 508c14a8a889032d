"""The conv family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator): a forward convolution as an implicit GEMM, one launch, its pointwise epilogue in the kernel.
The candidate's module defines `_epilogue(v0, v1, v2, v3)`: the elementwise chain after the convolution,
v0 the accumulator (bias added), v1..v3 the extra tensors it reads (a bias parameter, a residual).

Every convolution is read as 3-D (1-D and 2-D ones have D = H = 1 and a kernel of 1 there):
x [N, C_in, D, H, W], w [C_out, C_in/G, KD, KH, KW], y [N, C_out, OD, OH, OW], all contiguous. The GEMM
of group g: rows M = N x OD x OH x OW output positions, columns the group's C_out/G channels, K the
group's C_in/G channels x the KD x KH x KW taps; the x tile is gathered by index math (no im2col copy),
masked to 0 in the padding. Programs: (column block, row block, group), columns fastest, so the
programs that gather the same rows run together.

`STRATEGY`:
- "taps": a loop over the taps, each one's row offsets and padding mask worked out once, and within it
  the group's channels in BLOCK_K steps, a tl.dot each (for wide channel counts);
- "gemm": K flattened, (channel, tap) split from k by division (for few channels a group: 3 x 3 x 3 is
  one K step where "taps" would run 9 of 3 channels);
- "direct": the taps loop with one channel at a time as an outer product on FMA units, no tl.dot (the
  depthwise and narrow-group forms, whose columns are too few for a dot).
`PREC`: the fp32 dot: "ieee" (exact, FMA units) or "tf32x3" (three TF32 tensor-core dots of the hi/lo
split operands into a fresh accumulator a step: ~2^-21 relative a product, against the 1e-4 an fp32
output must meet, which plain TF32's 2^-11 cannot); 16-bit operands: "native".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _epilogue(v0, v1, v2, v3):  # replaced by the candidate's own
    return v0


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b, at the precision PREC names."""
    if PREC == "native":
        acc = tl.dot(a, b, acc)
    elif PREC == "tf32x3":
        # low 13 of fp32's 23 mantissa bits cleared (-8192 == 0xFFFFE000): the value is exact in TF32
        a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        a_lo = a - a_hi
        b_lo = b - b_hi
        # a fresh tensor-core accumulator a step, added with ordinary fp32 adds: tensor cores accumulate
        # with truncation, which over a long K drifts past 1e-4
        part = tl.dot(a_lo, b_hi, input_precision="tf32")
        part = tl.dot(a_hi, b_lo, part, input_precision="tf32")
        acc += tl.dot(a_hi, b_hi, part, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def _extra(ptr, sn, sc, sd, sh, sw, nb, od, oh, ow, oc, mask):
    """An extra tensor of the epilogue at the tile's outputs, by its strides broadcast to y's shape."""
    rows = nb.to(tl.int64) * sn + od * sd + oh * sh + ow * sw
    return tl.load(ptr + rows[:, None] + (oc * sc)[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _conv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, e1_ptr, e2_ptr, e3_ptr,
    s1n, s1c, s1d, s1h, s1w, s2n, s2c, s2d, s2h, s2w, s3n, s3c, s3d, s3h, s3w,
    C_IN, D, H, W, C_OUT, OD, OH, OW, M, C_IN_G, C_OUT_G, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRAS: tl.constexpr,
    STRATEGY: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(C_OUT_G, BLOCK_N)
    m_blocks = tl.cdiv(M, BLOCK_M)
    pid_n = pid % n_blocks
    pid_m = (pid // n_blocks) % m_blocks
    g = pid // (n_blocks * m_blocks)
    # rows: output positions (n, od, oh, ow); columns: the group's output channels
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < M
    OS = OD * OH * OW
    nb = rm // OS
    s = rm % OS
    ow = s % OW
    oh = (s // OW) % OH
    od = s // (OW * OH)
    ocl = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = ocl < C_OUT_G
    oc = g * C_OUT_G + ocl
    TAPS: tl.constexpr = KD * KH * KW
    K = C_IN_G * TAPS
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    DHW = D * H * W
    x_m = x_ptr + (nb.to(tl.int64) * C_IN + g * C_IN_G) * DHW  # each row's sample, the group's channel 0
    w_n = w_ptr + oc.to(tl.int64) * K  # each column's filter
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if STRATEGY == "gemm":
        rk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            k_mask = k < K
            c = k // TAPS
            t = k % TAPS
            di = d0[:, None] + ((t // (KH * KW)) * DD)[None, :]
            hi = h0[:, None] + (((t // KW) % KH) * DH)[None, :]
            wi = w0[:, None] + ((t % KW) * DW)[None, :]
            inside = (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            inside = inside & m_mask[:, None] & k_mask[None, :]
            a = tl.load(x_m[:, None] + c[None, :] * DHW + (di * H + hi) * W + wi, mask=inside, other=0.0)
            b = tl.load(w_n[None, :] + k[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            acc = _mma(a, b, acc, PREC)
    else:
        for kd in range(KD):
            di = d0 + kd * DD
            for kh in range(KH):
                hi = h0 + kh * DH
                row_ok = m_mask & (di >= 0) & (di < D) & (hi >= 0) & (hi < H)
                for kw in range(KW):
                    wi = w0 + kw * DW
                    inside = row_ok & (wi >= 0) & (wi < W)
                    x_tap = x_m + (di * H + hi) * W + wi
                    w_tap = w_n + (kd * KH + kh) * KW + kw
                    if STRATEGY == "taps":
                        rk = tl.arange(0, BLOCK_K)
                        for c0 in range(0, C_IN_G, BLOCK_K):
                            c = c0 + rk
                            c_mask = c < C_IN_G
                            a = tl.load(
                                x_tap[:, None] + c[None, :] * DHW, mask=inside[:, None] & c_mask[None, :],
                                other=0.0,
                            )  # fmt: skip
                            b = tl.load(
                                w_tap[None, :] + c[:, None] * TAPS, mask=c_mask[:, None] & n_mask[None, :],
                                other=0.0,
                            )  # fmt: skip
                            acc = _mma(a, b, acc, PREC)
                    else:
                        for c in range(C_IN_G):
                            a = tl.load(x_tap + c * DHW, mask=inside, other=0.0).to(tl.float32)
                            b = tl.load(w_tap + c * TAPS, mask=n_mask, other=0.0).to(tl.float32)
                            acc += a[:, None] * b[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + oc, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    v1 = 0.0
    v2 = 0.0
    v3 = 0.0
    if EXTRAS >= 1:
        v1 = _extra(e1_ptr, s1n, s1c, s1d, s1h, s1w, nb, od, oh, ow, oc, mask)
    if EXTRAS >= 2:
        v2 = _extra(e2_ptr, s2n, s2c, s2d, s2h, s2w, nb, od, oh, ow, oc, mask)
    if EXTRAS >= 3:
        v3 = _extra(e3_ptr, s3n, s3c, s3d, s3h, s3w, nb, od, oh, ow, oc, mask)
    out = _epilogue(acc, v1, v2, v3)
    y = y_ptr + (nb.to(tl.int64) * C_OUT * OS + s)[:, None] + (oc.to(tl.int64) * OS)[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask)


def _conv_launch(x, w, b, extras, stride, padding, dilation, out_dtype, strategy, fp32_dot, block_m,
                 block_n, block_k, num_warps, num_stages):  # fmt: skip
    """epilogue(conv(x, w) + b, *extras) over x's last w.dim() - 2 axes (zero padding); the groups are
    x's channels over the weight's input channels (a depthwise problem's groups follow its channels)."""
    spatial = w.dim() - 2
    pad = 3 - spatial
    x = x.contiguous()
    w = w.contiguous()
    n_, c_in = x.shape[0], x.shape[1]
    c_out = w.shape[0]
    dims = [1] * pad + list(x.shape[2:])
    ks = [1] * pad + list(w.shape[2:])
    st = [1] * pad + list(stride)
    pd = [0] * pad + list(padding)
    dl = [1] * pad + list(dilation)
    outs = [(dims[i] + 2 * pd[i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(3)]
    y = torch.empty([n_, c_out, *outs[pad:]], dtype=out_dtype or x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    c_in_g = w.shape[1]
    groups = c_in // c_in_g
    c_out_g = c_out // groups
    m = n_ * outs[0] * outs[1] * outs[2]
    floor = 1 if strategy == "direct" else 16  # a tl.dot's tiles are at least 16 a side
    bm = min(block_m, max(16, triton.next_power_of_2(m)))
    bn = min(block_n, max(floor, triton.next_power_of_2(c_out_g)))
    k = c_in_g if strategy == "taps" else c_in_g * ks[0] * ks[1] * ks[2]
    bk = min(block_k, max(floor, triton.next_power_of_2(k)))
    prec = fp32_dot if x.dtype == torch.float32 else "native"
    ptrs, strides = [], []
    for e in extras:
        e = e.expand(y.shape)
        ptrs.append(e)
        es = list(e.stride())
        strides += es[:2] + [0] * pad + es[2:]
    ptrs += [y] * (3 - len(extras))
    strides += [0] * (15 - len(strides))
    grid = (triton.cdiv(c_out_g, bn) * triton.cdiv(m, bm) * groups,)
    _conv_kernel[grid](
        x, w, b if b is not None else w, y, *ptrs, *strides, c_in, *dims, c_out, *outs, m, c_in_g, c_out_g,
        *st, *pd, *dl, KD=ks[0], KH=ks[1], KW=ks[2], HAS_BIAS=b is not None, EXTRAS=len(extras),
        STRATEGY=strategy, PREC=prec, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return y
