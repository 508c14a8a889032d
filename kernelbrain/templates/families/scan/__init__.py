"""Scans: cumulative sums and products along any axis, composed from the traced graph, with what is
written around them in PyTorch folded into the one pass over memory:

    y = epilogue(flip?(scan(fill ++ flip?(prologue(x0, ..., x3)))))   in fp32, stored once

a reverse scan (`x.flip(d).cumsum(d).flip(d)`), an exclusive one (a zero concatenated in front along the
scanned axis), a masked one (`cumsum(x * mask)`: the prologue, a bool input loaded as 0 or 1), and
slices of the other axes taken as views. Each program walks BLOCK_K rows in BLOCK_R chunks, a chunk
scanned by `tl.cumsum` or `tl.cumprod` with the running total carried in; the kernel is in
families/scan/parts.py, the chains are families/pointwise's.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, Graph, Node
from kernelbrain.templates import sizing
from kernelbrain.templates.base import Refusal, matches_by, one_output, the_one, tile_mutations, unsized
from kernelbrain.templates.families import pointwise
from kernelbrain.templates.render import constants, dtype_of, graph_doc, module, parts_of, plain_model

FAMILY = "scan"
PARTS = f"{__name__}.parts"

# (block_k, block_r, num_warps) of each round-0 set, all one strategy
ROUND0: list[dict[str, Any]] = [
    {"strategy": "chunked", "block_k": k, "block_r": r, "num_warps": w}
    for k, r, w in ((1, 1024, 4), (1, 4096, 8), (4, 256, 4), (1, 2048, 4))
]
BLOCKS = (128, 256, 512, 1024, 2048, 4096, 8192)
MUTATIONS = tile_mutations(compute=[("smaller_tiles", "a shallower scan tree a chunk")])
SCANS = {"aten.cumsum.default": 0, "aten.cumprod.default": 1}
FILLS = {"aten.zeros_like.default": 0.0, "aten.ones_like.default": 1.0, "aten.zeros.default": 0.0}
FILLS |= {"aten.ones.default": 1.0}


class NotScan(Refusal):
    """What the graph holds that this family cannot compose."""


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    return sizing.step(knobs, move, "block_r", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    return 32 * knobs["num_warps"] <= knobs["block_k"] * knobs["block_r"] <= 8192


def _bound(value: int, size: int) -> list[int]:
    """A traced slice bound as the launcher reads it: [0, v] for v itself, [1, v] for the axis's size plus
    v, whichever is nearer (the trace has `x.size(d) - 1` as a number; at another shape it is another)."""
    value = max(0, min(size, value + size if value < 0 else value))
    return [1, value - size] if abs(value - size) < value else [0, value]


def _fill_of(graph: Graph, ref: tuple[int, int] | None, dim: int) -> tuple[int, float]:
    """The length along `dim` and the value of a constant-filled tensor (zeros_like, ...)."""
    ref = pointwise.through(graph, ref)
    if ref is None:
        raise NotScan("a concatenation of no tensor")
    node = graph.nodes[ref[0]]
    if node.op == "aten.full_like.default" and isinstance(node.args.get("fill_value"), int | float):
        value = float(node.args["fill_value"])
    elif node.op in FILLS:
        value = FILLS[node.op]
    else:
        raise NotScan(f"a concatenation of {node.op} along the scanned axis")
    return node.outs[0].shape[dim], value


def _layout(graph: Graph, j: int, dim: int) -> tuple[list, list, tuple[int, int] | None]:
    """What node j does, if it only lays values out: (its ops along the scanned axis, its slices of other
    axes, the tensor it lays out); else ([], [], None)."""
    node = graph.nodes[j]
    rank = len(node.outs[0].shape)
    src = graph.ref(node.args.get("self"))
    if node.op in pointwise.PASS_THROUGH:
        return [], [], src
    if node.op == "aten.flip.default":
        if [d % rank for d in node.args["dims"]] != [dim]:
            raise NotScan("a flip of an axis the scan does not run along")
        return [["flip"]], [], src
    if node.op in ("aten.slice.Tensor", "aten.narrow.default"):
        d = int(node.args["dim"]) % rank
        if node.args.get("step", 1) != 1:
            raise NotScan("a strided slice")
        size = graph.meta(src).shape[d]
        start = node.args.get("start") or 0
        start = start + size if start < 0 else start
        end = start + node.args["length"] if "length" in node.args else node.args.get("end")
        span = [_bound(start, size), _bound(size if end is None else end, size)]
        return ([["slice", *span]], [], src) if d == dim else ([], [[d, *span]], src)
    if node.op == "aten.cat.default" and int(node.args.get("dim", 0)) % rank == dim:
        tensors = [graph.ref(t) for t in node.args["tensors"]]
        if len(tensors) != 2:
            raise NotScan("a concatenation of more than a tensor and a fill")
        for front, (fill_ref, value_ref) in ((True, tensors), (False, tensors[::-1])):
            try:
                k, value = _fill_of(graph, fill_ref, dim)
            except NotScan:
                continue
            return [["cat", k, value, front]], [], value_ref
        raise NotScan("a concatenation of two computed tensors")
    return [], [], None


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one scan with its layout ops and elementwise chains around it."""
    one_output(graph, NotScan)
    at = the_one(graph, SCANS, NotScan, "scans")
    # a slice's bounds are read relative to the axis (`_bound`)
    unsized(graph, NotScan, {(s.node, s.arg) for s in graph.sized if s.arg in ("start", "end", "length")})
    node = graph.nodes[at]
    if node.args.get("dtype") not in (None, "float32"):
        raise NotScan(f"a scan to {node.args['dtype']}")
    rank = len(node.outs[0].shape)
    dim = int(node.args["dim"]) % max(rank, 1)
    # before: back from the scan's input through the layout ops, to where the elementwise chain ends
    before: list = []
    slices: list = []
    start = graph.ref(node.args.get("self"))
    while start is not None:
        ops, cuts, src = _layout(graph, start[0], dim)
        if src is None:
            break
        before, slices, start = ops + before, cuts + slices, src
    if start is None or graph.meta(start).dtype == "bool":
        raise NotScan("a scan of no float tensor")
    if sum(op[0] == "cat" for op in before) > 1:
        raise NotScan("two concatenations before the scan")
    head = pointwise.compose(Graph(nodes=graph.nodes[: start[0] + 1], outputs=[list(start)]))
    # after: an elementwise chain on the scanned value alone (no fill reaches it), and layout ops
    out_ref = tuple(graph.outputs[0])
    nodes: list[Node] = [Node(op=INPUT, args={"index": 0}, outs=[node.outs[0]])]
    moved: dict[tuple[int, int], list[int]] = {(at, 0): [0, 0]}
    after: list = []
    for j in range(at + 1, len(graph.nodes)):
        later = graph.nodes[j]
        refs = [r for v in later.args.values() for r in graph.refs(v)]
        if not refs or not set(refs) & set(moved):
            continue  # a constant, or what only a fill is made from
        ops, cuts, src = _layout(graph, j, dim)
        if src is not None and src in moved:
            after, slices = after + ops, slices + cuts
            moved[(j, 0)] = moved[src]
            continue
        if any(op[0] == "cat" for op in after):
            raise NotScan(f"{later.op} after a fill concatenated to the scanned value")
        if any(r not in moved for r in refs):
            raise NotScan(f"{later.op} of the scanned value with what it scanned")
        pointwise.carry(graph, j, moved, nodes)
    if out_ref not in moved:
        raise NotScan("an output the scan does not reach")
    if sum(op[0] == "cat" for op in after) > 1:
        raise NotScan("two concatenations after the scan")
    epilogue = None
    if moved[out_ref] != [0, 0]:
        epilogue = pointwise.compose(Graph(nodes=nodes, outputs=[moved[out_ref]]))
    # the output's dtype follows the float inputs' one dtype, as at every shape the problem times
    out_dtype = graph.meta(out_ref).dtype
    floats = {graph.nodes[i].outs[0].dtype for i, n in enumerate(graph.nodes) if n.op == INPUT} - {"bool"}
    follows = floats == {out_dtype}
    return {
        **pointwise.around(head, epilogue),
        "op": SCANS[node.op],
        "dim": dim,
        "before": before,
        "after": after,
        "slices": slices,
        "dtype": None if follows else out_dtype,
        "ops": graph.ops(),
    }


