"""The conv_transpose family's Triton parts (copied into a candidate by `templates.render`, never
imported by the generator).

The 2-D strategies: `_convt_kernel` serves `direct`, `phase` and `phase_dot` (the constexprs PHASE and
DOT), with `_taps` summing one tap's input channels as outer products or as a tl.dot;
`_convt_rows_kernel` serves `rows`; `_convt_dense_kernel` serves `rows_dense`, its weight tiles built
by `_dense_w` or, with `prepack`, packed once a call by `_pack_dense_w`. `_launch` picks the kernel and
its grid from the knob constants the candidate's module defines (PHASE, DOT, ROWS, DENSE, BLOCK_*,
NUM_WARPS, FP32_DOT, PREPACK: `conv_transpose.render` writes them), the convolution's stride, padding,
dilation, output padding and groups given as the traced ones.

The 1-3-D strategies (`nd_dot`, `nd_fma`): `_convt_nd_kernel`, one tap a `_convt_nd_tap`, launched by
`_convt_nd_launch` with its knobs as arguments; the pointwise chain after the convolution fused as
conv's is (the candidate's `_epilogue`, conv's parts' `_mma` and `_extra` rendered beside them).

Every candidate copies the functions of its strategies here, and its id is its source's hash: any edit
to them, comments included, makes new candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The knob constants `_launch` reads as globals: the candidate writes its own (conv_transpose.render);
# these defaults, never copied, only let this module import and lint.
PHASE = False
DOT = False
ROWS = False
DENSE = True
BLOCK_P = 128
BLOCK_C = 16
BLOCK_K = 8
NUM_WARPS = 4
FP32_DOT = "ieee"
PREPACK = False


@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr):
    # fp32 operands: PREC is "ieee" (FMA units) or "tf32x3" (three TF32 tensor-core dots); 16-bit: "native"
    if PREC == "native":  # noqa: SIM108
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=PREC)
    return acc


@triton.jit
def _taps(
    acc, x_tap, w_tap, valid, c_mask, rk, C_IN_G, HW, W_STRIDE, DOT: tl.constexpr, PREC: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one tap (kh, kw): acc += x[pixels, group channels] @ w[group channels, output channels]
    for c0 in range(0, C_IN_G, BLOCK_K):
        kc = c0 + rk
        k_mask = kc < C_IN_G
        if DOT:
            a = tl.load(x_tap[:, None] + kc[None, :] * HW, mask=valid[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(
                w_tap[None, :] + kc[:, None] * W_STRIDE, mask=k_mask[:, None] & c_mask[None, :], other=0.0
            )
            acc = _dot(a, b, acc, PREC)
        else:
            # BLOCK_K outer products w[c, C block] x x[c, pixel block] at once, on FMA units
            a = tl.load(x_tap[None, :] + kc[:, None] * HW, mask=k_mask[:, None] & valid[None, :], other=0.0)
            b = tl.load(
                w_tap[None, :] + kc[:, None] * W_STRIDE, mask=k_mask[:, None] & c_mask[None, :], other=0.0
            )
            acc += tl.sum(b.to(tl.float32)[:, :, None] * a.to(tl.float32)[:, None, :], axis=0)
    return acc


@triton.jit
def _convt_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_IN_G, C_OUT_G, N_CB, SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, PHASE: tl.constexpr, DOT: tl.constexpr,
    PREC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # axis 0: (n, group, output-channel block); axis 1: output-pixel block; axis 2: stride phase
    pid0 = tl.program_id(0)
    pid_p = tl.program_id(1)
    cb = pid0 % N_CB
    ng = pid0 // N_CB
    G = C_IN // C_IN_G
    g = ng % G
    n = ng // G
    ocl = cb * BLOCK_C + tl.arange(0, BLOCK_C)  # output channel within the group
    c_mask = ocl < C_OUT_G
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    rk = tl.arange(0, BLOCK_K)
    if PHASE:
        phase = tl.program_id(2)
        rh = phase // SW
        rw = phase % SW
        OHP = (OH - rh + SH - 1) // SH  # rows and columns of this phase: oh = rh + i*SH, ow = rw + j*SW
        OWP = (OW - rw + SW - 1) // SW
        p_mask = p < OHP * OWP
        pi = p // tl.maximum(OWP, 1)
        pj = p % tl.maximum(OWP, 1)
        oh = rh + pi * SH
        ow = rw + pj * SW
    else:
        p_mask = p < OH * OW
        oh = p // OW
        ow = p % OW
    HW = H * W
    W_STRIDE = C_OUT_G * KH * KW
    x_n = x_ptr + (n.to(tl.int64) * C_IN + g * C_IN_G) * HW
    # w[c, ocl, kh, kw]: (C_IN, C_OUT_G, KH, KW), contiguous
    w_g = w_ptr + (g * C_IN_G).to(tl.int64) * W_STRIDE + ocl * (KH * KW)
    if DOT:
        acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
    for kh in range(KH):
        for kw in range(KW):
            if PHASE:
                # one scalar test per phase and tap: the division is exact for the whole block or never
                th = rh + PH - kh * DH
                tw = rw + PW - kw * DW
                if (th % SH == 0) & (tw % SW == 0):
                    ih = th // SH + pi
                    iw = tw // SW + pj
                    valid = p_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                    acc = _taps(
                        acc, x_n + ih * W + iw, w_g + kh * KW + kw, valid, c_mask, rk, C_IN_G, HW, W_STRIDE,
                        DOT, PREC, BLOCK_K,
                    )  # fmt: skip
            else:
                th = oh + PH - kh * DH
                tw = ow + PW - kw * DW
                thp = tl.where(th >= 0, th, 0)
                twp = tl.where(tw >= 0, tw, 0)
                ih = thp // SH
                iw = twp // SW
                valid = p_mask & (th >= 0) & (tw >= 0) & (thp % SH == 0) & (twp % SW == 0)
                valid = valid & (ih < H) & (iw < W)
                acc = _taps(
                    acc, x_n + ih * W + iw, w_g + kh * KW + kw, valid, c_mask, rk, C_IN_G, HW, W_STRIDE, DOT,
                    PREC, BLOCK_K,
                )  # fmt: skip
    oc = g * C_OUT_G + ocl
    y_n = y_ptr + n.to(tl.int64) * C_OUT * OH * OW
    if DOT:
        if HAS_BIAS:
            acc += tl.load(b_ptr + oc, mask=c_mask, other=0.0).to(tl.float32)[None, :]
        y = y_n + oc[None, :].to(tl.int64) * (OH * OW) + (oh * OW + ow)[:, None]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=p_mask[:, None] & c_mask[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + oc, mask=c_mask, other=0.0).to(tl.float32)[:, None]
        y = y_n + oc[:, None].to(tl.int64) * (OH * OW) + (oh * OW + ow)[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=c_mask[:, None] & p_mask[None, :])


@triton.jit
def _convt_rows_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_OUT_G, N_CB, C_IN_G: tl.constexpr,
    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr,
    DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    # axis 0: (n, group, channel block, output row); axis 1: block of columns j, ow = rw + j*SW per phase
    pid0 = tl.program_id(0)
    oh = pid0 % OH
    t = pid0 // OH
    cb = t % N_CB
    ng = t // N_CB
    G = C_IN // C_IN_G
    g = ng % G
    n = ng // G
    ocl = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = ocl < C_OUT_G
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    HW = H * W
    W_STRIDE = C_OUT_G * KH * KW
    x_n = x_ptr + (n.to(tl.int64) * C_IN + g * C_IN_G) * HW
    w_g = w_ptr + (g * C_IN_G).to(tl.int64) * W_STRIDE + ocl * (KH * KW)
    oc = g * C_OUT_G + ocl
    y_row = y_ptr + (n.to(tl.int64) * C_OUT + oc[:, None]) * (OH * OW) + oh * OW
    if HAS_BIAS:
        bias = tl.load(b_ptr + oc, mask=c_mask, other=0.0).to(tl.float32)
    for rw in tl.static_range(SW):
        acc = tl.zeros([BLOCK_C, BLOCK_J], dtype=tl.float32)
        ow = rw + j * SW
        o_mask = ow < OW
        for kh in tl.static_range(KH):
            th = oh + PH - kh * DH
            ih = th // SH
            if (th >= 0) & (th % SH == 0) & (ih < H):  # does this row take tap row kh at all
                for kw in tl.static_range(KW):
                    # the tap's column phase is known at compile time: only phase rw's taps are traced
                    if (rw + PW - kw * DW) % SW == 0:
                        iw = j + (rw + PW - kw * DW) // SW
                        valid = o_mask & (iw >= 0) & (iw < W)
                        x_tap = x_n + ih * W + iw
                        w_tap = w_g + kh * KW + kw
                        for c in tl.static_range(C_IN_G):
                            xv = tl.load(x_tap + c * HW, mask=valid, other=0.0).to(tl.float32)
                            wv = tl.load(w_tap + c * W_STRIDE, mask=c_mask, other=0.0).to(tl.float32)
                            acc += wv[:, None] * xv[None, :]
        if HAS_BIAS:
            acc += bias[:, None]
        tl.store(y_row + ow[None, :], acc.to(y_ptr.dtype.element_ty), mask=c_mask[:, None] & o_mask[None, :])


@triton.jit
def _dense_w(
    w_ptr, g, cb, C_OUT_G, C_IN_G: tl.constexpr, SW: tl.constexpr, PW: tl.constexpr, DW: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr, SWP: tl.constexpr, DMIN: tl.constexpr, NDP: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # rows_dense's weight tiles (module docstring): rows m = (channel, phase p), K = (input channel,
    # column offset d); the tap of phase p at offset d is kw = (p + PW - d*SW) / DW when exact, zero
    # where no tap meets. Returns the pointers of the tile at kh = 0 and input channels 0.. (a tap row
    # kh adds kh*KW, a K step c0 adds c0*W_STRIDE), its mask, and K's input channel
    m = tl.arange(0, BLOCK_C * SWP)
    ocl = cb * BLOCK_C + m // SWP
    p = m % SWP
    k = tl.arange(0, BLOCK_K * NDP)
    kc = k // NDP
    d = DMIN + k % NDP
    tw = p[:, None] + PW - d[None, :] * SW
    twp = tl.where(tw >= 0, tw, 0)
    kw = twp // DW
    ok = (p < SW)[:, None] & (tw >= 0) & (twp % DW == 0) & (kw < KW) & (ocl < C_OUT_G)[:, None]
    W_STRIDE = C_OUT_G * KH * KW
    w = w_ptr + (g * C_IN_G + kc[None, :]).to(tl.int64) * W_STRIDE + ocl[:, None] * (KH * KW) + kw
    return w, ok, kc


@triton.jit
def _pack_dense_w(
    w_ptr, wp_ptr, C_OUT_G, N_CB, N_C0, C_IN_G: tl.constexpr, SW: tl.constexpr, PW: tl.constexpr,
    DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, SWP: tl.constexpr, DMIN: tl.constexpr,
    NDP: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one dense weight tile per program, stored contiguously at its (group, channel block, kh, K step)
    pid = tl.program_id(0)
    c0i = pid % N_C0
    t = pid // N_C0
    kh = t % KH
    t = t // KH
    cb = t % N_CB
    g = t // N_CB
    w, ok, kc = _dense_w(w_ptr, g, cb, C_OUT_G, C_IN_G, SW, PW, DW, KH, KW, SWP, DMIN, NDP, BLOCK_C, BLOCK_K)
    c0 = c0i * BLOCK_K
    a = tl.load(w + c0 * (C_OUT_G * KH * KW) + kh * KW, mask=ok & (c0 + kc < C_IN_G)[None, :], other=0.0)
    MM: tl.constexpr = BLOCK_C * SWP
    KK: tl.constexpr = BLOCK_K * NDP
    dst = wp_ptr + pid.to(tl.int64) * (MM * KK) + tl.arange(0, MM)[:, None] * KK + tl.arange(0, KK)[None, :]
    tl.store(dst, a)


@triton.jit
def _convt_dense_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_OUT_G, N_CB, N_JB, C_IN_G: tl.constexpr,
    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr,
    DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, SWP: tl.constexpr,
    DMIN: tl.constexpr, NDP: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one program: output row oh, BLOCK_C channels, columns ow = j*SW + p for BLOCK_J periods j and every
    # phase p < SW. Column-block fastest in the grid: neighbouring programs write neighbouring columns.
    pid = tl.program_id(0)
    jb = pid % N_JB
    t = pid // N_JB
    oh = t % OH
    t = t // OH
    cb = t % N_CB
    ng = t // N_CB
    G = C_IN // C_IN_G
    g = ng % G
    n = ng // G
    # an implicit GEMM per tap row kh: rows m = (channel, phase p), K = (input channel, column offset d),
    # columns j: the weights a [m, K] matrix (_dense_a) and the input a [K, j] one, x[c, ih, j + d].
    # PACKED: the weight tiles come ready from _pack_dense_w, one plain load each, with no index and mask
    # tensors live across the kh loop (on group_conv at the H200 no faster: probe4, 6.22x against 6.35x)
    MM: tl.constexpr = BLOCK_C * SWP
    KK: tl.constexpr = BLOCK_K * NDP
    N_C0: tl.constexpr = (C_IN_G + BLOCK_K - 1) // BLOCK_K
    k = tl.arange(0, KK)
    d = DMIN + k % NDP
    # the unpacked tiles' pointers and mask, built once and kept across the tap loop
    w_g, a_ok, kc = _dense_w(
        w_ptr, g, cb, C_OUT_G, C_IN_G, SW, PW, DW, KH, KW, SWP, DMIN, NDP, BLOCK_C, BLOCK_K
    )
    W_STRIDE = C_OUT_G * KH * KW
    j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    iw = j[None, :] + d[:, None]
    b_ok = (iw >= 0) & (iw < W)
    HW = H * W
    x_n = x_ptr + (n.to(tl.int64) * C_IN + g * C_IN_G) * HW
    wp = w_ptr + ((g * N_CB + cb) * KH * N_C0).to(tl.int64) * (MM * KK)
    a_offs = tl.arange(0, MM)[:, None] * KK + k[None, :]
    acc = tl.zeros([MM, BLOCK_J], dtype=tl.float32)
    for kh in tl.static_range(KH):
        th = oh + PH - kh * DH
        ih = th // SH
        if (th >= 0) & (th % SH == 0) & (ih < H):  # rows taking no kh skip every load: zeros
            for c0 in range(0, C_IN_G, BLOCK_K):
                c = c0 + kc
                c_ok = c < C_IN_G
                if PACKED:
                    a = tl.load(wp + (kh * N_C0 + c0 // BLOCK_K) * (MM * KK) + a_offs)
                else:
                    a = tl.load(w_g + (c0 * W_STRIDE + kh * KW), mask=a_ok & c_ok[None, :], other=0.0)
                b = tl.load(x_n + (c * HW + ih * W)[:, None] + iw, mask=b_ok & c_ok[:, None], other=0.0)
                acc = _dot(a, b, acc, PREC)
    # [channel, phase, j] -> [channel, j*SWP + p], then gathered into contiguous columns w = j*SW + p:
    # one store of BLOCK_J*SW adjacent columns per channel (the phases' stride-SW stores would leave
    # every 32-byte sector partly written, which costs more L2 time than the whole computation)
    acc = tl.permute(tl.reshape(acc, [BLOCK_C, SWP, BLOCK_J]), (0, 2, 1))
    acc = tl.reshape(acc, [BLOCK_C, BLOCK_J * SWP])
    ocb = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cb_ok = ocb < C_OUT_G
    oc = g * C_OUT_G + ocb
    if HAS_BIAS:
        acc += tl.load(b_ptr + oc, mask=cb_ok, other=0.0).to(tl.float32)[:, None]
    w = tl.arange(0, BLOCK_J * SWP)
    src = tl.minimum((w // SW) * SWP + w % SW, BLOCK_J * SWP - 1)
    vals = tl.gather(acc, tl.broadcast_to(src[None, :], (BLOCK_C, BLOCK_J * SWP)), axis=1)
    ow = jb * BLOCK_J * SW + w
    y_row = y_ptr + (n.to(tl.int64) * C_OUT + oc[:, None]) * (OH * OW) + oh * OW
    tl.store(
        y_row + ow[None, :],
        vals.to(y_ptr.dtype.element_ty),
        mask=cb_ok[:, None] & ((w < BLOCK_J * SW) & (ow < OW))[None, :],
    )


def _launch(x, weight, bias, stride, padding, dilation, output_padding, groups):
    # a 2-D transposed convolution by the 2-D strategies, its parameters the traced ones
    n, c_in, h, w = x.shape
    weight = weight.contiguous()
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    oph, opw = output_padding
    c_out_g = weight.shape[1]
    c_out = c_out_g * groups
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (w - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    y = torch.empty((n, c_out, oh, ow), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if x.numel() == 0:
        return y.zero_() if bias is None else y.copy_(bias.view(1, -1, 1, 1).expand_as(y))
    x = x.contiguous()
    prec = FP32_DOT if x.dtype == torch.float32 else "native"
    block_c = min(BLOCK_C, max(16, triton.next_power_of_2(c_out_g)))
    n_cb = triton.cdiv(c_out_g, block_c)
    c_in_g = c_in // groups
    block_k = min(BLOCK_K, triton.next_power_of_2(c_in_g))
    if DOT:
        block_k = max(16, block_k)  # tl.dot's minimum; masked past the group's channels
    if ROWS:
        grid = (n * groups * n_cb * oh, triton.cdiv(triton.cdiv(ow, sw), BLOCK_P))
        _convt_rows_kernel[grid](
            x, weight, bias if bias is not None else weight, y, c_in, h, w, c_out, oh, ow, c_out_g, n_cb,
            C_IN_G=c_in_g, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, KH=kh, KW=kw, HAS_BIAS=bias is not None,
            BLOCK_J=BLOCK_P, BLOCK_C=block_c, num_warps=NUM_WARPS,
        )  # fmt: skip
        return y
    if DENSE:
        swp = triton.next_power_of_2(sw)
        # input-column offsets d = (p + pw - kw*dw)/sw of the (phase, tap) pairs that meet: K's second axis
        offs = [(p + pw - t * dw) // sw for p in range(sw) for t in range(kw) if (p + pw - t * dw) % sw == 0]
        dmin = min(offs, default=0)
        ndp = triton.next_power_of_2(max(offs, default=0) - dmin + 1)
        # tl.dot's 16 per dimension: channel (and K) blocks widened, the extra rows masked
        block_c = max(min(BLOCK_C, triton.next_power_of_2(c_out_g)), triton.cdiv(16, swp))
        block_k = max(min(BLOCK_K, triton.next_power_of_2(c_in_g)), triton.cdiv(16, ndp))
        block_j = max(16, BLOCK_P // swp)
        n_cb = triton.cdiv(c_out_g, block_c)
        n_jb = triton.cdiv(triton.cdiv(ow, sw), block_j)
        wt = weight
        if PREPACK:  # the weights as dense tiles, packed each call (they may change between calls)
            n_c0 = triton.cdiv(c_in_g, block_k)
            tiles = groups * n_cb * kh * n_c0
            wt = torch.empty((tiles, block_c * swp, block_k * ndp), dtype=weight.dtype, device=weight.device)
            _pack_dense_w[(tiles,)](
                weight, wt, c_out_g, n_cb, n_c0, C_IN_G=c_in_g, SW=sw, PW=pw, DW=dw, KH=kh, KW=kw, SWP=swp,
                DMIN=dmin, NDP=ndp, BLOCK_C=block_c, BLOCK_K=block_k, num_warps=4,
            )  # fmt: skip
        _convt_dense_kernel[(n * groups * n_cb * oh * n_jb,)](
            x, wt, bias if bias is not None else weight, y, c_in, h, w, c_out, oh, ow, c_out_g, n_cb, n_jb,
            C_IN_G=c_in_g, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, KH=kh, KW=kw, HAS_BIAS=bias is not None,
            SWP=swp, DMIN=dmin, NDP=ndp, PREC=prec, PACKED=PREPACK, BLOCK_J=block_j, BLOCK_C=block_c,
            BLOCK_K=block_k, num_warps=NUM_WARPS,
        )  # fmt: skip
        return y
    if PHASE:
        pixels = triton.cdiv(oh, sh) * triton.cdiv(ow, sw)
        grid = (n * groups * n_cb, triton.cdiv(pixels, BLOCK_P), sh * sw)
    else:
        grid = (n * groups * n_cb, triton.cdiv(oh * ow, BLOCK_P), 1)
    _convt_kernel[grid](
        x, weight, bias if bias is not None else weight, y, c_in, h, w, c_out, oh, ow, c_in // groups,
        c_out_g, n_cb, sh, sw, ph, pw, dh, dw, KH=kh, KW=kw, HAS_BIAS=bias is not None, PHASE=PHASE, DOT=DOT,
        PREC=prec, BLOCK_P=BLOCK_P, BLOCK_C=block_c, BLOCK_K=block_k, num_warps=NUM_WARPS,
    )  # fmt: skip
    return y


# The 1-3-D strategies (`nd_dot`, `nd_fma`): every convolution read as 3-D (a 1-D or 2-D one has
# D = H = 1, a kernel of 1 and stride 1 there), its pointwise chain fused. `_mma`, `_extra` (conv_parts'
# own) and `_epilogue` (the traced chain) are rendered beside these by conv_transpose.render.


@triton.jit
def _convt_nd_tap(
    acc, x_tap, inside, w_tap, n_mask, C_IN_G, DHW, W_CS, DOT: tl.constexpr, PREC: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one tap: acc[rows, channels] += x[rows, group's input channels] @ w[group's input channels, channels]
    if DOT:
        rk = tl.arange(0, BLOCK_K)
        for c0 in range(0, C_IN_G, BLOCK_K):
            c = c0 + rk
            c_ok = c < C_IN_G
            a = tl.load(x_tap[:, None] + c[None, :] * DHW, mask=inside[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w_tap[None, :] + c[:, None] * W_CS, mask=c_ok[:, None] & n_mask[None, :], other=0.0)
            acc = _mma(a, b, acc, PREC)  # noqa: F821 - conv_parts' own, rendered beside this
    else:
        for c in range(C_IN_G):
            a = tl.load(x_tap + c * DHW, mask=inside, other=0.0).to(tl.float32)
            b = tl.load(w_tap + c * W_CS, mask=n_mask, other=0.0).to(tl.float32)
            acc += a[:, None] * b[None, :]
    return acc


@triton.jit
def _convt_nd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, e1_ptr, e2_ptr, e3_ptr,
    s1n, s1c, s1d, s1h, s1w, s2n, s2c, s2d, s2h, s2w, s3n, s3c, s3d, s3h, s3w,
    NB, C_IN, D, H, W, C_OUT, OD, OH, OW, M_MAX, C_IN_G, C_OUT_G, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRAS: tl.constexpr,
    PHASE_W: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # axis 1: the stride phase (rd, rh[, rw]): the outputs od = rd + qd*SD, oh = rh + qh*SH (ow = rw +
    # qw*SW with PHASE_W, else every ow) take exactly the taps kd with (rd + PD - kd*DD) % SD == 0 (one
    # scalar test per phase and tap), reading input row (rd + PD - kd*DD) / SD + qd; without PHASE_W the
    # last dim's taps are masked per output column and its stores are contiguous.
    # axis 0: (group, row block, column block), columns fastest: the programs that gather the same rows
    # run together. Rows: (n, qd, qh, qw) of the phase; columns: the group's output channels.
    pid = tl.program_id(0)
    phase = tl.program_id(1)
    n_blocks = tl.cdiv(C_OUT_G, BLOCK_N)
    m_blocks = tl.cdiv(M_MAX, BLOCK_M)
    pid_n = pid % n_blocks
    pid_m = (pid // n_blocks) % m_blocks
    g = pid // (n_blocks * m_blocks)
    if PHASE_W:
        rw = phase % SW
        t = phase // SW
        QW = (OW - rw + SW - 1) // SW
    else:
        rw = 0
        t = phase
        QW = OW
    rh = t % SH
    rd = t // SH
    QH = (OH - rh + SH - 1) // SH
    QD = (OD - rd + SD - 1) // SD
    QS = QD * QH * QW
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = rm < NB * QS
    QS1 = tl.maximum(QS, 1)  # a phase no output falls in (an output dim shorter than its stride)
    nb = rm // QS1
    s = rm % QS1
    qw = s % QW
    qh = (s // QW) % QH
    qd = s // (QW * QH)
    od = rd + qd * SD
    oh = rh + qh * SH
    ow = rw + qw * SW if PHASE_W else qw
    ocl = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = ocl < C_OUT_G
    oc = g * C_OUT_G + ocl
    TAPS: tl.constexpr = KD * KH * KW
    W_CS = C_OUT_G * TAPS  # the weight's input-channel stride: w is (C_IN, C_OUT_G, KD, KH, KW)
    DHW = D * H * W
    x_m = x_ptr + (nb.to(tl.int64) * C_IN + g * C_IN_G) * DHW  # each row's sample, the group's channel 0
    w_n = w_ptr + (g * C_IN_G).to(tl.int64) * W_CS + ocl * TAPS  # each column's filter, input channel 0
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kd in range(KD):
        td = rd + PD - kd * DD
        if td % SD == 0:  # exact or never, for the whole phase
            di = td // SD + qd
            d_ok = m_mask & (di >= 0) & (di < D)
            for kh in range(KH):
                th = rh + PH - kh * DH
                if th % SH == 0:
                    hi = th // SH + qh
                    row_ok = d_ok & (hi >= 0) & (hi < H)
                    x_row = x_m + (di * H + hi) * W
                    for kw in range(KW):
                        w_tap = w_n + (kd * KH + kh) * KW + kw
                        if PHASE_W:
                            tw = rw + PW - kw * DW
                            if tw % SW == 0:
                                wi = tw // SW + qw
                                inside = row_ok & (wi >= 0) & (wi < W)
                                acc = _convt_nd_tap(
                                    acc, x_row + wi, inside, w_tap, n_mask, C_IN_G, DHW, W_CS, DOT, PREC,
                                    BLOCK_K,
                                )  # fmt: skip
                        else:
                            tw = ow + PW - kw * DW
                            twp = tl.where(tw >= 0, tw, 0)
                            wi = twp // SW
                            inside = row_ok & (tw >= 0) & (twp % SW == 0) & (wi < W)
                            acc = _convt_nd_tap(
                                acc, x_row + wi, inside, w_tap, n_mask, C_IN_G, DHW, W_CS, DOT, PREC, BLOCK_K
                            )  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(b_ptr + oc, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    v1 = 0.0
    v2 = 0.0
    v3 = 0.0
    if EXTRAS >= 1:
        v1 = _extra(e1_ptr, s1n, s1c, s1d, s1h, s1w, nb, od, oh, ow, oc, mask)  # noqa: F821 - conv_parts'
    if EXTRAS >= 2:
        v2 = _extra(e2_ptr, s2n, s2c, s2d, s2h, s2w, nb, od, oh, ow, oc, mask)  # noqa: F821
    if EXTRAS >= 3:
        v3 = _extra(e3_ptr, s3n, s3c, s3d, s3h, s3w, nb, od, oh, ow, oc, mask)  # noqa: F821
    out = _epilogue(acc, v1, v2, v3)  # noqa: F821 - the candidate's traced chain, rendered beside this
    OS = OD * OH * OW
    rows = nb.to(tl.int64) * C_OUT * OS + (od * OH + oh) * OW + ow
    y = y_ptr + rows[:, None] + (oc.to(tl.int64) * OS)[None, :]
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask)


def _convt_nd_launch(
    x, w, b, extras, stride, padding, dilation, output_padding, groups, out_dtype, dot, phase_w, fp32_dot,
    block_m, block_n, block_k, num_warps, num_stages,
):  # fmt: skip
    """epilogue(conv_transpose(x, w) + b, *extras) over x's last w.dim() - 2 axes; stride, padding,
    dilation, output padding and groups are the traced ones."""
    spatial = w.dim() - 2
    pad = 3 - spatial
    x = x.contiguous()
    w = w.contiguous()
    n_, c_in = x.shape[0], x.shape[1]
    c_out_g = w.shape[1]
    c_out = c_out_g * groups
    c_in_g = c_in // groups
    dims = [1] * pad + list(x.shape[2:])
    ks = [1] * pad + list(w.shape[2:])
    st = [1] * pad + list(stride)
    pd = [0] * pad + list(padding)
    dl = [1] * pad + list(dilation)
    op = [0] * pad + list(output_padding)
    outs = [(dims[i] - 1) * st[i] - 2 * pd[i] + dl[i] * (ks[i] - 1) + op[i] + 1 for i in range(3)]
    y = torch.empty([n_, c_out, *outs[pad:]], dtype=out_dtype or x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    sw = st[2] if phase_w else 1
    # the largest phase's rows (phase 0's): the grid's row blocks; smaller phases mask the rest
    m_max = n_ * triton.cdiv(outs[0], st[0]) * triton.cdiv(outs[1], st[1]) * triton.cdiv(outs[2], sw)
    floor = 16 if dot else 1  # a tl.dot's tiles are at least 16 a side
    bm = min(block_m, max(16, triton.next_power_of_2(m_max)))
    bn = min(block_n, max(floor, triton.next_power_of_2(c_out_g)))
    bk = min(block_k, max(floor, triton.next_power_of_2(c_in_g)))
    prec = fp32_dot if x.dtype == torch.float32 else "native"
    ptrs, strides = [], []
    for e in extras:
        e = e.expand(y.shape)
        ptrs.append(e)
        es = list(e.stride())
        strides += es[:2] + [0] * pad + es[2:]
    ptrs += [y] * (3 - len(extras))
    strides += [0] * (15 - len(strides))
    grid = (triton.cdiv(c_out_g, bn) * triton.cdiv(m_max, bm) * groups, st[0] * st[1] * sw)
    _convt_nd_kernel[grid](
        x, w, b if b is not None else w, y, *ptrs, *strides, n_, c_in, *dims, c_out, *outs, m_max, c_in_g,
        c_out_g, *st, *pd, *dl, KD=ks[0], KH=ks[1], KW=ks[2], HAS_BIAS=b is not None, EXTRAS=len(extras),
        PHASE_W=phase_w, DOT=dot, PREC=prec, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return y
