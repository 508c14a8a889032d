"""Reductions: sum, mean, max, min, prod, argmax, argmin and the L1, L2 and max norms over any axis or set
of axes, with the elementwise ops before the reduction (over up to four inputs) and after it (on the
reduced value) fused in, composed from the traced graph.

    y = epilogue(reduce_R(prologue(x0, ..., x3)))   in fp32, stored once in the output's dtype

Each input is read in place through its strides as an [outer, high, R, inner] view (templates/
reduce_plan.py: a broadcast input at stride 0, never expanded in memory; an input no such view reads is
copied once). Each program takes BLOCK_K kept positions and loops over R in BLOCK_R steps, tiling R where
it is contiguous (rows, inner = 1) and the kept positions where they are (inner > 1). A short K with a
long R (a loss, a full reduction) splits R over SPLIT programs, and a `high` axis (reduced axes that no
one stride walks: a full reduction with a broadcast input) gives each of its positions a program; their
fp32 partials are combined by a second launch. A knob set whose lanes would add more than
reduce_plan.MAX_SERIAL terms serially at the traced shape is infeasible (fp32 accuracy).
The chains are families/pointwise's; the kernels are in families/reduce/parts.py.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, Graph, Node
from kernelbrain.templates import sizing
from kernelbrain.templates.base import MORE_WARPS, Refusal, matches_by, tile_mutations
from kernelbrain.templates.families import pointwise
from kernelbrain.templates.families.reduce.planner import MAX_SERIAL, plan_reduction
from kernelbrain.templates.render import (
    PROMOTED,
    constants,
    dtype_of,
    graph_doc,
    module,
    parts_of,
    plain_model,
)

FAMILY = "reduce"
PARTS = f"{__name__}.parts"
PLAN = f"{__name__}.planner"  # the launcher's plan, plain Python


def shared_parts() -> str:
    """What a candidate module holds once beside any number of `_reduce_kernel`/`_reduce_launch` copies
    (a family may copy those per stage, under suffixes): the launcher's plan and the kernel's helpers."""
    plan_parts = (
        "MAX_SERIAL",
        "LONG_RUN",
        "SECOND_TILE",
        "MIN_CHUNK",
        "_cdiv",
        "_pow2",
        "_size",
        "_cuts",
        "_last",
    )
    kernel_parts = ("_identity", "_times", "_infinite", "_finish", "_prod")
    return parts_of(PLAN, *plan_parts, "plan_reduction") + "\n" + parts_of(PARTS, *kernel_parts)


# block_k x block_r: kept positions x reduced elements a step, for a reduction along the last axis;
# along a middle axis (neighbouring kept positions neighbours in memory) the launcher tiles block_r
# kept positions (fewer when inner is narrower) x the rest of the tile's elements along R
# (block_k, block_r, split, num_warps) of each set: "split" where R is split, else "loop"
ROUND0: list[dict[str, Any]] = [
    {"strategy": "split" if split > 1 else "loop", "block_k": k, "block_r": r, "split": split, "num_warps": w}
    for k, r, split, w in (
        (1, 1024, 1, 4),
        (32, 256, 1, 8),
        (1, 2048, 64, 8),
        (4, 512, 1, 4),
        (1, 4096, 1, 8),
        (1, 1024, 16, 4),
        # a full reduction of a large tensor (a loss): ~1024 programs fill an H200's 132 SMs, each lane's
        # serial terms stay far inside MAX_SERIAL
        (1, 2048, 1024, 8),
    )
]
BLOCKS = (128, 256, 512, 1024, 2048, 4096, 8192)
MAX_SPLIT = 4096  # more_split's last parent: up to 16384 chunks of R

MUTATIONS = tile_mutations(
    latency=[("more_split", "more programs on each long reduction keep more SMs reading"), MORE_WARPS],
    spills=[("smaller_tiles", "fewer accumulators a program")],
)


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "more_split" and k["split"] < MAX_SPLIT:
        return {**k, "strategy": "split", "split": max(16, k["split"] * 4)}
    return sizing.step(k, move, "block_r", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Accumulators for BLOCK_K x BLOCK_R elements fit a program's registers; an argmax or a logsumexp
    (two values a lane) never splits; at the traced shape (`plan`), a sum's, a product's or a
    logsumexp's lanes add at most MAX_SERIAL terms serially over both launches, with the split the knobs
    give (not one the launcher had to raise)."""
    if spec["op"] >= 4 and knobs["split"] > 1:
        return False
    if not 32 * knobs["num_warps"] <= knobs["block_k"] * knobs["block_r"] <= 8192:
        return False
    found = plan(spec, knobs)
    rounds = spec["op"] in (0, 3, 6)
    return found is None or not rounds or (not found["raised"] and found["serial"] <= MAX_SERIAL)


