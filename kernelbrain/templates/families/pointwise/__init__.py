"""Pointwise: any chain of elementwise ATen ops over up to four broadcast inputs, composed from the
traced graph into one pass over memory.

    y = f(x0, x1, x2, x3)   every op elementwise, computed in fp32, stored once in the output's dtype

The graph's ops become one Triton function, `_body`, a statement per op (an expression from `EXPRESSIONS`,
calling the helpers of families/pointwise/parts.py where one expression is not accurate enough); the
kernels there load the inputs, call it and store the result. Inputs of the output's shape and contiguous
take the flat kernel; broadcast or strided ones the strided kernel (each input's strides over four
collapsed dims, 0 where it broadcasts). Constants of the trace (a negative slope, an init argument) are
written into `_body` as the reference had them.

Strategy axes: elements per program (`block`), warps, and a persistent grid (`ctas_per_sm` programs per
SM, each looping over tiles) against one tile per program.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kernelbrain.core.graph import INPUT, PARAM, Graph, Meta, Node
from kernelbrain.templates import sizing
from kernelbrain.templates.base import FLOATS, MORE_WARPS, Refusal, matches_by, tile_mutations
from kernelbrain.templates.render import (
    PROMOTED,
    chain,
    constants,
    dtype_of,
    knob_text,
    module,
    parts_of,
    plain_model,
)

FAMILY = "pointwise"
PARTS = f"{__name__}.parts"
MAX_INPUTS = 4

ROUND0: list[dict[str, Any]] = [
    {"strategy": "tile", "block": 1024, "num_warps": 4},
    {"strategy": "tile", "block": 4096, "num_warps": 8},
    {"strategy": "persistent", "block": 2048, "num_warps": 8, "ctas_per_sm": 4},
    {"strategy": "tile", "block": 2048, "num_warps": 4},
    {"strategy": "tile", "block": 8192, "num_warps": 16},
]
BLOCKS = (256, 512, 1024, 2048, 4096, 8192, 16384)

MUTATIONS = tile_mutations(
    near_peak=[
        ("larger_tiles", "at the bandwidth roof: more bytes in flight a program"),
        ("persistent", "a grid the GPU holds at once: no tail of half-empty waves"),
    ],
    latency=[MORE_WARPS, ("persistent", "programs that stay resident and loop hide the launch of each tile")],
    spills=[("smaller_tiles", "fewer elements a program, fewer registers")],
    compute=[("fewer_warps", "fewer warps, more registers each for the chain's math")],
)


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "persistent" and k["strategy"] != "persistent":
        return {**k, "strategy": "persistent", "ctas_per_sm": 4}
    return sizing.step(k, move, "block", BLOCKS)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Any block serves any size; a warp holds at least 32 elements."""
    return knobs["block"] >= 32 * knobs["num_warps"]


# --- the graph's ops as fp32 Triton expressions ------------------------------------------------------


def _num(v: Any) -> str:
    if isinstance(v, dict) and "float" in v:
        return f'float("{v["float"]}")'
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, int | float):
        return repr(float(v))
    raise ValueError(f"not a number: {v!r}")


def _pow_scalar(a: str, e: Any) -> str:
    if isinstance(e, int | float) and not isinstance(e, bool):
        e = float(e)
        if e == 0.5:
            return f"tl.sqrt({a})"
        if e.is_integer() and 1 <= e <= 8:
            return "(" + " * ".join([a] * int(e)) + ")"
        if e.is_integer() and -4 <= e <= -1:
            return "(1.0 / (" + " * ".join([a] * int(-e)) + "))"
    return f"_pow({a}, {_num(e)})"


def _clamp(a: str, lo: Any, hi: Any) -> str:
    if lo is not None:
        a = f"tl.maximum({a}, {lo})"
    if hi is not None:
        a = f"tl.minimum({a}, {hi})"
    return a


def _scaled(b: str, alpha: Any) -> str:
    return b if alpha in ("1.0", None) else f"({alpha} * {b})"  # alpha as _num wrote it


