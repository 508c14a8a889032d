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

A family renders ROW_NORM_SOURCE (consts LAYER, NUM_WARPS, MAX_BLOCK and the strategy's knobs) and
calls `_launch(x2, y2, weight, bias, eps)` on 2-D contiguous views; weight and bias may be None.
"""

from __future__ import annotations

from typing import Any

# elements a program may hold in registers; past this Triton spends minutes compiling a kernel that spills
MAX_BLOCK = 32768
# register-tile elements per thread: above this the tile, its fp32 copy and the weights no longer fit
MAX_PER_THREAD = 64
FLOAT_DTYPES = {"float32", "float16", "bfloat16"}

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


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile(spec: dict, knobs: dict[str, Any]) -> int | None:
    """Register-tile elements a program holds at the traced row length (None: unknown length).

    `n_cols` is the exact row length D; `min_cols` a lower bound when the trace cannot tell D (the
    normalised dims of F.layer_norm are not recorded, but D is at least the last dim)."""
    d = spec.get("n_cols") or spec.get("min_cols")
    if knobs["strategy"] == "registers":
        return _next_pow2(d) * knobs["rows"] if d else None
    return min(knobs["block_n"], _next_pow2(d)) if d else knobs["block_n"]


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """A program's register tile must fit MAX_BLOCK elements and MAX_PER_THREAD per thread."""
    if knobs["strategy"] == "split" and knobs["split"] < 2:
        return False
    t = tile(spec, knobs)
    if t is None:
        return True  # row length unknown: the launcher refuses at run time what does not fit
    return t <= MAX_BLOCK and t <= MAX_PER_THREAD * 32 * knobs["num_warps"]


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    strategy, warps = k["strategy"], k["num_warps"]
    if move == "registers":
        return None if strategy == "registers" else {"strategy": "registers", "rows": 1, "num_warps": warps}
    if move == "more_warps":
        return {**k, "num_warps": warps * 2} if warps < 16 else None
    if move == "fewer_warps":
        return {**k, "num_warps": warps // 2} if warps > 1 else None
    if move == "more_rows":
        return {**k, "rows": k["rows"] * 2} if strategy == "registers" and k["rows"] < 32 else None
    if move == "more_splits":
        if strategy == "split":
            return {**k, "split": k["split"] * 2} if k["split"] < 64 else None
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
        return {**k, "block_n": k["block_n"] // 2} if k["block_n"] > 128 else None
    if move == "larger_tiles":
        if strategy == "registers":
            return None
        return {**k, "block_n": k["block_n"] * 2} if k["block_n"] < 16384 else None
    raise ValueError(f"unknown move {move!r}")


def consts(knobs: dict[str, Any], layer: bool) -> list[str]:
    """The module constants ROW_NORM_SOURCE[strategy] reads."""
    out = [f"LAYER = {layer}", f"NUM_WARPS = {knobs['num_warps']}", f"MAX_BLOCK = {MAX_BLOCK}"]
    out += [f"{name.upper()} = {knobs[name]}" for name in ("rows", "block_n", "split") if name in knobs]
    return out


# what every strategy applies to a tile: the row's shift and scale, then the optional affine weights
_APPLY = """
@triton.jit
def _apply(x, shift, scale, w_ptr, b_ptr, cols, col_mask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    y = (x - shift) * scale
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _scale(m2, D, eps, LAYER: tl.constexpr):
    # LayerNorm: 1 / sqrt(var + eps); L2: 1 / max(||x||, eps), M2 holding the sum of squares
    scale = 1.0 / tl.maximum(tl.sqrt(m2), eps)
    if LAYER:
        scale = 1.0 / tl.sqrt(m2 / D + eps)
    return scale
"""

# per-lane Welford over [start, end) of one row, lanes merged exactly; shared by looped and split
_STATS = """
@triton.jit
def _merge(cnt, mean, m2):
    n = tl.sum(cnt, axis=0)
    mu = tl.sum(cnt * mean, axis=0) / tl.maximum(n, 1.0)
    d = mean - mu
    return n, mu, tl.sum(m2, axis=0) + tl.sum(cnt * d * d, axis=0)


@triton.jit
def _chunk_stats(x_row, start, end, BLOCK_N: tl.constexpr, LAYER: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    cnt = tl.zeros([BLOCK_N], tl.float32)
    mean = tl.zeros([BLOCK_N], tl.float32)
    m2 = tl.zeros([BLOCK_N], tl.float32)
    for s in range(start, end, BLOCK_N):
        k = s + cols
        mask = k < end
        x = tl.load(x_row + k, mask=mask, other=0.0).to(tl.float32)
        if LAYER:
            cnt += mask.to(tl.float32)
            delta = x - mean
            mean += tl.where(mask, delta / tl.maximum(cnt, 1.0), 0.0)
            m2 += tl.where(mask, delta * (x - mean), 0.0)
        else:
            m2 += x * x
    return _merge(cnt, mean, m2)
"""

_LAUNCH_ARGS = "w if w is not None else x2, b if b is not None else x2"

ROW_NORM_SOURCE = {
    "registers": _APPLY
    + """
@triton.jit
def _row_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, n_rows, D, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                     LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < D
    mask = (rows[:, None] < n_rows) & col_mask[None, :]
    offs = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # exact two-pass statistics over the registers: the centred values never leave them
    shift = tl.zeros([ROWS], tl.float32)
    if LAYER:
        shift = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - shift[:, None], 0.0)
    scale = _scale(tl.sum(xc * xc, axis=1), D, eps, LAYER)
    y = _apply(x, shift[:, None], scale[:, None], w_ptr, b_ptr, cols[None, :], col_mask[None, :], HAS_W,
               HAS_B)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x2, y2, w, b, eps):
    n_rows, D = x2.shape
    block = triton.next_power_of_2(D)
    if block > MAX_BLOCK:
        raise ValueError(f"registers holds whole rows: rows of {D} exceed {MAX_BLOCK} elements")
    rows = max(1, min(ROWS, triton.next_power_of_2(n_rows), MAX_BLOCK // block))
    _row_norm_kernel[(triton.cdiv(n_rows, rows),)](x2, y2, """
    + _LAUNCH_ARGS
    + """, n_rows, D, eps, ROWS=rows,
                                                    BLOCK=block, LAYER=LAYER, HAS_W=w is not None,
                                                    HAS_B=b is not None, num_warps=NUM_WARPS)
""",
    "looped": _APPLY
    + _STATS
    + """
@triton.jit
def _row_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, D, eps, BLOCK_N: tl.constexpr, LAYER: tl.constexpr,
                     HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * D
    y_row = y_ptr + row * D
    n, mean, m2 = _chunk_stats(x_row, 0, D, BLOCK_N, LAYER)
    scale = _scale(m2, D, eps, LAYER)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, D, BLOCK_N):
        k = start + cols
        mask = k < D
        x = tl.load(x_row + k, mask=mask, other=0.0).to(tl.float32)
        y = _apply(x, mean, scale, w_ptr, b_ptr, k, mask, HAS_W, HAS_B)
        tl.store(y_row + k, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x2, y2, w, b, eps):
    n_rows, D = x2.shape
    block_n = min(BLOCK_N, triton.next_power_of_2(D))
    _row_norm_kernel[(n_rows,)](x2, y2, """
    + _LAUNCH_ARGS
    + """, D, eps, BLOCK_N=block_n, LAYER=LAYER,
                                HAS_W=w is not None, HAS_B=b is not None, num_warps=NUM_WARPS)
""",
    "split": _APPLY
    + _STATS
    + """
@triton.jit
def _chunk_stats_kernel(x_ptr, part_ptr, D, chunk, n_chunks, BLOCK_N: tl.constexpr, LAYER: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    start = (pid % n_chunks) * chunk
    n, mean, m2 = _chunk_stats(x_ptr + row * D, start, tl.minimum(start + chunk, D), BLOCK_N, LAYER)
    part = part_ptr + pid.to(tl.int64) * 3
    tl.store(part, n)
    tl.store(part + 1, mean)
    tl.store(part + 2, m2)


@triton.jit
def _row_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, D, chunk, n_chunks, eps, CHUNKS: tl.constexpr,
                     BLOCK_N: tl.constexpr, LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    start = (pid % n_chunks) * chunk
    end = tl.minimum(start + chunk, D)
    # every chunk's program merges its row's partials in the same fixed order: identical statistics
    i = tl.arange(0, CHUNKS)
    parts = part_ptr + (row * n_chunks + i) * 3
    live = i < n_chunks
    cnt = tl.load(parts, mask=live, other=0.0)
    mean = tl.load(parts + 1, mask=live, other=0.0)
    m2 = tl.load(parts + 2, mask=live, other=0.0)
    n, mu, m2_row = _merge(cnt, mean, m2)
    scale = _scale(m2_row, D, eps, LAYER)
    cols = tl.arange(0, BLOCK_N)
    for s in range(start, end, BLOCK_N):
        k = s + cols
        mask = k < end
        x = tl.load(x_ptr + row * D + k, mask=mask, other=0.0).to(tl.float32)
        y = _apply(x, mu, scale, w_ptr, b_ptr, k, mask, HAS_W, HAS_B)
        tl.store(y_ptr + row * D + k, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x2, y2, w, b, eps):
    n_rows, D = x2.shape
    block_n = min(BLOCK_N, triton.next_power_of_2(D))
    # chunks of whole tiles; never more chunks than tiles
    n_chunks = max(1, min(SPLIT, triton.cdiv(D, block_n)))
    chunk = triton.cdiv(triton.cdiv(D, n_chunks), block_n) * block_n
    n_chunks = triton.cdiv(D, chunk)
    part = torch.empty((n_rows * n_chunks, 3), dtype=torch.float32, device=x2.device)
    _chunk_stats_kernel[(n_rows * n_chunks,)](x2, part, D, chunk, n_chunks, BLOCK_N=block_n, LAYER=LAYER,
                                              num_warps=NUM_WARPS)
    _row_norm_kernel[(n_rows * n_chunks,)](x2, y2, """
    + _LAUNCH_ARGS
    + """, part, D, chunk, n_chunks, eps,
                                           CHUNKS=triton.next_power_of_2(n_chunks), BLOCK_N=block_n,
                                           LAYER=LAYER, HAS_W=w is not None, HAS_B=b is not None,
                                           num_warps=NUM_WARPS)
""",
}
