"""Contractions: one GEMM-like op (aten.mm, aten.addmm, aten.bmm) with the views around it that
torch.matmul, F.linear and einsum decompose into, and a pointwise epilogue on its accumulator tile,
composed from the traced graph into one Triton kernel.

    y[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n], e1, e2, e3)   fp32 accumulation, one store

Every view (t, transpose, permute, view, reshape, expand, unsqueeze, squeeze, clone) is followed
symbolically: each axis of a tensor is the run of source dims ("atoms": a forward input's or a
parameter's dim, or a broadcast) it merges. At the contraction, an operand's axes say which source dims
make its batch, rows and columns; ModelNew lays each operand out from its source by a permute and a
reshape (a view wherever the strides allow: a transposed operand is read by its strides, not copied)
and broadcast batch pieces get stride 0. The output is the contraction's rows and columns in order, so
the views after it only regroup them (a permute that reorders them is refused).

The epilogue is families/pointwise's chain with the contraction value as v0 and up to three further
tensors (a bias, a residual forward input, a parameter), each broadcast to the shape it meets the chain
at and read per tile by its strides. ModelNew runs Model's constructor (its parameters are Model's own)
and reads them by their state-dict names.

A triu/tril in the chain (on the contraction's rows and columns) is a mask on each element's diagonal
(its column less its row); the tiles where the output does not read the product (the chain's band of
diagonals) skip the K loop and run the chain on zeros.

The family is the head of a composed candidate (base.Head): what follows the chain when it is not
pointwise (a row sum, a logsumexp, x - max(x), reductions in sequence) is the tail, which the composer
(compose/) cuts off: the chain's value h is written once in its traced dtype and the memory-bound
families compose the rest over h and forward's tensors as further launches in the same candidate.

Precision: fp32 operands take an exact "ieee" dot, "tf32x3" (three TF32 dots of hi/lo splits made in
registers, see families/gemm_epilogue) or "presplit" (the same three dots of hi/lo planes the launcher
writes once); fp16/bf16 ones a plain dot accumulating in fp32.

Layout ("layout" knob): "strided" reads each operand by its strides; "k" copies an operand that is not
K-contiguous (the TF32 tensor-core dot reads both operands K-major); "mn" copies A M-contiguous and B
N-contiguous (the FMA dot's outer products). Split-K ("split_k" knob, round 0 only where few output tiles
meet a long K): K in slices on the grid's third axis, each slice's fp32 partial tile to a workspace, and a
second small launch sums the slices in order (deterministic) and applies the epilogue once to the sum;
the tail, if any, follows as before. The kernels and their launcher are in families/contraction/parts.py.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Meta, Node
from kernelbrain.templates import limits, model_source, render, sizing
from kernelbrain.templates.base import unsized
from kernelbrain.templates.families import gemm_epilogue, pointwise
from kernelbrain.templates.families.contraction.axes import (
    SAME,
    VIEWS,
    Atom,
    Atoms,
    Axes,
    NotContraction,
    batch_pieces,
    operand_axes,
    operand_plan,
    view_axes,
)
from kernelbrain.templates.render import chain, constants, dtype_of, graph_doc, parts_of
from kernelbrain.templates.rewrite import readers

FAMILY = "contraction"
PARTS = f"{__name__}.parts"
MAX_EXTRAS = 3
MAX_PIECES = 3  # batch dims the kernel indexes (the grid's second axis)
SPLIT_K_MIN_SLICE = 1024  # K a split-K slice keeps at least (its partial tile's store is then cheap)
SPLIT_K_MAX_WORKSPACE = 256 << 20  # bytes of fp32 partial tiles
LAYOUTS = ("strided", "k", "mn")

# Measured on an H200 (issue 17's round-0 probe, fp32 1e-4): on x @ W^T (level 2's Linear: both operands
# K-contiguous) tf32x3 at 128 x 128, 8 warps ran 1.4-1.6x eager, ieee 0.28x; on a row-major B
# (N-contiguous: level 1's A @ B) tf32x3 ran 0.65x, ieee 0.79x. Hopper's TF32 tensor-core dot reads both
# operands K-major, the FMA dot's outer products want A M- and B N-contiguous: "layout" copies an
# operand into the layout its dot wants (a read and a write of it, small beside an O(MNK) GEMM).
# presplit writes the hi/lo planes once instead of splitting each tile in registers on every reuse.
# Split-K sets first: feasible only where the M x N tiles leave most SMs idle and K is long.
_BIG = {"block_m": 128, "block_n": 128, "block_k": 32, "group_m": 8, "num_warps": 8, "num_stages": 3}
ROUND0: list[dict[str, Any]] = [
    {"strategy": "tf32x3", **_BIG, "layout": "strided", "split_k": 32},
    {"strategy": "ieee", "block_m": 64, "block_n": 64, "block_k": 32, "group_m": 8, "num_warps": 4,
     "num_stages": 3, "layout": "strided", "split_k": 16},
    {"strategy": "presplit", **_BIG, "layout": "k", "split_k": 1},
    {"strategy": "tf32x3", **_BIG, "layout": "k", "split_k": 1},
    {"strategy": "tf32x3", "block_m": 128, "block_n": 64, "block_k": 32, "group_m": 8, "num_warps": 4,
     "num_stages": 4, "layout": "k", "split_k": 1},
    {"strategy": "ieee", "block_m": 64, "block_n": 64, "block_k": 32, "group_m": 8, "num_warps": 4,
     "num_stages": 3, "layout": "mn", "split_k": 1},
]  # fmt: skip

MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        (
            "tf32x3",
            "at the FMA roof: three TF32 tensor-core dots keep fp32 accuracy at several times the rate",
        ),
        ("larger_tiles", "bigger output tiles do more dot work per loaded element"),
        ("presplit", "split the fp32 operands into TF32 hi/lo planes once, not in registers per tile"),
    ],
    "memory-bound near peak": [
        ("larger_tiles", "bigger output tiles re-read A and B fewer times"),
        ("wider_groups", "a wider GROUP_M swizzle keeps the B tiles a group shares in L2"),
    ],
    "memory-bound with poor coalescing": [("longer_k", "longer K tiles make longer contiguous loads")],
    "latency or occupancy-limited": [
        ("more_stages", "a deeper software pipeline keeps more tile loads in flight"),
        ("smaller_tiles", "smaller output tiles make more programs to fill the SMs"),
        ("more_splits", "more split-K slices make more programs over a long K"),
    ],
    "launch-bound": [("larger_tiles", "fewer, fatter programs")],
    "register spills": [
        ("more_warps", "spread the accumulator over more threads"),
        ("smaller_tiles", "a smaller output tile holds a smaller accumulator"),
    ],
}


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    """gemm_epilogue's moves on the tiles (one rule for both), and this family's own: presplit (with
    K-major planes) and more split-K slices (feasible() keeps them to the shapes that want them)."""
    k = {"layout": "strided", "split_k": 1, **knobs}
    if move == "presplit":
        return {**k, "strategy": "presplit", "layout": "k"} if k["strategy"] != "presplit" else None
    if move == "more_splits":
        return sizing.doubled(k, "split_k", 128)
    return gemm_epilogue.mutate(k, move)


def tile(spec: dict, knobs: dict[str, Any]) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) the launcher uses at the traced shape: never wider than the matrix
    (rounded up to a power of two, at least 16: tl.dot's minimum)."""

    return (
        sizing.clamp(knobs["block_m"], spec["m"], 16),
        sizing.clamp(knobs["block_n"], spec["n"], 16),
        sizing.clamp(knobs["block_k"], spec["k"], 16),
    )


