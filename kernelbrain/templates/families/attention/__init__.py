"""Scaled dot-product attention, no mask, flash-style forward: O = softmax(Q K^T * s) V.

Shapes: Q (..., Lq, D), K (..., Lk, D), V (..., Lk, Dv), O (..., Lq, Dv); s = 1/sqrt(D) (SDPA's default).
The kernels `render` copies, and the online softmax they run, are in `families/attention/parts`.

Strategies:
- `full_d`: one pass. A program holds its Q block [BLOCK_M, D], K/V tiles [BLOCK_N, D] and acc
  [BLOCK_M, Dv] whole (D padded to a power of two) and walks the keys with an online softmax: minimal
  FLOPs, only for heads small enough (feasible() decides). At run time a head too wide for it falls
  back to `d_tiled` (the ladder's shapes may differ from the traced one).
- `d_tiled`: the head dim tiled twice. Each program holds one BLOCK_DV-wide output chunk (a third grid
  axis), and S_j is summed over BLOCK_D chunks of the head: every output chunk recomputes the scores,
  Dv/BLOCK_DV times Q K^T's FLOPs traded for registers.
- `materialized`: for heads too wide for `full_d` (padded D > FULL_D_MAX), three kernels: S = Q K^T as
  a batched GEMM into scratch, a row softmax of S into P, O = P V as a batched GEMM. Each GEMM costs
  its FLOPs once, on large tiles, at the price of writing and reading S and P (bh in chunks under
  SCRATCH_BYTES). Where the head fits `full_d` the same candidate runs `full_d`. With the knob
  short16, a 16-bit wide head whose keys fit one tile (padded Lk <= SHORT16_MAX) takes one kernel
  instead (scores, softmax in registers, P times each block_dv chunk of V): at that size the host
  time of three launches decides the speed.

Precision (one candidate serves every dtype of a problem's shapes):
- `qk32`, fp32 Q K^T. The gate's x8 seed makes the softmax nearly one-hot, and where a row's two
  largest scores nearly tie the output moves by ~|V| * (score error) * s: any fp32 accumulation over D
  (ieee, TF32, 3xTF32, PyTorch's own fp32 SDPA) misses 1e-4. "fp64" (the default) widens the Q and K
  tiles into an fp64 dot (exact products, fp64 sums), keeps S - m' in fp64 and rounds to fp32 only the
  exponent. "ieee" and "tf32x3" remain as knob values, never proposed in round 0.
- `pv32`, fp32 P V: P in [0, 1] and V exact, so products good to 2^-21 pass: "ieee" (FMA), "tf32x3"
  (three TF32 tensor-core dots split in registers), and "presplit" (materialized only; elsewhere it
  runs as tf32x3): the same three products with the splits done before the GEMM, P and V written as
  hi + lo planes rounded to TF32's 10 mantissa bits, so the GEMM takes three plain TF32 dots of
  operands loaded straight from memory. Plain TF32 rounds P to 10 bits (errors ~1e-2): never used.
- `p16`, 16-bit P V: the tensor-core dot wants P in V's dtype, and one bf16 rounding of P fails the x8
  seed. "split" (the default) writes P = hi + lo, both in V's dtype, and sums two dots in fp32 (error
  ~2^-17); "single" (one rounded P) remains as a knob value. V is never cast to fp16: bf16 values out of
  fp16's range would change what is computed. 16-bit Q K^T is a tensor-core dot of exact products with
  fp32 accumulation, which the 1e-2 tolerance absorbs.

Tiles by dtype: the tiles that suit fp64 scores on fp32 inputs (narrow head-dim steps, DMMA's small K)
starve the 16-bit tensor cores (16 elements of K an instruction, long K loops over wide tiles). The
optional knobs wide16_{m,n,d,k,warps,stages} set the 16-bit tiles apart for heads too wide for full_d
(materialized's GEMMs, short16, d_tiled), narrow16_{m,n,d,warps,stages} for heads that fit it (full_d,
and d_tiled's chunks), each falling back to its fp32 knob; `tiles()` says what a knob set launches
with. feasible() checks the wide16 tiles at the traced head when it is wide; the narrow16 ones only
for their form (a set out of resources at a narrow 16-bit head fails that shape's gate at run time:
wasted budget, not a wrong result).

What was measured behind these choices and the round-0 sets: docs/templates.md, "attention".
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import limits, sizing
from kernelbrain.templates.base import FLOATS
from kernelbrain.templates.render import constants, knob_text, module, parts_of, plain_model

FAMILY = "attention"
PARTS = f"{__name__}.parts"
FLOAT_DTYPES = FLOATS  # the dtypes it serves (tools/attn_check.py checks each)
# what every candidate copies of PARTS, in order: the kernels, then the host code that picks and launches
# them at run time (by strategy, dtype and head width)
KERNEL_PARTS = ("_dot16", "_qk", "_pv", "_attn_full_d", "_attn_d_tiled", "_scores", "_finite", "_tf32")
KERNEL_PARTS += ("_split_store", "_split_v", "_softmax_rows", "_pv_gemm", "_attn_short16")
HOST_PARTS = ("_materialized", "_launch")
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


# 16-bit tiles for wide heads run as materialized's three kernels
WIDE16_FAST = _tiles16("wide16", m=128, n=64, d=64, k=32, warps=4, stages=3)
# short16 and its tiles: 16-bit wide heads whose keys fit one tile in one kernel
SHORT16_FAST = {
    "short16": True,
    **_tiles16("wide16", m=32, n=64, d=128, k=32, warps=4, stages=2),
}
# 16-bit tiles for heads that fit full_d
NARROW16_FAST = _tiles16("narrow16", m=64, n=64, warps=4, stages=3)


# round 0 spreads pv32 over its three values (the search keeps the faster) and the strategies over the
# head widths; why these tiles: docs/templates.md, "attention"
def _set(strategy: str, m: int, n: int, warps: int, stages: int, pv32: str, **more: Any) -> dict[str, Any]:
    """A round-0 knob set: `m` x `n` score tiles, fp64 scores at fp32 (qk32), split 16-bit P V (p16);
    `more`'s head-dim tiles (block_d, block_dv, block_k) before the warps, its 16-bit ones after."""
    tiles = {k: more.pop(k) for k in ("block_d", "block_dv", "block_k") if k in more}
    knobs = {"strategy": strategy, "block_m": m, "block_n": n, **tiles, "num_warps": warps}
    return knobs | {"num_stages": stages, "qk32": "fp64", "pv32": pv32, "p16": "split", **more}


