"""Scaled dot-product attention, no mask, flash-style forward: O = softmax(Q K^T * s) V.

Shapes: Q (..., Lq, D), K (..., Lk, D), V (..., Lk, Dv), O (..., Lq, Dv); s = 1/sqrt(D) (SDPA's default).
One program per (batch*head, BLOCK_M query rows); it walks the keys in BLOCK_N tiles and never holds a
whole score row. With the scores of tile j, S_j = Q_blk K_j^T * s (fp32), the online softmax keeps per
query row a running max m, a running sum l and an unnormalised accumulator acc:

    m' = max(m, rowmax S_j)
    alpha = exp(m - m')          (rescales what was summed under the old max; 0 at the start)
    P_j = exp(S_j - m')
    l' = alpha * l + rowsum P_j
    acc' = alpha * acc + P_j V_j
    O_blk = acc / l              (after the last tile)

exp is taken as exp2, and the scale is applied after the max is subtracted: with R_j = Q_blk K_j^T the
raw scores and m' their running max, P_j = exp2((R_j - m') * c), c = s * log2(e). (Scaling first
rounds the large scores of signed, wide inputs once more: measured 2e-4 abs error against torch fp32's
1.3e-4 at D = 40.) Keys past Lk score -inf (P = 0); rows past Lq and columns past D are masked loads
(zeros) and masked stores. Every dot accumulates in fp32, whatever the input dtype. fp32 inputs
(tolerance 1e-4) use tl.dot(input_precision="ieee"): a TF32 dot (~5e-4 relative per product) fails;
fp16/bf16 take the default tensor-core dot, with P cast to V's dtype for P V.

Strategies:
- `full_d`: the Q block [BLOCK_M, D], K/V tiles [BLOCK_N, D] and acc [BLOCK_M, Dv] live whole (D padded
  to a power of two). One pass, minimal FLOPs; only for heads small enough (feasible() decides: acc
  within registers, one stage of K/V tiles within shared memory). At run time a head too wide for it
  falls back to `d_tiled` (the ladder's shapes may differ from the traced one).
- `d_tiled`: the head dim is tiled twice. The output is split into BLOCK_DV-wide column chunks, one per
  program (a third grid axis), each holding only acc [BLOCK_M, BLOCK_DV]; S_j is built as
  sum over BLOCK_D chunks c of Q_blk[:, c] K_j[:, c]^T. Every output chunk recomputes the scores:
  QK^T costs Dv/BLOCK_DV times its FLOPs (trading FLOPs for registers), the P V work is unchanged.
"""

from __future__ import annotations

from typing import Any

FAMILY = "attention"
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
# H100/H200: 227 KiB of shared memory per block (opt-in maximum)
MAX_SMEM = 227 * 1024
# fp32 accumulator + Q-block elements per thread before spilling
MAX_REGS_PER_THREAD = 128
# widest (padded) head the full_d kernel is ever launched with
FULL_D_MAX = 256
_ELT = {"float32": 4, "float16": 2, "bfloat16": 2}

