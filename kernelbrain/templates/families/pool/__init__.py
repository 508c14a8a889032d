"""Pooling: max and average over 1, 2 or 3 trailing axes, with stride, padding, dilation, ceil mode,
count_include_pad and divisor_override as the reference's ATen op has them, composed from the traced
graph with the elementwise chains before it (on each element read) and after it (on each window's
result):

    y = epilogue(pool(prologue(x)))   in fp32, stored once in the output's dtype

1-D pooling reaches ATen as 2-D pooling between an unsqueeze and a squeeze: those views are kept as
views. Each program computes BLOCK outputs, visiting the window's taps as unrolled loads; the kernel is
in families/pool/parts.py, the chains are families/pointwise's.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, Graph, Node
from kernelbrain.templates import sizing
from kernelbrain.templates.base import Refusal, matches_by, one_output, the_one, tile_mutations, unsized
from kernelbrain.templates.families import pointwise
from kernelbrain.templates.render import constants, dtype_of, graph_doc, module, parts_of, plain_model

FAMILY = "pool"
PARTS = f"{__name__}.parts"

# (block, num_warps) of each round-0 set, all one strategy
ROUND0: list[dict[str, Any]] = [
    {"strategy": "window", "block": b, "num_warps": w} for b, w in ((512, 4), (1024, 4), (2048, 8), (256, 2))
]
BLOCKS = (128, 256, 512, 1024, 2048, 4096)
MUTATIONS = tile_mutations(
    near_peak=[("larger_tiles", "more outputs a program share their window's loads")],
    spills=[("smaller_tiles", "fewer outputs a program")],
    compute=[("smaller_tiles", "more programs for the window's arithmetic")],
    coalescing=[("larger_tiles", "longer runs of neighbouring outputs")],
)
POOLS = {  # ATen op -> (spatial axes, max)
    "aten.max_pool2d_with_indices.default": (2, True),
    "aten.max_pool3d_with_indices.default": (3, True),
    "aten.max_pool2d.default": (2, True),
    "aten.max_pool3d.default": (3, True),
    "aten.avg_pool2d.default": (2, False),
    "aten.avg_pool3d.default": (3, False),
}
VIEWS = {"aten.unsqueeze.default": "unsqueeze", "aten.squeeze.dim": "squeeze"}
MAX_TAPS = 512  # the window's taps are unrolled: beyond this, compile time grows past use


class NotPool(Refusal):
    """What the graph holds that this family cannot compose."""


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    return sizing.step(knobs, move, "block", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    return knobs["block"] >= 32 * knobs["num_warps"]


def _listed(value: Any, n: int) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [int(v) for v in values] * (n if len(values) == 1 else 1)


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one pooling with views and elementwise chains around it."""
    one_output(graph, NotPool)
    at = the_one(graph, POOLS, NotPool, "poolings")
    unsized(graph, NotPool)
    node = graph.nodes[at]
    spatial, pool_max = POOLS[node.op]
    a = node.args
    kernel = _listed(a["kernel_size"], spatial)
    stride = _listed(a.get("stride") or kernel, spatial)  # an empty stride is the kernel's
    padding = _listed(a.get("padding", 0), spatial)
    dilation = _listed(a.get("dilation", 1), spatial) if pool_max else [1] * spatial
    taps = kernel[0] * kernel[-1] * (kernel[1] if spatial == 3 else 1)
    if taps > MAX_TAPS:
        raise NotPool(f"a window of {taps} taps")
    # before: views back to where the elementwise chain ends
    pre: list = []
    start = graph.ref(a["self"])
    while start is not None and graph.nodes[start[0]].op in VIEWS.keys() | pointwise.PASS_THROUGH:
        view = graph.nodes[start[0]]
        if view.op in VIEWS:
            pre.insert(0, [VIEWS[view.op], int(view.args["dim"])])
        start = graph.ref(view.args["self"])
    if start is None:
        raise NotPool("a pooling of no tensor")
    head = pointwise.compose(Graph(nodes=graph.nodes[: start[0] + 1], outputs=[list(start)]))
    if len(head["inputs"]) != 1:
        raise NotPool("a pooling of more than one input")
    # after: views and an elementwise chain on the pooled value alone
    needed = graph.needed()
    if (at, 1) in needed:
        raise NotPool("the indices of a max pooling")
    nodes: list[Node] = [Node(op=INPUT, args={"index": 0}, outs=[node.outs[0]])]
    moved: dict[tuple[int, int], list[int]] = {(at, 0): [0, 0]}
    post: list = []
    for j in range(at + 1, len(graph.nodes)):
        later = graph.nodes[j]
        if (j, 0) not in needed:
            continue  # the indices of a max pooling, or what nothing uses
        src = graph.ref(later.args.get("self"))
        if later.op in VIEWS.keys() | pointwise.PASS_THROUGH and src in moved:
            if later.op in VIEWS:
                post.append([VIEWS[later.op], int(later.args["dim"])])
            moved[(j, 0)] = moved[src]
            continue
        refs = [graph.ref(v) for v in later.args.values()]
        if any(r is not None and r not in moved for r in refs):
            raise NotPool(f"{later.op} of the pooled value with what it pooled")
        pointwise.carry(graph, j, moved, nodes)
    out_ref = tuple(graph.outputs[0])
    if out_ref not in moved:
        raise NotPool("an output the pooling does not reach")
    epilogue = None
    if moved[out_ref] != [0, 0]:
        epilogue = pointwise.compose(Graph(nodes=nodes, outputs=[moved[out_ref]]))
    out_dtype = graph.meta(out_ref).dtype
    in_dtype = graph.meta(start).dtype
    return {
        **pointwise.around(head, epilogue),
        "max": pool_max,
        "spatial": spatial,
        "kernel": kernel,
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "ceil": bool(a.get("ceil_mode", False)),
        "count_pad": bool(a.get("count_include_pad", True)),
        "divisor": a.get("divisor_override") or 0,
        "pre": pre,
        "post": post,
        "dtype": None if out_dtype == in_dtype else out_dtype,
        "ops": graph.ops(),
    }


matches = matches_by(compose)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    x = signature["forward"][spec["inputs"][0]]
    kind = "max" if spec["max"] else "average"
    dtype = dtype_of(spec["dtype"], f"{x}.dtype")
    how = "Each output written once, the window in fp32"
    doc = graph_doc(f"{spec['spatial']}-D {kind} pooling with its chains", FAMILY, spec, knobs, how)
    lines = f"""\
        return _pool_launch({x}, PRE, POST, SPATIAL, KERNEL, STRIDE, PADDING, DILATION, CEIL, MAX, COUNT_PAD,
                            DIVISOR, {dtype}, BLOCK, NUM_WARPS)
"""
    return module(
        doc,
        constants(BLOCK=knobs["block"], NUM_WARPS=knobs["num_warps"]),
        constants(SPATIAL=spec["spatial"], KERNEL=spec["kernel"], STRIDE=spec["stride"]),
        constants(PADDING=spec["padding"], DILATION=spec["dilation"], CEIL=spec["ceil"], MAX=spec["max"]),
        constants(COUNT_PAD=spec["count_pad"], DIVISOR=spec["divisor"], PRE=spec["pre"], POST=spec["post"]),
        pointwise.helper_parts(spec),
        *pointwise.chains(spec, "v0"),
        parts_of(PARTS, "_pool_kernel", "_out_size", "_pool_launch"),
        plain_model(signature, lines),
    )