ROUND0: list[dict[str, Any]] = [
    # materialized, 128 x 64 score tiles; presplit P V steps 32 keys (two planes of both operands per stage);
    # 16-bit: wide heads (sdp_attn's fp16 rung, D = 1024) through short16 (one kernel), heads that fit full_d
    # (its bf16 rung, D = 128) through full_d on NARROW16_FAST
    _set("materialized", 128, 64, 8, 3, "presplit", block_d=16, block_dv=128, block_k=32, **SHORT16_FAST,
         **NARROW16_FAST),
    # 16-bit: wide heads through the three kernels on WIDE16_FAST; heads that fit full_d on a second narrow16
    # set (2 stages)
    _set("materialized", 128, 64, 8, 3, "ieee", block_d=16, block_dv=128, **WIDE16_FAST,
         **_tiles16("narrow16", m=64, n=64, warps=4, stages=2)),
    _set("full_d", 64, 32, 4, 2, "tf32x3"),
    _set("full_d", 128, 64, 8, 2, "ieee"),
    # d_tiled: tiles that compile without spills at fp32 (fp64 scores, either P V) and fp16
    _set("d_tiled", 64, 64, 8, 2, "ieee", block_d=32, block_dv=128),
    _set("d_tiled", 128, 32, 8, 3, "tf32x3", block_d=16, block_dv=128),
    _set("d_tiled", 64, 32, 8, 2, "ieee", block_d=16, block_dv=256),
]  # fmt: skip

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


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    """A lone scaled_dot_product_attention (contiguous calls aside) on a float tensor of >= 2 dims."""
    seq = [o for o in ops if str(o["op"]).strip("_") != "contiguous"]
    if len(seq) != 1 or seq[0]["op"] != "scaled_dot_product_attention":
        return None
    op = seq[0]
    if op.get("dtype") not in FLOATS:
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
    return sizing.clamp(knobs["block_m"], spec.get("lq"), 16), sizing.clamp(
        knobs["block_n"], spec.get("lq"), 16
    )


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
        if not sizing.fits(t16["m"] * (SHORT16_MAX + knobs["block_dv"]), t16["warps"], limits.ACC_PER_THREAD):
            return False
        # and stages Q and K chunks [m + SHORT16_MAX, d] per pipeline stage and P [m, SHORT16_MAX] in shared
        # memory, at 16 bits: an estimate of what the compiler allocates, so a set near the limit may be
        # misjudged (docs/templates.md, "attention")
        smem = 2 * (t16["stages"] * (t16["m"] + SHORT16_MAX) * t16["d"] + t16["m"] * SHORT16_MAX)
        if smem > limits.TARGET.smem_per_block:
            return False
    own16 = dtype == "float32" and any(k in knobs for k in TILE16_KNOBS)
    if own16 and not _fits(spec | {"dtype": "float16"}, knobs, prec):
        return False
    return _fits(spec, knobs, prec)


