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
y has A's dtype.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import model_source

FAMILY = "gemv"
# accumulator elements a program may hold; past this Triton spends minutes compiling a kernel that spills
MAX_TILE = 16384
# columns of x served one by one (a grid axis): past this the product is a GEMM, not this family's
MAX_N = 16
# accumulator elements per thread: above this the accumulator, the loaded tile and x no longer fit registers
MAX_PER_THREAD = 64
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
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
    if op.get("dtype") not in FLOAT_DTYPES or op.get("ndim") not in (2, 3) or len(shape) != op.get("ndim"):
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
    bm, bk = knobs["block_m"], knobs["block_k"]
    if spec.get("m"):
        bm = min(bm, _next_pow2(spec["m"]))
    if spec.get("k"):
        bk = min(bk, max(16, _next_pow2(spec["k"])))
    return bm, bk


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """The accumulator tile must fit: MAX_TILE elements, MAX_PER_THREAD per thread."""
    bm, bk = tile(spec, knobs)
    if knobs["strategy"] == "split_k" and knobs.get("split_k", 1) < 2:
        return False
    return bm * bk <= MAX_TILE and bm * bk <= MAX_PER_THREAD * 32 * knobs["num_warps"]


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
    if move == "more_warps":
        return {**k, "num_warps": k["num_warps"] * 2} if k["num_warps"] < 16 else None
    if move == "fewer_warps":
        return {**k, "num_warps": k["num_warps"] // 2} if k["num_warps"] > 1 else None
    if move == "smaller_tiles":
        bk = k["block_k"] // 2
        return {**k, "block_k": bk} if bk >= 64 else None
    if move == "longer_k_tiles":
        bk = k["block_k"] * 2
        bm = k["block_m"] // 2 if bk * k["block_m"] > MAX_TILE // 2 and k["block_m"] > 1 else k["block_m"]
        return {**k, "block_m": bm, "block_k": bk} if bk <= 8192 else None
    raise ValueError(f"unknown move {move!r}")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


_KERNELS = '''
@triton.jit(do_not_specialize=["grid_m"])  # a count of blocks: M's gate and rung sizes share one compile
def _gemv_kernel(a_ptr, b_ptr, out_ptr, M, K, k_per_split, grid_m, stride_ab, stride_am, stride_bb, stride_bk,
                 stride_bn, stride_ob, stride_om, stride_on, stride_os, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    # axis 0 runs over (batch, row block): the batch never meets axis 1/2's 65535 limit
    batch = (tl.program_id(0) // grid_m).to(tl.int64)
    pid_m = tl.program_id(0) % grid_m
    split = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + batch * stride_ab + rows.to(tl.int64)[:, None] * stride_am
    b_col = b_ptr + batch * stride_bb + n * stride_bn
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    # every lane keeps its own short chain; a tree reduction over BLOCK_K sums the lanes,
    # and every CHUNK tiles the lanes are summed into the row totals: no chain is longer than
    # CHUNK + K / (BLOCK_K * CHUNK) additions
    total = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(k_start, k_end, BLOCK_K * CHUNK):
        c_end = tl.minimum(c0 + BLOCK_K * CHUNK, k_end)
        acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for k0 in range(c0, c_end, BLOCK_K):
            k = k0 + cols
            k_mask = k < c_end
            x = tl.load(b_col + k.to(tl.int64) * stride_bk, mask=k_mask, other=0.0).to(tl.float32)
            a = tl.load(a_rows + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            acc += a.to(tl.float32) * x[None, :]
        total += tl.sum(acc, axis=1)
    out = out_ptr + split.to(tl.int64) * stride_os + batch * stride_ob + n * stride_on
    out += rows.to(tl.int64) * stride_om
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit(do_not_specialize=["grid_r"])
def _sum_splits_kernel(part_ptr, y_ptr, M, n_splits, grid_r, stride_ps, stride_pb, stride_pn, stride_yb,
                       stride_ym, stride_yn, BLOCK_R: tl.constexpr, SPLITS: tl.constexpr):
    batch = (tl.program_id(0) // grid_r).to(tl.int64)
    pid = tl.program_id(0) % grid_r
    n = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    s = tl.arange(0, SPLITS)
    mask = (s[:, None] < n_splits) & (rows[None, :] < M)
    part = part_ptr + batch * stride_pb + n * stride_pn
    p = tl.load(part + s[:, None].to(tl.int64) * stride_ps + rows[None, :], mask=mask, other=0.0)
    total = tl.sum(p, axis=0)
    tl.store(y_ptr + batch * stride_yb + n * stride_yn + rows.to(tl.int64) * stride_ym,
             total.to(y_ptr.dtype.element_ty), mask=rows < M)


def _launch(a, b, y):
    """a (B, M, K) contiguous, b (B, K, N), y (B, M, N)."""
    n_batch, M, K = a.shape
    N = b.shape[2]
    block_m = min(BLOCK_M, triton.next_power_of_2(M))
    block_k = min(BLOCK_K, max(16, triton.next_power_of_2(K)))
    grid_m = triton.cdiv(M, block_m)
    # split K into ranges of whole tiles; never more ranges than tiles
    split = max(1, min(SPLIT_K, triton.cdiv(K, block_k)))
    k_per_split = max(1, triton.cdiv(triton.cdiv(K, split), block_k)) * block_k
    split = max(1, triton.cdiv(K, k_per_split))
    grid = (n_batch * grid_m, split, N)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2))
    if split == 1:
        _gemv_kernel[grid](a, b, y, M, K, k_per_split, grid_m, *strides, *y.stride(), 0, BLOCK_M=block_m,
                           BLOCK_K=block_k, CHUNK=CHUNK, num_warps=NUM_WARPS)
        return
    part = torch.empty((split, n_batch, N, M), dtype=torch.float32, device=a.device)
    _gemv_kernel[grid](a, b, part, M, K, k_per_split, grid_m, *strides, part.stride(1), part.stride(3),
                       part.stride(2), part.stride(0), BLOCK_M=block_m, BLOCK_K=block_k, CHUNK=CHUNK,
                       num_warps=NUM_WARPS)
    # a block of rows that follows no size (one compile for every M), shorter where the splits are many
    block_r = 256
    splits = triton.next_power_of_2(split)
    while splits * block_r > 8192 and block_r > 16:
        block_r //= 2
    grid_r = triton.cdiv(M, block_r)
    _sum_splits_kernel[(n_batch * grid_r, N)](part, y, M, split, grid_r, part.stride(0), part.stride(1),
                                              part.stride(2), y.stride(0), y.stride(1), y.stride(2),
                                              BLOCK_R=block_r, SPLITS=splits, num_warps=4)
'''


_WRAPPER = '''
def _matvec(A, x):
    """A @ x for A (M, K) or (B, M, K) and x (K,), (K, N) or (B, K, N), computed by the kernels."""
    vector = x.dim() == 1
    b = x.unsqueeze(-1) if vector else x
    if A.dim() not in (2, 3) or b.dim() not in (2, 3) or A.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemv wants A (M, K) or (B, M, K) and x (K,), (K, N) or (B, K, N): got "
                         f"{tuple(A.shape)}, {tuple(x.shape)}")
    if b.dim() == 3:
        if A.dim() == 3 and A.shape[0] != b.shape[0]:
            raise ValueError(f"gemv wants as many batches in A as in x: {tuple(A.shape)}, {tuple(x.shape)}")
        # one A for every batch of x: a zero batch stride, no copy
        a3 = A.contiguous() if A.dim() == 3 else A.contiguous().unsqueeze(0).expand(b.shape[0], -1, -1)
        b3 = b
    else:
        # one x for every row of A, batched or not: A is a single (rows, K) matrix
        a3 = A.contiguous().view(1, -1, A.shape[-1])
        b3 = b.unsqueeze(0)
    y = torch.empty((a3.shape[0], a3.shape[1], b3.shape[2]), dtype=A.dtype, device=A.device)
    if y.numel():
        _launch(a3, b3, y)
    y = y.view(*(A.shape[:-1] if b.dim() == 2 else a3.shape[:-1]), b.shape[-1])
    return y.squeeze(-1) if vector else y
'''


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init_args = model_source.init_args(signature, "".join(f", {a}=None" for a in signature["init"]))
    fwd = signature["forward"]
    a_name, b_name = fwd[0], fwd[1]
    rest = "".join(f", {a}" for a in fwd[2:])
    consts = [
        f"BLOCK_M = {knobs['block_m']}",
        f"BLOCK_K = {knobs['block_k']}",
        f"SPLIT_K = {knobs.get('split_k', 1) if knobs['strategy'] == 'split_k' else 1}",
        f"NUM_WARPS = {knobs['num_warps']}",
        f"CHUNK = {CHUNK}",
    ]
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    # the (B, K) spelling: Model unsqueezes x to (B, K, 1) and squeezes the product back to (B, M)
    call = (
        f"_matvec({a_name}, {b_name}.unsqueeze(-1)).squeeze(-1)"
        if spec.get("column")
        else f"_matvec({a_name}, {b_name})"
    )
    return f'''"""Matrix-vector product y = A @ x: kernelbrain gemv template ({knob_text}).

Blocked fp32 accumulation ([BLOCK_M, BLOCK_K] lanes, one tree reduction at the end){
        ", split over K with a deterministic second reduction" if knobs["strategy"] == "split_k" else ""
    }.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{chr(10).join(consts)}
{_KERNELS}{_WRAPPER}

class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()

    def forward(self, {a_name}, {b_name}{rest}):
        return {call}
'''
