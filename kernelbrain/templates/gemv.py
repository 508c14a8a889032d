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

The trace records only A's shape (the first tensor argument of matmul): a second operand with more
than one column is served column by column (a grid axis), correct but slow. y has A's dtype.
"""

from __future__ import annotations

from typing import Any

FAMILY = "gemv"
# accumulator elements a program may hold; past this Triton spends minutes compiling a kernel that spills
MAX_TILE = 16384
# accumulator elements per thread: above this the accumulator, the loaded tile and x no longer fit registers
MAX_PER_THREAD = 64
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}
_NAMES = {"matmul", "__matmul__", "mm", "mv"}
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


def matches(ops: list[dict]) -> dict | None:
    """A single 2-D matmul of floats and nothing else (view/contiguous glue aside)."""
    seq = [o for o in ops if o["op"] not in {"contiguous"}]
    if len(seq) != 1 or seq[0]["op"] not in _NAMES:
        return None
    op = seq[0]
    if op.get("dtype") not in FLOAT_DTYPES or op.get("ndim") != 2:
        return None
    shape = [int(s) for s in op.get("shape") or []]
    if len(shape) != 2:
        return None
    return {"m": shape[0], "k": shape[1], "dtype": op["dtype"]}


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
@triton.jit
def _gemv_kernel(a_ptr, b_ptr, out_ptr, M, K, k_per_split, stride_am, stride_bk, stride_bn, stride_om,
                 stride_on, stride_os, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_K)
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_am
    b_col = b_ptr + n * stride_bn
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
    out = out_ptr + split.to(tl.int64) * stride_os + n * stride_on + rows.to(tl.int64) * stride_om
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _sum_splits_kernel(part_ptr, y_ptr, M, n_splits, stride_ps, stride_pn, stride_ym, stride_yn,
                       BLOCK_R: tl.constexpr, SPLITS: tl.constexpr):
    pid = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    s = tl.arange(0, SPLITS)
    mask = (s[:, None] < n_splits) & (rows[None, :] < M)
    p = tl.load(part_ptr + s[:, None].to(tl.int64) * stride_ps + n * stride_pn + rows[None, :], mask=mask,
                other=0.0)
    total = tl.sum(p, axis=0)
    tl.store(y_ptr + n * stride_yn + rows.to(tl.int64) * stride_ym, total.to(y_ptr.dtype.element_ty),
             mask=rows < M)


def _launch(a, b, y):
    """a (M, K) contiguous, b (K, N), y (M, N)."""
    M, K = a.shape
    N = b.shape[1]
    block_m = min(BLOCK_M, triton.next_power_of_2(M))
    block_k = min(BLOCK_K, max(16, triton.next_power_of_2(K)))
    grid_m = triton.cdiv(M, block_m)
    # split K into ranges of whole tiles; never more ranges than tiles
    split = max(1, min(SPLIT_K, triton.cdiv(K, block_k)))
    k_per_split = max(1, triton.cdiv(triton.cdiv(K, split), block_k)) * block_k
    split = max(1, triton.cdiv(K, k_per_split))
    if split == 1:
        _gemv_kernel[(grid_m, 1, N)](a, b, y, M, K, k_per_split, a.stride(0), b.stride(0), b.stride(1),
                                     y.stride(0), y.stride(1), 0, BLOCK_M=block_m, BLOCK_K=block_k,
                                     CHUNK=CHUNK, num_warps=NUM_WARPS)
        return
    part = torch.empty((split, N, M), dtype=torch.float32, device=a.device)
    _gemv_kernel[(grid_m, split, N)](a, b, part, M, K, k_per_split, a.stride(0), b.stride(0), b.stride(1),
                                     part.stride(2), part.stride(1), part.stride(0), BLOCK_M=block_m,
                                     BLOCK_K=block_k, CHUNK=CHUNK, num_warps=NUM_WARPS)
    block_r = min(1024, triton.next_power_of_2(M))
    splits = triton.next_power_of_2(split)
    while splits * block_r > 8192 and block_r > 16:
        block_r //= 2
    _sum_splits_kernel[(triton.cdiv(M, block_r), N)](part, y, M, split, part.stride(0), part.stride(1),
                                                     y.stride(0), y.stride(1), BLOCK_R=block_r,
                                                     SPLITS=splits, num_warps=4)
'''


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init_args = "".join(f", {a}=None" for a in signature["init"])
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
    return f'''"""Matrix-vector product y = A @ x: kernelbrain gemv template ({knob_text}).

Blocked fp32 accumulation ([BLOCK_M, BLOCK_K] lanes, one tree reduction at the end){
        ", split over K with a deterministic second-pass sum" if knobs["strategy"] == "split_k" else ""
    }.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{chr(10).join(consts)}
{_KERNELS}

class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()

    def forward(self, {a_name}, {b_name}{rest}):
        a = {a_name}.contiguous()
        vector = {b_name}.dim() == 1
        b = {b_name}.unsqueeze(1) if vector else {b_name}
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"gemv wants A (M, K), x (K, N): got {{tuple(a.shape)}}, {{tuple(b.shape)}}")
        y = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        if y.numel():
            _launch(a, b, y)
        return y.squeeze(1) if vector else y
'''
