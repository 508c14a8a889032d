"""Forward convolution (1-D, 2-D, 3-D; stride, zero padding, dilation, groups, bias or none) with the
elementwise chain after it, composed from the traced graph into one Triton kernel, an implicit GEMM:

    y = epilogue(conv(x, w) + b, e1, e2, e3)   accumulated in fp32, stored once in the output's dtype

where e1..e3 are the other tensors the chain reads (a bias parameter of the model's, a forward input
added as a residual), each broadcast to the output's shape. ModelNew runs the problem's own constructor
(`refine`), so its parameters are Model's under the same names, and reads the convolution's weight and
bias and the chain's parameters by those names; stride, padding and dilation are constants of the
trace, the groups x's channels over the weight's input channels at each call. The kernel is in
families/conv/parts.py, the chain is families/pointwise's.

The family is the head of a composed candidate (base.Head): the composer (compose/) cuts off what
follows the chain when it is not elementwise (a min over the channels, a spatial sum, a logsumexp, a
softmax, reductions in sequence: the tail, whose launches read the chain's value h, written once in its
traced dtype) and what makes the convolution's input where no forward input is it (a pooling or an
activation of one: the prelude, whose value the convolution reads as it would a forward input), and
renders this family's stage (`sections`, `launch`) between theirs. Of several convolutions the head is
the one of the most multiply-adds; the others are launches of its prelude or tail (`stage_parts`,
`stage_call`: this family's kernel at its first feasible round-0 knobs).

Strategy axes (conv_parts' docstring has the detail): "taps" (a tl.dot per tap and channel step, in
one pipelined loop), "gemm" (K = taps x channels flattened: few channels a group), "direct" (outer
products on FMA units: depthwise and narrow groups); tiles BLOCK_M x BLOCK_N x BLOCK_K, warps, pipeline
stages; `channels_last` (the dot forms: x copied channels-last once a call, where it is not already, so
each gather is contiguous along the channels: a read and a write of x, worth it where the output
channels are many and x is not huge); and the fp32 dot's precision, `fp32_dot`:

- "tf32": one TF32 tensor-core pass. PyTorch runs an fp32 convolution on CUDA through cuDNN with TF32
  allowed by default (torch.backends.cudnn.allow_tf32, unlike matmul's), so the user's own eager
  convolution errs by TF32's rounding; the gate (child/tolerance.py) admits an element within
  REFERENCE_MULTIPLE times the reference's own error against float64 truth, so a TF32 candidate passes
  there on its merits, or fails where it errs past that. Contraction keeps "tf32x3": eager matmul is
  full fp32. On a CPU the reference is exact fp32 and Triton's interpreter ignores input_precision
  (an fp32 numpy product), so a "tf32" candidate there computes, and is judged, as "ieee": the CPU tests
  check its indexing, the GPU gate its precision.
- "tf32x3": three TF32 passes of the hi/lo split operands, ~fp32's accuracy: where cuDNN's fp32 conv is
  not TF32 (allow_tf32 off, or a shape cuDNN runs in full fp32) the "tf32" sets fail the gate and these
  remain; round 0 holds both, as the device is not known to `feasible`.
- "ieee": FMA units, exact (a mutation for register spills).
"""

from __future__ import annotations

import math
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Node
from kernelbrain.templates import limits, model_source, render, sizing
from kernelbrain.templates.base import FLOATS, Refusal, unsized
from kernelbrain.templates.families import pointwise
from kernelbrain.templates.render import chain, constants, dtype_of, graph_doc, parts_of

FAMILY = "conv"
PARTS = f"{__name__}.parts"
STRATEGIES = ("taps", "gemm", "direct")
DOT_STRATEGIES = ("taps", "gemm")
FP32_DOTS = ("tf32x3", "ieee", "tf32")  # the first: a knob set's without one


