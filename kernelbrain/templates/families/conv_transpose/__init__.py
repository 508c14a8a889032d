"""Transposed convolution (1-D, 2-D, 3-D; stride, zero padding, output padding, dilation, groups, bias
or none) with the elementwise chain after it, composed from the traced graph, no torch conv.

Shapes: x (N, C_in, [D,] [H,] W); weight (C_in, C_out/G, [KD,] [KH,] KW) (ConvTranspose's layout);
groups G, with C_in_g = C_in/G input and C_out_g = C_out/G output channels per group. Per spatial dim,
with stride s, padding p, dilation d, kernel K and output padding op, the output size is

    O = (I - 1)*s - 2*p + d*(K - 1) + op + 1

and the gather form of the transposed convolution (input channel c in group g = oc // C_out_g):

    y[n, oc, o..] = b[oc] + sum_{c, k..} x[n, c, i..] * w[c, oc - g*C_out_g, k..],  i = (o + p - k*d) / s

a tap contributing only when every division is exact and 0 <= i < I. Accumulation is in fp32; the
chain after the convolution (a bias parameter, a residual input, activations: families/pointwise's)
is applied to the fp32 tile before the one store. As conv's, the family is the head of a composed
candidate (base.Head): what follows the chain when it is not elementwise (a reduction, a softmax, a
norm, a pooling: the tail) and what makes its input where that is no forward input (a pooling of one:
the prelude) are launches the composer (compose/) cuts off and composes.

ModelNew runs the problem's own constructor (`refine`), so its parameters are Model's under the same
names and the gate's state-dict copy makes them identical; forward reads the convolution's weight and
bias (and the chain's parameters) by those names. Stride, padding, output padding, dilation and groups
are constants of the trace (a number computed from a size is refused). The kernels are in
`families/conv_transpose/parts`.

The 1-3-D strategies (`nd_*`), any dimensionality, with the fused chain:
- `nd_dot`: the stride-phase decomposition as an implicit GEMM. The outputs with o % s == r in every
  phased dim (one of the grid's phases) take exactly the taps with (r + p - k*d) % s == 0, reading input
  (r + p - k*d)/s + q where o = r + q*s: no masked-away taps, one scalar test per phase and tap. Per
  valid tap a [output positions x C_in_g] x [C_in_g x C_out_g block] tl.dot, K in BLOCK_K steps.
  `phase_w` (knob): whether the last dim's phases are in the grid too (True: no wasted taps, stores
  at stride s_w) or in the tile (False: its taps masked per column, 1/s_w of them wasted, stores
  contiguous).
- `nd_fma`: the same loop with one input channel at a time as an outer product on FMA units (narrow
  groups, whose few output channels would waste most of a dot's columns).
Knobs: BLOCK_M (output positions a program), BLOCK_N (output channels), BLOCK_K (input channels a dot
step), num_warps, num_stages, fp32_dot, phase_w, and `dims`: the dimensionality the set was chosen for
(round 0 holds sets per dimensionality; a set is feasible only at its own). The nd round-0 sets are
unmeasured guesses for an H200 (tile shapes from conv's measured implicit GEMM, adjusted to the
channel counts KernelBench's transposed convolutions have); the lead measures them.

The 2-D strategies below were measured on an H200 on group_conv and stay round 0's first for a plain
2-D transposed convolution (no chain fused: they have no epilogue; a tail after them is allowed).

2-D strategy axes:
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

What was measured behind the strategies and the round-0 order: docs/templates.md, "conv_transpose".
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import limits, render, sizing
from kernelbrain.templates.base import Refusal, unsized
from kernelbrain.templates.families import conv, pointwise
from kernelbrain.templates.render import chain, constants, dtype_of, graph_doc, parts_of

FAMILY = "conv_transpose"
PARTS = f"{__name__}.parts"
# what a 2-D strategy's candidate copies of PARTS, in order: the kernels of every 2-D strategy, then the
# launcher that picks one by the knob constants
KERNEL_PARTS = ("_dot", "_taps", "_convt_kernel", "_convt_rows_kernel", "_dense_w", "_pack_dense_w")
KERNEL_PARTS += ("_convt_dense_kernel",)
HOST_PARTS = ("_launch",)
# what an nd strategy's candidate copies: conv's dot and extra-tensor loads, then these
CONV_PARTS = ("_mma", "_extra")
ND_PARTS = ("_convt_nd_tap", "_convt_nd_kernel", "_convt_nd_launch")
STRATEGIES_2D = ("direct", "phase", "phase_dot", "rows", "rows_dense")
STRATEGIES_ND = ("nd_dot", "nd_fma")
STRATEGIES = STRATEGIES_2D + STRATEGIES_ND
# fp32 products of the tl.dot forms (module docstring), the first the default
FP32_DOTS = ("ieee", "tf32x3")
DOT_STRATEGIES = ("phase_dot", "rows_dense", "nd_dot")
# the transposed convolution's ops in the graph (aten.convolution's with transposed=True)
CONVS = {"aten.convolution.default", "aten._convolution.default"}
CONVS |= {f"aten.conv_transpose{d}d.{o}" for d in (1, 2, 3) for o in ("default", "input")}
MAX_EXTRAS = conv.MAX_EXTRAS
VIEWS = pointwise.PASS_THROUGH  # what the chain may hold besides elementwise ops, for the tail's cut
# the head of a composed candidate (base.Head), as conv's; its stages' parts go after its own the other
# way round (its candidates have always had them so)
HEAD, CHAIN, INPUT_ARG, TAIL_NOTE = "transposed convolution", VIEWS, "input", conv.TAIL_NOTE
STAGE_ORDER = ("tail", "prelude")

TF32_DENSE = {
    "strategy": "rows_dense",
    "block_p": 128,
    "block_c": 16,
    "block_k": 8,
    "num_warps": 2,
    "fp32_dot": "tf32x3",
}
ROUND0_2D: list[dict[str, Any]] = [
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


def _nd(
    dims: int, strategy: str, bm: int, bn: int, bk: int, warps: int, stages: int = 3, **more: Any
) -> dict:
    knobs = {"strategy": strategy, "dims": dims, "phase_w": True, "block_m": bm, "block_n": bn}
    knobs |= {"block_k": bk, "num_warps": warps, "num_stages": stages}
    if strategy == "nd_dot":
        knobs["fp32_dot"] = "tf32x3"
    return knobs | more


# Unmeasured guesses for an H200, per dimensionality (module docstring): tf32x3 dots first (conv's
# measured implicit GEMM prefers them at fp32), tiles after conv's round 0, narrower channel tiles in 3-D
# (KernelBench's 3-D transposed convolutions have 8 to 64 output channels a group), a contiguous-store
# variant (phase_w False) for strided last dims, and the FMA form for narrow groups.
ROUND0_ND: dict[int, list[dict[str, Any]]] = {
    1: [
        _nd(1, "nd_dot", 128, 64, 32, 4),
        _nd(1, "nd_dot", 128, 128, 32, 8),
        _nd(1, "nd_dot", 128, 64, 32, 4, phase_w=False),
        _nd(1, "nd_fma", 128, 16, 1, 4, 1),
    ],
    2: [
        _nd(2, "nd_dot", 128, 64, 32, 4),
        _nd(2, "nd_dot", 64, 64, 32, 4),
        _nd(2, "nd_dot", 128, 64, 32, 4, phase_w=False),
        _nd(2, "nd_fma", 128, 16, 1, 4, 1),
    ],
    3: [
        _nd(3, "nd_dot", 128, 32, 32, 4),
        _nd(3, "nd_dot", 128, 64, 16, 4),
        _nd(3, "nd_dot", 128, 32, 32, 4, phase_w=False),
        _nd(3, "nd_fma", 128, 16, 1, 4, 1),
        _nd(3, "nd_fma", 256, 8, 1, 4, 1),
    ],
}
# the measured 2-D sets first (a plain 2-D transposed convolution: they were measured on the H200 and
# keep their order), then the nd sets, each feasible only at its own dimensionality
ROUND0: list[dict[str, Any]] = ROUND0_2D + [k for d in (1, 2, 3) for k in ROUND0_ND[d]]

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
        ("contiguous_w", "the last dim's phases in the tile: contiguous stores, its taps masked per column"),
        ("rows_dense", "every phase of a row block in one GEMM, stored as one contiguous run of columns"),
        ("rows", "all stride phases of a row from one program: interleaved stores fill L2 lines together"),
        ("larger_tiles", "longer pixel blocks make longer contiguous row loads and stores"),
    ],
    "latency or occupancy-limited": [
        ("more_stages", "a deeper pipeline keeps more tile loads in flight (nd forms)"),
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
        ("fewer_stages", "fewer pipeline buffers (nd forms)"),
        ("prepack", "packed weight tiles need no index or mask tensors held across the tap loop"),
    ],
}


def fp32_dot(knobs: dict[str, Any]) -> str:
    """The fp32 dot precision of a knob set (knob sets recorded before the knob existed: ieee)."""
    v = str(knobs.get("fp32_dot", FP32_DOTS[0]))
    if v not in FP32_DOTS:
        raise ValueError(f"conv_transpose knob fp32_dot={v!r}: expected one of {', '.join(FP32_DOTS)}")
    return v


class NotConvTranspose(Refusal):
    """What the graph holds that this family cannot compose."""


REFUSAL = NotConvTranspose


def plain_2d(spec: dict) -> bool:
    """A 2-D transposed convolution with no chain fused into it: what the 2-D strategies serve."""
    return spec["spatial"] == 2 and not spec["epilogue"] and not spec["extras"] and not spec["out_dtype"]


def _feasible_2d(knobs: dict[str, Any]) -> bool:
    """Power-of-two blocks (>= 16 per tl.dot dim), the accumulator (and, for the FMA forms, the
    BLOCK_K x BLOCK_C x BLOCK_P product summed over K) within registers."""
    bp, bc, bk, warps = knobs["block_p"], knobs["block_c"], knobs["block_k"], knobs["num_warps"]
    if not sizing.pow2(bp, bc, bk) or warps not in sizing.WARPS:
        return False
    if knobs.get("prepack") and knobs["strategy"] != "rows_dense":
        return False  # only rows_dense has weight tiles to pack
    acc = sizing.fits(bp * bc, warps, limits.ACC_PER_THREAD)
    if knobs["strategy"] == "phase_dot":
        return min(bp, bc, bk) >= 16 and acc
    if knobs["strategy"] == "rows":  # one phase's [BLOCK_C, BLOCK_P] accumulator live at a time
        return bp >= 16 and bc >= 16 and acc
    if knobs["strategy"] == "rows_dense":  # a [BLOCK_C x phases, BLOCK_P / phases] accumulator
        # narrower blocks than tl.dot's 16 are widened (and masked) at launch, so they stay allowed
        return bp >= 16 and bc >= 4 and acc
    return bp >= 16 and bc >= 16 and sizing.fits(bp * bc * (1 + bk), warps, 2 * limits.ACC_PER_THREAD)


def _feasible_nd(spec: dict, knobs: dict[str, Any]) -> bool:
    """Power-of-two tiles (a tl.dot's at least 16 a side), the accumulator within registers, the dot's
    pipelined tiles within shared memory; the dot form only for groups of at least 8 output channels
    (narrower ones waste most of a dot's columns: nd_fma serves them)."""
    bm, bn, bk, warps = knobs["block_m"], knobs["block_n"], knobs["block_k"], knobs["num_warps"]
    if not sizing.pow2(bm, bn, bk) or warps not in sizing.WARPS or knobs["num_stages"] < 1 or bm < 16:
        return False
    if not sizing.fits(bm * bn, warps, limits.ACC_PER_THREAD):
        return False
    if knobs["strategy"] == "nd_fma":
        return True
    if min(bm, bn, bk) < 16 or spec["c_out_g"] < 8:
        return False
    size = 2 if spec["dtype"] in {"float16", "bfloat16"} else 4
    return knobs["num_stages"] * (bm * bk + bk * bn) * size <= conv.SHARED_BYTES


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Known knobs; a 2-D strategy only for a plain 2-D transposed convolution (`plain_2d`), an nd set
    only at the dimensionality it was chosen for; the tiles as `_feasible_2d`/`_feasible_nd` say (the
    stages' own knobs are the composer's to check)."""
    strategy = knobs.get("strategy")
    if strategy not in STRATEGIES:
        return False
    try:
        fp32_dot(knobs)
    except ValueError:
        return False
    if strategy in STRATEGIES_2D:
        return plain_2d(spec) and _feasible_2d(knobs)
    if knobs.get("dims", spec["spatial"]) != spec["spatial"]:
        return False
    return _feasible_nd(spec, knobs)


TILE_MOVES = ("wider_channels", "larger_tiles", "smaller_tiles", "more_warps", "longer_k")


def _tiles(
    k: dict[str, Any], move: str, channels: str, positions: str, most_c: int, most_k: int
) -> dict | None:
    """The tile moves both forms make, each on its own knobs: the output channels a program (up to
    most_c), its output positions (16 to 512), its warps, its K step (up to most_k)."""
    if move == "wider_channels":
        return sizing.doubled(k, channels, most_c)
    if move == "larger_tiles":
        return sizing.doubled(k, positions, 512)
    if move == "smaller_tiles":
        return sizing.halved(k, positions, 16)
    if move == "more_warps":
        return sizing.warps(k, move)
    return sizing.doubled(k, "block_k", most_k)


def _mutate_nd(k: dict[str, Any], move: str) -> dict[str, Any] | None:
    dot = k["strategy"] == "nd_dot"
    if move == "phase":
        return None if k["phase_w"] else {**k, "phase_w": True}
    if move == "contiguous_w":
        return {**k, "phase_w": False} if k["phase_w"] else None
    if move == "dot":
        if dot:
            return None
        return {**k, "strategy": "nd_dot", "block_n": max(16, k["block_n"]), "block_k": max(16, k["block_k"]),
                "num_stages": max(2, k["num_stages"]), "fp32_dot": "tf32x3"}  # fmt: skip
    if move in {"tf32x3_dot", "ieee_dot"}:
        v = move.removesuffix("_dot")
        return {**k, "fp32_dot": v} if dot and fp32_dot(k) != v else None
    if move in TILE_MOVES:
        return _tiles(k, move, "block_n", "block_m", 256, 128) if dot or move != "longer_k" else None
    if move == "more_stages":
        return sizing.stages(k, move) if dot else None
    if move == "fewer_stages":
        return sizing.stages(k, move)
    if move in {"rows", "rows_dense", "prepack"}:
        return None  # the 2-D strategies' own
    raise ValueError(f"unknown move {move!r}")


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if k["strategy"] in STRATEGIES_ND:
        return _mutate_nd(k, move)
    if move in {"contiguous_w", "more_stages", "fewer_stages"}:
        return None  # the nd strategies' own
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
    if move in TILE_MOVES:
        return _tiles(k, move, "block_c", "block_p", 128, 64)
    raise ValueError(f"unknown move {move!r}")


def head(graph: Graph) -> int:
    """The one transposed convolution. Raises NotConvTranspose naming what is not."""
    if len(graph.outputs) != 1:
        raise NotConvTranspose(f"{len(graph.outputs)} outputs")
    found = [i for i, n in enumerate(graph.nodes) if n.op in CONVS or "conv" in n.op]
    if len(found) != 1:
        raise NotConvTranspose(f"{len(found)} convolutions")
    node = graph.nodes[found[0]]
    if node.op not in CONVS or ("convolution" in node.op and not node.args.get("transposed")):
        raise NotConvTranspose(f"{node.op}, not a transposed convolution")
    return found[0]


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one transposed convolution of a forward input (or of a prelude's
    value) and the elementwise chain after it, up to the output: the head the composer cut
    (compose/stages.with_stages). Raises NotConvTranspose naming what is not."""
    at = head(graph)
    a = graph.nodes[at].args
    # groups, stride, ... are kept as constants: none may have been computed from a size
    unsized(graph, NotConvTranspose)
    spec = conv.common(graph, at, "transposed convolution", NotConvTranspose)
    dims = {k: conv.per_dim(a, k, spec["spatial"]) for k in conv.PER_DIM}
    negative = min(dims["padding"] + dims["output_padding"]) < 0
    if negative or min(dims["stride"]) < 1 or min(dims["dilation"]) < 1:
        stride, padding, dilation, output_padding = (dims[k] for k in conv.PER_DIM)
        raise NotConvTranspose(
            f"stride {stride}, padding {padding}, output padding {output_padding}, dilation {dilation}"
        )
    w = graph.meta(graph.ref(a["weight"])).shape
    return {**spec, **dims, "c_in_g": int(w[0]) // max(spec["groups"], 1), "c_out_g": int(w[1])}


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """The problem's constructor, run by ModelNew so that its parameters are Model's."""
    return conv.refine(spec, problem_source)


def reads(spec: dict) -> list[list]:
    """The tensors the head's launch reads: its input, weight and bias, and the chain's tensors."""
    return conv.reads(spec)


def title(spec: dict, knobs: dict[str, Any]) -> str:
    """The candidate's docstring, as far as the head goes."""
    how = "Accumulated in fp32" + (", the chain applied before the one store" if spec["epilogue"] else "")
    return graph_doc(f"{spec['spatial']}-D transposed convolution with its chain", FAMILY, spec, knobs, how)


def sections(spec: dict, knobs: dict[str, Any]) -> list[str]:
    """The head's part of the candidate module: the geometry and knobs as constants, the strategy's parts
    (an nd strategy's with conv's dot and the chain)."""
    strategy = knobs["strategy"]
    out = [
        constants(STRIDE=spec["stride"], PADDING=spec["padding"], DILATION=spec["dilation"]),
        constants(OUTPUT_PADDING=spec["output_padding"], GROUPS=spec["groups"]),
    ]
    if strategy in STRATEGIES_2D:
        out += [
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
            parts_of(PARTS, *KERNEL_PARTS, *HOST_PARTS),
        ]
    else:
        out += [
            constants(DOT=strategy == "nd_dot", PHASE_W=bool(knobs["phase_w"]), FP32_DOT=fp32_dot(knobs)),
            constants(BLOCK_M=knobs["block_m"], BLOCK_N=knobs["block_n"], BLOCK_K=knobs["block_k"]),
            constants(NUM_WARPS=knobs["num_warps"], NUM_STAGES=knobs["num_stages"]),
            pointwise.helper_parts(spec),
            chain("_epilogue", spec["epilogue"], spec["epilogue_result"]),
            parts_of(conv.PARTS, *CONV_PARTS),
            parts_of(PARTS, *ND_PARTS),
        ]
    return out


def launch(spec: dict, knobs: dict[str, Any], names: list[str]) -> str:
    """The line of forward setting kb_h: `names` the tensors by input index (a prelude's value too)."""
    x, w, b = names[spec["input"]], render.tensor(spec["weight"], names), render.tensor(spec["bias"], names)
    geometry = "STRIDE, PADDING, DILATION, OUTPUT_PADDING, GROUPS"
    if knobs["strategy"] in STRATEGIES_2D:
        return f"        kb_h = _launch({x}, {w}, {b}, {geometry})\n"
    dtype = dtype_of(spec["out_dtype"], "None")
    extras = ", ".join(render.tensor(e, names) for e in spec["extras"])
    return (
        f"        kb_h = _convt_nd_launch(\n            {x}, {w}, {b}, [{extras}], {geometry}, {dtype},\n"
        "            DOT, PHASE_W, FP32_DOT, BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES,\n        )\n"
    )