def _tile_ok(field: str, v: int) -> bool:
    if field == "stages":
        return v >= 1
    if field == "warps":
        return v in sizing.WARPS
    return sizing.pow2(v, least=16)  # tl.dot's minimum; power-of-two blocks


def _fits(spec: dict, knobs: dict[str, Any], prec: dict[str, str]) -> bool:
    dtype = spec.get("dtype", "float32")
    d = max(16, sizing.next_pow2(spec.get("d") or 16))
    t = tiles(knobs, dtype, d)
    tiled = knobs["strategy"] in {"d_tiled", "materialized"}
    sizes = [t["m"], t["n"]] + ([t["d"], knobs["block_dv"]] if tiled else [])
    sizes += [t["k"]] if any(k in knobs for k in ("block_k", "wide16_k", "narrow16_k")) else []
    if not sizing.pow2(*sizes, least=16) or t["stages"] < 1 or t["warps"] not in sizing.WARPS:
        return False
    bm, bn = _blocks(spec, {"block_m": t["m"], "block_n": t["n"]})
    elt = _ELT.get(dtype, 4)
    wide = dtype == "float32" and prec["qk32"] == "fp64"
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
        # accumulator alone counts
        pv_regs = bm * dv + (parts * bm * bk if dtype == "float32" else 0)
        regs = max(scores + (2 * (bm * bd + bd * bn) if wide else 0), pv_regs)
        smem = t["stages"] * max(
            (bm + bn) * bd * elt,
            parts * bm * bk * p_elt + bk * dv * elt * (parts if dtype == "float32" else 1),
        )
    return sizing.fits(regs, t["warps"], limits.ACC_PER_THREAD) and smem <= limits.TARGET.smem_per_block


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
        return sizing.halved(k, "block_n", 16)
    if move == "more_stages":
        return sizing.stages(k, move)
    if move == "more_warps":
        return sizing.warps(k, move)
    raise ValueError(f"unknown move {move!r}")


def _strings(**values: str) -> str:
    """String knob constants, `NAME = "value"` a line (in double quotes, as the candidates have always
    spelled them); the values are knob names, which need no escaping."""
    return "".join(f'{name} = "{value}"\n' for name, value in values.items())


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    fwd = list(signature["forward"])
    if len(fwd) < 3:
        raise ValueError(f"attention needs forward(q, k, v): got forward({', '.join(fwd)})")
    q, k, v = fwd[:3]
    prec = precision(knobs)
    by = {
        "float32": tiles(knobs, "float32", FULL_D_MAX),
        "narrow16": tiles(knobs, "float16", FULL_D_MAX),
        "wide16": tiles(knobs, "float16", 2 * FULL_D_MAX),
    }
    doc = (
        "Scaled dot-product attention (flash forward, online softmax): kernelbrain attention template\n"
        f"({knob_text(knobs)})."
    )
    lines = f"""\
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
"""
    knob_constants = (
        _strings(STRATEGY=knobs["strategy"])
        + constants(BLOCK_DV=knobs.get("block_dv", 128))
        + "# the launch tiles: fp32 inputs; 16-bit inputs with heads that fit full_d, and wider ones\n"
        + constants(TILES=by)
        + _strings(QK32=prec["qk32"], PV32=prec["pv32"], P16=prec["p16"])
        + constants(SHORT16=bool(knobs.get("short16", False)), SHORT16_MAX=SHORT16_MAX)
        + constants(FULL_D_MAX=FULL_D_MAX, SCRATCH_BYTES=SCRATCH_BYTES)
    )
    return module(
        doc,
        "import math\n",
        knob_constants,
        parts_of(PARTS, "LOG2E", *KERNEL_PARTS, *HOST_PARTS),
        plain_model(signature, lines, default=""),
    )