def smem_bytes(spec: dict, knobs: dict[str, Any]) -> int:
    """The software pipeline's A and B tiles a stage (fp32: the widest; presplit: hi and lo planes of
    both), plus a tf32x3 dot's hi/lo split in registers staged for the dot."""
    bm, bn, bk = tile(spec, knobs)
    per_stage = (bm * bk + bk * bn) * 4
    if knobs["strategy"] == "presplit":
        return knobs["num_stages"] * 2 * per_stage
    return knobs["num_stages"] * per_stage + (2 * per_stage if knobs["strategy"] == "tf32x3" else 0)


def wants_split_k(spec: dict, knobs: dict[str, Any]) -> bool:
    """Split-K pays where the output's tiles (times the batch) leave most of the SMs idle (fewer than two
    waves) and K is long enough for every slice to keep SPLIT_K_MIN_SLICE of it, with the partial tiles'
    workspace within SPLIT_K_MAX_WORKSPACE."""
    bm, bn, _ = tile(spec, knobs)
    split = knobs.get("split_k", 1)
    tiles = math.ceil(spec["m"] / bm) * math.ceil(spec["n"] / bn) * spec["batch"]
    workspace = split * spec["batch"] * spec["m"] * spec["n"] * 4
    return (
        tiles < 2 * limits.TARGET.sms
        and spec["k"] >= split * SPLIT_K_MIN_SLICE
        and workspace <= SPLIT_K_MAX_WORKSPACE
    )


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Tiles of powers of two >= 16, the pipeline within shared memory, the accumulator (and the tile of
    each epilogue tensor) within registers, the batch within the grid's second axis; split-K only where
    the shape wants it (wants_split_k)."""
    if (
        not sizing.pow2(knobs["block_m"], knobs["block_n"], knobs["block_k"], least=16)
        or knobs["num_stages"] < 1
    ):
        return False
    if spec["batch"] > limits.TARGET.grid_y or knobs.get("layout", "strided") not in LAYOUTS:
        return False
    split = knobs.get("split_k", 1)
    if split < 1 or (split > 1 and not wants_split_k(spec, knobs)):
        return False
    bm, bn, _ = tile(spec, knobs)
    # in the K loop the accumulator (and a tf32x3 split's operands); in the epilogue the accumulator and
    # each extra tile, once, where a thread may hold up to 255 registers
    in_loop = bm * bn * (1 + (knobs["strategy"] in ("tf32x3", "presplit")))
    in_epilogue = bm * bn * (1 + len(spec["extras"]))
    warps = knobs["num_warps"]
    fits = sizing.fits(in_loop, warps, limits.ACC_PER_THREAD)
    fits = fits and sizing.fits(in_epilogue, warps, 2 * limits.ACC_PER_THREAD)
    return smem_bytes(spec, knobs) <= limits.TARGET.smem_per_block and fits


# --- the graph ---------------------------------------------------------------------------------------

CONTRACTIONS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}

# triu/tril (and their in-place forms) on the last two axes -> whether they keep the upper triangle
TRIANGLES = {"aten.triu.default": True, "aten.triu_.default": True, "aten.tril.default": False,
             "aten.tril_.default": False}  # fmt: skip


# the head of a composed candidate (base.Head): what the composer needs to cut its tail off (it has no
# prelude: its operands are read through views)
HEAD, CHAIN, INPUT_ARG, REFUSAL = "contraction", VIEWS | set(TRIANGLES), None, NotContraction
TAIL_NOTE = "Then the tail over its value, composed by the memory-bound families"
STAGE_ORDER = ("tail",)


def head(graph: Graph) -> int:
    """The one contraction the output needs. Raises NotContraction naming how many there are."""
    if len(graph.outputs) != 1:
        raise NotContraction(f"{len(graph.outputs)} outputs")
    wanted = {n for n, _ in graph.needed()}
    found = [i for i, n in enumerate(graph.nodes) if n.op in CONTRACTIONS and i in wanted]
    if len(found) != 1:
        raise NotContraction(f"{len(found)} contractions")
    return found[0]


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one contraction of two (viewed) tensors and a pointwise epilogue, up
    to the output: the head the composer cut (compose/stages.with_stages). Raises NotContraction (or
    pointwise.NotPointwise) naming what is not."""
    at = head(graph)
    node = graph.nodes[at]
    unsized(graph, NotContraction, {(i, "size") for i, n in enumerate(graph.nodes) if n.op in VIEWS})
    sizes = Atoms(graph)
    sources: dict[int, int] = {}
    first, second = ("mat1", "mat2") if node.op == "aten.addmm.default" else ("self", "mat2")
    a = operand_axes(graph, sizes, node.args[first], sources)
    b = operand_axes(graph, sizes, node.args[second], sources)
    pieces = batch_pieces(sizes, a[0], b[0]) if len(a) == 3 else []
    if len(pieces) > MAX_PIECES:
        raise NotContraction(f"{len(pieces)} batch dims")
    for what, run in (("rows", a[-2]), ("reduced dims", a[-1]), ("reduced dims", b[-2]), ("columns", b[-1])):
        if any(x[0] < 0 for x in run):
            raise NotContraction(f"a broadcast along the contraction's {what}")
    rank = {s: len(graph.nodes[s].outs[0].shape) for s in sources}
    a_plan = operand_plan([pa for pa, _ in pieces] + [a[-2], a[-1]], sources, rank)
    b_plan = operand_plan([pb for _, pb in pieces] + [b[-2], b[-1]], sources, rank)
    batch_atoms = [pa if pa[0][0] >= 0 else pb for pa, pb in pieces]
    result: Axes = [tuple(x) for x in batch_atoms] + [a[-2], b[-1]]
    flat = [x for ax in result for x in ax if sizes.size(x) != 1]
    epi = _epilogue(graph, sizes, at, result, flat, sources)
    out_dtype = graph.meta(tuple(graph.outputs[0])).dtype
    operand_dtype = node.outs[0].dtype
    m = sizes.axis(a[-2])
    return {
        "sources": [_source(graph.nodes[s]) for s in sorted(sources, key=sources.get)],
        "a": a_plan,
        "b": b_plan,
        "out_axes": [[list(sources_of(x, sources)) for x in ax] for ax in epi["out"]],
        "extras": epi["extras"],
        "epilogue": epi["body"],
        "epilogue_result": epi["result"],
        "helpers": epi["helpers"],
        "dtype": None if out_dtype == operand_dtype else out_dtype,
        "m": m,
        "n": sizes.axis(b[-1]),
        "k": sizes.axis(a[-1]),
        "batch": math.prod(sizes.axis(p[0] if p[0][0][0] >= 0 else p[1]) for p in pieces),
        "triangle": epi["triangle"],
        "ops": graph.ops(),
    }