def plan(spec: dict, knobs: dict[str, Any]) -> dict | None:
    """reduce_plan.plan_reduction at the traced shape (the inputs' shapes and strides from the graph's
    metas), as the candidate's launcher plans at a call of that shape; None for a spec without them."""
    shapes, strides = spec.get("shapes"), spec.get("strides")
    if shapes is None or strides is None:
        return None
    shape = _broadcast(shapes)
    nd = len(shape)
    dims = sorted({d % max(nd, 1) for d in spec["dims"]}) if spec["dims"] else list(range(nd))
    expanded = [_expanded(shape, s, st) for s, st in zip(shapes, strides, strict=True)]
    return plan_reduction(
        shape, dims, expanded, knobs["block_k"], knobs["block_r"], knobs["split"], spec["op"]
    )


def _expanded(shape: list[int], own: list[int], strides: list[int]) -> list[int]:
    """An input's strides over the broadcast `shape`, as torch's expand gives them: 0 along an axis it
    broadcasts (one it lacks, or a 1 where the shape is longer)."""
    lead = len(shape) - len(own)
    return [0] * lead + [
        0 if n == 1 and m != 1 else t for t, n, m in zip(strides, own, shape[lead:], strict=True)
    ]


def _broadcast(shapes: list[list[int]]) -> list[int]:
    nd = max(len(s) for s in shapes)
    padded = [[1] * (nd - len(s)) + list(s) for s in shapes]
    return [max(sizes) if min(sizes) != 0 else 0 for sizes in zip(*padded, strict=True)]


# ATen reduction -> (OP, PRE, POST) of reduce_parts, by which of its results is used
_PLAIN = {
    op: code
    for code, ops in (
        ((0, 0, 0), ("aten.sum.dim_IntList", "aten.sum.default")),
        ((0, 0, 1), ("aten.mean.dim", "aten.mean.default")),
        ((1, 0, 0), ("aten.amax.default", "aten.max.default")),
        ((2, 0, 0), ("aten.amin.default", "aten.min.default")),
        ((3, 0, 0), ("aten.prod.dim_int", "aten.prod.default")),
        ((4, 0, 0), ("aten.argmax.default",)),
        ((5, 0, 0), ("aten.argmin.default",)),
        ((6, 0, 0), ("aten.logsumexp.default",)),
    )
    for op in ops
}
_PAIRED = {"aten.max.dim": ((1, 0, 0), (4, 0, 0)), "aten.min.dim": ((2, 0, 0), (5, 0, 0))}
_NORMS = {1: (0, 1, 0), 2: (0, 2, 2), "inf": (1, 1, 0)}
REDUCTIONS = {*_PLAIN, *_PAIRED, "aten.linalg_vector_norm.default", "aten.norm.ScalarOpt_dim"}


class NotReduction(Refusal):
    """What the graph holds that this family cannot compose."""


def _combine(node: Node, out: int) -> tuple[int, int, int]:
    if node.op in _PAIRED:
        return _PAIRED[node.op][out]
    if node.op in _PLAIN:
        if node.args.get("dtype") not in (None, "float32"):
            raise NotReduction(f"{node.op} to {node.args['dtype']}")
        return _PLAIN[node.op]
    ord_ = node.args.get("ord", node.args.get("p", 2))
    ord_ = int(ord_) if isinstance(ord_, float) and ord_.is_integer() else ord_
    ord_ = "inf" if isinstance(ord_, dict) and ord_.get("float") == "inf" else ord_
    if ord_ not in _NORMS or node.args.get("dtype") is not None:
        raise NotReduction(f"a norm of order {ord_}")
    return _NORMS[ord_]


