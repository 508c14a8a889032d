"""The contraction family's Triton parts (copied into a candidate by `templates.render`, never imported by
the generator): y[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n], e1, e2, e3) over up to three batch
dims, every operand read through its strides (a transposed or broadcast operand is copied only where the
LAYOUT knob asks for a K- or M/N-contiguous copy, or presplit writes hi/lo planes).

`_contraction_kernel`: BLOCK_M x BLOCK_N output tiles (GROUP_M swizzled), K in BLOCK_K steps, the batch on
the grid's second axis, split-K slices on its third. PRECISION ("ieee", "tf32x3" or "presplit") chooses
the fp32 dot (SPLIT: fp32 operands); fp16/bf16 operands take a plain dot accumulating in fp32. The
candidate's `_epilogue` (the traced chain, emitted by `render.chain`) runs in `_finish` on the fp32 tile
of the whole K sum with the extra tensors loaded by their strides: in the GEMM itself, or with split-K
in `_split_k_sum`, which adds the slices' partial tiles in order first. A tile whose diagonals miss the
band where the output reads the product (a triu/tril masks the rest: `_meets_band`) skips the K loop.
`_contraction_launch` lays the operands out from their sources (plans the family computed from the
trace)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _dot_tile(a, b, a_lo, b_lo, acc, SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ b in fp32: exact ("ieee"), three TF32 dots of the hi/lo split ("tf32x3": split here in
    registers; "presplit": a and b are the hi planes, a_lo and b_lo the lo planes the launcher wrote),
    each K tile's three into a fresh accumulator added in fp32 (tensor cores truncate), or a plain dot
    of fp16/bf16."""
    if SPLIT:
        if PRECISION == "tf32x3":
            # low 13 of fp32's 23 mantissa bits cleared (-8192 == 0xFFFFE000): exact in TF32
            a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            part = tl.dot(a - a_hi, b_hi, input_precision="tf32")
            part = tl.dot(a_hi, b - b_hi, part, input_precision="tf32")
            acc += tl.dot(a_hi, b_hi, part, input_precision="tf32")
        elif PRECISION == "presplit":
            part = tl.dot(a_lo, b, input_precision="tf32")
            part = tl.dot(a, b_lo, part, input_precision="tf32")
            acc += tl.dot(a, b, part, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _extra(ptr, b0, b1, b2, rm, rn, s_b0, s_b1, s_b2, s_m, s_n, mask):
    """An epilogue tensor's values at the tile, in fp32 (strides 0 where it broadcasts)."""
    base = ptr + b0 * s_b0 + b1 * s_b1 + b2 * s_b2
    offs = rm.to(tl.int64)[:, None] * s_m + rn.to(tl.int64)[None, :] * s_n
    return tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _finish(acc, y_ptr, e1_ptr, e2_ptr, e3_ptr, b0, b1, b2, rm, rn, M, N, ROWS,
            sy_b0, sy_b1, sy_b2, sy_m, sy_n, s1_b0, s1_b1, s1_b2, s1_m, s1_n,
            s2_b0, s2_b1, s2_b2, s2_m, s2_n, s3_b0, s3_b1, s3_b2, s3_m, s3_n,
            EXTRAS: tl.constexpr):  # fmt: skip
    """The epilogue on the fp32 tile of the whole sum (its extra tensors read by their strides), stored.
    The chain's kb_d: each element's diagonal, its column less its row within ROWS (a triu/tril's)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    v1 = acc
    v2 = acc
    v3 = acc
    if EXTRAS >= 1:
        v1 = _extra(e1_ptr, b0, b1, b2, rm, rn, s1_b0, s1_b1, s1_b2, s1_m, s1_n, mask)
    if EXTRAS >= 2:
        v2 = _extra(e2_ptr, b0, b1, b2, rm, rn, s2_b0, s2_b1, s2_b2, s2_m, s2_n, mask)
    if EXTRAS >= 3:
        v3 = _extra(e3_ptr, b0, b1, b2, rm, rn, s3_b0, s3_b1, s3_b2, s3_m, s3_n, mask)
    kb_d = rn[None, :] - (rm % ROWS)[:, None]
    out = _epilogue(acc, v1, v2, v3, kb_d)  # noqa: F821 - the candidate's traced chain, rendered beside this
    y = y_ptr + b0 * sy_b0 + b1 * sy_b1 + b2 * sy_b2
    y += rm.to(tl.int64)[:, None] * sy_m + rn.to(tl.int64)[None, :] * sy_n
    tl.store(y, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _meets_band(pid_m, pid_n, M, N, ROWS, DIAG_LO: tl.constexpr, DIAG_HI: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Whether the tile holds an element whose diagonal (column less row within ROWS) lies in
    DIAG_LO..DIAG_HI (None: unbounded): from its rows' and columns' ranges, all of ROWS where its rows
    wrap past a multiple of ROWS."""
    m0 = pid_m * BLOCK_M
    m1 = tl.minimum(m0 + BLOCK_M, M) - 1
    wraps = m0 // ROWS != m1 // ROWS
    r0 = tl.where(wraps, 0, m0 % ROWS)
    r1 = tl.where(wraps, ROWS - 1, m1 % ROWS)
    n0 = pid_n * BLOCK_N
    lo = n0 - r1
    hi = tl.minimum(n0 + BLOCK_N, N) - 1 - r0
    if DIAG_LO is not None:
        lo = tl.maximum(lo, DIAG_LO)
    if DIAG_HI is not None:
        hi = tl.minimum(hi, DIAG_HI)
    return lo <= hi


@triton.jit
def _contraction_kernel(a_ptr, b_ptr, y_ptr, e1_ptr, e2_ptr, e3_ptr, M, N, K, B1, B2, K_PER, A_LO, B_LO, ROWS,
                        sa_b0, sa_b1, sa_b2, sa_m, sa_k, sb_b0, sb_b1, sb_b2, sb_k, sb_n,
                        sy_split, sy_b0, sy_b1, sy_b2, sy_m, sy_n,
                        s1_b0, s1_b1, s1_b2, s1_m, s1_n, s2_b0, s2_b1, s2_b2, s2_m, s2_n,
                        s3_b0, s3_b1, s3_b2, s3_m, s3_n,
                        EXTRAS: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                        PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SKIP: tl.constexpr,
                        DIAG_LO: tl.constexpr, DIAG_HI: tl.constexpr):  # fmt: skip
    """One output tile over K[split * K_PER, +K_PER) (the grid's third axis: split-K). PARTIAL: the fp32
    sum stored to the split's plane of the workspace y_ptr (the epilogue waits for `_split_k_sum`);
    otherwise the epilogue applied and y stored. A_LO, B_LO: presplit's offsets from hi to lo planes.
    SKIP: a tile with no diagonal in DIAG_LO..DIAG_HI (the output reads the sum nowhere in it, a
    triu/tril masks it) runs no K step: its epilogue runs on zeros, its partial tile is not stored."""
    # GROUP_M row blocks walk the column blocks together: the B tiles they share stay in L2
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    b2 = batch % B2
    b1 = (batch // B2) % B1
    b0 = batch // (B2 * B1)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_start = split * K_PER
    k_end = tl.minimum(K, k_start + K_PER)
    a_tile = a_ptr + b0 * sa_b0 + b1 * sa_b1 + b2 * sa_b2
    a_tile += rm.to(tl.int64)[:, None] * sa_m + (k_start + rk).to(tl.int64)[None, :] * sa_k
    b_tile = b_ptr + b0 * sb_b0 + b1 * sb_b1 + b2 * sb_b2
    b_tile += (k_start + rk).to(tl.int64)[:, None] * sb_k + rn.to(tl.int64)[None, :] * sb_n
    m_mask = rm[:, None] < M
    n_mask = rn[None, :] < N
    k_stop = k_end
    if SKIP:
        k_stop = tl.where(
            _meets_band(pid_m, pid_n, M, N, ROWS, DIAG_LO, DIAG_HI, BLOCK_M, BLOCK_N), k_end, k_start
        )
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        k_left = k_end - k0
        a_mask = m_mask & (rk[None, :] < k_left)
        b_mask = (rk[:, None] < k_left) & n_mask
        a = tl.load(a_tile, mask=a_mask, other=0.0)
        b = tl.load(b_tile, mask=b_mask, other=0.0)
        a_lo = a
        b_lo = b
        if SPLIT and PRECISION == "presplit":
            a_lo = tl.load(a_tile + A_LO, mask=a_mask, other=0.0)
            b_lo = tl.load(b_tile + B_LO, mask=b_mask, other=0.0)
        acc = _dot_tile(a, b, a_lo, b_lo, acc, SPLIT, PRECISION)
        a_tile += BLOCK_K * sa_k
        b_tile += BLOCK_K * sb_k
    if PARTIAL:
        part = y_ptr + split.to(tl.int64) * sy_split + b0 * sy_b0 + b1 * sy_b1 + b2 * sy_b2
        part += rm.to(tl.int64)[:, None] * sy_m + rn.to(tl.int64)[None, :] * sy_n
        m_stored = M
        if SKIP:  # a skipped tile stores no row
            m_stored = tl.where(k_stop > k_start, M, 0)
        tl.store(part, acc, mask=(rm[:, None] < m_stored) & n_mask)
    else:
        _finish(acc, y_ptr, e1_ptr, e2_ptr, e3_ptr, b0, b1, b2, rm, rn, M, N, ROWS,
                sy_b0, sy_b1, sy_b2, sy_m, sy_n, s1_b0, s1_b1, s1_b2, s1_m, s1_n,
                s2_b0, s2_b1, s2_b2, s2_m, s2_n, s3_b0, s3_b1, s3_b2, s3_m, s3_n, EXTRAS)  # fmt: skip


@triton.jit
def _split_k_sum(w_ptr, y_ptr, e1_ptr, e2_ptr, e3_ptr, M, N, B1, B2, SPLITS, ROWS,
                 sw_split, sw_b0, sw_b1, sw_b2, sw_m, sw_n, sy_b0, sy_b1, sy_b2, sy_m, sy_n,
                 s1_b0, s1_b1, s1_b2, s1_m, s1_n, s2_b0, s2_b1, s2_b2, s2_m, s2_n,
                 s3_b0, s3_b1, s3_b2, s3_m, s3_n,
                 EXTRAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SKIP: tl.constexpr, DIAG_LO: tl.constexpr, DIAG_HI: tl.constexpr):  # fmt: skip
    """Split-K's second launch: the splits' fp32 partial tiles summed in split order (deterministic),
    then the epilogue once on the sum, and y stored. SKIP: only the elements with a diagonal in
    DIAG_LO..DIAG_HI are read (the GEMM stored no tile without one), the rest sum to zero."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    b2 = batch % B2
    b1 = (batch // B2) % B1
    b0 = batch // (B2 * B1)
    grid_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    w = w_ptr + b0 * sw_b0 + b1 * sw_b1 + b2 * sw_b2
    w += rm.to(tl.int64)[:, None] * sw_m + rn.to(tl.int64)[None, :] * sw_n
    read = mask
    if SKIP:
        diagonal = rn[None, :] - (rm % ROWS)[:, None]
        if DIAG_LO is not None:
            read = read & (diagonal >= DIAG_LO)
        if DIAG_HI is not None:
            read = read & (diagonal <= DIAG_HI)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(w + s * sw_split, mask=read, other=0.0)
    _finish(acc, y_ptr, e1_ptr, e2_ptr, e3_ptr, b0, b1, b2, rm, rn, M, N, ROWS,
            sy_b0, sy_b1, sy_b2, sy_m, sy_n, s1_b0, s1_b1, s1_b2, s1_m, s1_n,
            s2_b0, s2_b1, s2_b2, s2_m, s2_n, s3_b0, s3_b1, s3_b2, s3_m, s3_n, EXTRAS)  # fmt: skip


def _operand(srcs, plan):
    """An operand as a [pieces..., rows, cols] view of its source and the strides the kernel reads it
    by: plan = (source, order, groups), each group the source dims one logical dim merges (None: a
    batch piece the operand broadcasts over, stride 0). A copy only where the merged dims do not
    flatten by their strides."""
    src, order, groups = plan
    t = srcs[src].permute(order)
    sizes = [1 if g is None else math.prod(srcs[src].shape[d] for d in g) for g in groups]
    t = t.reshape(sizes)
    strides = [0 if g is None else s for g, s in zip(groups, t.stride(), strict=True)]
    return t, sizes, strides


def _size(srcs, atoms):
    return math.prod(srcs[s].shape[d] for s, d in atoms)


def _padded(strides, pieces):
    """Strides of [b0, b1, b2, m, n]: the batch pieces padded in front to three."""
    return [0] * (3 - pieces) + list(strides)


@triton.jit
def _split_planes(x_ptr, n, BLOCK: tl.constexpr):
    """presplit's planes in place: x[:n] becomes hi (its low 13 mantissa bits cleared: exact in TF32) and
    x[n:2n] lo = x - hi (exact in fp32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    tl.store(x_ptr + offs, hi, mask=mask)
    tl.store(x_ptr + n + offs, x - hi, mask=mask)


def _flipped(t: torch.Tensor, last: bool) -> torch.Tensor:
    """t itself where its last dim is to be the contiguous one (`last`), else its last two dims swapped."""
    return t if last else t.transpose(-1, -2)


def _laid_out(t, last, planes):
    """t ([..., rows, cols]) with its last dim contiguous (`last`) or its rows dim, and the offset from
    a hi element to its lo: planes 1, a view where t already is so (else a copy), offset 0; planes 2,
    presplit's copy of t as hi and lo planes (`_split_planes`)."""
    t = t.detach()  # a parameter's copy for the kernel, not for autograd
    if planes == 1:
        return _flipped(_flipped(t, last).contiguous(), last), 0
    raw = t.new_empty([2, *_flipped(t, last).shape])
    out = _flipped(raw, last)
    out[0].copy_(t)
    n = t.numel()
    _split_planes[(triton.cdiv(n, 1024),)](raw, n, BLOCK=1024)
    return out[0], out.stride(0)


def _contraction_launch(srcs, a_plan, b_plan, out_axes, extras, triangle, dtype, precision, layout, split_k,
                        block_m, block_n, block_k, group_m, num_warps, num_stages):  # fmt: skip
    """y = epilogue(A @ B, extras...) from the sources: plans as `_operand` reads them, `out_axes` the
    output's axes as (source, dim) atoms, `extras` (tensor, axes of the shape it meets the chain at),
    `triangle` the epilogue's triu/tril (None: none): the atoms of the rows it reads and the band of
    diagonals where the output reads the sum (None: unbounded), tiles outside it skipping the K loop.
    layout: "strided" reads the operands by their strides; "k" copies each one that is not K-contiguous
    (tensor cores' TF32 dots read both K-major), "mn" copies A M-contiguous and B N-contiguous (the
    FMA dot's outer products); presplit writes hi/lo planes ("strided": as "k"). split_k > 1: K in that
    many slices, fp32 partial tiles to a workspace, summed in order by `_split_k_sum`, which applies the
    epilogue."""
    a, a_sizes, a_strides = _operand(srcs, a_plan)
    b, b_sizes, b_strides = _operand(srcs, b_plan)
    pieces = len(a_sizes) - 2
    batch = [max(x, y) for x, y in zip(a_sizes[:pieces], b_sizes[:pieces], strict=True)]
    M, K = a_sizes[-2:]
    N = b_sizes[-1]
    if dtype is None:
        dtype = a.dtype if a.dtype == b.dtype else torch.float32
    y = torch.empty([_size(srcs, axis) for axis in out_axes], dtype=dtype, device=a.device)
    if y.numel() == 0:
        return y
    split = a.dtype == torch.float32
    if precision == "presplit" and not (split and b.dtype == torch.float32):
        precision = "tf32x3"
    planes = 2 if precision == "presplit" else 1
    if planes == 2 and layout == "strided":
        layout = "k"
    a_lo = b_lo = 0
    if layout != "strided":
        a, a_lo = _laid_out(a, layout == "k", planes)
        b, b_lo = _laid_out(b, layout != "k", planes)
        # broadcast batch pieces (size 1 in the tensor) keep their stride 0
        a_strides = [0 if s == 0 else t for s, t in zip(a_strides, a.stride(), strict=True)]
        b_strides = [0 if s == 0 else t for s, t in zip(b_strides, b.stride(), strict=True)]
    logical = [*batch, M, N]
    y_l = y.view(logical)
    tensors, strides = [], []
    for t, axes in extras:
        e = t.expand([_size(srcs, axis) for axis in axes]).reshape(logical)
        tensors.append(e)
        strides += _padded(e.stride(), pieces)
    while len(tensors) < 3:
        tensors.append(y_l)
        strides += [0] * 5
    rows, band = M, [None, None]
    if triangle is not None:
        rows, band = _size(srcs, triangle["rows"]), triangle["diagonals"]
    skip = {"SKIP": band != [None, None], "DIAG_LO": band[0], "DIAG_HI": band[1]}
    bm = min(block_m, max(16, triton.next_power_of_2(M)))
    bn = min(block_n, max(16, triton.next_power_of_2(N)))
    bk = min(block_k, max(16, triton.next_power_of_2(K)))
    # K slices of whole BLOCK_K steps, none empty
    k_per = triton.cdiv(triton.cdiv(K, max(1, split_k)), bk) * bk
    splits = triton.cdiv(K, k_per)
    full = [1, 1, 1, *batch][-3:]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), full[0] * full[1] * full[2], splits)
    out = y_l if splits == 1 else torch.empty([splits, *logical], dtype=torch.float32, device=a.device)
    out_strides = [out.stride(0) if splits > 1 else 0, *_padded(out.stride()[-2 - pieces :], pieces)]
    _contraction_kernel[grid](a, b, out, *tensors, M, N, K, full[1], full[2], k_per, a_lo, b_lo, rows,
                              *_padded(a_strides, pieces), *_padded(b_strides, pieces), *out_strides,
                              *strides, EXTRAS=len(extras), SPLIT=split, PRECISION=precision,
                              PARTIAL=splits > 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m,
                              **skip, num_warps=num_warps, num_stages=num_stages)  # fmt: skip
    if splits > 1:  # 16 x 32 tiles: a short, memory-bound pass over the partial sums
        grid = (triton.cdiv(M, 16) * triton.cdiv(N, 32), grid[1])
        _split_k_sum[grid](out, y_l, *tensors, M, N, full[1], full[2], splits, rows, *out_strides,
                           *_padded(y_l.stride(), pieces), *strides, EXTRAS=len(extras), BLOCK_M=16,
                           BLOCK_N=32, **skip, num_warps=4)  # fmt: skip
    return y
