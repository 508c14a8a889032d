"""The pointwise family's Triton parts: real `@triton.jit` functions, copied into a candidate's module by
`templates.render` (read from this file's text; the generator never imports Triton). The candidate's
module defines `_body(v0, v1, v2, v3)`, the traced graph's elementwise chain in fp32 (composed by
families/pointwise); the kernels here load up to four inputs, call it, and store its result.

Activations are written for fp32 accuracy across the whole range: `_tanh` from exp of a non-positive
argument (no overflow), `_log1p` and `_expm1` with the classic correction so that small arguments keep
their digits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelbrain import candidate


@triton.jit
def chain_stub(v0, v1, v2, v3):
    """Where a kernel here (or reduce's, scan's, cross_entropy's) calls a traced chain (`_body`,
    `_prologue`, `_epilogue`): every candidate defines its own (render.chain), never this."""
    return v0


_body = chain_stub


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _log1p(x):
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _expm1(x):
    u = tl.exp(x)
    um1 = u - 1.0
    small = tl.abs(x) < 1e-5
    exact = tl.where(u == 1.0, x, um1 * x / tl.log(tl.where(u == 1.0, 2.0, u)))
    return tl.where(small, x + 0.5 * x * x, tl.where(tl.abs(x) > 0.5, um1, exact))


@triton.jit
def _softplus(x, beta, threshold):
    bx = x * beta
    return tl.where(bx > threshold, x, _log1p(tl.exp(tl.minimum(bx, threshold))) / beta)


@triton.jit
def _elu(x, alpha, scale, input_scale):
    return tl.where(x > 0, x * scale, _expm1(tl.minimum(x, 0.0) * input_scale) * (alpha * scale))


@triton.jit
def _gelu_erf(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _gelu_tanh(x):
    return 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def _log_sigmoid(x):
    return tl.minimum(x, 0.0) - _log1p(tl.exp(-tl.abs(x)))


@triton.jit
def _mish(x):
    return x * _tanh(_softplus(x, 1.0, 20.0))


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _pow(a, b):
    """a ** b as torch computes it for real tensors: a negative base takes an integral exponent's sign."""
    mag = tl.exp2(b * tl.log2(tl.abs(a)))
    odd = tl.abs(b - 2.0 * tl.floor(b * 0.5)) == 1.0  # an odd integer
    negative = tl.where(tl.floor(b) == b, tl.where(odd, -mag, mag), float("nan"))
    return tl.where(b == 0.0, 1.0, tl.where(a < 0, negative, mag))


@triton.jit
def _round(x):
    """Half to even, as torch.round."""
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie, tl.where(odd, r - 1.0, r), r)


