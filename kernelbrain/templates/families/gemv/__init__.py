"""Matrix-vector product y = A @ x, A (M, K) row-major, x (K, 1) (or (K,), or a few columns).

A program takes BLOCK_M rows of A and walks a range of K in tiles of BLOCK_K contiguous elements,
multiplying each tile by the matching slice of x and adding it into a [BLOCK_M, BLOCK_K] fp32
accumulator; one tree reduction over BLOCK_K at the end gives the row sums. Every lane thus adds a
chain of only K / (BLOCK_K * SPLIT_K) terms, and the tree adds log2(BLOCK_K) levels: a blocked
reduction, accurate enough at K ~ 1e6 where a serial chain would not be. Every CHUNK tiles the lanes
are folded into the row totals, so no chain grows past CHUNK + K / (BLOCK_K * CHUNK) terms.

Strategy axes:
- `row_blocks`: one program per BLOCK_M rows covers all of K and writes y directly (one launch).
- `split_k`: SPLIT_K programs per row block each cover a K range and write fp32 partial sums to a
  (SPLIT_K, N, M) buffer; a second small kernel adds the partials in a fixed order (deterministic,
  no atomics). With M / BLOCK_M small (M = 2048 on 132 SMs) this is what fills the machine.
- BLOCK_M (rows per program: x is re-read M / BLOCK_M times), BLOCK_K (load width), num_warps.

Batched: A (B, M, K) times x (B, K, 1) (torch.bmm / torch.matmul), or (B, K) spelled
`bmm(A, x.unsqueeze(-1)).squeeze(-1)`: the batch folds into the row-block grid axis, each program
reading its batch's A rows and vector. A 2-D (or 1-D) x with a 3-D A is matmul's broadcast: the same
vector for every batch, so A is served as one (B*M, K) matrix.

A second operand with a few columns (up to MAX_N: a small batched GEMM) is served column by column (a
grid axis), correct but slow; with more, or with a K that is not A's last dim (a transposed operand the
trace does not show), the family does not match.
y has A's dtype. The kernels and their launcher are in families/gemv/parts.py; the knobs reach them as
the candidate's module constants, passed on by ModelNew.forward.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import limits, sizing
from kernelbrain.templates.base import FLOATS
from kernelbrain.templates.render import constants, knob_text, module, parts_of, plain_model

FAMILY = "gemv"
PARTS = f"{__name__}.parts"
# accumulator elements a program may hold; past this Triton spends minutes compiling a kernel that spills
MAX_TILE = 16384
# columns of x served one by one (a grid axis): past this the product is a GEMM, not this family's
MAX_N = 16
_NAMES = {"matmul", "__matmul__", "mm", "mv", "bmm"}
# calls that copy or view and change nothing matching cares about
_GLUE = {"contiguous"}
# K tiles a lane accumulates before its partial sums are folded into the row totals
CHUNK = 32

ROUND0: list[dict[str, Any]] = [
    {"strategy": "row_blocks", "block_m": 8, "block_k": 1024, "num_warps": 8},
    {"strategy": "split_k", "block_m": 16, "block_k": 512, "split_k": 16, "num_warps": 4},
    {"strategy": "split_k", "block_m": 4, "block_k": 2048, "split_k": 8, "num_warps": 8},
    {"strategy": "split_k", "block_m": 32, "block_k": 256, "split_k": 32, "num_warps": 4},
    {"strategy": "row_blocks", "block_m": 2, "block_k": 4096, "num_warps": 16},
]

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "memory-bound near peak": [
        ("more_rows", "at the bandwidth roof only fewer bytes help: more rows per program re-read x less"),
    ],
    "latency or occupancy-limited": [
        ("more_splits", "more K splits per row block put more programs (and loads) in flight"),
        ("more_warps", "more warps per program keep more loads in flight"),
    ],
    "launch-bound": [
        ("single_pass", "one launch instead of two: drop the split and its reduction kernel"),
        ("fewer_splits", "fewer, longer K ranges: fewer programs and a smaller partial buffer"),
    ],
    "register spills": [("smaller_tiles", "a narrower K tile lowers register pressure")],
    "compute-bound": [("fewer_warps", "a multiply-add per element is cheap; fewer warps cut overhead")],
    "memory-bound with poor coalescing": [
        ("longer_k_tiles", "wider K tiles make longer contiguous loads along each row of A"),
    ],
}


def _column_dim(op: dict, ndim: int) -> bool:
    """unsqueeze/squeeze at the last dim of a batched operand: (B, K) -> (B, K, 1), (B, M, 1) -> (B, M)."""
    dim = op.get("dim")
    return isinstance(dim, int) and not isinstance(dim, bool) and dim % ndim == ndim - 1


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    """A single matmul of floats and nothing else (contiguous aside): 2-D A, or batched 3-D A; the batched
    vector (B, K) may come unsqueezed to (B, K, 1) before and the product squeezed after."""
    seq = [o for o in ops if o["op"] not in _GLUE]
    names = [o["op"] for o in seq]
    column = names[:1] == ["unsqueeze"] and names[2:] == ["squeeze"] and len(seq) == 3
    if column:
        unsq, seq, sq = seq[0], seq[1:2], seq[2]
    if len(seq) != 1 or seq[0]["op"] not in _NAMES:
        return None
    op = seq[0]
    shape = [int(s) for s in op.get("shape") or []]
    if op.get("dtype") not in FLOATS or op.get("ndim") not in (2, 3) or len(shape) != op.get("ndim"):
        return None
    spec = {"m": shape[-2], "k": shape[-1], "batch": shape[0] if len(shape) == 3 else 1, "dtype": op["dtype"]}
    other = op.get("other_shape")  # absent in older traces
    if other is not None and not column:
        n, k = (1, other[0]) if len(other) == 1 else (other[-1], other[-2])
        if k != spec["k"] or n > MAX_N:
            return None  # a GEMM (a matrix, not a few columns), or operands this spelling does not show
    if column:
        # x (B, K) made (B, K, 1), the product (B, M, 1) made (B, M): nothing else is this spelling
        if len(shape) != 3:
            return None
        b, m, k = shape
        if unsq.get("shape") != [b, k] or sq.get("shape") != [b, m, 1]:
            return None
        if not (_column_dim(unsq, 3) and _column_dim(sq, 3)):
            return None
        spec["column"] = True
    return spec


def tile(spec: dict, knobs: dict[str, Any]) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_K) the launcher uses at the traced shape."""
    return sizing.clamp(knobs["block_m"], spec.get("m")), sizing.clamp(knobs["block_k"], spec.get("k"), 16)


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """The accumulator tile must fit: MAX_TILE elements, limits.TILE_PER_THREAD per thread (above it the
    accumulator, the loaded tile and x no longer fit registers)."""
    bm, bk = tile(spec, knobs)
    if knobs["strategy"] == "split_k" and knobs.get("split_k", 1) < 2:
        return False
    return bm * bk <= MAX_TILE and sizing.fits(bm * bk, knobs["num_warps"], limits.TILE_PER_THREAD)


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    split = k["strategy"] == "split_k"
    if move == "more_rows":
        bm = k["block_m"] * 2
        # keep the tile's size: what the rows gain, K gives back
        bk = k["block_k"] // 2 if bm * k["block_k"] > MAX_TILE // 2 else k["block_k"]
        return {**k, "block_m": bm, "block_k": bk} if bm <= 64 and bk >= 64 else None
    if move == "more_splits":
        s = k.get("split_k", 1) * (2 if split else 4)
        return {**k, "strategy": "split_k", "split_k": s} if s <= 128 else None
    if move == "fewer_splits":
        if not split:
            return None
        s = k["split_k"] // 2
        if s < 2:
            return {kk: v for kk, v in k.items() if kk != "split_k"} | {"strategy": "row_blocks"}
        return {**k, "split_k": s}
    if move == "single_pass":
        return (
            {kk: v for kk, v in k.items() if kk != "split_k"} | {"strategy": "row_blocks"} if split else None
        )
    if move in sizing.WARP_MOVES:
        return sizing.warps(k, move)
    if move == "smaller_tiles":
        bk = k["block_k"] // 2
        return {**k, "block_k": bk} if bk >= 64 else None
    if move == "longer_k_tiles":
        bk = k["block_k"] * 2
        bm = k["block_m"] // 2 if bk * k["block_m"] > MAX_TILE // 2 and k["block_m"] > 1 else k["block_m"]
        return {**k, "block_m": bm, "block_k": bk} if bk <= 8192 else None
    raise ValueError(f"unknown move {move!r}")


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    a_name, b_name = signature["forward"][:2]
    split = knobs["strategy"] == "split_k"
    # the (B, K) spelling: Model unsqueezes x to (B, K, 1) and squeezes the product back to (B, M)
    x = f"{b_name}.unsqueeze(-1)" if spec.get("column") else b_name
    call = f"_matvec({a_name}, {x}, BLOCK_M, BLOCK_K, SPLIT_K, CHUNK, NUM_WARPS)"
    if spec.get("column"):
        call += ".squeeze(-1)"
    doc = (
        f"Matrix-vector product y = A @ x: kernelbrain gemv template ({knob_text(knobs)}).\n\n"
        "Blocked fp32 accumulation ([BLOCK_M, BLOCK_K] lanes, one tree reduction at the end)"
        f"{', split over K with a deterministic second reduction' if split else ''}.\n"
    )
    return module(
        doc,
        constants(BLOCK_M=knobs["block_m"], BLOCK_K=knobs["block_k"]),
        constants(SPLIT_K=knobs.get("split_k", 1) if split else 1, NUM_WARPS=knobs["num_warps"], CHUNK=CHUNK),
        parts_of(PARTS, "_gemv_kernel", "_sum_splits_kernel", "_gemv_launch", "_matvec"),
        plain_model(signature, f"        return {call}\n"),
    )