ROUND0: list[dict[str, Any]] = [
    {"strategy": "full_d", "block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2},
    {"strategy": "full_d", "block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2},
    {
        "strategy": "d_tiled",
        "block_m": 64,
        "block_n": 64,
        "block_d": 64,
        "block_dv": 128,
        "num_warps": 4,
        "num_stages": 2,
    },
    {
        "strategy": "d_tiled",
        "block_m": 128,
        "block_n": 32,
        "block_d": 32,
        "block_dv": 64,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "strategy": "d_tiled",
        "block_m": 32,
        "block_n": 64,
        "block_d": 64,
        "block_dv": 256,
        "num_warps": 4,
        "num_stages": 2,
    },
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        ("wider_dv", "wider output chunks recompute Q K^T fewer times"),
        ("full_d", "one pass over the whole head: no recomputed scores"),
    ],
    "memory-bound near peak": [
        ("larger_m", "more query rows per program re-read each K/V tile fewer times"),
        ("wider_dv", "fewer output chunks re-read Q and K fewer times"),
    ],
    "memory-bound with poor coalescing": [
        ("longer_d", "longer head-dim chunks make longer contiguous loads")
    ],
    "latency or occupancy-limited": [
        ("more_stages", "a deeper software pipeline keeps more K/V loads in flight"),
        ("smaller_m", "fewer query rows per program make more programs to fill the SMs"),
    ],
    "launch-bound": [("larger_m", "fewer, fatter programs amortise launch and scheduling cost")],
    "register spills": [
        ("narrower_dv", "a narrower output chunk holds a smaller accumulator"),
        ("more_warps", "spread the accumulator over more threads"),
        ("smaller_n", "a narrower key tile holds fewer scores"),
    ],
}


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def matches(ops: list[dict]) -> dict | None:
    """A lone scaled_dot_product_attention (contiguous calls aside) on a float tensor of >= 2 dims."""
    seq = [o for o in ops if str(o["op"]).strip("_") != "contiguous"]
    if len(seq) != 1 or seq[0]["op"] != "scaled_dot_product_attention":
        return None
    op = seq[0]
    if op.get("dtype") not in FLOAT_DTYPES:
        return None
    shape = [int(s) for s in op.get("shape") or []]
    if len(shape) < 2:
        return None
    bh = 1
    for s in shape[:-2]:
        bh *= s
    return {"bh": bh, "lq": shape[-2], "d": shape[-1], "dtype": op["dtype"]}


def _blocks(spec: dict, knobs: dict[str, Any]) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) at the traced shape: clamped to the sequence (>= 16, tl.dot's minimum)."""
    cap = max(16, _next_pow2(spec["lq"])) if spec.get("lq") else None
    bm, bn = knobs["block_m"], knobs["block_n"]
    return (min(bm, cap), min(bn, cap)) if cap else (bm, bn)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Power-of-two tiles >= 16; full_d only where acc + Q block fit in registers and the K/V tiles of
    every pipeline stage (at least one) fit in shared memory; d_tiled's chunks likewise."""
    keys = ("block_m", "block_n") + (("block_d", "block_dv") if knobs["strategy"] == "d_tiled" else ())
    if any(knobs[k] < 16 or knobs[k] & (knobs[k] - 1) for k in keys) or knobs["num_stages"] < 1:
        return False
    bm, bn = _blocks(spec, knobs)
    elt = _ELT.get(spec.get("dtype", "float32"), 4)
    threads = 32 * knobs["num_warps"]
    d = max(16, _next_pow2(spec.get("d") or 16))
    if knobs["strategy"] == "full_d":
        if d > FULL_D_MAX:
            return False
        regs = bm * d + bm * d * elt // 4 + bm * bn  # acc, Q block, scores
        smem = knobs["num_stages"] * 2 * bn * d * elt
    else:
        bd = min(knobs["block_d"], d)
        dv = min(knobs["block_dv"], d)
        regs = bm * dv + bm * bn
        smem = knobs["num_stages"] * (bm * bd + bn * bd + bn * dv) * elt
    return regs <= MAX_REGS_PER_THREAD * threads and smem <= MAX_SMEM


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    tiled = k["strategy"] == "d_tiled"
    if move == "full_d":
        if not tiled:
            return None
        return {
            "strategy": "full_d",
            "block_m": k["block_m"],
            "block_n": k["block_n"],
            "num_warps": k["num_warps"],
            "num_stages": k["num_stages"],
        }
    if move in {"wider_dv", "narrower_dv", "longer_d"}:
        if not tiled:
            return (
                {**k, "strategy": "d_tiled", "block_d": 64, "block_dv": 128}
                if move == "narrower_dv"
                else None
            )
        key = "block_d" if move == "longer_d" else "block_dv"
        v = k[key] // 2 if move == "narrower_dv" else k[key] * 2
        return {**k, key: v} if 16 <= v <= 512 else None
    if move in {"larger_m", "smaller_m"}:
        v = k["block_m"] * 2 if move == "larger_m" else k["block_m"] // 2
        return {**k, "block_m": v} if 16 <= v <= 256 else None
    if move == "smaller_n":
        return {**k, "block_n": k["block_n"] // 2} if k["block_n"] > 16 else None
    if move == "more_stages":
        return {**k, "num_stages": k["num_stages"] + 1} if k["num_stages"] < 5 else None
    if move == "more_warps":
        return {**k, "num_warps": k["num_warps"] * 2} if k["num_warps"] < 16 else None
    raise ValueError(f"unknown move {move!r}")


_KERNELS = """
@triton.jit
def _attn_full_d(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
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
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        cols = n0 + rn
        # K tile read transposed: [BLOCK_D, BLOCK_N]
        kt = tl.load(k_base + cols[None, :] * D + rd[:, None], mask=(cols[None, :] < Lk) & (rd[:, None] < D),
                     other=0.0)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        elif UPCAST:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32))
        else:
            s = tl.dot(q, kt)
        s = tl.where(cols[None, :] < Lk, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2((m_i - m_new) * qk_scale)
        p = tl.exp2((s - m_new[:, None]) * qk_scale)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_mask = (cols[:, None] < Lk) & (rdv[None, :] < DV)
        v = tl.load(v_base + cols[:, None] * DV + rdv[None, :], mask=v_mask, other=0.0)
        if IEEE:
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        elif UPCAST:
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc * alpha[:, None])
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = acc / l_i[:, None]
    o = o_ptr + bh * Lq * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=(rm[:, None] < Lq) & (rdv[None, :] < DV))


@triton.jit
def _attn_d_tiled(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale,
                  IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
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
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        cols = n0 + rn
        n_mask = cols[None, :] < Lk
        # scores of this key tile, summed over BLOCK_D chunks of the head dim
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + rd
            q = tl.load(q_base + rm[:, None] * D + dd[None, :], mask=m_mask & (dd[None, :] < D), other=0.0)
            kt = tl.load(k_base + cols[None, :] * D + dd[:, None], mask=n_mask & (dd[:, None] < D), other=0.0)
            if IEEE:
                s = tl.dot(q, kt, s, input_precision="ieee")
            elif UPCAST:
                s = tl.dot(q.to(tl.float32), kt.to(tl.float32), s)
            else:
                s = tl.dot(q, kt, s)
        s = tl.where(n_mask, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2((m_i - m_new) * qk_scale)
        p = tl.exp2((s - m_new[:, None]) * qk_scale)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_mask = (cols[:, None] < Lk) & (rdv[None, :] < DV)
        v = tl.load(v_base + cols[:, None] * DV + rdv[None, :], mask=v_mask, other=0.0)
        if IEEE:
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        elif UPCAST:
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc * alpha[:, None])
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = acc / l_i[:, None]
    o = o_ptr + bh * Lq * DV + rm[:, None] * DV + rdv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=m_mask & (rdv[None, :] < DV))


def _launch(q, k, v, o):
    BH, Lq, D = q.shape
    Lk, DV = k.shape[1], v.shape[2]
    qk_scale = LOG2E / math.sqrt(D)
    cap = max(16, triton.next_power_of_2(max(Lq, Lk)))
    bm = min(BLOCK_M, max(16, triton.next_power_of_2(Lq)))
    bn = min(BLOCK_N, cap)
    d_pad = max(16, triton.next_power_of_2(D))
    dv_pad = max(16, triton.next_power_of_2(DV))
    ieee = q.dtype == torch.float32
    # the Triton CPU interpreter's bf16 tl.dot returns garbage: there, bf16 tiles are widened to fp32
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    if STRATEGY == "full_d" and max(d_pad, dv_pad) <= FULL_D_MAX:
        grid = (triton.cdiv(Lq, bm), BH)
        _attn_full_d[grid](q, k, v, o, Lq, Lk, D, DV, qk_scale, IEEE=ieee, UPCAST=upcast,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d_pad, BLOCK_DV=dv_pad,
                           num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        return
    bd = min(BLOCK_D, d_pad)
    bdv = min(BLOCK_DV, dv_pad)
    grid = (triton.cdiv(Lq, bm), BH, triton.cdiv(DV, bdv))
    _attn_d_tiled[grid](q, k, v, o, Lq, Lk, D, DV, qk_scale, IEEE=ieee, UPCAST=upcast,
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv,
                        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
"""


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init_args = "".join(f", {a}" for a in signature["init"])
    fwd = list(signature["forward"])
    if len(fwd) < 3:
        raise ValueError(f"attention needs forward(q, k, v): got forward({', '.join(fwd)})")
    q, k, v = fwd[:3]
    rest = "".join(f", {a}" for a in fwd[3:])
    consts = [
        f'STRATEGY = "{knobs["strategy"]}"',
        f"BLOCK_M = {knobs['block_m']}",
        f"BLOCK_N = {knobs['block_n']}",
        f"BLOCK_D = {knobs.get('block_d', 64)}",
        f"BLOCK_DV = {knobs.get('block_dv', 128)}",
        f"NUM_WARPS = {knobs['num_warps']}",
        f"NUM_STAGES = {knobs['num_stages']}",
        f"FULL_D_MAX = {FULL_D_MAX}",
        "LOG2E = 1.4426950408889634",
    ]
    knob_text = ", ".join(f"{a}={b}" for a, b in knobs.items())
    return f'''"""Scaled dot-product attention (flash forward, online softmax): kernelbrain attention template
({knob_text})."""

import math
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

{chr(10).join(consts)}
{_KERNELS}

class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()

    def forward(self, {q}, {k}, {v}{rest}):
        lead = {q}.shape[:-2]
        Lq, D = {q}.shape[-2:]
        Lk, DV = {k}.shape[-2], {v}.shape[-1]
        q3 = {q}.reshape(-1, Lq, D).contiguous()
        k3 = {k}.reshape(-1, Lk, D).contiguous()
        v3 = {v}.reshape(-1, Lk, DV).contiguous()
        o = torch.empty((q3.shape[0], Lq, DV), dtype={q}.dtype, device={q}.device)
        if o.numel():
            _launch(q3, k3, v3, o)
        return o.reshape(*lead, Lq, DV)
'''