def _smooth_l1(d: str, beta: Any, scale: float | None) -> str:
    """Smooth L1 (scale 1: the quadratic part divided by beta) or Huber (None: the linear part times
    delta) of the distance d; beta 0 is the L1 distance itself."""
    b = float(beta)
    if b == 0.0:
        return d
    quadratic = f"0.5 * _d * _d / {b!r}" if scale is not None else "0.5 * _d * _d"
    linear = f"_d - {0.5 * b!r}" if scale is not None else f"{b!r} * (_d - {0.5 * b!r})"
    body = f"tl.where(_d < {b!r}, {quadratic}, {linear})"
    return body.replace("_d", f"({d})")


def _cast(a: str, dtype: Any) -> str:
    if dtype in {"float16", "bfloat16"}:  # the reference rounds here: so does the chain
        return f"{a}.to(tl.{dtype}).to(tl.float32)"
    if dtype == "bool":
        return f"({a} != 0.0)"
    if dtype in {None, "float32", "float64"}:
        return a
    raise ValueError(f"a cast to {dtype}")


# op -> its expression from the op's arguments, each an expression ("v3", "0.5") or a literal (str for
# strings, None). Helpers (`_tanh`, ...) come from PARTS.
Args = dict[str, Any]
_UNARY = {
    "abs": "tl.abs({})",
    "neg": "(-{})",
    "exp": "tl.exp({})",
    "exp2": "tl.exp2({})",
    "log": "tl.log({})",
    "log2": "tl.log2({})",
    "log10": "(tl.log({}) * 0.4342944819032518)",
    "sqrt": "tl.sqrt({})",
    "rsqrt": "tl.rsqrt({})",
    "sin": "tl.sin({})",
    "cos": "tl.cos({})",
    "sigmoid": "tl.sigmoid({})",
    "tanh": "_tanh({})",
    "relu": "tl.maximum({}, 0.0)",
    "erf": "tl.erf({})",
    "floor": "tl.floor({})",
    "ceil": "tl.ceil({})",
    "reciprocal": "(1.0 / {})",
    "square": "({0} * {0})",
    "sign": "_sign({})",
    "round": "_round({})",
    "sgn": "_sign({})",
    "log1p": "_log1p({})",
    "expm1": "_expm1({})",
    "silu": "({0} * tl.sigmoid({0}))",
    "mish": "_mish({})",
    "hardsigmoid": "tl.minimum(tl.maximum({} / 6.0 + 0.5, 0.0), 1.0)",
    "hardswish": "({0} * tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0)",
    "logical_not": "({} == 0.0)",
    "clone": "{}",
    "alias": "{}",
    "detach": "{}",
    "lift_fresh": "{}",
}
_COMPARE = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}


# binary op -> its expression of x (self) and y (other); xs and ys: x and y scaled by alpha (add, sub)
_BINARY = {
    "add": "({x} + {ys})",
    "sub": "({x} - {ys})",
    "rsub": "({y} - {xs})",
    "mul": "({x} * {y})",
    "div": "({x} / {y})",
    "maximum": "tl.maximum({x}, {y})",
    "minimum": "tl.minimum({x}, {y})",
    "pow_tensor": "_pow({x}, {y})",
    "logical_and": "(({x} != 0.0) & ({y} != 0.0))",
    "logical_or": "(({x} != 0.0) | ({y} != 0.0))",
    **{name: f"({{x}} {symbol} {{y}})" for name, symbol in _COMPARE.items()},
}


def _binary(name: str) -> Callable[[Args], str]:
    form = _BINARY[name]

    def expr(a: Args) -> str:
        x, y, alpha = a["self"], a["other"], a.get("alpha")
        return form.format(x=x, y=y, xs=_scaled(x, alpha), ys=_scaled(y, alpha))

    return expr


