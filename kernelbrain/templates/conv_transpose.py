"""Grouped, strided, padded, dilated 2-D transposed convolution (nn.ConvTranspose2d), no torch conv.

Shapes: x (N, C_in, H, W); weight (C_in, C_out/G, KH, KW) (ConvTranspose2d's layout); groups G, with
C_in_g = C_in/G input and C_out_g = C_out/G output channels per group. The output size is

    OH = (H - 1)*sh - 2*ph + dh*(KH - 1) + oph + 1        (likewise OW with sw, pw, dw, KW, opw)

and the gather form of the transposed convolution (input channel c in group g = oc // C_out_g):

    y[n, oc, oh, ow] = b[oc] + sum_{c, kh, kw} x[n, c, ih, iw] * w[c, oc - g*C_out_g, kh, kw]
    where  ih = (oh + ph - kh*dh) / sh,  iw = (ow + pw - kw*dw) / sw,

a tap contributing only when both divisions are exact and 0 <= ih < H, 0 <= iw < W. Accumulation is
in fp32. The dot forms' fp32 products (knob `fp32_dot`) are "ieee" (FMA units, the default) or
"tf32x3" (three TF32 tensor-core dots, hi*hi + hi*lo + lo*hi of operands split in registers: products
good to ~2^-21 relative, against 1e-4; plain TF32's 2^-11 is ruled out by the 1e-4 tolerance).

Strategy axes:
- `direct`: one program per (n, group, output-channel block, output-pixel block); every tap (kh, kw)
  is visited for every pixel and masked when the division is not exact or out of range; an outer
  product w[C block] x x[pixel block] per (tap, input channel), on FMA units.
- `phase`: stride-phase decomposition. The outputs with oh % sh == rh, ow % sw == rw (one of sh*sw
  phases, the grid's third axis) take exactly the taps with (rh + ph - kh*dh) % sh == 0 (likewise kw),
  and for those ih = (rh + ph - kh*dh)/sh + i where oh = rh + i*sh: no masked-away taps (1/(sh*sw)
  of the direct form's tap visits at stride (2, 3)), contiguous input rows per tap.
- `phase_dot`: the phase form as an implicit GEMM: per valid tap a [pixels x C_in_g] x [C_in_g x
  C_out_g block] tl.dot (input_precision="ieee" for fp32), K in BLOCK_K steps over the group's
  input channels.
- `rows`: one output row of one (n, group, channel block) per program, and within it every stride
  phase of a block of columns (ow = rw + j*sw, all rw). The row decides which kh contribute (one
  scalar test per kh: a row with none, half of them at stride 2, only writes zeros); each (kh, kw)
  tap belongs to exactly one column phase, known at compile time from the constexpr stride, padding
  and dilation, so no tap is visited in vain. The phases of a row are written by the same program one
  after another, so their interleaved (stride-sw) stores complete the same L2 lines at once instead
  of leaving them partially written, as `phase`'s grid of phases does (there the phases of a line are
  written by programs far apart in time).
- `rows_dense`: one output row per program, like `rows`, but the row's phases are one implicit GEMM
  per valid kh: rows (output channel, phase p), columns the periods j (ow = j*sw + p), K (input
  channel, input-column offset d), the weight of phase p at offset d being tap kw = (p + pw - d*sw)/dw
  where that is exact (zero elsewhere), so every (phase, tap) pair that meets is in one tl.dot (ieee
  for fp32) over contiguous input rows x[c, ih, j + d]. The phase axis is padded to a power of two
  (4 at stride 3). The tile is then gathered in registers into contiguous columns and stored once:
  every warp writes whole 32-byte sectors. (On group_conv at an H200, this kernel storing each
  phase at stride 3, as `rows` does, kept the L2 busy with partly written sectors: its stores alone,
  with no computation, took 1.3 ms; gathered into contiguous columns, 0.23 ms.) Rows with no valid
  kh (half of them at stride 2) load nothing.
Knobs: BLOCK_P (output pixels per program; for `rows`, columns per phase; for `rows_dense`, column
slots, BLOCK_P / next_pow2(sw) periods of sw columns), BLOCK_C (output channels per program), BLOCK_K
(dot's K in input channels; unused by `rows`), num_warps, `fp32_dot` (above; only the tl.dot forms,
phase_dot and rows_dense, take it: the others are FMA outer products), and `prepack` (rows_dense: a
small kernel first writes each (group, channel block, kh, K step) weight tile as a dense, zero-filled
[BLOCK_C x phases, BLOCK_K x offsets] block, so the main kernel loads each with one unmasked load
instead of building its index and mask tensors, which otherwise stay live across the tap loop; on
group_conv at the H200, where the unpacked kernel holds 127 registers a thread at 22% occupancy, it
was no faster, so round 0 leaves it to the mutations).

ModelNew builds the same nn.ConvTranspose2d under Model's attribute name (`conv_transpose2d`, the
KernelBench name, unless the spec says otherwise), from Model's constructor parameters, so the
state_dict keys match and the gate's copy makes the weights identical; forward reads stride, padding,
dilation, output_padding and groups from that module and only computes the output with Triton.
"""