matches = matches_by(compose)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    xs = ", ".join(forward[i] for i in spec["inputs"])
    dtype = dtype_of(spec["dtype"], "floats[0] if len(set(floats)) == 1 else torch.float32")
    kind = "cumulative product" if spec["op"] else "cumulative sum"
    how = "Each element read and written once, in fp32"
    doc = graph_doc(f"Scan ({kind}) with its chains", FAMILY, spec, knobs, how)
    lines = f"""\
        xs = [{xs}]
        floats = [x.dtype for x in xs if x.dtype != torch.bool]
        dtype = {dtype}
        return _scan_launch(xs, SLICES, DIM, BEFORE, AFTER, OP, dtype, BLOCK_K, BLOCK_R, NUM_WARPS)
"""
    return module(
        doc,
        constants(BLOCK_K=knobs["block_k"], BLOCK_R=knobs["block_r"], NUM_WARPS=knobs["num_warps"]),
        constants(DIM=spec["dim"], OP=spec["op"], SLICES=spec["slices"]),
        constants(BEFORE=spec["before"], AFTER=spec["after"]),
        pointwise.helper_parts(spec),
        *pointwise.chains(spec),
        parts_of(PARTS, "_scan_kernel", "_at", "_back", "_scan_launch"),
        plain_model(signature, lines),
    )