EXPRESSIONS: dict[str, Callable[[Args], str]] = {
    **{f"aten.{op}.default": (lambda a, f=f: f.format(a["self"])) for op, f in _UNARY.items()},
    **{
        f"aten.{op}.{kind}": _binary(op)
        for op in ("add", "sub", "mul", "div")
        for kind in ("Tensor", "Scalar")
    },
    "aten.rsub.Scalar": _binary("rsub"),
    "aten.rsub.Tensor": _binary("rsub"),
    "aten.maximum.default": _binary("maximum"),
    "aten.minimum.default": _binary("minimum"),
    "aten.logical_and.default": _binary("logical_and"),
    "aten.logical_or.default": _binary("logical_or"),
    # on bools only (compose refuses them on integers): what `&` and `|` of two comparisons dispatch
    "aten.bitwise_and.Tensor": _binary("logical_and"),
    "aten.bitwise_or.Tensor": _binary("logical_or"),
    **{f"aten.{op}.{kind}": _binary(op) for op in _COMPARE for kind in ("Tensor", "Scalar")},
    "aten.pow.Tensor_Scalar": lambda a: _pow_scalar(a["self"], a["raw"]["exponent"]),
    "aten.pow.Tensor_Tensor": lambda a: f"_pow({a['self']}, {a['exponent']})",
    "aten.clamp.default": lambda a: _clamp(a["self"], a["min"], a["max"]),
    "aten.clamp.Tensor": lambda a: _clamp(a["self"], a["min"], a["max"]),
    "aten.clamp_min.default": lambda a: _clamp(a["self"], a["min"], None),
    "aten.clamp_min.Tensor": lambda a: _clamp(a["self"], a["min"], None),
    "aten.clamp_max.Tensor": lambda a: _clamp(a["self"], None, a["max"]),
    "aten.scalar_tensor.default": lambda a: a["s"],
    "aten.clamp_max.default": lambda a: _clamp(a["self"], None, a["max"]),
    "aten.hardtanh.default": lambda a: _clamp(a["self"], a["min_val"], a["max_val"]),
    "aten.leaky_relu.default": lambda a: (
        f"tl.where({a['self']} > 0, {a['self']}, {a['self']} * {a['negative_slope']})"
    ),
    "aten.elu.default": lambda a: f"_elu({a['self']}, {a['alpha']}, {a['scale']}, {a['input_scale']})",
    "aten.celu.default": lambda a: (
        f"(tl.maximum({a['self']}, 0.0) + _expm1(tl.minimum({a['self']}, 0.0) / {a['alpha']}) * {a['alpha']})"
    ),
    "aten.selu.default": lambda a: f"_elu({a['self']}, 1.6732632423543772, 1.0507009873554805, 1.0)",
    "aten.gelu.default": lambda a: (
        f"_gelu_tanh({a['self']})" if a["raw"].get("approximate") == "tanh" else f"_gelu_erf({a['self']})"
    ),
    "aten.softplus.default": lambda a: f"_softplus({a['self']}, {a['beta']}, {a['threshold']})",
    "aten.threshold.default": lambda a: (
        f"tl.where({a['self']} > {a['threshold']}, {a['self']}, {a['value']})"
    ),
    "aten.log_sigmoid_forward.default": lambda a: f"_log_sigmoid({a['self']})",
    "aten.where.self": lambda a: f"tl.where({a['condition']}, {a['self']}, {a['other']})",
    "aten.where.ScalarSelf": lambda a: f"tl.where({a['condition']}, {a['self']}, {a['other']})",
    "aten.where.ScalarOther": lambda a: f"tl.where({a['condition']}, {a['self']}, {a['other']})",
    "aten._to_copy.default": lambda a: _cast(a["self"], a["raw"].get("dtype")),
    "aten.xlogy.Tensor": lambda a: f"tl.where({a['self']} == 0.0, 0.0, {a['self']} * tl.log({a['other']}))",
    # the elementwise maps of the losses (templates/decompose.py splits each from its reduction)
    "kb.mse_loss": lambda a: f"(({a['self']} - {a['target']}) * ({a['self']} - {a['target']}))",
    "kb.smooth_l1_loss": lambda a: _smooth_l1(f"tl.abs({a['self']} - {a['target']})", a["raw"]["beta"], 1.0),
    "kb.huber_loss": lambda a: _smooth_l1(f"tl.abs({a['self']} - {a['target']})", a["raw"]["delta"], None),
    "kb.soft_margin_loss": lambda a: f"_softplus(-({a['target']} * {a['self']}), 1.0, 20.0)",
    "kb.binary_cross_entropy": lambda a: (
        f"(({a['target']} - 1.0) * tl.maximum(_log1p(-{a['self']}), -100.0)"
        f" - {a['target']} * tl.maximum(tl.log({a['self']}), -100.0))"
    ),
}
# helpers of PARTS each expression may call, by the name it is called with
HELPERS = (
    "_tanh",
    "_log1p",
    "_expm1",
    "_softplus",
    "_elu",
    "_gelu_erf",
    "_gelu_tanh",
    "_log_sigmoid",
    "_mish",
    "_sign",
    "_round",
    "_pow",
)
# what each helper calls in turn
_CALLS = {
    "_softplus": ("_log1p",),
    "_elu": ("_expm1",),
    "_gelu_tanh": ("_tanh",),
    "_log_sigmoid": ("_log1p",),
}
_CALLS |= {"_mish": ("_tanh", "_softplus", "_log1p")}
# ops that keep the shape and only relabel: a view of the same shape is its input
# ops that hand their input on unchanged (the composed families look through them)
PASS_THROUGH = {"aten.detach.default", "aten.clone.default", "aten.alias.default"}
_SAME_SHAPE_VIEWS = {
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.reshape.default",
    "aten.expand.default",
}


