"""The attention family's Triton parts (copied into a candidate by `templates.render`, never imported
by the generator).

The flash kernels (`_attn_full_d`, `_attn_d_tiled`): one program per (batch*head, BLOCK_M query rows)
walks the keys in BLOCK_N tiles and never holds a whole score row. With the scores of tile j,
S_j = Q_blk K_j^T * s, the online softmax keeps per query row a running max m, a running sum l and an
unnormalised fp32 accumulator acc:

    m' = max(m, rowmax S_j)
    alpha = exp(m - m')          (rescales what was summed under the old max; 0 at the start)
    P_j = exp(S_j - m')
    l' = alpha * l + rowsum P_j
    acc' = alpha * acc + P_j V_j
    O_blk = acc / l              (after the last tile)

exp is taken as exp2, and the scale is applied after the max is subtracted: with R_j = Q_blk K_j^T the
raw scores and m' their running max, P_j = exp2((R_j - m') * c), c = s * log2(e). Keys past Lk score
-inf (P = 0); rows past Lq and columns past D are masked loads (zeros) and masked stores.

`materialized` runs `_scores`, `_softmax_rows` (and for presplit P V `_split_v`) and `_pv_gemm`;
`short16` runs `_attn_short16`. `_launch` picks the kernel at run time from the strategy, the dtype
and the head width, with the knob constants the candidate's module defines (STRATEGY, BLOCK_DV, TILES,
QK32, PV32, P16, SHORT16, ...: `attention.render` writes them). Every candidate copies the same parts,
LOG2E and every function here, and its id is its source's hash: any edit to them, comments included,
makes new candidates.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelbrain import candidate

# The knob constants `_launch` and `_materialized` read as globals: the candidate writes its own
# (attention.render); these defaults, never copied, only let this module import and lint.
STRATEGY = "full_d"
BLOCK_DV = 128
TILE = {"m": 64, "n": 64, "d": 64, "k": 64, "warps": 4, "stages": 2}
TILES = {"float32": TILE, "narrow16": TILE, "wide16": TILE}
QK32 = "fp64"
PV32 = "ieee"
P16 = "split"
SHORT16 = False
SHORT16_MAX = 256
FULL_D_MAX = 256
SCRATCH_BYTES = 1 << 30

LOG2E = 1.4426950408889634


@triton.jit
def _dot16(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        # the Triton CPU interpreter's bf16 tl.dot returns garbage: there the tiles widen (exactly) to fp32
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _qk(q, kt, s, QK: tl.constexpr, UPCAST: tl.constexpr):
    # s += q kt. fp32 inputs: QK names the recipe (module docstring); 16-bit inputs (QK "mma"): exact
    # products, fp32 sums on the tensor cores
    if QK == "fp64":
        s = tl.dot(q.to(tl.float64), kt.to(tl.float64), s, input_precision="ieee", out_dtype=tl.float64)
    elif QK == "ieee":
        s = tl.dot(q, kt, s, input_precision="ieee")
    elif QK == "tf32x3":
        s = tl.dot(q, kt, s, input_precision="tf32x3")
    else:
        s = _dot16(q, kt, s, UPCAST)
    return s


@triton.jit
def _pv(p, v, acc, PV: tl.constexpr, UPCAST: tl.constexpr):
    # acc += p v with p the fp32 probabilities. fp32 V: PV is "ieee" or "tf32x3". 16-bit V: the dot
    # takes P in V's dtype; "split" adds the rounding remainder lo = p - hi as a second dot
    if PV == "ieee":
        acc = tl.dot(p, v, acc, input_precision="ieee")
    elif PV == "tf32x3" or PV == "presplit":  # presplit's pre-split operands exist only in materialized
        acc = tl.dot(p, v, acc, input_precision="tf32x3")
    else:
        hi = p.to(v.dtype)
        acc = _dot16(hi, v, acc, UPCAST)
        if PV == "split":
            acc = _dot16((p - hi.to(tl.float32)).to(v.dtype), v, acc, UPCAST)
    return acc


@triton.jit
def _attn_full_d(
    q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale, QK: tl.constexpr, PV: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q_base = q_ptr + bh * Lq * D
    k_base = k_ptr + bh * Lk * D
    v_base = v_ptr + bh * Lk * DV
    q_mask = (rm[:, None] < Lq) & (rd[None, :] < D)
    q = tl.load(q_base + rm[:, None] * D + rd[None, :], mask=q_mask, other=0.0)
    # scores (and their running max) in fp64 for the fp64 recipe, else fp32
    s_zero = tl.zeros([BLOCK_M, BLOCK_N], tl.float64 if QK == "fp64" else tl.float32)
    m_i = tl.full([BLOCK_M], -float("inf"), s_zero.dtype)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        cols = n0 + rn
        # K tile read transposed: [BLOCK_D, BLOCK_N]
        kt = tl.load(
            k_base + cols[None, :] * D + rd[:, None], mask=(cols[None, :] < Lk) & (rd[:, None] < D), other=0.0
        )
        s = _qk(q, kt, s_zero, QK, UPCAST)
        s = tl.where(cols[None, :] < Lk, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(((m_i - m_new) * qk_scale).to(tl.float32))
        p = tl.exp2(((s - m_new[:, None]) * qk_scale).to(tl.float32))
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_mask = (cols[:, None] < Lk) & (rdv[None, :] < DV)
        v = tl.load(v_base + cols[:, None] * DV + rdv[None, :], mask=v_mask, other=0.0)
        acc = _pv(p, v, acc * alpha[:, None], PV, UPCAST)
        m_i = m_new
    out = acc / l_i[:, None]
    o = o_ptr + bh * Lq * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=(rm[:, None] < Lq) & (rdv[None, :] < DV))


@triton.jit
def _attn_d_tiled(
    q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale, QK: tl.constexpr, PV: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    pid_dv = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = pid_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    q_base = q_ptr + bh * Lq * D
    k_base = k_ptr + bh * Lk * D
    v_base = v_ptr + bh * Lk * DV
    m_mask = rm[:, None] < Lq
    s_zero = tl.zeros([BLOCK_M, BLOCK_N], tl.float64 if QK == "fp64" else tl.float32)
    m_i = tl.full([BLOCK_M], -float("inf"), s_zero.dtype)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        cols = n0 + rn
        n_mask = cols[None, :] < Lk
        # scores of this key tile, summed over BLOCK_D chunks of the head dim in one accumulator
        s = s_zero
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + rd
            q = tl.load(q_base + rm[:, None] * D + dd[None, :], mask=m_mask & (dd[None, :] < D), other=0.0)
            kt = tl.load(k_base + cols[None, :] * D + dd[:, None], mask=n_mask & (dd[:, None] < D), other=0.0)
            s = _qk(q, kt, s, QK, UPCAST)
        s = tl.where(n_mask, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(((m_i - m_new) * qk_scale).to(tl.float32))
        p = tl.exp2(((s - m_new[:, None]) * qk_scale).to(tl.float32))
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_mask = (cols[:, None] < Lk) & (rdv[None, :] < DV)
        v = tl.load(v_base + cols[:, None] * DV + rdv[None, :], mask=v_mask, other=0.0)
        acc = _pv(p, v, acc * alpha[:, None], PV, UPCAST)
        m_i = m_new
    out = acc / l_i[:, None]
    o = o_ptr + bh * Lq * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=m_mask & (rdv[None, :] < DV))


@triton.jit
def _scores(
    q_ptr, k_ptr, s_ptr, Lq, Lk, D, QK: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # S[bh] = Q[bh] K[bh]^T, raw (unscaled): one [BLOCK_M, BLOCK_N] tile, BLOCK_D steps over the head
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    q_base = q_ptr + bh * Lq * D
    k_base = k_ptr + bh * Lk * D
    s = tl.zeros([BLOCK_M, BLOCK_N], tl.float64 if QK == "fp64" else tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + rd
        q_mask = (rm[:, None] < Lq) & (dd[None, :] < D)
        q = tl.load(q_base + rm[:, None] * D + dd[None, :], mask=q_mask, other=0.0)
        k_mask = (rn[None, :] < Lk) & (dd[:, None] < D)
        kt = tl.load(k_base + rn[None, :] * D + dd[:, None], mask=k_mask, other=0.0)
        s = _qk(q, kt, s, QK, UPCAST)
    out = s_ptr + bh * Lq * Lk + rm[:, None].to(tl.int64) * Lk + rn[None, :]
    tl.store(out, s.to(s_ptr.dtype.element_ty), mask=(rm[:, None] < Lq) & (rn[None, :] < Lk))


@triton.jit
def _finite(x):
    return (x.to(tl.uint32, bitcast=True) & 0x7F800000) != 0x7F800000


@triton.jit
def _tf32(x):
    # x rounded (to nearest, ties away) to TF32's 10 explicit mantissa bits: a TF32 dot takes it exactly.
    # Within one rounding step of FLT_MAX it truncates instead (rounding up would give inf); inf and NaN
    # pass unchanged (the carry of a rounded NaN could reach the sign bit)
    b = x.to(tl.uint32, bitcast=True)
    r = tl.where((b & 0x7FFFFFFF) < 0x7F7FF000, (b + 0x1000) & 0xFFFFE000, b & 0xFFFFE000)
    return tl.where(_finite(x), r.to(tl.float32, bitcast=True), x)


@triton.jit
def _split_store(ptr, plane, x, mask, SPLIT: tl.constexpr):
    # x itself (SPLIT "none"); or its hi part at ptr and its remainder one plane further, each rounded to
    # TF32's 10 mantissa bits ("tf32": fp32 planes a TF32 dot takes exactly; a non-finite x is all hi, so
    # inf stays inf and NaN NaN) or to the planes' 16-bit dtype ("half": P for a 16-bit V, x in [0, 1])
    if SPLIT == "tf32":
        hi = _tf32(x)
        tl.store(ptr, hi, mask=mask)
        tl.store(ptr + plane, tl.where(_finite(x), _tf32(x - hi), 0.0), mask=mask)
    elif SPLIT == "half":
        hi = x.to(ptr.dtype.element_ty)
        tl.store(ptr, hi, mask=mask)
        tl.store(ptr + plane, (x - hi.to(tl.float32)).to(ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ptr, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_v(v_ptr, out_ptr, Lk, DV, plane, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr):
    # V[bh] (Lk x DV) split into TF32 hi/lo planes stored transposed (DV x Lk): the P V GEMM then reads
    # its B operand K-major, the layout Hopper's TF32 tensor-core instructions take from shared memory
    bh = tl.program_id(2).to(tl.int64)
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    rdv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    mask = (rk[:, None] < Lk) & (rdv[None, :] < DV)
    v = tl.load(v_ptr + bh * Lk * DV + rk[:, None] * DV + rdv[None, :], mask=mask, other=0.0)
    _split_store(out_ptr + bh * Lk * DV + rdv[None, :] * Lk + rk[:, None], plane, v, mask, "tf32")


@triton.jit
def _softmax_rows(
    s_ptr, p_ptr, rows, Lk, qk_scale, plane, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr
):
    # P: the softmax of S * scale along each row of S, in S's precision up to the exponent (as in the flash
    # kernels): an online max/sum pass, then a pass that writes normalised fp32 P
    rr = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rk = tl.arange(0, BLOCK_K)
    r_mask = rr[:, None] < rows
    base = rr[:, None] * Lk
    m = tl.full([BLOCK_R], -float("inf"), s_ptr.dtype.element_ty)
    l = tl.zeros([BLOCK_R], tl.float32)  # noqa: E741
    for k0 in range(0, Lk, BLOCK_K):
        cols = k0 + rk
        s = tl.load(s_ptr + base + cols[None, :], mask=r_mask & (cols[None, :] < Lk), other=-float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # rows past the end stay at -inf: keep their shift finite (their P is never stored)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(((m - m_safe) * qk_scale).to(tl.float32))
        l = l * alpha + tl.sum(tl.exp2(((s - m_safe[:, None]) * qk_scale).to(tl.float32)), axis=1)  # noqa: E741
        m = m_new
    m = tl.where(m == -float("inf"), 0.0, m)
    inv = 1.0 / l
    for k0 in range(0, Lk, BLOCK_K):
        cols = k0 + rk
        mask = r_mask & (cols[None, :] < Lk)
        s = tl.load(s_ptr + base + cols[None, :], mask=mask, other=-float("inf"))
        p = tl.exp2(((s - m[:, None]) * qk_scale).to(tl.float32)) * inv[:, None]
        _split_store(p_ptr + base + cols[None, :], plane, p, mask, SPLIT)


@triton.jit
def _pv_gemm(
    p_ptr, v_ptr, o_ptr, Lq, Lk, DV, p_plane, v_plane, PV: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # O[bh] = P[bh] V[bh]: one [BLOCK_M, BLOCK_DV] tile, BLOCK_N steps over the keys. presplit: P and V
    # are hi/lo plane pairs (p_plane, v_plane apart), three exact TF32 dots
    pid_m = tl.program_id(0)
    pid_dv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rdv = pid_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
    p_base = p_ptr + bh * Lq * Lk + rm[:, None].to(tl.int64) * Lk
    v_base = v_ptr + bh * Lk * DV
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        cols = n0 + rn
        p_mask = (rm[:, None] < Lq) & (cols[None, :] < Lk)
        p = tl.load(p_base + cols[None, :], mask=p_mask, other=0.0)
        v_mask = (cols[:, None] < Lk) & (rdv[None, :] < DV)
        if PV == "presplit":  # noqa: SIM108  (V's planes are stored transposed: DV x Lk)
            v_offs = rdv[None, :] * Lk + cols[:, None]
        else:
            v_offs = cols[:, None] * DV + rdv[None, :]
        v = tl.load(v_base + v_offs, mask=v_mask, other=0.0)
        if PV == "presplit":
            p_lo = tl.load(p_base + p_plane + cols[None, :], mask=p_mask, other=0.0)
            v_lo = tl.load(v_base + v_plane + v_offs, mask=v_mask, other=0.0)
            acc = tl.dot(p_lo, v, acc, input_precision="tf32")
            acc = tl.dot(p, v_lo, acc, input_precision="tf32")
            acc = tl.dot(p, v, acc, input_precision="tf32")
        elif PV == "split16" or PV == "single16":  # P already in V's dtype: hi (and lo) planes
            acc = _dot16(p, v, acc, UPCAST)
            if PV == "split16":
                p_lo = tl.load(p_base + p_plane + cols[None, :], mask=p_mask, other=0.0)
                acc = _dot16(p_lo, v, acc, UPCAST)
        else:
            acc = _pv(p, v, acc, PV, UPCAST)
    o = o_ptr + bh * Lq * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(o, acc.to(o_ptr.dtype.element_ty), mask=(rm[:, None] < Lq) & (rdv[None, :] < DV))


@triton.jit
def _attn_short16(
    q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale, PV: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # short16 (16-bit inputs, wide heads, every key in one tile): one program holds its BLOCK_M rows'
    # whole score rows, S = Q K^T stepping BLOCK_D over the head, takes their softmax in registers, then
    # walks the output in BLOCK_DV column chunks, P (split into V's dtype: hi and lo) times each V chunk.
    # The materialized recipe's FLOPs and precision in one launch and no scratch
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    q_base = q_ptr + bh * Lq * D
    k_base = k_ptr + bh * Lk * D
    v_base = v_ptr + bh * Lk * DV
    m_mask = rm[:, None] < Lq
    n_ok = rn < Lk
    s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = d0 + rd
        q = tl.load(q_base + rm[:, None] * D + dd[None, :], mask=m_mask & (dd[None, :] < D), other=0.0)
        k_mask = n_ok[None, :] & (dd[:, None] < D)
        kt = tl.load(k_base + rn[None, :] * D + dd[:, None], mask=k_mask, other=0.0)
        s = _dot16(q, kt, s, UPCAST)
    s = tl.where(n_ok[None, :], s, -float("inf"))
    m = tl.max(s, axis=1)
    p = tl.exp2((s - m[:, None]) * qk_scale)
    p = p / tl.sum(p, axis=1)[:, None]
    # P in V's dtype once, before the output chunks (hi, and for "split" the rounding remainder lo)
    hi = p.to(v_ptr.dtype.element_ty)
    lo = (p - hi.to(tl.float32)).to(v_ptr.dtype.element_ty)
    for dv0 in range(0, DV, BLOCK_DV):
        cols = dv0 + rdv
        v_mask = n_ok[:, None] & (cols[None, :] < DV)
        v = tl.load(v_base + rn[:, None] * DV + cols[None, :], mask=v_mask, other=0.0)
        acc = _dot16(hi, v, tl.zeros([BLOCK_M, BLOCK_DV], tl.float32), UPCAST)
        if PV == "split":
            acc = _dot16(lo, v, acc, UPCAST)
        o = o_ptr + bh * Lq * DV + rm[:, None] * DV + cols[None, :]
        tl.store(o, acc.to(o_ptr.dtype.element_ty), mask=m_mask & (cols[None, :] < DV))


def _materialized(q, k, v, o, qk, pv, upcast, qk_scale, t):
    BH, Lq, D = q.shape
    Lk, DV = k.shape[1], v.shape[2]
    s_dtype = torch.float64 if qk == "fp64" else torch.float32
    split = pv == "presplit"  # fp32 inputs only
    # 16-bit inputs: the softmax writes P in V's dtype, as hi + lo planes ("split") or rounded once
    half = q.dtype != torch.float32
    if half:
        pv = pv + "16"
    parts = 2 if split or pv == "split16" else 1
    p_dtype = v.dtype if half else torch.float32
    p_bytes = torch.finfo(p_dtype).bits // 8
    per_bh = Lq * Lk * (torch.finfo(s_dtype).bits // 8 + p_bytes * parts)
    per_bh += Lk * DV * 4 * parts if split else 0
    chunk = max(1, min(BH, SCRATCH_BYTES // max(1, per_bh)))
    s = torch.empty((chunk, Lq, Lk), dtype=s_dtype, device=q.device)
    # P (and for presplit V) as hi/lo planes: plane = the offset from a hi element to its lo
    p = torch.empty((parts, chunk, Lq, Lk), dtype=p_dtype, device=q.device)
    vs = torch.empty((parts, chunk, Lk, DV), dtype=torch.float32, device=q.device) if split else None
    bm, bn = t["m"], t["n"]
    bd = min(t["d"], max(16, triton.next_power_of_2(D)))
    bdv = min(BLOCK_DV, max(16, triton.next_power_of_2(DV)))
    bk = min(t["k"], max(16, triton.next_power_of_2(Lk)))
    p_split = "tf32" if split else ("half" if pv == "split16" else "none")
    row_block = min(1024, max(16, triton.next_power_of_2(Lk)))  # the softmax kernel's columns a step
    block_r = max(1, 2048 // row_block)
    for b0 in range(0, BH, chunk):
        b1 = min(BH, b0 + chunk)
        n = b1 - b0
        # one chunk (the usual case) passes the tensors themselves: at ~0.1 ms a call, each view costs
        qc, kc, vc, oc = (q, k, v, o) if n == BH else (q[b0:b1], k[b0:b1], v[b0:b1], o[b0:b1])
        _scores[(triton.cdiv(Lq, bm), triton.cdiv(Lk, bn), n)](
            qc, kc, s, Lq, Lk, D, QK=qk, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
            num_warps=t["warps"], num_stages=t["stages"],
        )  # fmt: skip
        _softmax_rows[(triton.cdiv(n * Lq, block_r),)](
            s, p, n * Lq, Lk, qk_scale, p[0].numel(), SPLIT=p_split, BLOCK_R=block_r, BLOCK_K=row_block,
            num_warps=4,
        )  # fmt: skip
        vv, v_plane = vc, 0
        if split:
            _split_v[(triton.cdiv(Lk, 64), triton.cdiv(DV, 64), n)](
                vv, vs, Lk, DV, vs[0].numel(), BLOCK_K=64, BLOCK_DV=64
            )
            vv, v_plane = vs, vs[0].numel()
        _pv_gemm[(triton.cdiv(Lq, bm), triton.cdiv(DV, bdv), n)](
            p, vv, oc, Lq, Lk, DV, p[0].numel(), v_plane, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=bk,
            BLOCK_DV=bdv, num_warps=t["warps"], num_stages=t["stages"],
        )  # fmt: skip


def _launch(q, k, v, o):
    BH, Lq, D = q.shape
    Lk, DV = k.shape[1], v.shape[2]
    qk_scale = LOG2E / math.sqrt(D)
    d_pad = max(16, triton.next_power_of_2(D))
    dv_pad = max(16, triton.next_power_of_2(DV))
    fits = max(d_pad, dv_pad) <= FULL_D_MAX
    t = TILES["float32" if q.dtype == torch.float32 else "narrow16" if fits else "wide16"]
    cap = max(16, triton.next_power_of_2(max(Lq, Lk)))
    bm = min(t["m"], max(16, triton.next_power_of_2(Lq)))
    bn = min(t["n"], cap)
    if q.dtype == torch.float32:
        qk, pv = QK32, PV32
    else:
        qk, pv = "mma", P16
    upcast = q.dtype == torch.bfloat16 and candidate.INTERPRETED
    lk_pad = max(16, triton.next_power_of_2(Lk))
    short = SHORT16 and q.dtype != torch.float32 and lk_pad <= SHORT16_MAX
    if STRATEGY == "materialized" and not fits and short:
        _attn_short16[(triton.cdiv(Lq, bm), BH)](
            q, k, v, o, Lq, Lk, D, DV, qk_scale, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=lk_pad,
            BLOCK_D=min(t["d"], d_pad), BLOCK_DV=min(BLOCK_DV, dv_pad), num_warps=t["warps"],
            num_stages=t["stages"],
        )  # fmt: skip
        return
    if STRATEGY == "materialized" and not fits:
        _materialized(q, k, v, o, qk, pv, upcast, qk_scale, {**t, "m": bm, "n": bn})
        return
    if STRATEGY in ("full_d", "materialized") and fits:
        grid = (triton.cdiv(Lq, bm), BH)
        _attn_full_d[grid](
            q, k, v, o, Lq, Lk, D, DV, qk_scale, QK=qk, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_D=d_pad, BLOCK_DV=dv_pad, num_warps=t["warps"], num_stages=t["stages"],
        )  # fmt: skip
        return
    bd = min(t["d"], d_pad)
    bdv = min(BLOCK_DV, dv_pad)
    grid = (triton.cdiv(Lq, bm), BH, triton.cdiv(DV, bdv))
    _attn_d_tiled[grid](
        q, k, v, o, Lq, Lk, D, DV, qk_scale, QK=qk, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
        BLOCK_DV=bdv, num_warps=t["warps"], num_stages=t["stages"],
    )  # fmt: skip
