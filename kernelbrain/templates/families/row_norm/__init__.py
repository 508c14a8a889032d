"""Row normalisation kernels, knobs and mutations shared by the layernorm and l2norm families.

x is viewed as contiguous rows of D elements; per row, with statistics accumulated in fp32:

    LayerNorm:  y = (x - mean) / sqrt(var + eps) [* w + b]     var = mean((x - mean)^2), biased
    L2:         y = x / max(sqrt(sum x^2), eps)                 (eps = 0: a plain x / ||x||)

Strategy axes:
- `registers`: ROWS whole rows per program in registers (BLOCK = next_pow2(D)); one read of x, exact
  two-pass statistics over the registers. ROWS > 1 packs several short rows into one program.
- `looped`: one row per program in tiles of BLOCK_N: a statistics sweep (per-lane Welford for the
  mean and M2, lanes merged exactly at the end) and a normalising sweep; any D, two reads of x.
- `split`: SPLIT programs per row (few, long rows: KernelBench's LayerNorm has 16 rows of 4M), each
  writing its chunk's (count, mean, M2) to a small fp32 buffer; a second kernel merges a row's
  partials in a fixed order (deterministic, no atomics) and normalises its chunk.
- num_warps.

Merging (count, mean, M2) of disjoint parts is exact (Chan et al.): n = sum n_i,
mean = sum n_i mean_i / n, M2 = sum M2_i + sum n_i (mean_i - mean)^2. For L2 the same triple carries
the sum of squares in M2 with n = mean = 0.

The kernels are real Triton functions in `parts` beside this. A family renders `kernels(knobs)` (the knob
constants and the strategy's parts) and calls `launcher(knobs)` as
`(x2, y2, weight, bias, eps, layer, <knob_args(knobs)>)` on 2-D contiguous views; weight and bias may be
None, layer is True for LayerNorm and False for L2.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.templates import limits, sizing
from kernelbrain.templates.render import constants, parts_of

PARTS = f"{__name__}.parts"  # the kernels and launchers, one of each per strategy

MAX_BLOCK = sizing.MAX_BLOCK

ROUND0: list[dict[str, Any]] = [
    {"strategy": "registers", "rows": 1, "num_warps": 4},
    {"strategy": "registers", "rows": 1, "num_warps": 16},
    {"strategy": "registers", "rows": 8, "num_warps": 4},
    {"strategy": "looped", "block_n": 2048, "num_warps": 8},
    {"strategy": "split", "block_n": 1024, "split": 16, "num_warps": 4},
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "memory-bound near peak": [
        ("registers", "at the bandwidth roof only fewer bytes help: hold the row in registers, read x once"),
    ],
    "latency or occupancy-limited": [
        ("more_warps", "more warps per row keep more loads in flight"),
        ("more_splits", "more programs per row fill the machine when rows are few and long"),
    ],
    "launch-bound": [
        ("more_rows", "fewer, fatter programs: several short rows per program"),
        ("fewer_splits", "fewer chunks per row, down to one launch instead of two"),
    ],
    "register spills": [("smaller_tiles", "a smaller tile (or a loop over tiles) lowers register pressure")],
    "compute-bound": [
        ("fewer_warps", "a few flops per element are cheap; fewer warps cut reduction overhead")
    ],
    "memory-bound with poor coalescing": [("larger_tiles", "wider tiles make longer contiguous loads")],
}


def tile(spec: dict, knobs: dict[str, Any]) -> int | None:
    """Register-tile elements a program holds at the traced row length (None: unknown length).

    `n_cols` is the exact row length D; `min_cols` a lower bound when the trace cannot tell D (the
    normalised dims of F.layer_norm are not recorded, but D is at least the last dim)."""
    d = spec.get("n_cols") or spec.get("min_cols")
    if knobs["strategy"] == "registers":
        return sizing.next_pow2(d) * knobs["rows"] if d else None
    return sizing.clamp(knobs["block_n"], d)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """A program's register tile must fit MAX_BLOCK elements and limits.TILE_PER_THREAD per thread."""
    if knobs["strategy"] == "split" and knobs["split"] < 2:
        return False
    t = tile(spec, knobs)
    if t is None:
        return True  # row length unknown: the launcher refuses at run time what does not fit
    return t <= MAX_BLOCK and sizing.fits(t, knobs["num_warps"], limits.TILE_PER_THREAD)


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    strategy, warps = k["strategy"], k["num_warps"]
    if move == "registers":
        return None if strategy == "registers" else {"strategy": "registers", "rows": 1, "num_warps": warps}
    if move in sizing.WARP_MOVES:
        return sizing.warps(k, move)
    if move == "more_rows":
        return sizing.doubled(k, "rows", 32) if strategy == "registers" else None
    if move == "more_splits":
        if strategy == "split":
            return sizing.doubled(k, "split", 64)
        return {"strategy": "split", "block_n": k.get("block_n", 1024), "split": 8, "num_warps": warps}
    if move == "fewer_splits":
        if strategy != "split":
            return None
        if k["split"] > 2:
            return {**k, "split": k["split"] // 2}
        return {"strategy": "looped", "block_n": k["block_n"], "num_warps": warps}
    if move == "smaller_tiles":
        if strategy == "registers":
            return {"strategy": "looped", "block_n": 1024, "num_warps": warps}
        return sizing.halved(k, "block_n", 128)
    if move == "larger_tiles":
        if strategy == "registers":
            return None
        return sizing.doubled(k, "block_n", 16384)
    raise ValueError(f"unknown move {move!r}")


# per strategy: the parts its candidate copies (callees first) and its launcher's knob constants, the
# arguments after (x2, y2, w, b, eps, layer)
_HELPERS = ("_apply", "_scale")
_STATS = ("_merge", "_chunk_stats")
STRATEGIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "registers": ((*_HELPERS, "_row_norm_registers_kernel", "_launch_registers"), ("ROWS", "MAX_BLOCK")),
    "looped": ((*_HELPERS, *_STATS, "_row_norm_looped_kernel", "_launch_looped"), ("BLOCK_N",)),
    "split": (
        (*_HELPERS, *_STATS, "_chunk_stats_kernel", "_row_norm_split_kernel", "_launch_split"),
        ("BLOCK_N", "SPLIT"),
    ),
}


def kernels(knobs: dict[str, Any], *extra: str) -> str:
    """The candidate's row-norm section: the knob constants, then the strategy's parts and `extra` ones."""
    values = {"NUM_WARPS": knobs["num_warps"], "MAX_BLOCK": MAX_BLOCK}
    values |= {name.upper(): knobs[name] for name in ("rows", "block_n", "split") if name in knobs}
    names, _ = STRATEGIES[knobs["strategy"]]
    return constants(**values) + "\n\n" + parts_of(PARTS, *names, *extra)


def launcher(knobs: dict[str, Any]) -> str:
    """The name of the strategy's launcher, `launcher(x2, y2, w, b, eps, layer, *knob_args)`."""
    return f"_launch_{knobs['strategy']}"


def knob_args(knobs: dict[str, Any]) -> str:
    """The launcher's knob arguments after `layer`, as the constants `kernels` defines."""
    _, args = STRATEGIES[knobs["strategy"]]
    return ", ".join((*args, "NUM_WARPS"))