def _dot(strategy: str, block_n: int, fp32_dot: str, channels_last: bool) -> dict[str, Any]:
    """A round-0 set of a dot form: 128 positions by block_n channels, 32 of K a step, 3 stages, warps
    as the tile is large."""
    warps = 8 if block_n == 128 else 4
    return {"strategy": strategy, "block_m": 128, "block_n": block_n, "block_k": 32, "num_warps": warps,
            "num_stages": 3, "fp32_dot": fp32_dot, "channels_last": channels_last}  # fmt: skip


ROUND0: list[dict[str, Any]] = [
    # fp32's accuracy first: at the gate's shapes cuDNN ran the reference in full fp32 on both problems
    # the H200 gated (benchmarks/results/probes/2026-12-04/round0-conv-mm), failing every "tf32" set
    _dot("gemm", 64, "tf32x3", True),
    # one TF32 pass, where the reference is TF32 too (see above), in the order the H200 ranked them: the
    # channels-last implicit GEMM, then taps
    _dot("gemm", 128, "tf32", True),
    _dot("taps", 128, "tf32", True),
    _dot("gemm", 64, "tf32", False),
    _dot("taps", 128, "tf32", False),
    _dot("taps", 64, "tf32x3", False),
    {"strategy": "direct", "block_m": 256, "block_n": 4, "block_k": 1, "num_warps": 4, "num_stages": 1},
    {"strategy": "direct", "block_m": 128, "block_n": 16, "block_k": 1, "num_warps": 4, "num_stages": 1},
]
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        ("tf32_dot", "fp32 dots as one TF32 pass, the precision of the reference's own cuDNN conv"),
        ("tf32x3_dot", "fp32 dots as three TF32 tensor-core dots instead of FMAs"),
        ("wider_channels", "more output channels a program: each gathered input tile feeds more columns"),
        ("longer_k", "a longer K step: fewer loop trips, larger dots"),
    ],
    "memory-bound near peak": [
        ("wider_channels", "more output channels a program re-gather each input tile fewer times"),
        ("larger_tiles", "more output positions a program re-read each filter fewer times"),
    ],
    "memory-bound with poor coalescing": [
        ("larger_tiles", "longer runs of neighbouring output positions: longer contiguous gathers"),
        ("taps", "one tap's row offsets a step: each gather a strided run of one input row"),
        ("channels_last", "x copied channels-last once a call: each gather contiguous along the channels"),
    ],
    "latency or occupancy-limited": [
        ("more_stages", "a deeper pipeline keeps more tile loads in flight"),
        ("smaller_tiles", "fewer output positions a program: more programs to fill the SMs"),
        ("more_warps", "more warps a program keep more loads in flight"),
        ("gemm", "channels and taps in one K: no short channel steps for narrow groups"),
    ],
    "launch-bound": [("larger_tiles", "fewer, fatter programs")],
    "register spills": [
        ("smaller_tiles", "a smaller accumulator a program"),
        ("ieee_dot", "an FMA dot keeps no TF32 hi/lo copies of its operands live"),
        ("fewer_stages", "fewer pipeline buffers"),
    ],
}
CONVS = {
    "aten.convolution.default",
    "aten._convolution.default",
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.conv3d.default",
}
MAX_EXTRAS = 3  # the chain's tensors besides the convolution's value (the kernel's v1..v3)
# the dot forms' pipelined tiles: a block's shared memory, less 27 KiB left for the compiler's own
SHARED_BYTES = limits.TARGET.smem_per_block - 27 * 1024
BLOCKS = (16, 32, 64, 128, 256, 512)
VIEWS = pointwise.PASS_THROUGH  # what the chain may hold besides elementwise ops, for the tail's cut
# the head of a composed candidate (base.Head): what the composer needs to cut its stages off
HEAD, CHAIN, INPUT_ARG = "convolution", VIEWS, "input"
TAIL_NOTE = "Then the tail over its value, composed by memory-bound families"
STAGE_ORDER = ("prelude", "tail")  # where its stages' parts go after its own, as its candidates have them