from __future__ import annotations

from typing import Any

FAMILY = "conv_transpose"
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
# fp32 accumulator elements per thread; past this the accumulator spills
MAX_ACC_PER_THREAD = 128
STRATEGIES = ("direct", "phase", "phase_dot", "rows", "rows_dense")
# fp32 products of the tl.dot forms (module docstring), the first the default
FP32_DOTS = ("ieee", "tf32x3")
DOT_STRATEGIES = ("phase_dot", "rows_dense")

TF32_DENSE = {
    "strategy": "rows_dense",
    "block_p": 128,
    "block_c": 16,
    "block_k": 8,
    "num_warps": 2,
    "fp32_dot": "tf32x3",
}
ROUND0: list[dict[str, Any]] = [
    # first, so a short budget measures them first: the fastest on group_conv at an H200 (tools/
    # gpu_conv_probe.py: 0.78-0.84 ms at the primary shape against eager's 5.8 and `rows`' 1.7)
    # tf32x3 dots: 7.54x eager against ieee's 7.11x at the primary shape (probe4, the same call)
    TF32_DENSE,
    {"strategy": "rows_dense", "block_p": 128, "block_c": 16, "block_k": 8, "num_warps": 2},
    {"strategy": "rows_dense", "block_p": 128, "block_c": 16, "block_k": 8, "num_warps": 4},
    {"strategy": "rows_dense", "block_p": 256, "block_c": 16, "block_k": 8, "num_warps": 4},
    {"strategy": "direct", "block_p": 256, "block_c": 16, "block_k": 8, "num_warps": 8},
    {"strategy": "phase", "block_p": 128, "block_c": 16, "block_k": 4, "num_warps": 4},
    {"strategy": "phase", "block_p": 64, "block_c": 32, "block_k": 8, "num_warps": 8},
    {"strategy": "phase_dot", "block_p": 64, "block_c": 16, "block_k": 16, "num_warps": 4},
    {"strategy": "phase_dot", "block_p": 128, "block_c": 32, "block_k": 16, "num_warps": 8},
    {"strategy": "rows", "block_p": 64, "block_c": 16, "block_k": 1, "num_warps": 4},
    {"strategy": "rows", "block_p": 128, "block_c": 16, "block_k": 1, "num_warps": 4},
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        ("phase", "stride phases visit only the taps that contribute: sh*sw times fewer tap visits"),
        ("dot", "an implicit-GEMM tl.dot over the group's input channels instead of outer products"),
        ("longer_k", "more input channels per step: fewer loop trips, more independent FMAs"),
        ("tf32x3_dot", "fp32 dots as three TF32 tensor-core dots instead of FMAs on the CUDA cores"),
    ],
    "memory-bound near peak": [
        ("wider_channels", "more output channels per program re-read each input pixel fewer times"),
    ],
    "memory-bound with poor coalescing": [
        ("rows_dense", "every phase of a row block in one GEMM, stored as one contiguous run of columns"),
        ("rows", "all stride phases of a row from one program: interleaved stores fill L2 lines together"),
        ("larger_tiles", "longer pixel blocks make longer contiguous row loads and stores"),
    ],
    "latency or occupancy-limited": [
        ("rows_dense", "rows as small GEMMs over the valid taps only; zero rows store without loading"),
        ("rows", "no phase grid: one row per program, each tap on its compile-time phase, no masked taps"),
        ("more_warps", "more warps keep more loads in flight"),
        ("smaller_tiles", "smaller pixel blocks make more programs to fill the SMs"),
        ("tf32x3_dot", "tensor-core dots finish each program's few FMAs-worth of work sooner"),
        ("prepack", "weight tiles packed once a call: no per-program index and mask tensors (registers)"),
    ],
    "launch-bound": [("larger_tiles", "fewer, fatter programs amortise launch and scheduling cost")],
    "register spills": [
        ("more_warps", "spread the accumulator over more threads"),
        ("smaller_tiles", "a smaller pixel block holds a smaller accumulator"),
        ("ieee_dot", "an FMA dot keeps no TF32 hi/lo copies of its operands live"),
        ("prepack", "packed weight tiles need no index or mask tensors held across the tap loop"),
    ],
}


