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
  every warp writes whole 32-byte sectors, where storing each phase at stride sw, as `rows` does,
  keeps the L2 busy with partly written sectors. Rows with no valid kh (half of them at stride 2)
  load nothing.
Knobs: BLOCK_P (output pixels per program; for `rows`, columns per phase; for `rows_dense`, column
slots, BLOCK_P / next_pow2(sw) periods of sw columns), BLOCK_C (output channels per program), BLOCK_K
(dot's K in input channels; unused by `rows`), num_warps, `fp32_dot` (above; only the tl.dot forms,
phase_dot and rows_dense, take it: the others are FMA outer products), and `prepack` (rows_dense: a
small kernel first writes each (group, channel block, kh, K step) weight tile as a dense, zero-filled
[BLOCK_C x phases, BLOCK_K x offsets] block, so the main kernel loads each with one unmasked load
instead of building its index and mask tensors, which otherwise stay live across the tap loop; round
0 leaves it to the mutations).

ModelNew builds the same nn.ConvTranspose2d under Model's attribute name (`conv_transpose2d`, the
KernelBench name, unless the spec says otherwise), from Model's constructor parameters, so the
state_dict keys match and the gate's copy makes the weights identical; forward reads stride, padding,
dilation, output_padding and groups from that module and only computes the output with Triton. The
kernels `render` copies are in `conv_transpose_parts`.

What was measured behind the strategies and the round-0 order: docs/templates.md, "conv_transpose".
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import model_source
from kernelbrain.templates.render import constants, module, parts

FAMILY = "conv_transpose"
PARTS = "kernelbrain.templates.conv_transpose_parts"
# what every candidate copies of PARTS, in order: the kernels of every strategy, then the launcher that
# picks one by the knob constants
KERNEL_PARTS = ("_dot", "_taps", "_convt_kernel", "_convt_rows_kernel", "_dense_w", "_pack_dense_w")
KERNEL_PARTS += ("_convt_dense_kernel",)
HOST_PARTS = ("_pair", "_launch")
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
    # rows_dense first, so a short budget measures it first: the fastest strategy on group_conv, its
    # tf32x3 dots ahead of ieee (docs/templates.md, "conv_transpose")
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


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
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
    init_args = model_source.init_args(signature, "".join(f", {p}" for p in params))
    conv_args = ", ".join(f"{p}={names[p]}" for p, _ in _CONV_PARAMS if p in names)
    attr = spec.get("conv_attr", "conv_transpose2d")
    x = signature["forward"][0]
    rest = "".join(f", {a}" for a in signature["forward"][1:])
    strategy = knobs["strategy"]
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    model = f"""class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()
        # the same nn.ConvTranspose2d as Model's, under the same name: same state_dict keys, same weights
        self.{attr} = nn.ConvTranspose2d({conv_args})

    def forward(self, {x}{rest}):
        return _launch({x}, self.{attr})
"""
    return module(
        f"Transposed 2-D convolution: kernelbrain conv_transpose template ({knob_text}).",
        constants(
            PHASE=strategy in ("phase", "phase_dot"),
            DOT=strategy == "phase_dot",
            ROWS=strategy == "rows",
            DENSE=strategy == "rows_dense",
            BLOCK_P=knobs["block_p"],
            BLOCK_C=knobs["block_c"],
            BLOCK_K=knobs["block_k"],
            NUM_WARPS=knobs["num_warps"],
            FP32_DOT=fp32_dot(knobs),
            PREPACK=bool(knobs.get("prepack", False)),
        ),
        parts(PARTS, *KERNEL_PARTS, *HOST_PARTS),
        model,
    )
