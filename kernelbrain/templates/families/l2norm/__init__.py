"""L2 normalisation over one dim: y = x / ||x||_2, or F.normalize's x / max(||x||_2, eps).

Matched from the trace in three spellings: `x / torch.norm(x, p=2, dim=d, keepdim=True)` (KernelBench
level 1), `F.normalize(x, p=2, dim=d)`, and the decomposed square -> sum over d (keepdim) -> sqrt ->
divide (or rsqrt -> multiply). Another dim than the last is moved last (a contiguous copy) so rows are
contiguous. The knobs and mutations are row_norm's, the kernels row_norm_parts': the sum of squares
rides in its M2.

The recorder keeps `p` only when passed by keyword; torch.norm's default ('fro') is the 2-norm over
one dim, so an absent p counts as 2.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates.base import FLOATS, op_name
from kernelbrain.templates.families import row_norm
from kernelbrain.templates.render import constants, knob_text, module, plain_model

FAMILY = "l2norm"
ROUND0, MUTATIONS = row_norm.ROUND0, row_norm.MUTATIONS
feasible, mutate = row_norm.feasible, row_norm.mutate

_IGNORED = {"contiguous"}
_SQUARES = {"pow", "mul"}


def _one_dim(dim: Any) -> int | None:
    if isinstance(dim, list | tuple):
        dim = dim[0] if len(dim) == 1 else None
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    seq = [o for o in ops if op_name(o) not in _IGNORED]
    names = [op_name(o) for o in seq]
    if not seq or seq[0].get("dtype") not in FLOATS:
        return None
    x = seq[0]
    shape = [int(s) for s in x.get("shape") or []]
    if names == ["normalize"]:
        reduce, eps = x, float(x.get("eps", 1e-12))
        if x.get("p", 2) not in (2, 2.0):
            return None
    elif names == ["norm", "div"]:
        reduce, eps = x, 0.0
        if x.get("p", 2) not in (2, 2.0) or not x.get("keepdim") or seq[1].get("shape") != shape:
            return None
    else:
        # x^2 -> sum (keepdim) -> sqrt -> x / . , or rsqrt -> x * . (x * x and x * rsqrt record as one call)
        if len(names) < 3 or names[0] not in _SQUARES or names[1] != "sum":
            return None
        if names[0] == "pow" and x.get("dim") != 2:
            return None
        tail = names[2:]
        if tail not in (["sqrt", "div"], ["rsqrt", "mul"]) and not (tail == ["rsqrt"] and names[0] == "mul"):
            return None
        reduce, eps = seq[1], 0.0
        if not reduce.get("keepdim") or reduce.get("shape") != shape:
            return None
    dim = _one_dim(reduce.get("dim", 1))
    if dim is None or not shape:
        return None
    dim %= len(shape)
    return {"dim": dim, "ndim": len(shape), "n_cols": shape[dim], "dtype": x["dtype"], "eps": eps}


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    x = signature["forward"][0]
    denominator = f"max(||x||, {spec['eps']!r})" if spec["eps"] else "||x||"
    doc = (
        f"L2 normalisation over dim {spec['dim']}: kernelbrain l2norm template ({knob_text(knobs)}).\n\n"
        f"y = x / {denominator}, the sum of squares accumulated in fp32.\n"
    )
    launch, args = row_norm.launcher(knobs), row_norm.knob_args(knobs)
    lines = f"""\
        dim = DIM % {x}.dim()
        # rows along the normalised dim: move it last when it is not
        xt = {x}.movedim(dim, -1).contiguous()
        y = torch.empty_like(xt)
        if y.numel():
            d = xt.shape[-1]
            {launch}(xt.view(-1, d), y.view(-1, d), None, None, EPS, False, {args})
        return y.movedim(-1, dim)
"""
    dims = constants(DIM=spec["dim"], EPS=float(spec["eps"]))
    return module(doc, row_norm.kernels(knobs), dims, plain_model(signature, lines))