def _name(op: dict) -> str:
    return str(op["op"]).strip("_")


def matches(ops: list[dict]) -> dict | None:
    """Exactly one 4-D floating-point conv_transpose2d (contiguous copies allowed), nothing else."""
    seq = [o for o in ops if _name(o) not in {"contiguous"}]
    if len(seq) != 1 or _name(seq[0]) != "conv_transpose2d":
        return None
    op = seq[0]
    if op.get("dtype") not in FLOAT_DTYPES:
        return None
    shape = [int(s) for s in op.get("shape") or []]
    if len(shape) != 4 or int(op.get("ndim", 4)) != 4:
        return None
    n, c_in, h, w = shape
    return {"n": n, "c_in": c_in, "h": h, "w": w, "dtype": op["dtype"]}


def fp32_dot(knobs: dict[str, Any]) -> str:
    """The fp32 dot precision of a knob set (knob sets recorded before the knob existed: ieee)."""
    v = str(knobs.get("fp32_dot", FP32_DOTS[0]))
    if v not in FP32_DOTS:
        raise ValueError(f"conv_transpose knob fp32_dot={v!r}: expected one of {', '.join(FP32_DOTS)}")
    return v


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Power-of-two blocks (>= 16 per tl.dot dim), the accumulator (and, for the FMA forms, the
    BLOCK_K x BLOCK_C x BLOCK_P product summed over K) within registers."""
    if knobs.get("strategy") not in STRATEGIES:
        return False
    bp, bc, bk, warps = knobs["block_p"], knobs["block_c"], knobs["block_k"], knobs["num_warps"]
    if any(b < 1 or b & (b - 1) for b in (bp, bc, bk)) or warps not in (1, 2, 4, 8, 16):
        return False
    try:
        fp32_dot(knobs)
    except ValueError:
        return False
    if knobs.get("prepack") and knobs["strategy"] != "rows_dense":
        return False  # only rows_dense has weight tiles to pack
    threads = 32 * warps
    if knobs["strategy"] == "phase_dot":
        return min(bp, bc, bk) >= 16 and bp * bc <= MAX_ACC_PER_THREAD * threads
    if knobs["strategy"] == "rows":  # one phase's [BLOCK_C, BLOCK_P] accumulator live at a time
        return bp >= 16 and bc >= 16 and bp * bc <= MAX_ACC_PER_THREAD * threads
    if knobs["strategy"] == "rows_dense":  # a [BLOCK_C x phases, BLOCK_P / phases] accumulator
        # narrower blocks than tl.dot's 16 are widened (and masked) at launch, so they stay allowed
        return bp >= 16 and bc >= 4 and bp * bc <= MAX_ACC_PER_THREAD * threads
    return bp >= 16 and bc >= 16 and bp * bc * (1 + bk) <= 2 * MAX_ACC_PER_THREAD * threads


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "phase":
        return {**k, "strategy": "phase"} if k["strategy"] == "direct" else None
    if move == "rows_dense":  # its K step covers BLOCK_K input channels: at least 8 of them
        return (
            None
            if k["strategy"] == "rows_dense"
            else {**k, "strategy": "rows_dense", "block_k": max(8, k["block_k"])}
        )
    if move == "rows":
        return None if k["strategy"] == "rows" else {**k, "strategy": "rows", "block_k": 1}
    if move == "dot":
        if k["strategy"] == "phase_dot":
            return None
        return {**k, "strategy": "phase_dot", "block_k": max(16, k["block_k"])}
    if move == "prepack":
        return {**k, "prepack": True} if k["strategy"] == "rows_dense" and not k.get("prepack") else None
    if move in {"tf32x3_dot", "ieee_dot"}:
        v = move.removesuffix("_dot")
        ok = k["strategy"] in DOT_STRATEGIES and fp32_dot(k) != v
        return {**k, "fp32_dot": v} if ok else None
    if move == "wider_channels":
        return {**k, "block_c": k["block_c"] * 2} if k["block_c"] < 128 else None
    if move == "larger_tiles":
        return {**k, "block_p": k["block_p"] * 2} if k["block_p"] < 512 else None
    if move == "smaller_tiles":
        return {**k, "block_p": k["block_p"] // 2} if k["block_p"] > 16 else None
    if move == "more_warps":
        return {**k, "num_warps": k["num_warps"] * 2} if k["num_warps"] < 16 else None
    if move == "longer_k":
        return {**k, "block_k": k["block_k"] * 2} if k["block_k"] < 64 else None
    raise ValueError(f"unknown move {move!r}")


_KERNEL = """
@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr):
    # fp32 operands: PREC is "ieee" (FMA units) or "tf32x3" (three TF32 tensor-core dots); 16-bit: "native"
    if PREC == "native":
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=PREC)
    return acc


