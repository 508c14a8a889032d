"""Cross-entropy and negative log-likelihood losses over class indices, composed from the traced graph:
`F.cross_entropy(x, t)` and `F.nll_loss(F.log_softmax(x, dim=1), t)` trace to `aten._log_softmax` then
`aten.nll_loss_forward` (a gather at each row's target), with class weights, an ignore_index, and the
reductions none, mean and sum; an elementwise chain on the logits before it (`x * scale`) and on the
loss after it, and a mean or sum of the unreduced losses:

    loss_i = -w[t_i] * log_softmax(prologue(x0, ..., x3))[i, t_i]     (0 where t_i is ignore_index)
    y = epilogue(loss)  |  epilogue(sum loss / sum w[t_i])  |  epilogue(sum loss)  |  epilogue(mean loss)

One launch reads the logits once (online max and sum of exp over the classes, the target's logit by its
index) and writes each row's loss, or the reduced loss: each program's sums added up by the last one
to finish, in a fixed order (the same result every run). Class weights are a forward input or a
parameter or buffer of the model's (ModelNew then runs the problem's constructor, as the moments family
does). Refused by name: label smoothing and probability targets (the log-probabilities read by more
than the gather), losses over more than two dims (`nll_loss2d`), a softmax then a log. The kernels are
in families/cross_entropy/parts.py.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Node
from kernelbrain.templates import base, model_source, sizing
from kernelbrain.templates.families import pointwise, reduce
from kernelbrain.templates.render import (
    constants,
    dtype_of,
    graph_doc,
    model_attr,
    module,
    parts_of,
    refined_model,
)

FAMILY = "cross_entropy"
PARTS = f"{__name__}.parts"

# `block`: a program's most elements (whole rows of up to that many classes, `rows` of them where they
# are short: "registers"; longer rows streamed in chunks of it: "online")
ROUND0: list[dict[str, Any]] = [
    {"strategy": "registers", "block": 4096, "rows": 16, "num_warps": 8},
    {"strategy": "online", "block": 1024, "rows": 1, "num_warps": 4},
    {"strategy": "registers", "block": 8192, "rows": 64, "num_warps": 16},
    {"strategy": "online", "block": 2048, "rows": 1, "num_warps": 8},
    {"strategy": "registers", "block": 2048, "rows": 128, "num_warps": 4},
]
BLOCKS = (256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_ROWS = 256
MAX_PER_THREAD = 64  # tile elements a thread holds: past this the fp32 tile and its exp spill

MUTATIONS = base.tile_mutations(
    near_peak=[("larger_tiles", "more bytes in flight a program, fewer chunk reductions")],
    latency=[base.MORE_WARPS, ("fewer_rows", "fewer rows a program: more programs where rows are few")],
    launch=[("more_rows", "fewer, fatter programs: several short rows each")],
    spills=[("smaller_tiles", "a smaller tile, the row streamed in more chunks")],
    compute=[("fewer_warps", "fewer warps, more registers each for the exp")],
    coalescing=[("larger_tiles", "longer contiguous runs of a row a program")],
)

LOG_SOFTMAX = "aten._log_softmax.default"
NLL = "aten.nll_loss_forward.default"
_OTHER_NLL = {"aten.nll_loss2d_forward.default": "a loss over more than two dims (nll_loss2d)"}
# reductions: torch's Reduction enum (0 none, 1 mean, 2 sum), and 3 a mean of the unreduced losses
NONE, MEAN, SUM, MEAN_ROWS = 0, 1, 2, 3
# a reduction of the unreduced losses after the loss, by its op
_OF_ROWS = {
    "aten.mean.default": MEAN_ROWS,
    "aten.mean.dim": MEAN_ROWS,
    "aten.sum.default": SUM,
    "aten.sum.dim_IntList": SUM,
}
TARGETS = {"int64", "int32", "int16", "uint8"}


class NotCrossEntropy(base.Refusal):
    """What the graph holds that this family cannot compose."""


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "more_rows" and k["rows"] < MAX_ROWS:
        return {**k, "rows": min(MAX_ROWS, k["rows"] * 4)}
    if move == "fewer_rows" and k["rows"] > 1:
        return {**k, "rows": max(1, k["rows"] // 4)}
    return sizing.step(k, move, "block", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """A program's tile (never more than `block` elements, whatever the shape) fits its threads'
    registers, and each warp has a row's worth of lanes."""
    threads = 32 * knobs["num_warps"]
    return threads <= knobs["block"] <= MAX_PER_THREAD * threads and 1 <= knobs["rows"] <= MAX_ROWS