def sources_of(atom: Atom, sources: dict[int, int]) -> tuple[int, int]:
    """An atom as contraction_parts reads it: (position among the sources, dim)."""
    return sources[atom[0]], atom[1]


def _source(node: Node) -> list[Any]:
    return ["input", int(node.args["index"])] if node.op == INPUT else ["param", str(node.args["name"])]


Band = tuple[int | None, int | None] | None  # the diagonals lo..hi (None: unbounded); None: no diagonal


def _hull(x: Band, y: Band) -> Band:
    """The least band holding both."""
    if x is None or y is None:
        return y if x is None else x
    lo = None if x[0] is None or y[0] is None else min(x[0], y[0])
    hi = None if x[1] is None or y[1] is None else max(x[1], y[1])
    return lo, hi


def _meet(x: Band, lo: int | None, hi: int | None) -> Band:
    """The diagonals of x from lo to hi (None: unbounded)."""
    if x is None:
        return None
    lo = x[0] if lo is None else lo if x[0] is None else max(x[0], lo)
    hi = x[1] if hi is None else hi if x[1] is None else min(x[1], hi)
    return None if lo is not None and hi is not None and lo > hi else (lo, hi)


def _triangle_rows(sizes: Atoms, axes: Axes, result: Axes, op: str) -> list[Atom]:
    """The row atoms of a triu/tril's second-last axis: a trailing run of the contraction's rows (a
    batch matmul folded into one mm repeats its rows per batch element: the triangle's row is the row
    modulo their size); its last axis must be the contraction's columns."""

    def real(axis: tuple[Atom, ...]) -> list[Atom]:
        return [x for x in axis if sizes.size(x) != 1]

    whole = real(result[-2])
    if len(axes) >= 2 and real(axes[-1]) == real(result[-1]):
        mine = real(axes[-2])
        if len(mine) <= len(whole) and mine == whole[len(whole) - len(mine) :]:
            return mine
    raise NotContraction(f"{op} on axes other than the contraction's rows and columns")