@triton.jit
def _taps(acc, x_tap, w_tap, valid, c_mask, rk, C_IN_G, HW, W_STRIDE, DOT: tl.constexpr, PREC: tl.constexpr,
          BLOCK_K: tl.constexpr):
    # one tap (kh, kw): acc += x[pixels, group channels] @ w[group channels, output channels]
    for c0 in range(0, C_IN_G, BLOCK_K):
        kc = c0 + rk
        k_mask = kc < C_IN_G
        if DOT:
            a = tl.load(x_tap[:, None] + kc[None, :] * HW, mask=valid[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_tap[None, :] + kc[:, None] * W_STRIDE, mask=k_mask[:, None] & c_mask[None, :],
                        other=0.0)
            acc = _dot(a, b, acc, PREC)
        else:
            # BLOCK_K outer products w[c, C block] x x[c, pixel block] at once, on FMA units
            a = tl.load(x_tap[None, :] + kc[:, None] * HW, mask=k_mask[:, None] & valid[None, :], other=0.0)
            b = tl.load(w_tap[None, :] + kc[:, None] * W_STRIDE, mask=k_mask[:, None] & c_mask[None, :],
                        other=0.0)
            acc += tl.sum(b.to(tl.float32)[:, :, None] * a.to(tl.float32)[:, None, :], axis=0)
    return acc


@triton.jit
def _convt_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_IN_G, C_OUT_G, N_CB,
                  SH, SW, PH, PW, DH, DW, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr,
                  PHASE: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, BLOCK_P: tl.constexpr,
                  BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
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
                    acc = _taps(acc, x_n + ih * W + iw, w_g + kh * KW + kw, valid, c_mask, rk, C_IN_G, HW,
                                W_STRIDE, DOT, PREC, BLOCK_K)
            else:
                th = oh + PH - kh * DH
                tw = ow + PW - kw * DW
                thp = tl.where(th >= 0, th, 0)
                twp = tl.where(tw >= 0, tw, 0)
                ih = thp // SH
                iw = twp // SW
                valid = p_mask & (th >= 0) & (tw >= 0) & (thp % SH == 0) & (twp % SW == 0)
                valid = valid & (ih < H) & (iw < W)
                acc = _taps(acc, x_n + ih * W + iw, w_g + kh * KW + kw, valid, c_mask, rk, C_IN_G, HW,
                            W_STRIDE, DOT, PREC, BLOCK_K)
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
def _convt_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_OUT_G, N_CB,
                       C_IN_G: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                       PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr,
                       KW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_J: tl.constexpr,
                       BLOCK_C: tl.constexpr):
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
def _dense_w(w_ptr, g, cb, C_OUT_G, C_IN_G: tl.constexpr, SW: tl.constexpr, PW: tl.constexpr,
             DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, SWP: tl.constexpr, DMIN: tl.constexpr,
             NDP: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
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
def _pack_dense_w(w_ptr, wp_ptr, C_OUT_G, N_CB, N_C0, C_IN_G: tl.constexpr, SW: tl.constexpr,
                  PW: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, SWP: tl.constexpr,
                  DMIN: tl.constexpr, NDP: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
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
def _convt_dense_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C_IN, H, W, C_OUT, OH, OW, C_OUT_G, N_CB, N_JB,
                        C_IN_G: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
                        PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr,
                        KW: tl.constexpr, HAS_BIAS: tl.constexpr, SWP: tl.constexpr, DMIN: tl.constexpr,
                        NDP: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr, BLOCK_J: tl.constexpr,
                        BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
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
    w_g, a_ok, kc = _dense_w(w_ptr, g, cb, C_OUT_G, C_IN_G, SW, PW, DW, KH, KW, SWP, DMIN, NDP, BLOCK_C,
                             BLOCK_K)
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
    tl.store(y_row + ow[None, :], vals.to(y_ptr.dtype.element_ty),
             mask=cb_ok[:, None] & ((w < BLOCK_J * SW) & (ow < OW))[None, :])


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _launch(x, conv):
    if conv.padding_mode != "zeros":
        raise ValueError("ConvTranspose2d supports only zero padding")
    n, c_in, h, w = x.shape
    weight = conv.weight.contiguous()
    bias = conv.bias
    groups = int(conv.groups)
    kh, kw = _pair(conv.kernel_size)
    sh, sw = _pair(conv.stride)
    ph, pw = _pair(conv.padding)
    dh, dw = _pair(conv.dilation)
    oph, opw = _pair(conv.output_padding)
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
            C_IN_G=c_in_g, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, KH=kh, KW=kw,
            HAS_BIAS=bias is not None, BLOCK_J=BLOCK_P, BLOCK_C=block_c, num_warps=NUM_WARPS,
        )
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
            )
        _convt_dense_kernel[(n * groups * n_cb * oh * n_jb,)](
            x, wt, bias if bias is not None else weight, y, c_in, h, w, c_out, oh, ow, c_out_g, n_cb,
            n_jb, C_IN_G=c_in_g, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, KH=kh, KW=kw,
            HAS_BIAS=bias is not None, SWP=swp, DMIN=dmin, NDP=ndp, PREC=prec, PACKED=PREPACK,
            BLOCK_J=block_j, BLOCK_C=block_c, BLOCK_K=block_k, num_warps=NUM_WARPS,
        )
        return y
    if PHASE:
        pixels = triton.cdiv(oh, sh) * triton.cdiv(ow, sw)
        grid = (n * groups * n_cb, triton.cdiv(pixels, BLOCK_P), sh * sw)
    else:
        grid = (n * groups * n_cb, triton.cdiv(oh * ow, BLOCK_P), 1)
    _convt_kernel[grid](
        x, weight, bias if bias is not None else weight, y, c_in, h, w, c_out, oh, ow, c_in // groups,
        c_out_g, n_cb, sh, sw, ph, pw, dh, dw, KH=kh, KW=kw, HAS_BIAS=bias is not None, PHASE=PHASE,
        DOT=DOT, PREC=prec, BLOCK_P=BLOCK_P, BLOCK_C=block_c, BLOCK_K=block_k,
        num_warps=NUM_WARPS,
    )
    return y