def _input(graph: Graph, value: Any, what: str) -> Node:
    """The node an argument refers to, which must be a forward input or a model's tensor."""
    ref = graph.ref(value)
    if ref is None:
        raise NotCrossEntropy(f"a {what} that is not a tensor")
    node = graph.nodes[ref[0]]
    if node.op not in (INPUT, PARAM):
        raise NotCrossEntropy(f"a {what} made by {node.op}")
    return node


def _weight(graph: Graph, value: Any, n_cls: int) -> dict | None:
    if value is None:
        return None
    if isinstance(value, dict) and "tensor" in value:
        raise NotCrossEntropy("class weights that are a tensor attribute, neither parameter nor buffer")
    node = _input(graph, value, "class weight")
    meta = node.outs[0]
    if meta.shape != [n_cls] or meta.dtype not in base.FLOATS:
        raise NotCrossEntropy(f"class weights of {meta.dtype} and shape {meta.shape}")
    if node.op == PARAM:
        return {"param": str(node.args["name"])}
    return {"input": int(node.args["index"])}


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one NLL loss (of a log-softmax, or of log-probabilities) of an
    elementwise chain, with a chain on its value. Raises NotCrossEntropy (or pointwise.NotPointwise)
    naming what is not."""
    base.one_output(graph, NotCrossEntropy)
    base.unsized(graph, NotCrossEntropy)
    for node in graph.nodes:
        if node.op in _OTHER_NLL:
            raise NotCrossEntropy(_OTHER_NLL[node.op])
    found = [i for i, n in enumerate(graph.nodes) if n.op == NLL]
    if not found and any(n.op == LOG_SOFTMAX for n in graph.nodes):
        raise NotCrossEntropy(f"a {LOG_SOFTMAX} with no NLL loss (probability targets?)")
    if len(found) != 1:
        raise NotCrossEntropy(f"{len(found)} NLL losses")
    at = found[0]
    nll = graph.nodes[at]
    source = graph.ref(nll.args["self"])
    if source is None:
        raise NotCrossEntropy("an NLL loss of no tensor")
    log_softmax = graph.nodes[source[0]].op == LOG_SOFTMAX
    # the chain on the logits: up to what the loss reads, or to what its log-softmax reads
    chain_end, logits = source[0] + 1, source
    if log_softmax:
        ls = graph.nodes[source[0]]
        rank = len(ls.outs[0].shape)
        if ls.args.get("half_to_float"):
            raise NotCrossEntropy(f"{LOG_SOFTMAX} to fp32 of half logits")
        if int(ls.args["dim"]) % max(rank, 1) != rank - 1:
            raise NotCrossEntropy(f"a log_softmax over dim {ls.args['dim']} of a {rank}-D input")
        chain_end, logits = source[0], graph.ref(ls.args["self"])
        if logits is None:
            raise NotCrossEntropy(f"{LOG_SOFTMAX} of no tensor")
    shape = graph.meta(source).shape
    if len(shape) not in (1, 2) or shape[-1] < 1:
        raise NotCrossEntropy(f"logits of shape {shape}")
    target = _input(graph, nll.args["target"], "target")
    if target.op != INPUT:
        raise NotCrossEntropy("a target that is the model's tensor")
    if target.outs[0].dtype not in TARGETS:
        raise NotCrossEntropy(f"a target of {target.outs[0].dtype}")
    weight = _weight(graph, nll.args.get("weight"), shape[-1])
    before = pointwise.compose(Graph(nodes=graph.nodes[:chain_end], outputs=[list(logits)]))
    after = _after(graph, at, int(nll.args.get("reduction", MEAN)))
    return {
        **pointwise.around(before, after),
        "chain_dtype": before["dtype"],
        "dtype": after["dtype"],
        "log_softmax": log_softmax,
        "target": int(target.args["index"]),
        "weight": weight,
        "ignore_index": int(nll.args.get("ignore_index", -100)),
        "mode": after["mode"],
        "n_cols": shape[-1],
        "ops": graph.ops(),
    }


def _after(graph: Graph, at: int, mode: int) -> dict:
    """The chain after the loss (pointwise's spec, on the loss as its one input) and the reduction mode,
    a mean or sum of the unreduced losses taken in."""
    needed = {n for n, _ in graph.needed()}
    moved: dict[tuple[int, int], list[int]] = {(at, 0): [0, 0]}
    start = graph.nodes[at].outs[0]
    nodes: list[Node] = []
    for j in range(at + 1, len(graph.nodes)):
        node = graph.nodes[j]
        if j not in needed:
            continue
        refs = [r for v in node.args.values() for r in graph.refs(v)]
        if node.op in _OF_ROWS and mode == NONE and not nodes and refs == [(at, 0)]:
            dims = reduce.dims_of(node)
            if dims not in (None, [0], [-1]) or node.args.get("keepdim") or node.args.get("dtype"):
                raise NotCrossEntropy(f"{node.op} over {dims} of the losses")
            mode, start, moved[(j, 0)] = _OF_ROWS[node.op], node.outs[0], [0, 0]
            continue
        args = {}
        for key, value in node.args.items():
            ref = graph.ref(value)
            if ref is None and graph.refs(value):
                raise NotCrossEntropy(f"{node.op} of a list of tensors")
            if ref is None:
                args[key] = value
            elif ref in moved:
                args[key] = {"ref": moved[ref]}
            elif ref[0] < at and graph.nodes[ref[0]].op == LOG_SOFTMAX:
                raise NotCrossEntropy(f"the log-probabilities read by {node.op} too (label smoothing)")
            else:
                other = graph.nodes[ref[0]].op
                raise NotCrossEntropy(f"{node.op} after the loss, of {other}'s value (not the loss's)")
        nodes.append(Node(op=node.op, args=args, outs=node.outs))
        for k in range(len(node.outs)):
            moved[(j, k)] = [len(nodes), k]
    out = (int(graph.outputs[0][0]), int(graph.outputs[0][1]))
    if out == (at, 1):
        raise NotCrossEntropy(f"{NLL}'s total weight")
    if out not in moved:
        raise NotCrossEntropy("an output the loss does not reach")
    first = Node(op=INPUT, args={"index": 0}, outs=[start])
    mapped = pointwise.compose(Graph(nodes=[first, *nodes], outputs=[moved[out]]))
    return {**mapped, "mode": mode}


matches = base.matches_by(compose)


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """Class weights the model holds: its constructor, run by ModelNew so that they are Model's."""
    if spec["weight"] is None or "param" not in spec["weight"]:
        return spec
    return model_source.with_constructor(spec, problem_source)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    xs = ", ".join(forward[i] for i in spec["inputs"])
    weight = spec["weight"]
    if weight is None:
        weight_text = "None"
    elif "param" in weight:
        if "init_body" not in spec:
            raise ValueError("class weights of the model's: refine(spec, problem_source) first")
        weight_text = model_attr(str(weight["param"]))
    else:
        weight_text = forward[weight["input"]]
    lp_dtype = dtype_of(spec["chain_dtype"], "floats[0] if len(set(floats)) == 1 else torch.float32")
    out_dtype = dtype_of(spec["dtype"], "lp_dtype")
    doc = graph_doc("Cross entropy", FAMILY, spec, knobs, "The logits read once, each row's loss in fp32")
    lines = f"""\
        xs = [{xs}]
        floats = [x.dtype for x in xs if x.dtype != torch.bool]
        lp_dtype = {lp_dtype}
        return _ce_launch(xs, {forward[spec["target"]]}, {weight_text}, {out_dtype}, lp_dtype, IGNORE_INDEX,
                          MODE, LOG_SOFTMAX, PROLOGUE, BLOCK, ROWS, NUM_WARPS)
"""
    return module(
        doc,
        constants(BLOCK=knobs["block"], ROWS=knobs["rows"], NUM_WARPS=knobs["num_warps"]),
        constants(IGNORE_INDEX=spec["ignore_index"], MODE=spec["mode"], LOG_SOFTMAX=spec["log_softmax"])
        + constants(PROLOGUE=bool(spec["prologue"])),
        pointwise.helper_parts(spec),
        *pointwise.chains(spec),
        parts_of(PARTS, "_rounded", "_logits", "_row_losses", "_ce_kernel", "MAX_PROGRAMS", "_ce_launch"),
        refined_model(spec, signature, lines),
    )
