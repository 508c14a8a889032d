"""Normalisation by statistics of the batch, composed from the traced graph: batch norm in training mode
(per-channel statistics over the batch, the running statistics and the batch count updated as torch
updates them) and in eval mode (by its running statistics: kb times references in eval mode), group
norm, and instance norm (ATen's batch norm over a [1, N x C, ...] view), each with or without its affine
weight and bias:

    y = (x - mean) / sqrt(var + eps) * weight + bias   the statistics in fp32, one pass to make them

ModelNew runs the problem's own constructor, so its parameters and buffers are Model's under the same
names (the gate loads Model's into it), and reads them by those names. Dim-only views of the input before
the norm and of its value after it (InstanceNorm2d of rows unsqueezed to [N, 1, 1, D], squeezed back) are
the candidate's forward's own views, applied around the launch. The kernels are in
families/moments/parts.py.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph
from kernelbrain.templates import base, model_source, sizing
from kernelbrain.templates.families import pointwise
from kernelbrain.templates.render import constants, graph_doc, model_attr, module, parts_of, refined_model

FAMILY = "moments"
PARTS = f"{__name__}.parts"
# what a candidate copies from PARTS, in order (a tail of another family's head copies the same)
PART_NAMES = (
    "_moments_kernel", "_moments_finish", "_moments_map", "_moments_tile", "_moments_map_launch",
    "_moments_launch",
)  # fmt: skip

# (block, split, num_warps) of each round-0 set, all one strategy
ROUND0: list[dict[str, Any]] = [
    {"strategy": "split_stats", "block": b, "split": s, "num_warps": w}
    for b, s, w in ((1024, 64, 4), (2048, 16, 8), (4096, 128, 8), (512, 8, 4))
]
BLOCKS = (256, 512, 1024, 2048, 4096, 8192)
MUTATIONS = base.tile_mutations(
    latency=[("more_split", "more programs on each statistic keep more SMs reading"), base.MORE_WARPS]
)
NORMS = {"aten.native_batch_norm.default", "aten.native_group_norm.default"}
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


class NotMoments(base.Refusal):
    """What the graph holds that this family cannot compose."""


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    if move == "more_split":
        return {**knobs, "split": knobs["split"] * 4} if knobs["split"] < 512 else None
    return sizing.step(knobs, move, "block", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    return knobs["block"] >= 32 * knobs["num_warps"]


def _param(graph: Graph, value: Any, repeated: bool = False) -> str | None:
    """The state-dict name of the parameter or buffer an argument is (through instance norm's repeat of
    it where `repeated`); None for no tensor."""
    ref = graph.ref(value)
    if ref is None:
        if value is not None:
            raise NotMoments("a norm's weight that is not a tensor")
        return None
    node = graph.nodes[ref[0]]
    if repeated and node.op == "aten.repeat.default":
        node = graph.nodes[graph.ref(node.args["self"])[0]]
    if node.op != PARAM:
        raise NotMoments(f"a norm's weight made by {node.op}")
    return str(node.args["name"])


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one batch-statistics normalisation of a forward input."""
    base.one_output(graph, NotMoments)
    at = base.the_one(graph, NORMS, NotMoments, "batch-statistics norms")
    # a group norm's sizes are its input's, read from it at each call
    base.unsized(graph, NotMoments, {(at, "N"), (at, "C"), (at, "HxW")})
    node = graph.nodes[at]
    a = node.args
    src = graph.ref(a["input"])
    viewed = src is not None and graph.nodes[src[0]].op in _VIEWS
    fed = graph.ref(graph.nodes[src[0]].args["self"]) if viewed else src  # what the kernel normalises
    start, pre = _before(graph, fed)
    if start is None or graph.nodes[start[0]].op != INPUT:
        raise NotMoments("a norm of what is not a forward input")
    x_meta = graph.meta(fed)
    if len(x_meta.shape) < 2 or x_meta.dtype not in base.FLOATS:
        raise NotMoments(f"a norm of a {x_meta.dtype} tensor of shape {x_meta.shape}")
    post = _after(graph, (at, 0), x_meta.shape if viewed else None)
    spec: dict[str, Any] = {
        "input": int(graph.nodes[start[0]].args["index"]),
        "pre": pre,
        "post": post,
        "ops": graph.ops(),
    }
    if node.op == "aten.native_group_norm.default":
        if viewed:
            raise NotMoments("a group norm of a view")
        return {
            **spec,
            "mode": "group",
            "group": int(a["group"]),
            "weight": _param(graph, a.get("weight")),
            "bias": _param(graph, a.get("bias")),
            "eps": float(a["eps"]),
            "momentum": 0.0,
            "running": None,
            "count": None,
        }
    if viewed:  # instance norm: batch norm over [1, N x C, ...]
        view = graph.meta(src).shape
        if view[:2] != [1, x_meta.shape[0] * x_meta.shape[1]] or a.get("running_mean") is not None:
            raise NotMoments("a batch norm over a view other than instance norm's")
        mode, running = "instance", None
        weight, bias = (_param(graph, a.get(k), repeated=True) for k in ("weight", "bias"))
    else:
        weight, bias = _param(graph, a.get("weight")), _param(graph, a.get("bias"))
        names = [_param(graph, a.get(k)) for k in ("running_mean", "running_var")]
        running = names if all(names) else None
        mode = "batch" if a.get("training") else "running"
        if mode == "running" and running is None:
            raise NotMoments("a batch norm in eval mode without running statistics")
    if running is not None and a.get("momentum") is None:
        raise NotMoments("a batch norm with a cumulative average (momentum None)")
    counted = counters(graph)
    return {
        **spec,
        "mode": mode,
        "group": 1,
        "weight": weight,
        "bias": bias,
        "eps": float(a["eps"]),
        "momentum": float(a.get("momentum") or 0.0),
        "running": running,
        "count": counted[0] if len(counted) == 1 and running and mode == "batch" else None,
    }


