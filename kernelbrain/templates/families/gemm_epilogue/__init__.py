"""nn.Linear followed by elementwise ops, fused: y = epilogue(x @ W^T + b).

A tiled GEMM (tl.dot over BLOCK_M x BLOCK_N output tiles, K in BLOCK_K steps, GROUP_M swizzled
program order so the W tiles a group needs stay in L2) whose epilogue adds the bias and applies the
traced elementwise ops (ReLU, divide by a constant) in registers before the one store of y.

ModelNew keeps an nn.Linear under Model's attribute name (`linear` unless the spec says otherwise), so
its state_dict has the same keys and the gate's copy makes the weights identical; only forward differs.

Precision (fp32 inputs, tolerance 1e-4: a plain TF32 dot, ~5e-4 relative per product, is too coarse):
- `ieee`: tl.dot(input_precision="ieee"), an exact fp32 dot (FMA units, no tensor cores).
- `tf32x3`: split a = a_hi + a_lo with a_hi = a with its low 13 mantissa bits cleared (exactly
  representable in TF32) and a_lo = a - a_hi (exact in fp32); then
  acc += a_lo @ b_hi + a_hi @ b_lo + a_hi @ b_hi, three TF32 tensor-core dots (a_lo @ b_lo, ~2^-22
  relative, is dropped). ~fp32 accuracy at tensor-core rates. Each K tile's three dots go to a fresh
  accumulator that is then added to the running one in fp32 registers: tensor cores accumulate with
  truncation, and chained over a long K (8192) that alone exceeds the 1e-4 tolerance
  (docs/templates.md, "gemm_epilogue"). The Triton CPU interpreter computes every dot in fp32, so
  there it equals ieee up to the dropped term.
Inputs that are not fp32 (fp16/bf16) take a plain dot with fp32 accumulation in either strategy.

The divisor: from the trace when it is recorded (an int divisor is the second positional int the
recorder writes as "dim"), overridden at run time by Model's constructor parameter named like
`divisor` when there is one.

The kernel and its launcher are in families/gemm_epilogue/parts.py: the strategy and the epilogue ops
reach the one kernel as constexprs (PRECISION, EPILOGUE_1/2), so each candidate compiles only its own code.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import limits, sizing
from kernelbrain.templates.base import FLOATS
from kernelbrain.templates.render import constants, init_with, knob_text, model_class, module, parts_of

FAMILY = "gemm_epilogue"
PARTS = f"{__name__}.parts"
_EPILOGUE = {"relu": "relu", "div": "div", "truediv": "div", "true_divide": "div", "divide": "div"}

ROUND0: list[dict[str, Any]] = [
    {
        "strategy": "ieee",
        "block_m": 64,
        "block_n": 64,
        "block_k": 32,
        "group_m": 8,
        "num_warps": 4,
        "num_stages": 3,
    },
    {
        "strategy": "tf32x3",
        "block_m": 128,
        "block_n": 128,
        "block_k": 32,
        "group_m": 8,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "strategy": "tf32x3",
        "block_m": 128,
        "block_n": 64,
        "block_k": 32,
        "group_m": 8,
        "num_warps": 4,
        "num_stages": 4,
    },
    {
        "strategy": "ieee",
        "block_m": 128,
        "block_n": 64,
        "block_k": 16,
        "group_m": 8,
        "num_warps": 8,
        "num_stages": 3,
    },
    {
        "strategy": "tf32x3",
        "block_m": 64,
        "block_n": 128,
        "block_k": 32,
        "group_m": 4,
        "num_warps": 4,
        "num_stages": 4,
    },
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "compute-bound": [
        (
            "tf32x3",
            "at the FMA roof: three TF32 tensor-core dots keep fp32 accuracy at several times the rate",
        ),
        ("larger_tiles", "bigger output tiles do more dot work per loaded element"),
    ],
    "memory-bound near peak": [
        ("larger_tiles", "bigger output tiles re-read x and W fewer times"),
        ("wider_groups", "a wider GROUP_M swizzle keeps the W tiles a group shares in L2"),
    ],
    "memory-bound with poor coalescing": [("longer_k", "longer K tiles make longer contiguous row loads")],
    "latency or occupancy-limited": [
        ("more_stages", "a deeper software pipeline keeps more tile loads in flight"),
        ("smaller_tiles", "smaller output tiles make more programs to fill the SMs"),
    ],
    "launch-bound": [("larger_tiles", "fewer, fatter programs amortise launch and scheduling cost")],
    "register spills": [
        ("more_warps", "spread the accumulator over more threads"),
        ("smaller_tiles", "a smaller output tile holds a smaller accumulator"),
    ],
}


def _name(op: dict) -> str:
    return str(op["op"]).strip("_")


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    """linear, then only ReLU / divide-by-a-constant ops (each at most once), ending in at least one."""
    seq = [o for o in ops if _name(o) not in {"contiguous"}]
    if len(seq) < 2 or _name(seq[0]) != "linear":
        return None
    lin = seq[0]
    if lin.get("dtype") not in FLOATS:
        return None
    shape = [int(s) for s in lin.get("shape") or []]
    if len(shape) < 2:
        return None
    epilogue = []
    divisor = None
    n_out = None
    for o in seq[1:]:
        kind = _EPILOGUE.get(_name(o))
        if kind is None or kind in epilogue:
            return None
        o_shape = [int(s) for s in o.get("shape") or []]
        if len(o_shape) != len(shape) or o_shape[:-1] != shape[:-1]:
            return None  # the epilogue works on the linear's output, (..., N), elementwise
        if n_out is None:
            n_out = o_shape[-1]
        elif o_shape[-1] != n_out:
            return None
        if kind == "div":
            d = o.get("dim")  # the recorder writes a second positional int as "dim": here the divisor
            divisor = float(d) if isinstance(d, int | float) and not isinstance(d, bool) and d != 0 else None
        epilogue.append(kind)
    m = 1
    for s in shape[:-1]:
        m *= s
    return {
        "m": m,
        "k": shape[-1],
        "n": n_out,
        "dtype": lin["dtype"],
        "epilogue": epilogue,
        "divisor": divisor,
    }


def _tile(spec: dict, knobs: dict[str, Any]) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) the launcher uses at the traced shape: never wider than the matrix
    (rounded up to a power of two, and at least 16: tl.dot's minimum)."""

    return (
        sizing.clamp(knobs["block_m"], spec.get("m"), 16),
        sizing.clamp(knobs["block_n"], spec.get("n"), 16),
        sizing.clamp(knobs["block_k"], spec.get("k"), 16),
    )


