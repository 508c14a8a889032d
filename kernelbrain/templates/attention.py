"""Scaled dot-product attention, no mask, flash-style forward: O = softmax(Q K^T * s) V.

Shapes: Q (..., Lq, D), K (..., Lk, D), V (..., Lk, Dv), O (..., Lq, Dv); s = 1/sqrt(D) (SDPA's default).
One program per (batch*head, BLOCK_M query rows); it walks the keys in BLOCK_N tiles and never holds a
whole score row. With the scores of tile j, S_j = Q_blk K_j^T * s, the online softmax keeps per query
row a running max m, a running sum l and an unnormalised fp32 accumulator acc:

    m' = max(m, rowmax S_j)
    alpha = exp(m - m')          (rescales what was summed under the old max; 0 at the start)
    P_j = exp(S_j - m')
    l' = alpha * l + rowsum P_j
    acc' = alpha * acc + P_j V_j
    O_blk = acc / l              (after the last tile)

exp is taken as exp2, and the scale is applied after the max is subtracted: with R_j = Q_blk K_j^T the
raw scores and m' their running max, P_j = exp2((R_j - m') * c), c = s * log2(e). Keys past Lk score
-inf (P = 0); rows past Lq and columns past D are masked loads (zeros) and masked stores.

Precision (the knobs qk32, pv32, p16; one candidate serves every dtype of a problem's shapes):
- fp32 Q K^T (`qk32`). The gate's x8 seed (signed inputs of std 8) makes the softmax nearly one-hot:
  at D = 1024 the raw scores have std 2048, and where a row's two largest scores nearly tie the output
  moves by ~|V| * (score error) * s. Any fp32 accumulation over D rounds partial sums of that size:
  an ieee (FMA) dot, a chain over all of D, misses 1e-4 at ~1 % of the outputs (max err ~5e-3, what
  the H200 measured), and so does PyTorch's own fp32 SDPA (2e-3 on CPU); fp32 chunks summed in fp64
  still fail at the tail. TF32 (the fp32 default) is far worse, and 3xTF32 (products good to ~2^-21)
  as bad as ieee. So "fp64" (the default) widens the Q and K tiles and accumulates the scores in an
  fp64 dot (exact products, fp64 sums; DMMA tensor cores on sm80/sm90), keeps S - m' in fp64 and
  rounds to fp32 only the exponent, which is small wherever P matters. "ieee" and "tf32x3" remain as
  knob values (fine for a looser tolerance or a narrow head), never proposed in round 0.
- fp32 P V (`pv32`): P in [0, 1] and V exact; products good to 2^-21 leave ~|V| * 1e-6, so both "ieee"
  (FMA on the CUDA cores) and "tf32x3" (three TF32 tensor-core dots) pass 1e-4; round 0 spreads both
  and the search keeps the faster. Plain TF32 rounds P to 10 bits: errors ~1e-2, never used.
  "presplit" (materialized only; elsewhere it runs as tf32x3) is 3xTF32 with the splits done before
  the GEMM: the softmax kernel writes P as hi + lo and a pass writes V likewise, each part rounded to
  TF32's 10 mantissa bits (so the TF32 tensor cores take it exactly), and the GEMM sums
  hi*hi + hi*lo + lo*hi in three plain TF32 dots of operands loaded straight from memory. The same
  products as tf32x3 (the dropped lo*lo is ~2^-22 relative), but no per-tile splitting in registers:
  on the H200 an in-register tf32x3 (or ieee) P V ran at ~40 TFLOP/s, slower than the fp64 scores.
- 16-bit P V (`p16`). The tensor-core dot wants P in V's dtype. Rounding P to bf16 (8 bits) perturbs
  each weight by 2^-9 relative; where weighted V values cancel (output near 0, |V| ~ 20) that leaves
  ~0.04 > 1e-2 (bf16 fails the x8 seed; fp16's 11 bits come within 1e-3 of the tolerance). "split"
  (the default) writes P = hi + lo, both in V's dtype (lo = P - hi is exact in fp32 before its own
  rounding), and accumulates two tensor-core dots in fp32: error ~2^-17, for one extra dot per tile.
  Casting V to fp16 for an fp16 P is not an option for bf16 inputs: bf16 values past fp16's range
  (65504) or below its normal range would overflow or lose bits, changing what is computed. "single"
  (one rounded P) remains as a knob value, never proposed. Q K^T in 16 bits is a tensor-core dot of
  exact products with fp32 accumulation, which the 1e-2 tolerance absorbs.

Tiles by dtype: one candidate serves every dtype of a problem's shapes, and the tiles that suit fp64
scores on fp32 inputs (narrow head-dim steps, DMMA's small K) starve the 16-bit tensor cores (whose
instructions step 16 elements of K at a time and want long K loops over wide tiles). The optional
knobs wide16_{m,n,d,k,warps,stages} set the 16-bit inputs' tiles apart for heads too wide for full_d
(materialized's GEMMs, d_tiled), narrow16_{m,n,d,warps,stages} for heads that fit it (full_d, and
d_tiled's chunks; on the H200 the fp16 GEMMs and the bf16 flash kernel wanted different tiles), each
falling back to its fp32 knob; `tiles()` says what a knob set launches with. feasible() checks the
wide16 tiles at the traced head when it is wide; the narrow16 ones only for their form (a set out of
resources at a narrow 16-bit head fails that shape's gate at run time: wasted budget, not a wrong
result).
For 16-bit inputs the materialized softmax writes P directly in V's dtype, as hi and lo planes for
p16="split" (the P V GEMM then loads both and runs two tensor-core dots, with no rounding in its loop).
With the knob short16, where the keys fit one tile (padded Lk <= SHORT16_MAX), a 16-bit wide head takes
one kernel: each program holds its rows' whole scores (Q K^T over the head in wide16_d steps), takes
their softmax in registers and multiplies P (split hi + lo as above) into each block_dv chunk of V: one
launch, no scratch. Host time decides at this size: on the H200 the fp16 rung's three-kernel call spent
154 us of host time a call against 80 us on the GPU, eager's one kernel 30 us against 116; short16 took
50-97 us of host time and 108 us on the GPU (benchmarks/results/h200/probe4).

Strategies:
- `full_d`: the Q block [BLOCK_M, D], K/V tiles [BLOCK_N, D] and acc [BLOCK_M, Dv] live whole (D padded
  to a power of two). One pass, minimal FLOPs; only for heads small enough (feasible() decides: acc
  within registers, one stage of K/V tiles within shared memory). At run time a head too wide for it
  falls back to `d_tiled` (the ladder's shapes may differ from the traced one).
- `materialized`: for heads too wide for `full_d` (padded D > FULL_D_MAX), three kernels: the scores
  S = Q K^T as a batched GEMM tile by tile (fp64 for the fp64 recipe, else fp32) into a scratch
  buffer, a row softmax of S into P (fp32, normalised), and O = P V as a batched GEMM. Q K^T and P V
  each cost their FLOPs once, on large tiles, at the price of writing and reading S and P (bh is
  processed in chunks so the scratch stays under SCRATCH_BYTES). Where the head fits `full_d`, the
  same candidate runs `full_d` with its block_m/block_n: there the one-pass kernel needs no scratch.
  Knobs: block_m x block_n score tiles stepping block_d over D; block_m x block_dv output tiles
  stepping block_n over the keys.
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
# the longest (padded) key range short16 holds whole in one tile
SHORT16_MAX = 256
# scratch for materialized's S and P per chunk of bh (the chunk shrinks to fit, down to one bh)
SCRATCH_BYTES = 1 << 30
STRATEGIES = ("full_d", "d_tiled", "materialized")
_ELT = {"float32": 4, "float16": 2, "bfloat16": 2}

# precision knobs (module docstring): the values each may take, the first the default
QK32 = ("fp64", "ieee", "tf32x3")
PV32 = ("ieee", "tf32x3", "presplit")
P16 = ("split", "single")
PRECISION = {"qk32": QK32, "pv32": PV32, "p16": P16}


def _tiles16(group: str, **fields: int) -> dict[str, int]:
    """A 16-bit tile group's knobs (module docstring, "Tiles by dtype"): _tiles16("wide16", m=128) is
    {"wide16_m": 128}."""
    return {f"{group}_{f}": v for f, v in fields.items()}


# the three-kernel 16-bit wide-head tiles the H200 ran fastest (probe4 stage 4: fp16 at D = 1024, GPU time)
WIDE16_FAST = _tiles16("wide16", m=128, n=64, d=64, k=32, warps=4, stages=3)
# short16's tiles the H200 timed fastest under kb's benchmark timer (probe4 stage 7: 1.05x eager at the fp16
# rung against the three-kernel call's 0.93x in the same call; host time 54 us a call against 154)
SHORT16_FAST = {
    "short16": True,
    **_tiles16("wide16", m=32, n=64, d=128, k=32, warps=4, stages=2),
}
NARROW16_FAST = _tiles16("narrow16", m=64, n=64, warps=4, stages=3)

# round 0 spreads pv32 over its three values; every set passes the gate on the H200 at every shape
# (benchmarks/results/h200/probe3)
ROUND0: list[dict[str, Any]] = [
    # materialized: the H200 probe's fastest tiles (128 x 64 scores, 8 warps, 3 stages: 12.8 ms of fp64
    # scores at the fp32 seed shape); presplit P V steps 32 keys (two planes of both operands per stage)
    {
        "strategy": "materialized",
        "block_m": 128,
        "block_n": 64,
        "block_d": 16,
        "block_dv": 128,
        "block_k": 32,
        "num_warps": 8,
        "num_stages": 3,
        "qk32": "fp64",
        "pv32": "presplit",
        "p16": "split",
        # 16-bit: fp16 at D = 1024 through short16 (one kernel); bf16 at D = 128 through full_d on the
        # H200's fastest of seven tile sets (probe4 stage 4: 3.10 ms)
        **SHORT16_FAST,
        **NARROW16_FAST,
    },
    {
        "strategy": "materialized",
        "block_m": 128,
        "block_n": 64,
        "block_d": 16,
        "block_dv": 128,
        "num_warps": 8,
        "num_stages": 3,
        "qk32": "fp64",
        "pv32": "ieee",
        "p16": "split",
        # 16-bit: the three-kernel call at fp16 (0.110 ms on the GPU, but 154 us of host time a call); the
        # probe's runner-up bf16 tiles (3.44 ms)
        **WIDE16_FAST,
        **_tiles16("narrow16", m=64, n=64, warps=4, stages=2),
    },
    {
        "strategy": "full_d",
        "block_m": 64,
        "block_n": 32,
        "num_warps": 4,
        "num_stages": 2,
        "qk32": "fp64",
        "pv32": "tf32x3",
        "p16": "split",
    },
    {
        "strategy": "full_d",
        "block_m": 128,
        "block_n": 64,
        "num_warps": 8,
        "num_stages": 2,
        "qk32": "fp64",
        "pv32": "ieee",
        "p16": "split",
    },
    # the d_tiled tiles compile without spills at fp32 (fp64 scores, either P V) and fp16 on sm90
    # (Triton 3.6, ptxas -v)
    {
        "strategy": "d_tiled",
        "block_m": 64,
        "block_n": 64,
        "block_d": 32,
        "block_dv": 128,
        "num_warps": 8,
        "num_stages": 2,
        "qk32": "fp64",
        "pv32": "ieee",
        "p16": "split",
    },
    {
        "strategy": "d_tiled",
        "block_m": 128,
        "block_n": 32,
        "block_d": 16,
        "block_dv": 128,
        "num_warps": 8,
        "num_stages": 3,
        "qk32": "fp64",
        "pv32": "tf32x3",
        "p16": "split",
    },
    {
        "strategy": "d_tiled",
        "block_m": 64,
        "block_n": 32,
        "block_d": 16,
        "block_dv": 256,
        "num_warps": 8,
        "num_stages": 2,
        "qk32": "fp64",
        "pv32": "ieee",
        "p16": "split",
    },
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        ("wider_dv", "wider output chunks recompute Q K^T fewer times"),
        ("full_d", "one pass over the whole head: no recomputed scores"),
        ("materialize", "scores computed once into scratch and reused by every output chunk"),
        ("tf32x3_pv", "fp32 P V as three TF32 tensor-core dots instead of FMAs on the CUDA cores"),
        ("presplit_pv", "fp32 P V as three TF32 dots of operands split once before the GEMM, not per tile"),
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
        ("ieee_pv", "an FMA P V keeps no TF32 hi/lo copies of its operands live"),
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


def precision(knobs: dict[str, Any]) -> dict[str, str]:
    """The precision knobs of a knob set, defaults filled in (knob sets recorded before they existed
    take the defaults)."""
    out = {k: str(knobs.get(k, values[0])) for k, values in PRECISION.items()}
    for k, v in out.items():
        if v not in PRECISION[k]:
            raise ValueError(f"attention knob {k}={v!r}: expected one of {', '.join(PRECISION[k])}")
    return out


# the tile fields and the fp32 knob each falls back to
TILE_FIELDS = {
    "m": "block_m",
    "n": "block_n",
    "d": "block_d",
    "k": "block_k",
    "warps": "num_warps",
    "stages": "num_stages",
}
# 16-bit inputs' own tiles (module docstring, "Tiles by dtype"): knobs f"{group}_{field}", one group for
# heads too wide for full_d (materialized's GEMMs, d_tiled) and one for those that fit it (full_d)
TILE16_GROUPS = ("wide16", "narrow16")
TILE16_KNOBS = {f"{g}_{f}": f for g in TILE16_GROUPS for f in TILE_FIELDS}


def tiles(knobs: dict[str, Any], dtype: str, d: int) -> dict[str, int]:
    """The tiles a knob set launches inputs of this dtype and (padded) head width with: m x n score
    tiles (full_d's and d_tiled's blocks too), d the head-dim step, k materialized's P V key step,
    warps, stages. 16-bit inputs take their group's knobs (wide16_* past FULL_D_MAX, else narrow16_*)
    where set, else the fp32 values."""
    base = {f: knobs[k] for f, k in TILE_FIELDS.items() if k in knobs}
    base.setdefault("d", 64)
    # knob sets recorded before block_k existed stepped block_n
    base.setdefault("k", knobs["block_n"])
    if dtype == "float32":
        return base
    group = "wide16" if d > FULL_D_MAX else "narrow16"
    return base | {f: int(knobs[f"{group}_{f}"]) for f in TILE_FIELDS if f"{group}_{f}" in knobs}


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Power-of-two tiles >= 16; full_d only where acc + Q block + scores fit in registers and the K/V
    tiles of every pipeline stage (at least one) fit in shared memory; d_tiled's chunks likewise.
    fp64 scores (qk32=fp64 on fp32 inputs) take two registers an element, and so do d_tiled's widened
    Q/K chunks; full_d's widened Q block is staged in shared memory (as ptxas shows on sm90). The tiles
    are those of the traced dtype; a knob set with 16-bit tiles of its own must also fit the traced
    head at 16 bits (the problems whose shapes change dtype keep the head dims of the traced one's
    family: sdp_attn's fp16 rung has the fp32 head)."""
    if knobs["strategy"] not in STRATEGIES:
        return False
    try:
        prec = precision(knobs)
    except ValueError:
        return False
    dtype = spec.get("dtype", "float32")
    if not all(_tile_ok(f, knobs[k]) for k, f in TILE16_KNOBS.items() if k in knobs):
        return False
    if knobs.get("short16") and knobs["strategy"] == "materialized":
        # short16 holds a [m, SHORT16_MAX] score block (P takes its place) and an [m, block_dv] accumulator
        t16 = tiles(knobs, "float16", 2 * FULL_D_MAX)
        if t16["m"] * (SHORT16_MAX + knobs["block_dv"]) > MAX_REGS_PER_THREAD * 32 * t16["warps"]:
            return False
        # and stages Q and K chunks [m + SHORT16_MAX, d] per pipeline stage and P [m, SHORT16_MAX] in shared
        # memory, at 16 bits: exact for one of the three sets the H200 refused, 10-12% off (either way)
        # for the other two (probe5 tiles.log), so a set near the limit may be misjudged
        if 2 * (t16["stages"] * (t16["m"] + SHORT16_MAX) * t16["d"] + t16["m"] * SHORT16_MAX) > MAX_SMEM:
            return False
    own16 = dtype == "float32" and any(k in knobs for k in TILE16_KNOBS)
    if own16 and not _fits(spec | {"dtype": "float16"}, knobs, prec):
        return False
    return _fits(spec, knobs, prec)


