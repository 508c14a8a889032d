"""RMS normalisation over one dimension of a contiguous tensor, no weight.

View the input as (N, C, S): N = the product of the dims before the reduced one, C = the reduced
dim, S = the product of the dims after it (for dim 1 of NCHW: N batches, C channels, S = H*W
spatial positions). For every (n, s):

    ms[n, s] = (1 / C) * sum_c x[n, c, s]^2          (accumulated in fp32)
    y[n, c, s] = x[n, c, s] / sqrt(ms[n, s] + eps)

Channel c of position s sits at n*C*S + c*S + s: the channels of one position are S elements apart,
the positions of one channel are contiguous. So a program takes a tile of BLOCK_S contiguous
positions of one n and reduces over the channels of that tile; every load is a row of BLOCK_S
contiguous elements (coalesced), and the reduction runs across rows. When the reduced dim is the
last one (S = 1) the tile degenerates to one position and the loads run along C, which is then the
contiguous axis.

Strategy axes: all C channels of a tile in registers (BLOCK_C = next_pow2(C), one read of x),
a loop over channel chunks of BLOCK_C that sums squares then re-reads each chunk to normalise it
(any C, two reads), the tile width BLOCK_S, and num_warps.

eps: the traced ops carry it only when it is passed as a keyword; otherwise ModelNew takes it from
its own constructor argument of that name (Model's), and failing both from DEFAULT_EPS.
"""

from __future__ import annotations

import math
from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import sizing
from kernelbrain.templates.base import FLOATS, op_name
from kernelbrain.templates.render import constants, init_with, knob_text, model_class, module, parts_of

FAMILY = "rmsnorm"
PARTS = f"{__name__}.parts"  # the kernels and launchers, one of each per strategy
MAX_BLOCK = sizing.MAX_BLOCK
DEFAULT_EPS = 1e-5

ROUND0: list[dict[str, Any]] = [
    {"strategy": "registers", "block_s": 128, "num_warps": 4},
    {"strategy": "registers", "block_s": 32, "num_warps": 2},
    {"strategy": "registers", "block_s": 256, "num_warps": 8},
    {"strategy": "looped", "block_c": 8, "block_s": 512, "num_warps": 4},
    {"strategy": "looped", "block_c": 16, "block_s": 256, "num_warps": 8},
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "memory-bound near peak": [
        ("registers", "at the bandwidth roof only fewer bytes help: hold a tile's channels and read x once"),
    ],
    "latency or occupancy-limited": [
        ("more_warps", "more warps per tile hide more load latency"),
        ("wider_tiles", "more positions per program keep more loads in flight"),
    ],
    "launch-bound": [("wider_tiles", "fewer, fatter programs amortise launch and scheduling cost")],
    "register spills": [
        ("narrower_tiles", "fewer positions per program lower register pressure"),
        ("smaller_chunks", "loop over smaller channel chunks instead of holding them all"),
    ],
    "compute-bound": [
        ("fewer_warps", "a square, a sum and a divide are cheap; fewer warps cut reduction overhead")
    ],
    "memory-bound with poor coalescing": [
        ("wider_tiles", "wider tiles make longer contiguous loads along the innermost axis"),
    ],
}

_SQUARES = {"pow", "square", "mul"}
_IGNORED = {"contiguous"}


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    """x^2 -> mean over one dim (keepdim) -> [+ eps] -> sqrt -> x / . , or rsqrt -> x * ."""
    seq = [o for o in ops if op_name(o) not in _IGNORED]
    names = [op_name(o) for o in seq]
    if names.count("mean") != 1:
        return None
    i = names.index("mean")
    mean = seq[i]
    if i != 1 or names[0] not in _SQUARES:
        return None
    square = seq[0]
    # pow records its exponent as the second positional int ("dim"); only an exponent of 2 is a square
    if names[0] == "pow" and square.get("dim") != 2:
        return None
    tail = names[i + 1 :]
    has_eps = tail[:1] == ["add"]
    if has_eps:
        tail = tail[1:]
    # x * x and x * rsqrt(...) record the same call (same op, same first tensor): the recorder keeps one
    if tail not in (["sqrt", "div"], ["rsqrt", "mul"]) and not (tail == ["rsqrt"] and names[0] == "mul"):
        return None
    if mean.get("dtype") not in FLOATS or not mean.get("keepdim"):
        return None
    shape = [int(s) for s in mean.get("shape") or []]
    if not shape or square.get("shape") != mean.get("shape"):
        return None
    dim = mean.get("dim")
    if isinstance(dim, list | tuple):
        if len(dim) != 1:
            return None
        dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool):
        return None
    ndim = len(shape)
    dim %= ndim
    eps = next((float(o["eps"]) for o in ops if isinstance(o.get("eps"), int | float)), None)
    return {
        "dim": dim,
        "ndim": ndim,
        "outer": math.prod(shape[:dim]),
        "n_channels": shape[dim],
        "inner": math.prod(shape[dim + 1 :]),
        "dtype": mean["dtype"],
        "eps": eps if eps is not None else (DEFAULT_EPS if has_eps else 0.0),
        "eps_traced": eps is not None,
    }