"""

# nn.ConvTranspose2d's parameters in its positional order, with the defaults ModelNew falls back to
# (bias: KernelBench's level-1 convention is a `bias: bool = False` parameter)
_CONV_PARAMS = (
    ("in_channels", None),
    ("out_channels", None),
    ("kernel_size", None),
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("bias", False),
    ("dilation", 1),
)
# KernelBench level 1's constructor order for transposed convolutions
_KB_ORDER = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias")


def constructor(signature: dict[str, list[str]]) -> dict[str, str]:
    """Which of Model's constructor parameters is which nn.ConvTranspose2d argument: by name where
    the names agree, else by KernelBench's positional order."""
    init = list(signature["init"])
    known = {p for p, _ in _CONV_PARAMS}
    if all(a in known for a in init) and {"in_channels", "out_channels", "kernel_size"} <= set(init):
        return {a: a for a in init}
    if len(init) < 3:
        raise ValueError(f"cannot tell the convolution's arguments from Model.__init__({', '.join(init)})")
    return {param: a for param, a in zip(_KB_ORDER, init, strict=False)}


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    names = constructor(signature)  # conv argument -> Model parameter
    by_param = {a: p for p, a in names.items()}
    defaults = dict(_CONV_PARAMS)
    params, defaulted = [], False
    for a in signature["init"]:
        p = by_param.get(a)
        if p is not None and defaults[p] is not None:
            params.append(f"{a}={defaults[p]!r}")
            defaulted = True
        else:
            params.append(f"{a}=None" if defaulted else a)
    init_args = "".join(f", {p}" for p in params)
    conv_args = ", ".join(f"{p}={names[p]}" for p, _ in _CONV_PARAMS if p in names)
    attr = spec.get("conv_attr", "conv_transpose2d")
    x = signature["forward"][0]
    rest = "".join(f", {a}" for a in signature["forward"][1:])
    strategy = knobs["strategy"]
    consts = [
        f"PHASE = {strategy in ('phase', 'phase_dot')}",
        f"DOT = {strategy == 'phase_dot'}",
        f"ROWS = {strategy == 'rows'}",
        f"DENSE = {strategy == 'rows_dense'}",
        f"BLOCK_P = {knobs['block_p']}",
        f"BLOCK_C = {knobs['block_c']}",
        f"BLOCK_K = {knobs['block_k']}",
        f"NUM_WARPS = {knobs['num_warps']}",
        f'FP32_DOT = "{fp32_dot(knobs)}"',
        f"PREPACK = {bool(knobs.get('prepack', False))}",
    ]
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    return f'''"""Transposed 2-D convolution: kernelbrain conv_transpose template ({knob_text})."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{chr(10).join(consts)}
{_KERNEL}

class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()
        # the same nn.ConvTranspose2d as Model's, under the same name: same state_dict keys, same weights
        self.{attr} = nn.ConvTranspose2d({conv_args})

    def forward(self, {x}{rest}):
        return _launch({x}, self.{attr})
'''