# views of a forward input that only move or add size-1 dims: the candidate's forward takes the same view
# (a view is not a torch op the rules forbid), and the kernel loads it by its strides
DIM_VIEWS: dict[str, Callable[[dict], str]] = {
    "aten.unsqueeze.default": lambda a: f".unsqueeze({a['dim']})",
    "aten.squeeze.dim": lambda a: f".squeeze({a['dim']})",
    "aten.squeeze.dims": lambda a: f".squeeze({tuple(a['dim'])})",
    "aten.permute.default": lambda a: f".permute({tuple(a['dims'])})",
    "aten.transpose.int": lambda a: f".transpose({a['dim0']}, {a['dim1']})",
    "aten.t.default": lambda a: ".t()",
}


class NotPointwise(Refusal):
    """What the graph holds that this family cannot compose (named in the refusal)."""


def compose(graph: Graph, views: bool = False) -> dict:
    """The spec of a graph that is one elementwise chain: its inputs (forward positions), the statements
    of `_body`, the output's dtype and shape. Raises NotPointwise naming what is not. With `views`, an
    input reached through DIM_VIEWS is a slot of its own, loaded as that view (`views`: each slot's
    view, applied by the candidate's forward); the slots are then in order of first use."""
    if len(graph.outputs) != 1:
        raise NotPointwise(f"{len(graph.outputs)} outputs")
    try:
        graph.unsized()
    except ValueError as e:
        raise NotPointwise(str(e)) from None
    out_ref = tuple(graph.outputs[0])
    out_meta = graph.meta(out_ref)
    if out_meta.dtype not in FLOATS:
        raise NotPointwise(f"an output of {out_meta.dtype}")
    wanted = graph.needed()
    names: dict[tuple[int, int], str] = {}
    inputs: list[int] = []
    lines: list[str] = []
    slot_views: list[str] = []
    slot_meta: list[Meta] = []
    pending: dict[tuple[int, int], tuple[int, str]] = {}  # an input or a view of one, not yet loaded

    def load(ref: tuple[int, int]) -> str:
        """The slot that loads a pending input (as its view), made at its first use."""
        if ref not in names:
            index, view = pending[ref]
            meta = graph.meta(ref)
            if meta.dtype not in FLOATS | {"bool"}:  # a bool mask is loaded as 0 or 1
                raise NotPointwise(f"an input of {meta.dtype}")
            if len(inputs) == MAX_INPUTS:
                raise NotPointwise(f"more than {MAX_INPUTS} inputs")
            names[ref] = f"v{len(inputs)}"
            inputs.append(index)
            slot_views.append(view)
            slot_meta.append(meta)
        return names[ref]

    for i, node in enumerate(graph.nodes):
        if node.op == INPUT:
            if (i, 0) in wanted:  # an input the chain never reads is not loaded
                pending[(i, 0)] = (int(node.args["index"]), "")
                if not views:
                    load((i, 0))
            continue
        needed = {k for k in range(len(node.outs)) if (i, k) in wanted}
        if not needed:
            continue  # computed and never used on the way to the output
        if node.op == PARAM:
            raise NotPointwise(f"the model's parameter {node.args['name']}")
        src = graph.ref(node.args.get("self"))
        if views and src in pending:  # a view of an input: its slot is made where something reads it
            index, view = pending[src]
            if node.op in DIM_VIEWS:
                pending[(i, 0)] = (index, view + DIM_VIEWS[node.op](node.args))
                continue
            if node.op in _SAME_SHAPE_VIEWS and graph.meta(src).shape == node.outs[0].shape:
                pending[(i, 0)] = (index, view)
                continue
        if node.op in _SAME_SHAPE_VIEWS:
            if src is not None and src in pending:
                load(src)
            if src is None or src not in names or graph.meta(src).shape != node.outs[0].shape:
                raise NotPointwise(f"{node.op} changing a shape")
            names[(i, 0)] = names[src]
            continue
        # an in-place op on a value of the chain's own (a clone's clamp_min_) reads as its functional form
        make = EXPRESSIONS.get(node.op) or EXPRESSIONS.get(node.op.replace("_.", ".", 1))
        if make is None:
            raise NotPointwise(node.op)
        if any(k != 0 for k in needed):
            raise NotPointwise(f"{node.op}'s second result")
        if node.op.startswith("aten.bitwise_") and node.outs[0].dtype != "bool":
            raise NotPointwise(f"{node.op} on integers")
        args: dict[str, Any] = {"raw": node.args}
        for key, value in node.args.items():
            ref = graph.ref(value)
            if ref is not None and ref in pending:
                load(ref)
            if ref is not None:
                if ref not in names:
                    raise NotPointwise(f"{node.op} on a tensor that is not an input of the chain")
                args[key] = names[ref]
            elif isinstance(value, dict) and "tensor" in value:
                what = value["tensor"]
                raise NotPointwise(what if isinstance(what, str) else "a tensor constant of the model's")
            elif isinstance(value, bool | int | float) or (isinstance(value, dict) and "float" in value):
                args[key] = _num(value)
            else:
                args[key] = value
        if node.outs[0].shape != out_meta.shape and math.prod(node.outs[0].shape) > 1:
            _check_broadcast(node.outs[0].shape, out_meta.shape, node.op)
        names[(i, 0)] = f"v{4 + len(lines)}"
        lines.append(f"{names[(i, 0)]} = {make(args)}")
    if out_ref in pending:
        load(out_ref)  # the output is an input's view: copied by the kernel
    if out_ref not in names:
        raise NotPointwise("an output no input reaches")
    if not inputs:
        raise NotPointwise("no tensor input")
    for meta in slot_meta:
        _check_broadcast(meta.shape, out_meta.shape, "an input")
    # the output takes its inputs' promoted dtype (each call's: a problem may time fp16 and fp32 shapes),
    # unless the chain casts to another
    dtypes = [meta.dtype for meta in slot_meta]
    promoted = "float32" if "float32" in dtypes or len(set(dtypes)) > 1 else dtypes[0]
    if "bool" in dtypes:  # the launcher's rule (one dtype kept, mixed ones fp32) would count the mask
        promoted = "bool"
    text = "\n".join(lines)
    used = [h for h in HELPERS if f"{h}(" in text]
    for h in list(used):
        used += [c for c in _CALLS.get(h, ()) if c not in used]
    return {
        "inputs": inputs,
        "views": slot_views,
        "body": lines,
        "result": names[out_ref],
        "helpers": [h for h in HELPERS if h in used],
        "dtype": None if out_meta.dtype == promoted else out_meta.dtype,
        "shape": out_meta.shape,
        "ops": graph.ops(),
    }