def smem_bytes(spec: dict, knobs: dict[str, Any]) -> int:
    """Shared memory of the software pipeline (fp32 tiles of x and W per stage), plus the split
    operands a tf32x3 dot may stage (hi and lo of both tiles)."""
    bm, bn, bk = _tile(spec, knobs)
    per_stage = (bm * bk + bk * bn) * 4
    extra = 2 * per_stage if knobs["strategy"] == "tf32x3" else 0
    return knobs["num_stages"] * per_stage + extra


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Tiles of powers of two >= 16, the pipeline within shared memory, the accumulator within registers."""
    if (
        not sizing.pow2(knobs["block_m"], knobs["block_n"], knobs["block_k"], least=16)
        or knobs["num_stages"] < 1
    ):
        return False
    bm, bn, _ = _tile(spec, knobs)
    acc = bm * bn * (2 if knobs["strategy"] == "tf32x3" else 1)  # the split keeps hi/lo operands live too
    in_smem = smem_bytes(spec, knobs) <= limits.TARGET.smem_per_block
    return in_smem and sizing.fits(acc, knobs["num_warps"], limits.ACC_PER_THREAD)


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "tf32x3":
        return {**k, "strategy": "tf32x3"} if k["strategy"] != "tf32x3" else None
    if move == "larger_tiles":
        # grow the smaller of the two output dims
        key = "block_m" if k["block_m"] <= k["block_n"] else "block_n"
        return sizing.doubled(k, key, 256)
    if move == "smaller_tiles":
        key = "block_m" if k["block_m"] >= k["block_n"] else "block_n"
        return sizing.halved(k, key, 16)
    if move == "wider_groups":
        return sizing.doubled(k, "group_m", 32)
    if move == "longer_k":
        return sizing.doubled(k, "block_k", 128)
    if move == "more_stages":
        return sizing.stages(k, move, 6)
    if move == "more_warps":
        return sizing.warps(k, move)
    raise ValueError(f"unknown move {move!r}")


_IN_NAMES = ("in_features", "input_size", "in_dim", "input_dim", "in_size", "d_in", "n_in")
_OUT_NAMES = (
    "out_features",
    "output_size",
    "out_dim",
    "output_dim",
    "out_size",
    "d_out",
    "n_out",
    "hidden_size",
)


def _find(init: list[str], exact: tuple[str, ...], prefixes: tuple[str, ...]) -> str | None:
    low = {a.lower(): a for a in init}
    for e in exact:
        if e in low:
            return low[e]
    return next((a for a in init if a.lower().startswith(prefixes)), None)


def constructor(signature: dict[str, list[str]]) -> dict[str, str | None]:
    """Which of Model's constructor parameters are the Linear's sizes, its bias flag and the divisor."""
    init = list(signature["init"])
    in_name = _find(init, _IN_NAMES, ("in_", "input"))
    out_name = _find(init, _OUT_NAMES, ("out_", "output"))
    if in_name is None or out_name is None or in_name == out_name:
        # KernelBench's convention: Model(in_features, out_features, ...)
        if len(init) < 2:
            raise ValueError(f"cannot tell the Linear's sizes from Model.__init__({', '.join(init)})")
        in_name, out_name = init[0], init[1]
    divisor = next((a for a in init if a.lower() == "divisor"), None) or next(
        (a for a in init if "div" in a.lower()), None
    )
    bias = next((a for a in init if a.lower() == "bias"), None)
    return {"in": in_name, "out": out_name, "divisor": divisor, "bias": bias}


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    names = constructor(signature)
    needs_divisor = "div" in spec["epilogue"]
    if needs_divisor and names["divisor"] is None and spec.get("divisor") is None:
        raise ValueError("the divisor is neither recorded in the trace nor a constructor parameter of Model")
    defaults = {names["bias"]: "True"} if names["bias"] else {}
    if names["divisor"] is not None and spec.get("divisor") is not None:
        defaults[names["divisor"]] = "DIVISOR"
    attr = spec.get("linear_attr", "linear")
    bias_arg = f", bias={names['bias']}" if names["bias"] else ""
    divisor_src = names["divisor"] if names["divisor"] else "DIVISOR"
    x = signature["forward"][0]
    epi_text = " -> ".join(["x @ W^T + b", *spec["epilogue"]])
    doc = f"Fused Linear + epilogue ({epi_text}): kernelbrain gemm_epilogue template ({knob_text(knobs)})."
    body = f"""\
        super().__init__()
        # the same nn.Linear as Model's, under the same name: same state_dict keys, same weights
        self.{attr} = nn.Linear({names["in"]}, {names["out"]}{bias_arg})
        divisor = {divisor_src}
        self.divisor = float(divisor) if divisor is not None else 1.0
