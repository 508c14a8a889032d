"""The conv family's Triton parts (copied into a candidate by `templates.render`, never imported by the
generator): a forward convolution as an implicit GEMM, one launch, its pointwise epilogue in the kernel.
The candidate's module defines `_epilogue(v0, v1, v2, v3)`: the elementwise chain after the convolution,
v0 the accumulator (bias added), v1..v3 the extra tensors it reads (a bias parameter, a residual).

Every convolution is read as 3-D (1-D and 2-D ones have D = H = 1 and a kernel of 1 there): x [N, C_in,
D, H, W] by its own strides (NCDHW or channels-last, no copy), the filter copied once a call as [C_out,
taps, C_in/G] (small; a column's filter contiguous along K, the operand order TF32 tensor-core dots
read), y [N, C_out, OD, OH, OW] contiguous. The GEMM of sample n and group g: rows M = the OD x OH x OW
output positions, columns the group's C_out/G channels, K the taps x the group's C_in/G channels,
channels fastest; the x tile is gathered by index math (no im2col copy), masked to 0 in the padding.
Programs: (column block, row block, sample, group), columns fastest, so the programs that gather the
same rows run together; a row block is a run of one sample's positions, so the store is provably
contiguous along M (coalesced, vectorised).

The x tile's fast axis follows x's layout (`CL`: channels contiguous): channels-last, the tile is loaded
[M, K], contiguous along K; NCDHW, it is loaded [K, M] and transposed for the dot, so that neighbouring
threads read neighbouring positions (along M, a row of the input) rather than addresses a channel apart.

`STRATEGY`:
- "taps": one loop over (tap, channel block) steps, the tap split from the step by scalar division and
  its row offsets and padding mask worked out per row (1-D), so an element of the tile costs an add and
  an and, and the pipeline runs across the taps (for wide channel counts);
- "gemm": K flattened, (tap, channel) split from k by division (1-D), the padding checked per element
  only along the axes whose kernel is wider than 1 (for few channels a group: 3 x 11 x 11 is 12 K steps
  of 32 where "taps" would run 121 of 3 channels in 16);
- "direct": the taps loop with one channel at a time as an outer product on FMA units, no tl.dot (the
  depthwise and narrow-group forms, whose columns are too few for a dot).
`PREC`: the fp32 dot: "ieee" (exact, FMA units), "tf32x3" (three TF32 tensor-core dots of the hi/lo split
operands into a fresh accumulator a step: ~2^-21 relative a product) or "tf32" (one TF32 pass: operands
to 10 mantissa bits, what cuDNN's own fp32 convolution does by default, so the reference errs as much;
conv.py's docstring has why the gate may admit it); 16-bit operands: "native".
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
    elif PREC == "tf32":
        acc = tl.dot(a, b, acc, input_precision="tf32")
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
    sxn, sxc, sxd, sxh, sxw,
    NB, D, H, W, C_OUT, OD, OH, OW, C_IN_G, C_OUT_G, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRAS: tl.constexpr,
    STRATEGY: tl.constexpr, PREC: tl.constexpr, CL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    OS = OD * OH * OW
    n_blocks = tl.cdiv(C_OUT_G, BLOCK_N)
    s_blocks = tl.cdiv(OS, BLOCK_M)
    pid_n = pid % n_blocks
    pid_s = (pid // n_blocks) % s_blocks
    nb = (pid // (n_blocks * s_blocks)) % NB
    g = pid // (n_blocks * s_blocks * NB)
    # rows: one sample's output positions, a contiguous run of them; columns: the group's output channels
    s = pid_s * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = s < OS
    ow = s % OW
    oh = (s // OW) % OH
    od = s // (OW * OH)
    ocl = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = ocl < C_OUT_G
    oc = g * C_OUT_G + ocl
    TAPS: tl.constexpr = KD * KH * KW
    K = TAPS * C_IN_G
    d0 = od * SD - PD
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    # each row's input origin (tap 0, the group's channel 0), by x's own strides
    x_n = x_ptr + (nb.to(tl.int64) * sxn + (g * C_IN_G).to(tl.int64) * sxc)
    x_row = x_n + (d0 * sxd + h0 * sxh + w0 * sxw)
    w_g = w_ptr + oc.to(tl.int64) * K  # each column's filter, as [C_out, taps, C_in/G]: K contiguous
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if STRATEGY == "taps":
        # one loop over (tap, channel block), so the pipeline runs across taps; the tap's row offsets
        # and padding mask are a row's (1-D), a tile's element costs one add and one and
        C_STEPS = tl.cdiv(C_IN_G, BLOCK_K)
        for step in range(0, TAPS * C_STEPS):
            t = step // C_STEPS
            c = (step % C_STEPS) * BLOCK_K + rk
            kd = t // (KH * KW)
            kh = (t // KW) % KH
            kw = t % KW
            di = d0 + kd * DD
            hi = h0 + kh * DH
            wi = w0 + kw * DW
            inside = m_mask & (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
            x_tap = x_row + (kd * DD * sxd + kh * DH * sxh + kw * DW * sxw)
            c_mask = c < C_IN_G
            if CL:  # channels contiguous: K the tile's fast axis
                a = tl.load(x_tap[:, None] + (c * sxc)[None, :], mask=inside[:, None] & c_mask[None, :],
                            other=0.0)  # fmt: skip
            else:  # positions contiguous: M the fast axis, loaded as [K, M] so neighbouring threads
                at = tl.load(x_tap[None, :] + (c * sxc)[:, None], mask=c_mask[:, None] & inside[None, :],
                             other=0.0)  # fmt: skip
                a = tl.trans(at)  # read neighbouring addresses
            b = tl.load(w_g[None, :] + (t * C_IN_G + c)[:, None],
                        mask=c_mask[:, None] & n_mask[None, :], other=0.0)  # fmt: skip
            acc = _mma(a, b, acc, PREC)
    elif STRATEGY == "gemm":
        # K = taps x channels flattened (channels fastest), each step's (tap, channel) a 1-D split; only
        # the axes whose kernel is wider than 1 are checked per element, the others per row
        row_ok = m_mask
        if KD == 1:
            row_ok = row_ok & (d0 >= 0) & (d0 < D)
        if KH == 1:
            row_ok = row_ok & (h0 >= 0) & (h0 < H)
        if KW == 1:
            row_ok = row_ok & (w0 >= 0) & (w0 < W)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            k_mask = k < K
            t = k // C_IN_G
            c = k % C_IN_G
            kd = t // (KH * KW)
            kh = (t // KW) % KH
            kw = t % KW
            k_off = c * sxc + kd * DD * sxd + kh * DH * sxh + kw * DW * sxw
            if CL:
                inside = row_ok[:, None] & k_mask[None, :]
                if KD > 1:
                    di = d0[:, None] + (kd * DD)[None, :]
                    inside = inside & (di >= 0) & (di < D)
                if KH > 1:
                    hi = h0[:, None] + (kh * DH)[None, :]
                    inside = inside & (hi >= 0) & (hi < H)
                if KW > 1:
                    wi = w0[:, None] + (kw * DW)[None, :]
                    inside = inside & (wi >= 0) & (wi < W)
                a = tl.load(x_row[:, None] + k_off[None, :], mask=inside, other=0.0)
            else:  # as "taps": loaded as [K, M]
                inside = k_mask[:, None] & row_ok[None, :]
                if KD > 1:
                    di = d0[None, :] + (kd * DD)[:, None]
                    inside = inside & (di >= 0) & (di < D)
                if KH > 1:
                    hi = h0[None, :] + (kh * DH)[:, None]
                    inside = inside & (hi >= 0) & (hi < H)
                if KW > 1:
                    wi = w0[None, :] + (kw * DW)[:, None]
                    inside = inside & (wi >= 0) & (wi < W)
                a = tl.trans(tl.load(x_row[None, :] + k_off[:, None], mask=inside, other=0.0))
            b = tl.load(w_g[None, :] + k[:, None], mask=k_mask[:, None] & n_mask[None, :],
                        other=0.0)  # fmt: skip
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
                    x_tap = x_row + (kd * DD * sxd + kh * DH * sxh + kw * DW * sxw)
                    w_tap = w_g + ((kd * KH + kh) * KW + kw) * C_IN_G
                    for c in range(C_IN_G):
                        a = tl.load(x_tap + c * sxc, mask=inside, other=0.0).to(tl.float32)
                        b = tl.load(w_tap + c, mask=n_mask, other=0.0).to(tl.float32)
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
    # a run of one sample's positions a column: the store is contiguous along M
    y = y_ptr + (nb.to(tl.int64) * C_OUT + oc)[None, :] * OS + s[:, None]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask)


def _conv_launch(x, w, b, extras, stride, padding, dilation, out_dtype, strategy, fp32_dot, channels_last,
                 block_m, block_n, block_k, num_warps, num_stages):  # fmt: skip
    """epilogue(conv(x, w) + b, *extras) over x's last w.dim() - 2 axes (zero padding); the groups are
    x's channels over the weight's input channels (a depthwise problem's groups follow its channels).
    x is read by its own strides; `channels_last` copies it channels-last first (one read and write of
    x) where it is not already. The filter is copied as [C_out, taps, C_in/G] (small)."""
    spatial = w.dim() - 2
    pad = 3 - spatial
    if channels_last and x.stride(1) != 1:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
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
    taps = ks[0] * ks[1] * ks[2]
    w = w.reshape(c_out, c_in_g, taps).transpose(1, 2).contiguous()  # no copy for 1x1 or depthwise
    os_ = outs[0] * outs[1] * outs[2]
    floor = 1 if strategy == "direct" else 16  # a tl.dot's tiles are at least 16 a side
    bm = min(block_m, max(16, triton.next_power_of_2(os_)))
    bn = min(block_n, max(floor, triton.next_power_of_2(c_out_g)))
    k = c_in_g if strategy == "taps" else c_in_g * taps
    bk = min(block_k, max(floor, triton.next_power_of_2(k)))
    prec = fp32_dot if x.dtype == torch.float32 else "native"
    xs = list(x.stride())
    xs = xs[:2] + [0] * pad + xs[2:]
    ptrs, strides = [], []
    for e in extras:
        e = e.expand(y.shape)
        ptrs.append(e)
        es = list(e.stride())
        strides += es[:2] + [0] * pad + es[2:]
    ptrs += [y] * (3 - len(extras))
    strides += [0] * (15 - len(strides))
    grid = (triton.cdiv(c_out_g, bn) * triton.cdiv(os_, bm) * n_ * groups,)
    _conv_kernel[grid](
        x, w, b if b is not None else w, y, *ptrs, *strides, *xs, n_, *dims, c_out, *outs, c_in_g, c_out_g,
        *st, *pd, *dl, KD=ks[0], KH=ks[1], KW=ks[2], HAS_BIAS=b is not None, EXTRAS=len(extras),
        STRATEGY=strategy, PREC=prec, CL=xs[1] == 1 and c_in > 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return y