def _epilogue(
    graph: Graph, sizes: Atoms, at: int, result: Axes, flat: list[Atom], sources: dict[int, int]
) -> dict:
    """The chain after the contraction as families/pointwise composes it (the contraction's value v0,
    the tensors it meets v1..v3), the output's axes, each extra tensor with the axes it meets at, and
    the triangle its triu/tril ops make (None: none).

    A triu/tril is `where(kb_d >= k, x, 0)` (`<=` for tril), kb_d the tile's diagonal: its column
    less its row within the rows the op reads. Each value's band is the diagonals where it depends on
    the contraction's value (a triangle narrows it, any other op joins its operands'): the output's is
    where tiles must run the K loop; elsewhere the chain runs on a zero accumulator, which every path
    to the output masks."""
    node = graph.nodes[at]
    axes_of: dict[tuple[int, int], Axes] = {(at, 0): result}
    band: dict[tuple[int, int], Band] = {(at, 0): (None, None)}
    rows: list[Atom] | None = None  # the row atoms of the triangles' row axis
    moved: dict[tuple[int, int], list[int]] = {(at, 0): [0, 0]}
    out_shape = graph.meta(tuple(graph.outputs[0])).shape
    nodes: list[Node] = [
        Node(op=INPUT, args={"index": 0}, outs=[Meta(shape=out_shape, strides=[], dtype=node.outs[0].dtype)])
    ]
    extras: list[list[Any]] = []
    extra_at: dict[tuple[int, int], list[int]] = {}

    def extra(ref: tuple[int, int], axes: Axes) -> list[int]:
        src = graph.nodes[ref[0]]
        while src.op in SAME:  # a clone or detach of a source reads as the source
            ref = graph.ref(src.args["self"])
            src = graph.nodes[ref[0]]
        if src.op not in (INPUT, PARAM):
            raise NotContraction(f"an epilogue tensor made by {src.op}")
        if ref not in extra_at:
            if len(extras) == MAX_EXTRAS:
                raise NotContraction(f"more than {MAX_EXTRAS} tensors in the epilogue")
            meta = src.outs[0]
            if len(meta.shape) > len(axes) or any(
                s not in (1, sizes.axis(ax))
                for s, ax in zip(reversed(meta.shape), reversed(axes), strict=False)
            ):
                raise NotContraction(f"an epilogue tensor of shape {meta.shape} that does not broadcast")
            nodes.append(
                Node(
                    op=INPUT,
                    args={"index": len(extras) + 1},
                    outs=[meta.model_copy(update={"shape": out_shape})],
                )
            )
            extra_at[ref] = [len(nodes) - 1, 0]
            extras.append(
                [
                    _source(src),
                    [[list(sources_of(x, sources)) if x[0] >= 0 else None for x in ax] for ax in axes],
                ]
            )
        return extra_at[ref]

    if node.op == "aten.addmm.default":  # the bias: added to the contraction's value before the chain
        if node.args.get("beta", 1) != 1 or node.args.get("alpha", 1) != 1:
            raise NotContraction("addmm with beta or alpha other than 1")
        bias = extra(graph.ref(node.args["self"]), result)
        add = {"self": {"ref": [0, 0]}, "other": {"ref": bias}, "alpha": 1}
        nodes.append(Node(op="aten.add.Tensor", args=add, outs=[nodes[0].outs[0]]))
        moved[(at, 0)] = [len(nodes) - 1, 0]
    # a node that reads nothing the chain made: a view of an extra tensor, read where it is used
    for j, n, mine in readers(graph, at, moved):
        first = mine[0]
        if n.op in VIEWS:
            axes = view_axes(sizes, n, axes_of[first])
            if [x for ax in axes for x in ax if sizes.size(x) != 1] != flat:
                raise NotContraction(f"{n.op} reordering the contraction's result")
            axes_of[(j, 0)], moved[(j, 0)], band[(j, 0)] = axes, moved[first], band[first]
            continue
        if n.op in TRIANGLES:
            k = n.args.get("diagonal", 0)
            if not isinstance(k, int) or isinstance(k, bool):
                raise NotContraction(f"{n.op} with a diagonal of {k!r}")
            mine_rows = _triangle_rows(sizes, axes_of[first], result, n.op)
            if rows is not None and mine_rows != rows:
                raise NotContraction(f"{n.op} over other rows than an earlier triangle's")
            rows = mine_rows
            upper = TRIANGLES[n.op]
            # the condition is Triton text over the chain's kb_d argument (pointwise copies a literal)
            args = {"condition": f"(kb_d {'>=' if upper else '<='} {k})", "self": {"ref": moved[first]}}
            nodes.append(
                Node(
                    op="aten.where.self",
                    args={**args, "other": 0.0},
                    outs=[o.model_copy(update={"shape": out_shape}) for o in n.outs],
                )
            )
            band[(j, 0)] = _meet(band[first], k, None) if upper else _meet(band[first], None, k)
            axes_of[(j, 0)], moved[(j, 0)] = axes_of[first], [len(nodes) - 1, 0]
            continue
        elementwise = n.op in pointwise.EXPRESSIONS or n.op.replace("_.", ".", 1) in pointwise.EXPRESSIONS
        if not elementwise or n.outs[0].shape != graph.meta(first).shape:
            raise NotContraction(f"{n.op} after the contraction")
        args = {}
        for key, value in n.args.items():
            if isinstance(value, list) and graph.refs(value):
                raise NotContraction(f"{n.op} of a list of tensors after the contraction")
            ref = graph.ref(value)
            if ref is None:
                args[key] = value
            elif ref in moved:
                args[key] = {"ref": moved[ref]}
            else:
                args[key] = {"ref": extra(ref, axes_of[first])}
        nodes.append(
            Node(op=n.op, args=args, outs=[o.model_copy(update={"shape": out_shape}) for o in n.outs])
        )
        axes_of[(j, 0)], moved[(j, 0)] = axes_of[first], [len(nodes) - 1, 0]
        band[(j, 0)] = functools.reduce(_hull, (band[r] for r in mine))
    out = tuple(graph.outputs[0])
    if out not in moved:
        raise NotContraction("an output the contraction does not reach")
    if moved[out] == [0, 0]:
        return {
            "out": axes_of[out],
            "extras": [],
            "body": [],
            "result": "v0",
            "helpers": [],
            "triangle": None,
        }
    triangle = None
    if rows is not None:  # no band: the output reads the contraction nowhere, and no tile needs it
        kept = band[out] or (1, 0)
        triangle = {"rows": [list(sources_of(x, sources)) for x in rows], "diagonals": list(kept)}
    chained = Graph(nodes=nodes, outputs=[moved[out]])
    spec = pointwise.compose(chained)
    if spec["inputs"][0] != 0:
        raise NotContraction("an epilogue that does not read the contraction")
    order = spec["inputs"][1:]
    return {
        "out": axes_of[out],
        "extras": [extras[i - 1] for i in order],
        "body": spec["body"],
        "result": spec["result"],
        "helpers": spec["helpers"],
        "triangle": triangle,
    }