@triton.jit
def _load(ptr, offs, mask):
    return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _flat_tile(y_ptr, x0, x1, x2, x3, n, tile, N_IN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.cast(tile, tl.int64) * BLOCK + tl.arange(0, BLOCK)  # tile: an int in a persistent loop
    mask = offs < n
    v0 = _load(x0, offs, mask)
    v1 = v0
    v2 = v0
    v3 = v0
    if N_IN > 1:
        v1 = _load(x1, offs, mask)
    if N_IN > 2:
        v2 = _load(x2, offs, mask)
    if N_IN > 3:
        v3 = _load(x3, offs, mask)
    tl.store(y_ptr + offs, _body(v0, v1, v2, v3).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _flat_kernel(y_ptr, x0, x1, x2, x3, n, N_IN: tl.constexpr, BLOCK: tl.constexpr):
    """Contiguous inputs of the output's shape: one tile of BLOCK elements a program."""
    _flat_tile(y_ptr, x0, x1, x2, x3, n, tl.program_id(0), N_IN, BLOCK)


@triton.jit
def _flat_persistent_kernel(y_ptr, x0, x1, x2, x3, n, N_IN: tl.constexpr, BLOCK: tl.constexpr):
    """The same tiles over a grid the GPU holds at once: each program takes every num_programs-th."""
    for tile in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        _flat_tile(y_ptr, x0, x1, x2, x3, n, tile, N_IN, BLOCK)


@triton.jit
def _strided_offset(rows, cols, d1, d2, s0, s1, s2, s3):
    """An input's element offsets for a [ROWS, BLOCK_C] tile of the output's four (collapsed) dims, rows
    over the first three: its strides are 0 where it broadcasts. Only the rows divide."""
    i2 = rows % d2
    r = rows // d2
    base = (r // d1) * s0 + (r % d1) * s1 + i2 * s2
    return base[:, None] + cols[None, :] * s3


@triton.jit
def _strided_kernel(
    y_ptr, x0, x1, x2, x3, n_rows, d1, d2, d3,
    a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3,
    N_IN: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Broadcast or strided inputs: each input's (a, b, c, e) strides over the output's four dims. A
    program takes ROWS rows (the first three dims) x BLOCK_C of the last: a division a row, not an
    element."""
    col_blocks = tl.cdiv(d3, BLOCK_C)
    rows = (tl.program_id(0) // col_blocks).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = (tl.program_id(0) % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < d3)[None, :]
    v0 = _load(x0, _strided_offset(rows, cols, d1, d2, a0, a1, a2, a3), mask)
    v1 = v0
    v2 = v0
    v3 = v0
    if N_IN > 1:
        v1 = _load(x1, _strided_offset(rows, cols, d1, d2, b0, b1, b2, b3), mask)
    if N_IN > 2:
        v2 = _load(x2, _strided_offset(rows, cols, d1, d2, c0, c1, c2, c3), mask)
    if N_IN > 3:
        v3 = _load(x3, _strided_offset(rows, cols, d1, d2, e0, e1, e2, e3), mask)
    out = rows[:, None] * d3 + cols[None, :]  # the output is contiguous
    tl.store(y_ptr + out, _body(v0, v1, v2, v3).to(y_ptr.dtype.element_ty), mask=mask)


MAX_DIMS = 4  # the strided kernel's dims after collapsing; more and the inputs are made contiguous


def _collapsed(shape: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Adjacent dims merged where every tensor (the contiguous output among them) steps through them as
    one; size-1 dims dropped."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        pairs = list(zip(out_strides, strides, strict=True))
        if out_shape and all(s[-1] == st[d] * shape[d] for s, st in pairs):
            out_shape[-1] *= shape[d]
            for s, st in zip(out_strides, strides, strict=True):
                s[-1] = st[d]
        else:
            out_shape.append(shape[d])
            for s, st in zip(out_strides, strides, strict=True):
                s.append(st[d])
    return out_shape, out_strides


def _launch(y, xs, block, num_warps, persistent_ctas):
    """y = _body(*xs), broadcast as torch broadcasts; persistent_ctas: programs per SM, 0 for a grid of
    one tile per program."""
    n = y.numel()
    if n == 0:
        return y
    xs = list(xs)
    n_in = len(xs)
    pad = xs + [xs[0]] * (4 - n_in)
    tiles = triton.cdiv(n, block)
    if all(x.shape == y.shape and x.is_contiguous() for x in xs):
        if persistent_ctas:
            sms = candidate.sm_count(y.device)
            grid = (min(tiles, sms * persistent_ctas),)
            _flat_persistent_kernel[grid](y, *pad, n, N_IN=n_in, BLOCK=block, num_warps=num_warps)
        else:
            _flat_kernel[(tiles,)](y, *pad, n, N_IN=n_in, BLOCK=block, num_warps=num_warps)
        return y
    every = [list(y.stride())] + [list(x.expand(y.shape).stride()) for x in xs]
    shape, strides = _collapsed(list(y.shape), every)
    if len(shape) > MAX_DIMS:  # rare: copies, then the flat kernel
        return _launch(y, [x.expand(y.shape).contiguous() for x in xs], block, num_warps, persistent_ctas)
    lead = MAX_DIMS - len(shape)
    shape = [1] * lead + shape
    per_input = [[0] * lead + s for s in strides[1:]]
    per_input += [per_input[0]] * (4 - n_in)
    flat = [s for st in per_input for s in st]
    block_c = min(block, triton.next_power_of_2(shape[3]))
    rows, n_rows = block // block_c, n // shape[3]
    grid = (triton.cdiv(n_rows, rows) * triton.cdiv(shape[3], block_c),)
    _strided_kernel[grid](y, *pad, n_rows, shape[1], shape[2], shape[3], *flat, N_IN=n_in, ROWS=rows,
                          BLOCK_C=block_c, num_warps=num_warps)  # fmt: skip
    return y