def dims_of(node: Node) -> list[int] | None:
    dim = node.args.get("dim")
    if dim is None or dim == []:
        return None
    return [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one reduction with elementwise chains around it. Raises NotReduction
    (or pointwise.NotPointwise) naming what is not."""
    if len(graph.outputs) != 1:
        raise NotReduction(f"{len(graph.outputs)} outputs")
    found = [i for i, n in enumerate(graph.nodes) if n.op in REDUCTIONS]
    if len(found) != 1:
        raise NotReduction(f"{len(found)} reductions")
    at = found[0]
    red = graph.nodes[at]
    source = graph.ref(red.args.get("self"))
    if source is None:
        raise NotReduction(f"{red.op} of no tensor")
    divide = _divided_by_size(graph, at)
    try:
        graph.unsized({(divide[0], "other")} if divide else ())
    except ValueError as e:
        raise NotReduction(str(e)) from None
    before = pointwise.compose(Graph(nodes=graph.nodes[:at], outputs=[list(source)]))
    # after: the reduced value as the chain's one input; nothing before the reduction may reach it
    out_ref = tuple(graph.outputs[0])
    used = out_ref if out_ref[0] == at else None
    nodes: list[Node] = []
    moved: dict[tuple[int, int], list[int]] = {}
    for j in range(at + 1, len(graph.nodes)):
        node = graph.nodes[j]
        if divide and j == divide[0]:  # the sum's division by a size: the launcher's, from the shapes
            used, moved[(j, 0)] = graph.ref(node.args["self"]), [0, 0]
            continue
        args = {}
        for key, value in node.args.items():
            ref = graph.ref(value)
            if ref is not None and ref[0] == at:
                if used is not None and used != ref:
                    raise NotReduction(f"both results of {red.op}")
                used = ref
                args[key] = {"ref": [0, 0]}
            elif ref is not None and ref in moved:
                args[key] = {"ref": moved[ref]}
            elif ref is not None:
                args[key] = {"tensor": "the reduced value with what it reduced (a normalisation)"}
            else:
                args[key] = value
        nodes.append(Node(op=node.op, args=args, outs=node.outs))
        for k in range(len(node.outs)):
            moved[(j, k)] = [len(nodes), k]
    if used is None:
        raise NotReduction("an output the reduction does not reach")
    meta = red.outs[used[1]]
    after = None
    if out_ref[0] != at and moved.get(out_ref) != [0, 0]:
        start = Node(op=INPUT, args={"index": 0}, outs=[meta])
        chain = Graph(nodes=[start, *nodes], outputs=[moved[out_ref]])
        after = pointwise.compose(chain)
    op, pre, post = _combine(red, used[1])
    if divide and (op, post) != (0, 0):
        raise NotReduction(f"a division by a size after {red.op}")
    metas = {int(n.args["index"]): n.outs[0] for n in graph.nodes if n.op == INPUT}
    traced = [metas[i] for i in before["inputs"] if i in metas]
    known = len(traced) == len(before["inputs"])
    out_dtype = graph.meta(out_ref).dtype
    dtypes = {graph.nodes[i].outs[0].dtype for i, n in enumerate(graph.nodes) if n.op == INPUT}
    follows = len(dtypes) == 1 and out_dtype in dtypes
    return {
        **pointwise.around(before, after),
        "op": op,
        "pre": pre,
        "post": post,
        "divide_by": divide[1] if divide else None,
        "dims": dims_of(red),
        # the inputs' traced shapes and strides: where feasible plans the launch (reduce_plan)
        "shapes": [m.shape for m in traced] if known else None,
        "strides": [m.strides for m in traced] if known else None,
        "keepdim": bool(red.args.get("keepdim", False)),
        "dtype": None if follows else out_dtype,
        "ops": graph.ops(),
    }


def _divided_by_size(graph: Graph, at: int) -> tuple[int, list[int]] | None:
    """The node dividing the reduction's value by a size of an input's (a batch mean), with that size
    as [input, start, end]: the product of the input's axes [start, end)."""
    for s in graph.sized:
        node = graph.nodes[s.node]
        src = graph.ref(node.args.get("self"))
        by_size = s.arg == "other" and s.input >= 0 and not s.offset
        if node.op in _DIVIDES and by_size and src is not None and src[0] == at:
            return s.node, [s.input, s.start, s.end]
    return None


_DIVIDES = {"aten.div.Tensor", "aten.div.Scalar"}


matches = matches_by(compose)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    xs = ", ".join(forward[i] for i in spec["inputs"])
    dtype = dtype_of(spec["dtype"], PROMOTED)
    divisor = "0"
    if spec.get("divide_by"):  # a size of an input's, read from its shape at each call
        index, start, end = spec["divide_by"]
        divisor = f"_prod({forward[index]}.shape[{start}:{end}])"
    doc = graph_doc(
        "Reduction with its elementwise chains", FAMILY, spec, knobs, "The input read once, in fp32"
    )
    lines = f"""\
        xs = [{xs}]
        dtype = {dtype}
        return _reduce_launch(xs, DIMS, KEEPDIM, dtype, OP, PRE, POST, BLOCK_K, BLOCK_R, SPLIT, NUM_WARPS,
                              {divisor})
"""
    knob_constants = {"BLOCK_K": knobs["block_k"], "BLOCK_R": knobs["block_r"], "SPLIT": knobs["split"]}
    return module(
        doc,
        constants(**knob_constants, NUM_WARPS=knobs["num_warps"]),
        constants(DIMS=spec["dims"], KEEPDIM=spec["keepdim"]),
        constants(OP=spec["op"], PRE=spec["pre"], POST=spec["post"]),
        parts_of(pointwise.PARTS, *spec["helpers"]) if spec["helpers"] else "",
        *pointwise.chains(spec),
        shared_parts(),
        parts_of(PARTS, "_reduce_kernel", "_reduce_launch"),
        plain_model(signature, lines),
    )