def reads(spec: dict) -> list[list]:
    """The tensors the head's launch reads: the operands' sources and the epilogue's tensors."""
    return [*spec["sources"], *(e[0] for e in spec["extras"])]


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """The problem's constructor, run by ModelNew so that the parameters it reads are Model's."""
    if not any(s[0] == "param" for s in reads(spec)):
        return spec
    return model_source.with_constructor(spec, problem_source)


def epilogue(spec: dict) -> str:
    """The candidate's one generated function: the traced chain, of the accumulator v0, the extra
    tensors v1..v3 and each element's diagonal kb_d (which a triu/tril reads)."""
    return chain("_epilogue", spec["epilogue"], spec["epilogue_result"], "v0, v1, v2, v3, kb_d")


def title(spec: dict, knobs: dict[str, Any]) -> str:
    """The candidate's docstring, as far as the head goes."""
    how = "One tiled dot, the epilogue on the fp32 accumulator"
    return graph_doc("Contraction with its epilogue", FAMILY, spec, knobs, how)


def sections(spec: dict, knobs: dict[str, Any]) -> list[str]:
    """The head's part of the candidate module: knobs and operand plans as constants, the chain, its parts."""
    launcher = (
        "_split_planes",
        "_operand",
        "_size",
        "_padded",
        "_flipped",
        "_laid_out",
        "_contraction_launch",
    )
    return [
        constants(PRECISION=knobs["strategy"], BLOCK_M=knobs["block_m"], BLOCK_N=knobs["block_n"]),
        constants(BLOCK_K=knobs["block_k"], GROUP_M=knobs["group_m"], NUM_WARPS=knobs["num_warps"]),
        constants(NUM_STAGES=knobs["num_stages"], LAYOUT=knobs.get("layout", "strided")),
        constants(SPLIT_K=knobs.get("split_k", 1)),
        constants(A_PLAN=spec["a"], B_PLAN=spec["b"], OUT_AXES=spec["out_axes"]),
        constants(EXTRA_AXES=[e[1] for e in spec["extras"]], TRIANGLE=spec.get("triangle")),
        "import math\n",
        parts_of(pointwise.PARTS, *spec["helpers"]) if spec["helpers"] else "",
        epilogue(spec),
        parts_of(
            PARTS, "_dot_tile", "_extra", "_finish", "_meets_band", "_contraction_kernel", "_split_k_sum"
        ),
        parts_of(PARTS, *launcher),
    ]


def launch(spec: dict, knobs: dict[str, Any], names: list[str]) -> str:
    """The lines of forward setting kb_h: `names` the forward tensors by input index."""
    srcs = ", ".join(render.tensor(s, names) for s in spec["sources"])
    tensors = [render.tensor(e[0], names) for e in spec["extras"]]
    extras = ", ".join(f"({t}, EXTRA_AXES[{i}])" for i, t in enumerate(tensors))
    dtype = dtype_of(spec["dtype"], "None")
    return f"""\
        srcs = [{srcs}]
        extras = [{extras}]
        kb_h = _contraction_launch(srcs, A_PLAN, B_PLAN, OUT_AXES, extras, TRIANGLE, {dtype}, PRECISION,
                                   LAYOUT, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_WARPS,
                                   NUM_STAGES)
"""