def _before(graph: Graph, ref: tuple[int, int] | None) -> tuple[tuple[int, int] | None, str]:
    """The value `ref` reads through dim-only views (pointwise.DIM_VIEWS: a forward input unsqueezed
    as InstanceNorm2d wants it) and ops that hand their input on, and those views as the candidate's
    forward takes them (".unsqueeze(1)...")."""
    views: list[str] = []
    while ref is not None and graph.nodes[ref[0]].op in pointwise.DIM_VIEWS.keys() | pointwise.PASS_THROUGH:
        n = graph.nodes[ref[0]]
        if n.op in pointwise.DIM_VIEWS:
            views.insert(0, pointwise.DIM_VIEWS[n.op](n.args))
        ref = graph.ref(n.args["self"])
    return ref, "".join(views)


def _after(graph: Graph, norm: tuple[int, int], fed: list[int] | None) -> str:
    """The dim-only views from the norm's value to the output, as `_before` writes them; `fed`: the
    shape instance norm's [1, N x C, ...] view was taken of, which one view back to it undoes. Raises
    NotMoments where anything else follows the norm."""
    views: list[str] = []
    out = tuple(graph.outputs[0])
    while out != norm:
        n = graph.nodes[out[0]]
        back = n.op in _VIEWS and fed is not None and n.outs[0].shape == fed
        if out[1] != 0 or not (back or n.op in pointwise.DIM_VIEWS.keys() | pointwise.PASS_THROUGH):
            raise NotMoments("ops after the norm")
        if back:
            fed = None  # one view back, straight after the norm
            if graph.ref(n.args["self"]) != norm:
                raise NotMoments("ops after the norm")
        elif n.op in pointwise.DIM_VIEWS:
            views.insert(0, pointwise.DIM_VIEWS[n.op](n.args))
        out = graph.ref(n.args["self"])
        if out is None:
            raise NotMoments("ops after the norm")
    if fed is not None and graph.meta(norm).shape != fed:
        raise NotMoments("a norm whose output is not its input's shape")
    return "".join(views)


def counters(graph: Graph) -> list[str]:
    """The state-dict names of the batch counters (`num_batches_tracked`) the graph increments in place:
    a batch norm module in training mode counts its batch before it normalises."""
    found = [
        i
        for i, n in enumerate(graph.nodes)
        if n.op == PARAM and n.args["name"].endswith("num_batches_tracked")
    ]
    return [
        graph.nodes[i].args["name"]
        for i in found
        if any(m.op == "aten.add_.Tensor" and graph.ref(m.args.get("self")) == (i, 0) for m in graph.nodes)
    ]


matches = base.matches_by(compose)


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """The problem's constructor, run by ModelNew so that its parameters are Model's."""
    return model_source.with_constructor(spec, problem_source)


def state(name: str | None, buffer: bool) -> str:
    """The expression reading a parameter or buffer of ModelNew's (Model's constructor run in it) by its
    state-dict name; "None" for none."""
    if name is None:
        return "None"
    return model_attr(name)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    running = spec["running"] or [None, None]
    how = "Statistics of the batch in fp32 from one read, then one map"
    doc = graph_doc(f"{spec['mode'].capitalize()} norm", FAMILY, spec, knobs, how)
    lines = f"""\
        return _moments_launch(
            {forward[spec["input"]]}{spec.get("pre", "")}, MODE, GROUP,
            {state(spec["weight"], False)}, {state(spec["bias"], False)},
            {state(running[0], True)}, {state(running[1], True)}, {state(spec["count"], True)},
            EPS, MOMENTUM, BLOCK, SPLIT, NUM_WARPS,
        ){spec.get("post", "")}
"""
    return module(
        doc,
        constants(BLOCK=knobs["block"], SPLIT=knobs["split"], NUM_WARPS=knobs["num_warps"]),
        constants(MODE=spec["mode"], GROUP=spec["group"], EPS=spec["eps"], MOMENTUM=spec["momentum"]),
        parts_of(PARTS, *PART_NAMES),
        refined_model(spec, signature, lines),
    )
