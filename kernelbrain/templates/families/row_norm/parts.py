"""The row-norm Triton parts layernorm and l2norm share (copied into a candidate by `templates.render`,
never imported by the generator): the tile helpers, then per strategy its kernels and launcher.

Every launcher takes 2-D contiguous views x2, y2 of rows of D elements, the optional affine weights w, b
(None: no affine), eps, then `layer` (True: LayerNorm, False: L2) and the strategy's knobs. See
`row_norm` for the strategies and the (count, mean, M2) statistics they carry.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# what every strategy applies to a tile: the row's shift and scale, then the optional affine weights
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


# per-lane Welford over [start, end) of one row, lanes merged exactly; shared by looped and split
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


@triton.jit
def _row_norm_registers_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, n_rows, D, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
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
               HAS_B)  # fmt: skip
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_registers(x2, y2, w, b, eps, layer, rows, max_block, num_warps):
    """Up to `rows` whole rows per program in registers, one read of x."""
    n_rows, D = x2.shape
    block = triton.next_power_of_2(D)
    if block > max_block:
        raise ValueError(f"registers holds whole rows: rows of {D} exceed {max_block} elements")
    rows = max(1, min(rows, triton.next_power_of_2(n_rows), max_block // block))
    _row_norm_registers_kernel[(triton.cdiv(n_rows, rows),)](
        x2, y2, w if w is not None else x2, b if b is not None else x2, n_rows, D, eps, ROWS=rows,
        BLOCK=block, LAYER=layer, HAS_W=w is not None, HAS_B=b is not None, num_warps=num_warps,
    )  # fmt: skip


@triton.jit
def _row_norm_looped_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, D, eps, BLOCK_N: tl.constexpr, LAYER: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * D
    y_row = y_ptr + row * D
    _n, mean, m2 = _chunk_stats(x_row, 0, D, BLOCK_N, LAYER)
    scale = _scale(m2, D, eps, LAYER)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, D, BLOCK_N):
        k = start + cols
        mask = k < D
        x = tl.load(x_row + k, mask=mask, other=0.0).to(tl.float32)
        y = _apply(x, mean, scale, w_ptr, b_ptr, k, mask, HAS_W, HAS_B)
        tl.store(y_row + k, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_looped(x2, y2, w, b, eps, layer, block_n, num_warps):
    """One row per program in tiles of up to `block_n`: a statistics sweep, then a normalising one."""
    n_rows, D = x2.shape
    block_n = min(block_n, triton.next_power_of_2(D))
    _row_norm_looped_kernel[(n_rows,)](
        x2, y2, w if w is not None else x2, b if b is not None else x2, D, eps, BLOCK_N=block_n, LAYER=layer,
        HAS_W=w is not None, HAS_B=b is not None, num_warps=num_warps,
    )  # fmt: skip


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
def _row_norm_split_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, D, chunk, n_chunks, eps, CHUNKS: tl.constexpr,
    BLOCK_N: tl.constexpr, LAYER: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
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
    _n, mu, m2_row = _merge(cnt, mean, m2)
    scale = _scale(m2_row, D, eps, LAYER)
    cols = tl.arange(0, BLOCK_N)
    for s in range(start, end, BLOCK_N):
        k = s + cols
        mask = k < end
        x = tl.load(x_ptr + row * D + k, mask=mask, other=0.0).to(tl.float32)
        y = _apply(x, mu, scale, w_ptr, b_ptr, k, mask, HAS_W, HAS_B)
        tl.store(y_ptr + row * D + k, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_split(x2, y2, w, b, eps, layer, block_n, split, num_warps):
    """Up to `split` programs per row: chunk statistics to a small buffer, then merge and normalise."""
    n_rows, D = x2.shape
    block_n = min(block_n, triton.next_power_of_2(D))
    # chunks of whole tiles; never more chunks than tiles
    n_chunks = max(1, min(split, triton.cdiv(D, block_n)))
    chunk = triton.cdiv(triton.cdiv(D, n_chunks), block_n) * block_n
    n_chunks = triton.cdiv(D, chunk)
    part = torch.empty((n_rows * n_chunks, 3), dtype=torch.float32, device=x2.device)
    _chunk_stats_kernel[(n_rows * n_chunks,)](
        x2, part, D, chunk, n_chunks, BLOCK_N=block_n, LAYER=layer, num_warps=num_warps
    )
    _row_norm_split_kernel[(n_rows * n_chunks,)](
        x2, y2, w if w is not None else x2, b if b is not None else x2, part, D, chunk, n_chunks, eps,
        CHUNKS=triton.next_power_of_2(n_chunks), BLOCK_N=block_n, LAYER=layer, HAS_W=w is not None,
        HAS_B=b is not None, num_warps=num_warps,
    )  # fmt: skip


def _layer_norm(x, normalized_shape, weight, bias, eps, launch, knobs):
    """LayerNorm of x over its trailing `normalized_shape` by `launch(x2, y2, w, b, eps, True, *knobs)`."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(f"layer norm over {shape} does not fit an input of shape {tuple(x.shape)}")
    d = 1
    for s in shape:
        d *= s
    xc = x.contiguous()
    y = torch.empty_like(xc)
    w = weight.contiguous() if weight is not None else None
    b = bias.contiguous() if bias is not None else None
    if y.numel():
        launch(xc.view(-1, d), y.view(-1, d), w, b, float(eps), True, *knobs)
    return y