def _tile_ok(field: str, v: int) -> bool:
    if field == "stages":
        return v >= 1
    if field == "warps":
        return v in (1, 2, 4, 8, 16)
    return v >= 16 and not v & (v - 1)  # tl.dot's minimum; power-of-two blocks


def _fits(spec: dict, knobs: dict[str, Any], prec: dict[str, str]) -> bool:
    dtype = spec.get("dtype", "float32")
    d = max(16, _next_pow2(spec.get("d") or 16))
    t = tiles(knobs, dtype, d)
    tiled = knobs["strategy"] in {"d_tiled", "materialized"}
    sizes = [t["m"], t["n"]] + ([t["d"], knobs["block_dv"]] if tiled else [])
    sizes += [t["k"]] if any(k in knobs for k in ("block_k", "wide16_k", "narrow16_k")) else []
    if any(b < 16 or b & (b - 1) for b in sizes) or t["stages"] < 1:
        return False
    if t["warps"] not in (1, 2, 4, 8, 16):
        return False
    bm, bn = _blocks(spec, {"block_m": t["m"], "block_n": t["n"]})
    elt = _ELT.get(dtype, 4)
    wide = dtype == "float32" and prec["qk32"] == "fp64"
    threads = 32 * t["warps"]
    scores = bm * bn * (2 if wide else 1)
    strategy = knobs["strategy"]
    if strategy == "materialized" and d <= FULL_D_MAX:  # runs full_d at this head: its limits apply
        strategy = "full_d"
    if strategy == "full_d":
        if d > FULL_D_MAX:
            return False
        regs = bm * d + scores + (0 if wide else bm * d * elt // 4)  # acc, scores, Q block
        smem = t["stages"] * 2 * bn * d * elt + (bm * d * 8 if wide else 0)
    elif strategy == "d_tiled":
        bd = min(t["d"], d)
        dv = min(knobs["block_dv"], d)
        regs = bm * dv + scores + (2 * (bm * bd + bd * bn) if wide else 0)
        smem = t["stages"] * (bm * bd + bn * bd + bn * dv) * elt
    else:
        bd = min(t["d"], d)
        dv = min(knobs["block_dv"], d)
        bk = t["k"]
        # presplit P V loads a hi and a lo tile of both operands (fp32); 16-bit P V a hi and a lo P tile
        # in V's dtype
        if dtype == "float32":
            parts, p_elt = (2 if prec["pv32"] == "presplit" else 1), 4
        else:
            parts, p_elt = (2 if prec["p16"] == "split" else 1), elt
        # the larger of the two GEMMs' needs: scores (fp64-widened operands) and P V. 16-bit P tiles go
        # to the tensor cores from shared memory as loaded (no conversion in registers): the
        # accumulator alone counts (the H200 ran 128 x 128 of it on 4 warps fastest, probe4)
        pv_regs = bm * dv + (parts * bm * bk if dtype == "float32" else 0)
        regs = max(scores + (2 * (bm * bd + bd * bn) if wide else 0), pv_regs)
        smem = t["stages"] * max(
            (bm + bn) * bd * elt,
            parts * bm * bk * p_elt + bk * dv * elt * (parts if dtype == "float32" else 1),
        )
    return regs <= MAX_REGS_PER_THREAD * threads and smem <= MAX_SMEM


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    tiled = k["strategy"] in {"d_tiled", "materialized"}
    if move == "materialize":
        if k["strategy"] == "materialized":
            return None
        return {"block_d": 16, "block_dv": 128} | k | {"strategy": "materialized"}
    if move == "full_d":
        if not tiled:
            return None
        return {a: b for a, b in k.items() if a not in {"block_d", "block_dv"}} | {"strategy": "full_d"}
    if move in {"tf32x3_pv", "ieee_pv", "presplit_pv"}:
        v = move.removesuffix("_pv")
        if v == "presplit" and k["strategy"] != "materialized":
            return None  # only materialized's GEMM takes pre-split operands
        return {**k, "pv32": v} if precision(k)["pv32"] != v else None
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
def _attn_full_d(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale,
                 QK: tl.constexpr, PV: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
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
        kt = tl.load(k_base + cols[None, :] * D + rd[:, None], mask=(cols[None, :] < Lk) & (rd[:, None] < D),
                     other=0.0)
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
def _attn_d_tiled(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale,
                  QK: tl.constexpr, PV: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
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
def _scores(q_ptr, k_ptr, s_ptr, Lq, Lk, D, QK: tl.constexpr, UPCAST: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
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
def _softmax_rows(s_ptr, p_ptr, rows, Lk, qk_scale, plane, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    # P: the softmax of S * scale along each row of S, in S's precision up to the exponent (as in the flash
    # kernels): an online max/sum pass, then a pass that writes normalised fp32 P
    rr = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rk = tl.arange(0, BLOCK_K)
    r_mask = rr[:, None] < rows
    base = rr[:, None] * Lk
    m = tl.full([BLOCK_R], -float("inf"), s_ptr.dtype.element_ty)
    l = tl.zeros([BLOCK_R], tl.float32)
    for k0 in range(0, Lk, BLOCK_K):
        cols = k0 + rk
        s = tl.load(s_ptr + base + cols[None, :], mask=r_mask & (cols[None, :] < Lk), other=-float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # rows past the end stay at -inf: keep their shift finite (their P is never stored)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(((m - m_safe) * qk_scale).to(tl.float32))
        l = l * alpha + tl.sum(tl.exp2(((s - m_safe[:, None]) * qk_scale).to(tl.float32)), axis=1)
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
def _pv_gemm(p_ptr, v_ptr, o_ptr, Lq, Lk, DV, p_plane, v_plane, PV: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr):
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
        if PV == "presplit":  # V's planes are stored transposed (DV x Lk)
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
def _attn_short16(q_ptr, k_ptr, v_ptr, o_ptr, Lq, Lk, D, DV, qk_scale, PV: tl.constexpr,
                  UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
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
            num_warps=t["warps"], num_stages=t["stages"])
        _softmax_rows[(triton.cdiv(n * Lq, block_r),)](s, p, n * Lq, Lk, qk_scale, p[0].numel(),
                                                      SPLIT=p_split, BLOCK_R=block_r, BLOCK_K=row_block,
                                                      num_warps=4)
        vv, v_plane = vc, 0
        if split:
            _split_v[(triton.cdiv(Lk, 64), triton.cdiv(DV, 64), n)](vv, vs, Lk, DV, vs[0].numel(), BLOCK_K=64,
                                                                   BLOCK_DV=64)
            vv, v_plane = vs, vs[0].numel()
        _pv_gemm[(triton.cdiv(Lq, bm), triton.cdiv(DV, bdv), n)](
            p, vv, oc, Lq, Lk, DV, p[0].numel(), v_plane, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=bk,
            BLOCK_DV=bdv, num_warps=t["warps"], num_stages=t["stages"])


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
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    lk_pad = max(16, triton.next_power_of_2(Lk))
    short = SHORT16 and q.dtype != torch.float32 and lk_pad <= SHORT16_MAX
    if STRATEGY == "materialized" and not fits and short:
        _attn_short16[(triton.cdiv(Lq, bm), BH)](
            q, k, v, o, Lq, Lk, D, DV, qk_scale, PV=pv, UPCAST=upcast, BLOCK_M=bm, BLOCK_N=lk_pad,
            BLOCK_D=min(t["d"], d_pad), BLOCK_DV=min(BLOCK_DV, dv_pad), num_warps=t["warps"],
            num_stages=t["stages"])
        return
    if STRATEGY == "materialized" and not fits:
        _materialized(q, k, v, o, qk, pv, upcast, qk_scale, {**t, "m": bm, "n": bn})
        return
    if STRATEGY in ("full_d", "materialized") and fits:
        grid = (triton.cdiv(Lq, bm), BH)
        _attn_full_d[grid](q, k, v, o, Lq, Lk, D, DV, qk_scale, QK=qk, PV=pv, UPCAST=upcast,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d_pad, BLOCK_DV=dv_pad,
                           num_warps=t["warps"], num_stages=t["stages"])
        return
    bd = min(t["d"], d_pad)
    bdv = min(BLOCK_DV, dv_pad)
    grid = (triton.cdiv(Lq, bm), BH, triton.cdiv(DV, bdv))
    _attn_d_tiled[grid](q, k, v, o, Lq, Lk, D, DV, qk_scale, QK=qk, PV=pv, UPCAST=upcast,
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DV=bdv,
                        num_warps=t["warps"], num_stages=t["stages"])
"""


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init_args = "".join(f", {a}" for a in signature["init"])
    fwd = list(signature["forward"])
    if len(fwd) < 3:
        raise ValueError(f"attention needs forward(q, k, v): got forward({', '.join(fwd)})")
    q, k, v = fwd[:3]
    rest = "".join(f", {a}" for a in fwd[3:])
    prec = precision(knobs)
    by = {
        "float32": tiles(knobs, "float32", FULL_D_MAX),
        "narrow16": tiles(knobs, "float16", FULL_D_MAX),
        "wide16": tiles(knobs, "float16", 2 * FULL_D_MAX),
    }
    consts = [
        f'STRATEGY = "{knobs["strategy"]}"',
        f"BLOCK_DV = {knobs.get('block_dv', 128)}",
        "# the launch tiles: fp32 inputs; 16-bit inputs with heads that fit full_d, and wider ones",
        f"TILES = {by!r}",
        f'QK32 = "{prec["qk32"]}"',
        f'PV32 = "{prec["pv32"]}"',
        f'P16 = "{prec["p16"]}"',
        f"SHORT16 = {bool(knobs.get('short16', False))}",
        f"SHORT16_MAX = {SHORT16_MAX}",
        f"FULL_D_MAX = {FULL_D_MAX}",
        f"SCRATCH_BYTES = {SCRATCH_BYTES}",
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