def tile(spec: dict, knobs: dict[str, Any]) -> tuple[int, int]:
    """(BLOCK_C, BLOCK_S) the launcher uses at the traced shape."""
    block_s = sizing.clamp(knobs["block_s"], spec.get("inner"))
    c = spec.get("n_channels")
    if knobs["strategy"] == "registers":
        return (sizing.next_pow2(c) if c else MAX_BLOCK), block_s
    return sizing.clamp(knobs["block_c"], c), block_s


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """A program's tile (all channels for `registers`, a chunk for `looped`) must fit MAX_BLOCK elements."""
    block_c, block_s = tile(spec, knobs)
    if knobs["strategy"] == "registers" and spec.get("n_channels") is None:
        return True  # shape unknown: the launcher refuses at run time what does not fit
    return block_c * block_s <= MAX_BLOCK


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    looped = k["strategy"] == "looped"
    if move == "registers":
        return (
            {"strategy": "registers", "block_s": k["block_s"], "num_warps": k["num_warps"]}
            if looped
            else None
        )
    if move in sizing.WARP_MOVES:
        return sizing.warps(k, move)
    if move == "wider_tiles":
        bs = k["block_s"] * 2
        return {**k, "block_s": bs} if bs * k.get("block_c", 1) <= MAX_BLOCK and bs <= 4096 else None
    if move == "narrower_tiles":
        bs = k["block_s"] // 2
        return {**k, "block_s": bs} if bs >= 16 else None
    if move == "smaller_chunks":
        if not looped:
            return {"strategy": "looped", "block_c": 16, "block_s": k["block_s"], "num_warps": k["num_warps"]}
        bc = k["block_c"] // 2
        return {**k, "block_c": bc} if bc >= 1 else None
    raise ValueError(f"unknown move {move!r}")


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init = list(signature["init"])
    eps_name = next((a for a in init if a.lower() == "eps"), None) or next(
        (a for a in init if "eps" in a.lower()), None
    )
    x = signature["forward"][0]
    strategy = knobs["strategy"]
    knob_consts = {"NUM_WARPS": knobs["num_warps"], "MAX_BLOCK": MAX_BLOCK, "BLOCK_S": knobs["block_s"]}
    if "block_c" in knobs:
        knob_consts["BLOCK_C"] = knobs["block_c"]
    # the launcher's knob arguments after (x, y, n_outer, C, S, eps)
    knob_args = "BLOCK_S, MAX_BLOCK" if strategy == "registers" else "BLOCK_C, BLOCK_S"
    eps_source = eps_name if eps_name else "EPS"
    doc = (
        f"RMSNorm over dim {spec['dim']}: kernelbrain rmsnorm template ({knob_text(knobs)}).\n\n"
        f"y = x / sqrt(mean(x^2 over dim {spec['dim']}) + eps), accumulated in fp32.\n"
    )
    body = f"        super().__init__()\n        self.eps = float({eps_source})\n"
    lines = f"""\
        dim = DIM % {x}.dim()
        xc = {x}.contiguous()
        n_outer = 1
        for d in xc.shape[:dim]:
            n_outer *= d
        inner = 1
        for d in xc.shape[dim + 1 :]:
            inner *= d
        y = torch.empty_like(xc)
        if y.numel():
            _launch_{strategy}(xc, y, n_outer, xc.shape[dim], inner, self.eps, {knob_args}, NUM_WARPS)
        return y
"""
    return module(
        doc,
        constants(**knob_consts) + constants(DIM=spec["dim"], EPS=float(spec["eps"])),
        parts_of(PARTS, f"_rmsnorm_{strategy}_kernel", f"_launch_{strategy}"),
        model_class(
            init_with(signature, {eps_name: "EPS"} if eps_name else {}),
            body,
            ", ".join(signature["forward"]),
            lines,
        ),
    )