def through(graph: Graph, ref: tuple[int, int] | None) -> tuple[int, int] | None:
    """`ref` followed back past the ops that hand their input on (PASS_THROUGH: detach, clone, alias)."""
    while ref is not None and graph.nodes[ref[0]].op in PASS_THROUGH:
        ref = graph.ref(graph.nodes[ref[0]].args.get("self"))
    return ref


def carry(graph: Graph, j: int, moved: dict[tuple[int, int], list[int]], nodes: list[Node]) -> None:
    """Node j of `graph` appended to `nodes`, a chain being built apart from it: its references renumbered
    by `moved` (each a value already carried), and where its value now is recorded there."""
    node = graph.nodes[j]
    args = {k: ({"ref": moved[r]} if (r := graph.ref(v)) is not None else v) for k, v in node.args.items()}
    nodes.append(Node(op=node.op, args=args, outs=node.outs))
    moved[(j, 0)] = [len(nodes) - 1, 0]


def around(before: dict, after: dict | None) -> dict:
    """The chain fields of a family's spec that runs a chain on its input (`before`, this family's spec
    of it: its slots are the inputs) and one on its value (`after`, or None): prologue and epilogue, the
    helpers either calls in HELPERS' order."""
    used = before["helpers"] + (after["helpers"] if after else [])
    return {
        "inputs": before["inputs"],
        "prologue": before["body"],
        "prologue_result": before["result"],
        "epilogue": after["body"] if after else [],
        "epilogue_result": after["result"] if after else "v0",
        "helpers": [h for h in HELPERS if h in used],
    }


