"""LayerNorm over the trailing dims, with or without elementwise affine weight and bias.

    y = (x - mean) / sqrt(var + eps) [* weight + bias]      mean, var over the last k dims (biased var)

Matched from the trace in two spellings: one `layer_norm` call (nn.LayerNorm or F.layer_norm /
torch.layer_norm), or the decomposed mean -> x - mean -> square -> [+ eps] -> sqrt -> divide
(or rsqrt -> multiply) with no affine. The knobs and mutations are row_norm's; the kernels and the
`_layer_norm` wrapper are row_norm_parts'.

The trace records neither normalized_shape nor the weights, so `refine` reads them from the source:
ModelNew copies Model's constructor (same parameters under the same names: the gate's state-dict
copy makes them identical), and its forward passes the same normalized_shape, weight, bias and eps
expressions Model's forward does (for `self.<ln>(x)`: that module's own attributes), evaluated at
run time. A constructor or forward it cannot reproduce is no match.

After a compute-bound op the layer norm is a stage of its tail (compose/stages.py), composed from the
ATen graph instead (`compose`): there `aten.native_layer_norm` records normalized_shape, eps and which
tensors are the weight and bias, inputs of the tail's graph like the value it normalises.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from kernelbrain.core.graph import INPUT, Graph
from kernelbrain.templates import model_source as ms
from kernelbrain.templates.base import FLOATS, Refusal, op_name
from kernelbrain.templates.families import pointwise, row_norm
from kernelbrain.templates.render import knob_text, module, refined_model

FAMILY = "layernorm"
ROUND0, MUTATIONS = row_norm.ROUND0, row_norm.MUTATIONS
feasible, mutate = row_norm.feasible, row_norm.mutate
NORM = "aten.native_layer_norm.default"

_SQUARES = {"pow", "mul"}
_IGNORED = {"contiguous"}
_FUNCTIONAL = {"torch.nn.functional.layer_norm", "torch.layer_norm"}
_MODULES = {"torch.nn.LayerNorm", "torch.nn.modules.normalization.LayerNorm"}
# F.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5); torch.layer_norm adds cudnn_enable
_PARAMS = ["input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"]
_DEFAULTS = {"weight": ast.Constant(None), "bias": ast.Constant(None), "eps": ast.Constant(1e-5)}


def _trailing_dims(dim: Any, ndim: int) -> int | None:
    """How many trailing dims `dim` (an int or a list) names; None unless exactly the last k."""
    dims = dim if isinstance(dim, list | tuple) else [dim]
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    norm = sorted({d % ndim for d in dims})
    return len(norm) if norm == list(range(ndim - len(norm), ndim)) else None


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    seq = [o for o in ops if op_name(o) not in _IGNORED]
    names = [op_name(o) for o in seq]
    if not seq or seq[0].get("dtype") not in FLOATS:
        return None
    shape = [int(s) for s in seq[0].get("shape") or []]
    if not shape:
        return None
    if names == ["layer_norm"]:
        spec = {"form": "layer_norm", "dtype": seq[0]["dtype"], "shape": shape}
        dims = seq[0].get("normalized_shape")
        if dims and shape[len(shape) - len(dims) :] == dims:
            return {**spec, "norm_dims": len(dims), "n_cols": math.prod(dims)}
        return {**spec, "min_cols": shape[-1]}  # an older trace: D is at least the last dim
    # decomposed: mean, x - mean, its square, [+ eps], sqrt then divide (or rsqrt then multiply);
    # the recorder keeps one of identical calls, so mean(square) and (x - mean) * rsqrt may not reappear
    if len(names) < 4 or names[:2] != ["mean", "sub"] or names[2] not in _SQUARES:
        return None
    mean, sub, square = seq[:3]
    if names[2] == "pow" and square.get("dim") != 2:
        return None  # pow records its exponent as the second positional int ("dim")
    tail = names[3:]
    has_eps = tail[:1] == ["add"]
    if has_eps:
        tail = tail[1:]
    if tail not in (["sqrt", "div"], ["rsqrt", "mul"]) and not (tail == ["rsqrt"] and names[2] == "mul"):
        return None
    if not mean.get("keepdim") or not (mean.get("shape") == sub.get("shape") == square.get("shape")):
        return None
    k = _trailing_dims(mean.get("dim"), len(shape))
    if k is None:
        return None
    return {
        "form": "decomposed",
        "dtype": mean["dtype"],
        "shape": shape,
        "norm_dims": k,
        "n_cols": math.prod(shape[-k:]),
        "has_eps": has_eps,
    }


class NotLayerNorm(Refusal):
    """What the graph holds that `compose` cannot take (named in the refusal)."""


def compose(graph: Graph) -> dict:
    """The spec of a graph that is one layer norm of an input over its trailing dims, its weight and bias
    inputs too (or none): {"input", "weight", "bias" (input indices or None), "norm_dims", "n_cols",
    "eps", "dtype"}. The normalised dims are read from the input's shape at each call (the last
    norm_dims), so no size is a constant. Raises NotLayerNorm naming what is not."""
    if len(graph.outputs) != 1:
        raise NotLayerNorm(f"{len(graph.outputs)} outputs")
    found = [i for i, n in enumerate(graph.nodes) if n.op == NORM]
    if len(found) != 1:
        raise NotLayerNorm(f"{len(found)} layer norms")
    at = found[0]
    if tuple(graph.outputs[0]) != (at, 0):
        raise NotLayerNorm("ops after the norm" if graph.outputs[0][0] != at else "the norm's statistics")
    try:  # normalized_shape may be x.shape[-k:]: the call reads it from the input's shape
        graph.unsized({(at, "normalized_shape")})
    except ValueError as e:
        raise NotLayerNorm(str(e)) from None
    a = graph.nodes[at].args

    def index(key: str) -> int | None:
        ref = graph.ref(a.get(key))
        while ref is not None and graph.nodes[ref[0]].op in pointwise.PASS_THROUGH:
            ref = graph.ref(graph.nodes[ref[0]].args["self"])
        if ref is None:
            if a.get(key) is not None:
                raise NotLayerNorm(f"a layer norm's {key} that is not a tensor")
            return None
        if graph.nodes[ref[0]].op != INPUT:
            raise NotLayerNorm(f"a layer norm's {key} made by {graph.nodes[ref[0]].op}")
        return int(graph.nodes[ref[0]].args["index"])

    x, weight, bias = index("input"), index("weight"), index("bias")
    if x is None:
        raise NotLayerNorm("a layer norm of no tensor")
    x_meta = graph.meta(graph.ref(a["input"]))
    dims = [int(d) for d in a["normalized_shape"]]
    if not dims or x_meta.shape[len(x_meta.shape) - len(dims) :] != dims:
        raise NotLayerNorm(f"a layer norm over {dims} of a tensor of shape {x_meta.shape}")
    if x_meta.dtype not in FLOATS:
        raise NotLayerNorm(f"a layer norm of {x_meta.dtype}")
    return {
        "input": x,
        "weight": weight,
        "bias": bias,
        "norm_dims": len(dims),
        "n_cols": math.prod(dims),
        "eps": float(a["eps"]),
        "dtype": x_meta.dtype,
        "ops": graph.ops(),
    }


def _sqrt_eps(problem_source: str) -> list[ast.expr]:
    """The constant or self.<attr> operand of every `sqrt(A + B)` / `rsqrt(A + B)` in Model.forward."""
    fwd = ms.model_method(problem_source, "forward")
    out: list[ast.expr] = []
    for n in ast.walk(fwd) if fwd else ():
        if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute | ast.Name):
            continue
        fname = n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
        if fname not in {"sqrt", "rsqrt"}:
            continue
        # torch.sqrt(v + eps) or (v + eps).sqrt()
        arg = n.args[0] if n.args else getattr(n.func, "value", None)
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
            out += [
                side
                for side in (arg.left, arg.right)
                if (isinstance(side, ast.Constant) and isinstance(side.value, int | float))
                or (
                    isinstance(side, ast.Attribute)
                    and isinstance(side.value, ast.Name)
                    and side.value.id == "self"
                )
            ]
    return out


def refine(spec: dict, problem_source: str | None) -> dict | None:
    """The source's constructor and normalized_shape/weight/bias/eps expressions; None when the
    source is absent or shows something ModelNew cannot reproduce."""
    if problem_source is None:
        return None
    ctor = ms.constructor(problem_source)
    if ctor is None:
        return None
    out = {**spec, "init_params": ctor.params, "init_body": ctor.body}
    if spec["form"] == "decomposed":
        eps = "0.0"
        if spec["has_eps"]:
            found = {ast.unparse(e) for e in _sqrt_eps(problem_source)}
            if len(found) != 1:
                return None
            eps = found.pop()
        return {**out, "weight_expr": "None", "bias_expr": "None", "eps_expr": eps}
    fwd = ms.forward(problem_source)
    if fwd is None or not fwd.params:
        return None
    call, x = fwd.call, fwd.params[0]
    target = ms.dotted(call.func, fwd.aliases)
    if target in _FUNCTIONAL:
        args = ms.bind(call, _PARAMS, _DEFAULTS)
        if args is None or "normalized_shape" not in args:
            return None
        given = [args[k] for k in ("normalized_shape", "weight", "bias", "eps")]
        if not (isinstance(args.get("input"), ast.Name) and args["input"].id == x):
            return None
        if ms.free_names(given, {"self", *fwd.params}) - ms.candidate_names(fwd.aliases):
            return None
        shape, weight, bias, eps = (ast.unparse(e) for e in given)
        return {**out, "shape_expr": shape, "weight_expr": weight, "bias_expr": bias, "eps_expr": eps}
    # self.<attr>(x) with self.<attr> = nn.LayerNorm(...) in the constructor
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"):
        return None
    if (
        call.keywords
        or len(call.args) != 1
        or not (isinstance(call.args[0], ast.Name) and call.args[0].id == x)
    ):
        return None
    value = ms.self_assignment(fwd.init, f.attr)
    if not (isinstance(value, ast.Call) and ms.dotted(value.func, fwd.aliases) in _MODULES):
        return None
    ln = f"self.{f.attr}"
    return {
        **out,
        "shape_expr": f"{ln}.normalized_shape",
        "weight_expr": f"{ln}.weight",
        "bias_expr": f"{ln}.bias",
        "eps_expr": f"{ln}.eps",
    }


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    if "init_body" not in spec:
        raise ValueError("layernorm renders from a refined spec: refine(spec, problem_source) first")
    x = signature["forward"][0]
    shape = spec.get("shape_expr") or f"{x}.shape[{x}.dim() - {spec['norm_dims']} :]"
    affine = spec["weight_expr"] != "None" or spec["bias_expr"] != "None"
    doc = (
        f"LayerNorm ({spec['form']}): kernelbrain layernorm template ({knob_text(knobs)}).\n\n"
        f"y = (x - mean) / sqrt(var + eps){' * weight + bias' if affine else ''} over the normalised "
        "trailing dims,\n"
        "statistics accumulated in fp32. The constructor is Model's, so the parameters are too.\n"
    )
    args = f"{spec['weight_expr']}, {spec['bias_expr']}, {spec['eps_expr']}"
    launch = f"{row_norm.launcher(knobs)}, ({row_norm.knob_args(knobs)})"
    lines = f"        return _layer_norm({x}, {shape}, {args}, {launch})\n"
    return module(doc, row_norm.kernels(knobs, "_layer_norm"), refined_model(spec, signature, lines))