"""
    lines = f"""\
        weight = self.{attr}.weight.contiguous()
        bias = self.{attr}.bias
        if bias is not None:
            bias = bias.contiguous()
        x2 = {x}.reshape(-1, {x}.shape[-1]).contiguous()
        y2 = torch.empty((x2.shape[0], weight.shape[0]), dtype={x}.dtype, device={x}.device)
        if y2.numel():
            _gemm_launch(x2, weight, bias, y2, self.divisor, STRATEGY, EPILOGUE, BLOCK_M, BLOCK_N, BLOCK_K,
                         GROUP_M, NUM_WARPS, NUM_STAGES)
        return y2.reshape(*{x}.shape[:-1], weight.shape[0])
"""
    return module(
        doc,
        constants(STRATEGY=knobs["strategy"], EPILOGUE=list(spec["epilogue"])),
        constants(BLOCK_M=knobs["block_m"], BLOCK_N=knobs["block_n"], BLOCK_K=knobs["block_k"]),
        constants(GROUP_M=knobs["group_m"], NUM_WARPS=knobs["num_warps"], NUM_STAGES=knobs["num_stages"]),
        constants(DIVISOR=spec.get("divisor")),
        parts_of(PARTS, "_epilogue_op", "_gemm_kernel", "_gemm_launch"),
        model_class(init_with(signature, defaults), body, ", ".join(signature["forward"]), lines),
    )