class NotConv(Refusal):
    """What the graph holds that this family cannot compose."""


REFUSAL = NotConv


def fp32_dot(knobs: dict[str, Any]) -> str:
    return str(knobs.get("fp32_dot", FP32_DOTS[0]))


def channels_last(knobs: dict[str, Any]) -> bool:
    return knobs.get("channels_last", False) is True


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    dot = k["strategy"] in DOT_STRATEGIES
    if move in {"tf32_dot", "tf32x3_dot", "ieee_dot"}:
        v = move.removesuffix("_dot")
        return {**k, "fp32_dot": v} if dot and fp32_dot(k) != v else None
    if move in {"taps", "gemm"}:
        if k["strategy"] == move:
            return None
        return {**k, "strategy": move, "block_n": max(16, k["block_n"]), "block_k": max(16, k["block_k"]),
                "fp32_dot": fp32_dot(k), "channels_last": channels_last(k)}  # fmt: skip
    if move == "channels_last":
        return {**k, "channels_last": True} if dot and not channels_last(k) else None
    if move == "wider_channels":
        return sizing.doubled(k, "block_n", 256)
    if move == "longer_k":
        return sizing.doubled(k, "block_k", 128) if dot else None
    if move == "more_stages":
        return sizing.stages(k, move) if dot else None
    if move == "fewer_stages":
        return sizing.stages(k, move)
    return sizing.step(k, move, "block_m", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Known knobs, power-of-two tiles (a tl.dot's at least 16 a side), the accumulator within registers
    and the dot forms' pipelined tiles within shared memory; the dot forms only for groups of at least 8
    output channels (narrower ones waste most of a dot's columns: the direct form serves them);
    channels-last only for the dot forms (the direct form reads one channel at a time: it buys nothing)."""
    strategy = knobs.get("strategy")
    if strategy not in STRATEGIES or fp32_dot(knobs) not in FP32_DOTS:
        return False
    layout = knobs.get("channels_last", False)
    if layout not in (False, True) or (strategy == "direct" and layout):
        return False
    bm, bn, bk, warps = knobs["block_m"], knobs["block_n"], knobs["block_k"], knobs["num_warps"]
    if not sizing.pow2(bm, bn, bk) or warps not in sizing.WARPS or knobs["num_stages"] < 1:
        return False
    if not sizing.fits(bm * bn, warps, limits.ACC_PER_THREAD):
        return False
    if strategy == "direct":
        return bm >= 16
    if min(bm, bn, bk) < 16 or spec["c_out_g"] < 8:
        return False
    size = 2 if spec["dtype"] in {"float16", "bfloat16"} else 4
    return knobs["num_stages"] * (bm * bk + bk * bn) * size <= SHARED_BYTES


def tensor(graph: Graph, value: Any, what: str) -> list | None:
    """A convolution's weight or bias (conv_transpose's too): ["param", state-dict name] or ["input",
    forward position] (through detach and clone), None for no tensor."""
    ref = graph.ref(value)
    if ref is None:
        if value is not None:
            raise NotConv(f"a {what} that is not a tensor")
        return None
    node = graph.nodes[ref[0]]
    while node.op in pointwise.PASS_THROUGH:
        node = graph.nodes[graph.ref(node.args["self"])[0]]
    if node.op == PARAM:
        return ["param", str(node.args["name"])]
    if node.op == INPUT:
        return ["input", int(node.args["index"])]
    raise NotConv(f"a {what} made by {node.op}")


def epilogue(graph: Graph, at: int) -> tuple[dict | None, list[list]]:
    """The chain after the convolution (node `at`, transposed or not) as a pointwise spec whose v0 is
    the convolution's value, and the tensors it also reads, in the order of its v1..v3."""
    out = tuple(graph.outputs[0])
    # what the output needs, the convolution's own arguments left out
    wanted = {out}
    for j in range(len(graph.nodes) - 1, -1, -1):
        if j != at and any((j, k) in wanted for k in range(len(graph.nodes[j].outs))):
            for value in graph.nodes[j].args.values():
                wanted.update(graph.refs(value))
    if out == (at, 0):
        return None, []
    if (at, 0) not in wanted:
        raise NotConv("an output the convolution does not reach")
    conv = graph.nodes[at]
    nodes: list[Node] = [Node(op=INPUT, args={"index": 0}, outs=[conv.outs[0]])]
    moved: dict[tuple[int, int], list[int]] = {(at, 0): [0, 0]}
    extras: list[list] = []
    for j, node in enumerate(graph.nodes):
        if j == at or not any((j, k) in wanted for k in range(len(node.outs))):
            continue
        if node.op in (INPUT, PARAM):
            what = (
                ["input", int(node.args["index"])] if node.op == INPUT else ["param", str(node.args["name"])]
            )
            if len(extras) == MAX_EXTRAS:
                raise NotConv(f"more than {MAX_EXTRAS} tensors in the chain after the convolution")
            extras.append(what)
            nodes.append(Node(op=INPUT, args={"index": len(extras)}, outs=node.outs))
            moved[(j, 0)] = [len(nodes) - 1, 0]
            continue
        if j < at:
            raise NotConv(f"{node.op} before the convolution, read after it")
        if any(k != 0 and (j, k) in wanted for k in range(len(node.outs))):
            raise NotConv(f"{node.op}'s second result after the convolution")
        refs = [r for v in node.args.values() for r in graph.refs(v)]
        if any(r not in moved for r in refs):
            raise NotConv(f"{node.op} of what the chain after the convolution does not make")
        pointwise.carry(graph, j, moved, nodes)
    try:
        spec = pointwise.compose(Graph(nodes=nodes, outputs=[moved[out]]))
    except pointwise.NotPointwise as e:
        raise NotConv(f"after the convolution: {e}") from None
    if not spec["inputs"] or spec["inputs"][0] != 0:
        raise NotConv("a chain after the convolution that does not read it")
    # the chain's v1.. in the order pointwise named them
    return spec, [extras[i - 1] for i in spec["inputs"][1:]]


PER_DIM = {"stride": 1, "padding": 0, "dilation": 1, "output_padding": 0}  # and each one's default


def per_dim(args: dict[str, Any], key: str, spatial: int) -> list[int]:
    """A convolution's argument of each spatial dim (PER_DIM's): one value stands for all."""
    v = args.get(key, PER_DIM[key])
    v = v if isinstance(v, list) else [v]
    return [int(e) for e in v] * (spatial if len(v) == 1 else 1)


def chain_fields(after: dict | None) -> dict[str, Any]:
    """The spec's fields of the chain after the convolution (`epilogue`'s pointwise spec, or None)."""
    return {
        "epilogue": after["body"] if after else [],
        "epilogue_result": after["result"] if after else "v0",
        "helpers": after["helpers"] if after else [],
    }


def _work(graph: Graph, at: int) -> int:
    """Multiply-adds of the convolution at node `at`: its outputs times a weight's taps and channels."""
    w = graph.meta(graph.ref(graph.nodes[at].args["weight"])).shape
    taps = w[1] * math.prod(w[2:]) if len(w) > 2 else 1
    return math.prod(graph.nodes[at].outs[0].shape) * taps


def head(graph: Graph) -> int:
    """The convolution the search tunes, a forward one: of several, the one of the most multiply-adds
    (the latest of equals); the others are launches of its prelude or tail (compose/stages.py). Raises
    NotConv naming what is not."""
    if len(graph.outputs) != 1:
        raise NotConv(f"{len(graph.outputs)} outputs")
    wanted = {n for n, _ in graph.needed()}
    found = [i for i, n in enumerate(graph.nodes) if (n.op in CONVS or "convolution" in n.op) and i in wanted]
    if not found:
        raise NotConv("0 convolutions")
    forward = [i for i in found if not graph.nodes[i].args.get("transposed")]
    if not forward:
        raise NotConv("a transposed convolution")
    at = max(forward, key=lambda i: (_work(graph, i), i))
    a = graph.nodes[at].args
    if graph.nodes[at].op not in CONVS:
        raise NotConv(graph.nodes[at].op)
    if isinstance(a.get("padding"), str):
        raise NotConv(f"padding {a['padding']!r} as a string")
    return at


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one forward convolution of a forward input (or of a prelude's value,
    an INPUT past forward's) and the elementwise chain after it, up to the output: the head the composer
    cut (compose/stages.with_stages). Raises NotConv naming what is not."""
    at = head(graph)
    a = graph.nodes[at].args
    # the groups are read from the shapes at each call (a depthwise conv's follow its channels)
    unsized(graph, NotConv, {(at, "groups")})
    spec = common(graph, at, "convolution", NotConv)
    dims = {k: per_dim(a, k, spec["spatial"]) for k in ("stride", "padding", "dilation")}
    if any(p < 0 for p in dims["padding"]) or min(dims["stride"]) < 1 or min(dims["dilation"]) < 1:
        raise NotConv(f"stride {dims['stride']}, padding {dims['padding']}, dilation {dims['dilation']}")
    if any(o != 0 for o in a.get("output_padding") or []):
        raise NotConv("an output padding")
    w = graph.meta(graph.ref(a["weight"])).shape
    return {**spec, **dims, "c_in_g": int(w[1]), "c_out_g": int(w[0]) // max(spec["groups"], 1)}


def common(graph: Graph, at: int, what: str, refusal: type[Refusal]) -> dict[str, Any]:
    """What the spec of a convolution (`what`: "convolution", "transposed convolution") holds whatever its
    kind: the forward input it reads, its weight and bias, the chain after it, its spatial dims, groups,
    dtypes and ops; the refusal (`refusal`) names `what`."""
    a = graph.nodes[at].args
    src = pointwise.through(graph, graph.ref(a["input"]))
    if src is None or graph.nodes[src[0]].op != INPUT:
        made = graph.nodes[src[0]].op if src is not None else "no tensor"
        raise refusal(f"a {what} of {made}, not of a forward input")
    try:
        weight, bias = tensor(graph, a["weight"], "weight"), tensor(graph, a.get("bias"), "bias")
        after, extras = epilogue(graph, at)
    except NotConv as e:
        raise refusal(str(e).replace("convolution", what)) from None
    w_meta, x_meta = graph.meta(graph.ref(a["weight"])), graph.meta(graph.ref(a["input"]))
    spatial = len(w_meta.shape) - 2
    if not 1 <= spatial <= 3 or len(x_meta.shape) != spatial + 2:
        raise refusal(f"a {what} of a {len(x_meta.shape)}-D input by a {len(w_meta.shape)}-D weight")
    if x_meta.dtype not in FLOATS or w_meta.dtype != x_meta.dtype:
        raise refusal(f"a {what} of {x_meta.dtype} by {w_meta.dtype}")
    out_dtype = graph.meta(tuple(graph.outputs[0])).dtype
    if out_dtype not in FLOATS:
        raise refusal("an output that is not floating point")
    return {
        "input": int(graph.nodes[src[0]].args["index"]),
        "weight": weight,
        "bias": bias,
        "extras": extras,
        **chain_fields(after),
        "spatial": spatial,
        "groups": int(a.get("groups", 1)),
        "taps": [int(k) for k in w_meta.shape[2:]],
        "dtype": x_meta.dtype,
        "out_dtype": None if out_dtype == x_meta.dtype else out_dtype,
        "ops": graph.ops(),
    }


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """The problem's constructor, run by ModelNew so that its parameters are Model's (where any tensor
    the kernel reads is one)."""
    return model_source.with_constructor(spec, problem_source)


def stage_parts(spec: dict) -> str:
    """What a convolution that is one launch of another head's prelude or tail copies: its chain and
    the kernel (compose/render.py suffixes every name)."""
    helpers = parts_of(pointwise.PARTS, *spec["helpers"]) if spec["helpers"] else ""
    kernel = parts_of(PARTS, "_mma", "_extra", "_conv_kernel", "_conv_launch")
    return "\n\n".join(
        t for t in (helpers, chain("_epilogue", spec["epilogue"], spec["epilogue_result"]), kernel) if t
    )


def stage_call(spec: dict, knobs: dict[str, Any], args: list[str], out: str, suffix: str) -> str:
    """The line of forward (indented for a method) setting `out` to the convolution as one launch of a
    prelude or a tail: `args` the expressions of its graph's inputs, its knobs as literals."""
    dtype = dtype_of(spec["out_dtype"], "None")
    tensors = [render.tensor(spec[k], args) for k in ("weight", "bias")]
    extras = ", ".join(render.tensor(e, args) for e in spec["extras"])
    how = [repr(spec[k]) for k in ("stride", "padding", "dilation")]
    how += [dtype, repr(knobs["strategy"]), repr(fp32_dot(knobs)), repr(channels_last(knobs))]
    how += [str(knobs[k]) for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")]
    x = args[spec["input"]]
    return f"        {out} = _conv_launch{suffix}({x}, {', '.join(tensors)}, [{extras}], {', '.join(how)})\n"


def reads(spec: dict) -> list[list]:
    """The tensors the head's launch reads: its input, weight and bias, and the chain's tensors."""
    tensors = (["input", spec["input"]], spec["weight"], spec["bias"], *spec["extras"])
    return [t for t in tensors if t is not None]


def title(spec: dict, knobs: dict[str, Any]) -> str:
    """The candidate's docstring, as far as the head goes."""
    how = "An implicit GEMM accumulated in fp32, the chain applied before the one store"
    return graph_doc(f"{spec['spatial']}-D convolution with its chain", FAMILY, spec, knobs, how)


def sections(spec: dict, knobs: dict[str, Any]) -> list[str]:
    """The head's part of the candidate module: its knobs and geometry as constants, the chain, its parts."""
    return [
        constants(STRATEGY=knobs["strategy"], FP32_DOT=fp32_dot(knobs), BLOCK_M=knobs["block_m"]),
        constants(BLOCK_N=knobs["block_n"], BLOCK_K=knobs["block_k"], NUM_WARPS=knobs["num_warps"]),
        constants(NUM_STAGES=knobs["num_stages"], CHANNELS_LAST=channels_last(knobs)),
        constants(STRIDE=spec["stride"], PADDING=spec["padding"], DILATION=spec["dilation"]),
        parts_of(pointwise.PARTS, *spec["helpers"]) if spec["helpers"] else "",
        chain("_epilogue", spec["epilogue"], spec["epilogue_result"]),
        parts_of(PARTS, "_mma", "_extra", "_conv_kernel", "_conv_launch"),
    ]


def launch(spec: dict, knobs: dict[str, Any], names: list[str]) -> str:
    """The lines of forward setting kb_h: `names` the tensors by input index (a prelude's value too)."""
    w, b = render.tensor(spec["weight"], names), render.tensor(spec["bias"], names)
    extras = ", ".join(render.tensor(e, names) for e in spec["extras"])
    dtype = dtype_of(spec["out_dtype"], "None")
    return f"""\
        kb_h = _conv_launch(
            {names[spec["input"]]}, {w}, {b},
            [{extras}], STRIDE, PADDING, DILATION, {dtype}, STRATEGY, FP32_DOT, CHANNELS_LAST, BLOCK_M,
            BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES,
        )
"""