def chains(spec: dict, params: str = "v0, v1, v2, v3") -> list[str]:
    """A spec's prologue and epilogue (`around`'s fields) as the candidate's `_prologue` and `_epilogue`
    functions of `params`, two sections of its module."""
    return [
        chain("_prologue", spec["prologue"], spec["prologue_result"], params),
        chain("_epilogue", spec["epilogue"], spec["epilogue_result"], params),
    ]


def helper_parts(*specs: dict) -> str:
    """The helpers of PARTS that the specs' chains call, each once in HELPERS' order ("" where none)."""
    used = [h for h in HELPERS if any(h in s["helpers"] for s in specs)]
    return parts_of(PARTS, *used) if used else ""


def _check_broadcast(shape: list[int], out: list[int], what: str) -> None:
    tail = zip(reversed(shape), reversed(out), strict=False)
    if len(shape) > len(out) or any(s not in (1, o) for s, o in tail):
        raise NotPointwise(f"{what} of shape {shape} that does not broadcast to the output's {out}")


def _with_views(graph: Graph) -> dict:
    return compose(graph, views=True)


matches = matches_by(_with_views)


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    forward = signature["forward"]
    views = spec.get("views") or [""] * len(spec["inputs"])  # a spec recorded before views had none
    xs = ", ".join(forward[i] + view for i, view in zip(spec["inputs"], views, strict=True))
    dtype = dtype_of(spec["dtype"], PROMOTED)
    ctas = knobs.get("ctas_per_sm", 0) if knobs["strategy"] == "persistent" else 0
    doc = (
        f"Elementwise chain of {', '.join(spec['ops'])}: kernelbrain pointwise family "
        f"({knob_text(knobs)}).\n\n"
        "Each element read and written once, the chain in fp32, composed from the reference's ATen graph.\n"
    )
    lines = f"""\
        xs = [{xs}]
        shape = torch.broadcast_shapes(*(x.shape for x in xs))
        y = torch.empty(shape, dtype={dtype}, device=xs[0].device)
        return _launch(y, xs, BLOCK, NUM_WARPS, CTAS_PER_SM)
"""
    kernels = ("_load", "_flat_tile", "_flat_kernel", "_flat_persistent_kernel", "_strided_offset")
    launcher = ("MAX_DIMS", "_collapsed", "_launch")
    return module(
        doc,
        constants(BLOCK=knobs["block"], NUM_WARPS=knobs["num_warps"], CTAS_PER_SM=ctas),
        parts_of(PARTS, *spec["helpers"]) if spec["helpers"] else "",
        chain("_body", spec["body"], spec["result"]),
        parts_of(PARTS, *kernels, "_strided_kernel"),
        parts_of(PARTS, *launcher),
        plain_model(signature, lines),
    )
