"""Normalisations as reduce-then-map, composed from the traced graph: one reduction (with its chains, the
reduce family's) gives a statistic kept per reduced row, and an elementwise chain (the pointwise
family's) combines it with the inputs:

    s = epilogue(reduce_R(prologue(x)))      y = f(x0, ..., s)
    e.g. x / mean(|x|),  x * rsqrt(mean(x^2) + eps),  x - amax(x)

Two launches: the statistic in fp32 (reduce_parts), then the map over the output with the statistic as
one more, broadcast, input (pointwise_parts); the input is read twice. The statistic must keep the
reduced axes (keepdim) or reduce everything, so that it broadcasts against the inputs as it did in the
reference.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, Graph, Node
from kernelbrain.templates.base import Refusal, matches_by, the_one, unsized
from kernelbrain.templates.families import pointwise, reduce
from kernelbrain.templates.render import chain, constants, dtype_of, graph_doc, module, parts_of, plain_model

FAMILY = "normalize"

ROUND0: list[dict[str, Any]] = [
    {"strategy": "reduce_map", "block_k": 1, "block_r": 1024, "split": 1, "num_warps": 4, "block": 1024},
    {"strategy": "reduce_map", "block_k": 4, "block_r": 512, "split": 1, "num_warps": 4, "block": 2048},
    {"strategy": "reduce_map", "block_k": 1, "block_r": 4096, "split": 1, "num_warps": 8, "block": 4096},
    {"strategy": "reduce_map", "block_k": 1, "block_r": 2048, "split": 64, "num_warps": 8, "block": 4096},
]
MUTATIONS = reduce.MUTATIONS
mutate = reduce.mutate


class NotNormalize(Refusal):
    """What the graph holds that this family cannot compose."""


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    return reduce.feasible(spec["stat"], knobs) and knobs["block"] >= 32 * knobs["num_warps"]


def compose(graph: Graph) -> dict:
    """The specs of the statistic (reduce's) and of the map over the inputs and it (pointwise's)."""
    at = the_one(graph, reduce.REDUCTIONS, NotNormalize, "reductions")
    unsized(graph, NotNormalize)
    red = graph.nodes[at]
    # the statistic's chain: ops after the reduction on its value alone
    of_stat = {at}
    for j in range(at + 1, len(graph.nodes)):
        refs = [r for v in graph.nodes[j].args.values() for r in graph.refs(v)]
        if refs and all(r[0] in of_stat for r in refs):
            of_stat.add(j)
    used: set[tuple[int, int]] = set()
    for j in range(at + 1, len(graph.nodes)):
        if j not in of_stat:
            used |= {r for v in graph.nodes[j].args.values() for r in graph.refs(v) if r[0] in of_stat}
    if not used:
        raise NotNormalize("a reduction alone")
    if len(used) > 1:
        raise NotNormalize("more than one statistic")
    (stat_ref,) = used
    if not red.args.get("keepdim") and reduce.dims_of(red) is not None:
        raise NotNormalize(f"{red.op} without keepdim")
    stat = reduce.compose(Graph(nodes=graph.nodes[: stat_ref[0] + 1], outputs=[list(stat_ref)]))
    if stat["op"] in (4, 5):
        raise NotNormalize("an index as the statistic")
    # the map: the statistic becomes one more input, after forward's
    n_forward = 1 + max(int(n.args["index"]) for n in graph.nodes if n.op == INPUT)
    nodes = list(graph.nodes)
    nodes[stat_ref[0]] = Node(op=INPUT, args={"index": n_forward}, outs=[graph.meta(stat_ref)])
    if stat_ref[1] != 0:
        raise NotNormalize(f"{graph.nodes[stat_ref[0]].op}'s second result")
    inputs_first = sorted(range(len(nodes)), key=lambda i: (nodes[i].op != INPUT, i))  # slots in order
    mapped = pointwise.compose(_reordered(Graph(nodes=nodes, outputs=graph.outputs), inputs_first))
    mapped["stat_slot"] = mapped["inputs"].index(n_forward)
    return {"stat": stat, "map": mapped, "n_forward": n_forward, "ops": graph.ops()}


def _reordered(graph: Graph, order: list[int]) -> Graph:
    """The same graph with its nodes in `order` (inputs first: the statistic's slot comes after forward's
    inputs), references renumbered."""
    where = {old: new for new, old in enumerate(order)}

    def moved(value: Any) -> Any:
        if isinstance(value, list):
            return [moved(v) for v in value]
        ref = graph.ref(value)
        return {"ref": [where[ref[0]], ref[1]]} if ref is not None else value

    nodes = [
        Node(
            op=graph.nodes[i].op,
            args={k: moved(v) for k, v in graph.nodes[i].args.items()},
            outs=graph.nodes[i].outs,
        )
        for i in order
    ]
    return Graph(nodes=nodes, outputs=[[where[o[0]], o[1]] for o in graph.outputs])


matches = matches_by(compose)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    stat, mapped = spec["stat"], spec["map"]
    stat_xs = ", ".join(forward[i] for i in stat["inputs"])
    # the statistic's slot comes after forward's inputs (named so that no parameter of forward is it)
    map_xs = ", ".join(forward[i] if i < spec["n_forward"] else "kb_stat" for i in mapped["inputs"])
    dtype = dtype_of(mapped["dtype"], "None")
    how = "A statistic per reduced row, then the elementwise map with it, in fp32"
    doc = graph_doc("Normalisation", FAMILY, spec, knobs, how)
    lines = f"""\
        kb_stat = _reduce_launch([{stat_xs}], DIMS, True if DIMS else False, torch.float32, OP, PRE, POST,
                              BLOCK_K, BLOCK_R, SPLIT, NUM_WARPS)
        xs = [{map_xs}]
        given = [x for i, x in enumerate(xs) if i != STAT_SLOT]
        same = all(x.dtype == given[0].dtype for x in given)
        dtype = OUT_DTYPE or (given[0].dtype if same else torch.float32)
        y = torch.empty(torch.broadcast_shapes(*(x.shape for x in xs)), dtype=dtype, device=xs[0].device)
        return _launch(y, xs, BLOCK, NUM_WARPS, 0)
"""
    return module(
        doc,
        constants(BLOCK_K=knobs["block_k"], BLOCK_R=knobs["block_r"], SPLIT=knobs["split"]),
        constants(NUM_WARPS=knobs["num_warps"], BLOCK=knobs["block"], STAT_SLOT=mapped["stat_slot"]),
        constants(DIMS=stat["dims"], OP=stat["op"], PRE=stat["pre"], POST=stat["post"])
        + f"OUT_DTYPE = {dtype}\n",
        pointwise.helper_parts(stat, mapped),
        *pointwise.chains(stat),
        chain("_body", mapped["body"], mapped["result"]),
        reduce.shared_parts(),
        parts_of(reduce.PARTS, "_reduce_kernel", "_reduce_launch"),
        parts_of(pointwise.PARTS, "_load", "_flat_tile", "_flat_kernel", "_flat_persistent_kernel"),
        parts_of(pointwise.PARTS, "_strided_offset", "_strided_kernel", "MAX_DIMS", "_collapsed", "_launch"),
        plain_model(signature, lines),
    )
