"""ATen ops that are an elementwise map and a reduction in one (the losses: `smooth_l1_loss(x, y,
reduction=1)`), rewritten as the two before the composed families read the graph: an elementwise
`kb.<loss>` node (an expression of families/pointwise's) then `aten.mean` or `aten.sum` as the
reduction mode says (none: the map alone). Plain data in, plain data out, like core/graph."""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph, Meta, Node

# ATen loss -> the arguments its elementwise map keeps (besides self and target)
LOSSES: dict[str, tuple[str, ...]] = {
    "aten.smooth_l1_loss.default": ("beta",),
    "aten.huber_loss.default": ("delta",),
    "aten.mse_loss.default": (),
    "aten.soft_margin_loss.default": (),
    "aten.binary_cross_entropy.default": (),
}
MODES = {1: "aten.mean.default", 2: "aten.sum.default"}  # torch's Reduction enum: 0 none, 1 mean, 2 sum


def elementwise_name(op: str) -> str:
    """The elementwise node's op for a loss: "aten.mse_loss.default" -> "kb.mse_loss"."""
    return "kb." + op.split(".")[1]


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    return [max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True)]


def expand(graph: Graph) -> Graph:
    """The graph with every loss of LOSSES as its elementwise map and reduction; unchanged otherwise."""
    if not any(n.op in LOSSES for n in graph.nodes):
        return graph
    nodes: list[Node] = []
    where: dict[tuple[int, int], list[int]] = {}

    def moved(value: Any) -> Any:
        if isinstance(value, list):
            return [moved(v) for v in value]
        ref = graph.ref(value)
        return {"ref": where[ref]} if ref is not None else value

    for i, node in enumerate(graph.nodes):
        args = {k: moved(v) for k, v in node.args.items()}
        if node.op not in LOSSES or (node.op.endswith("binary_cross_entropy.default") and args.get("weight")):
            nodes.append(Node(op=node.op, args=args, outs=node.outs))
            where |= {(i, k): [len(nodes) - 1, k] for k in range(len(node.outs))}
            continue
        x, y = graph.ref(node.args["self"]), graph.ref(node.args["target"])
        shape = _broadcast(graph.meta(x).shape, graph.meta(y).shape) if x and y else node.outs[0].shape
        strides = [0] * len(shape)  # a value the graph made: its layout is the kernel's
        elementwise = Meta(shape=shape, strides=strides, dtype=node.outs[0].dtype)
        kept = {k: args[k] for k in ("self", "target", *LOSSES[node.op]) if k in args}
        nodes.append(Node(op=elementwise_name(node.op), args=kept, outs=[elementwise]))
        mode = MODES.get(int(node.args.get("reduction", 1)))
        if mode is not None:
            reduced = {"self": {"ref": [len(nodes) - 1, 0]}, "dtype": None}
            nodes.append(Node(op=mode, args=reduced, outs=node.outs))
        where[(i, 0)] = [len(nodes) - 1, 0]
    outputs = [where[(int(o[0]), int(o[1]))] for o in graph.outputs]
    sized = [s.model_copy(update={"node": where[(s.node, 0)][0]}) for s in graph.sized]
    return Graph(nodes=nodes, outputs=outputs, constants=graph.constants, sized=sized)
