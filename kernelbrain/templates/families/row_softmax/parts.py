"""The row_softmax family's Triton parts (copied into a candidate by `templates.render`, never imported by
the generator): a kernel and a launcher per strategy, each launcher taking the knobs as arguments.

Rows are those of a contiguous [n_rows, n_cols] view, the softmax dim last. `single_pass`,
`multi_row` and `online` keep one program's rows to themselves; `split_row` (`_softmax_kernel`) and
`deferred` (`_softmax_kernel_deferred`) split a row into chunks whose programs exchange their
statistics through `_publish` and `_row_stats`, and launch through `_launch_split`, which warms up and
launches the candidate's `_softmax_kernel` (deferred's candidate binds that name to its own kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelbrain import candidate

CTAS_PER_SM = 4  # programs asked of an SM: the candidate defines its own, from its knob


@triton.jit
def _softmax_kernel_single_pass(
    x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr, LOG: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    e = tl.exp(z)
    s = tl.sum(e, axis=0)
    y = z - tl.log(s) if LOG else e / s
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_single_pass(x2, y2, log, num_warps, max_block):
    """y2 = softmax(x2) over its rows, each row whole in one program's registers."""
    n_rows, n_cols = x2.shape
    block = triton.next_power_of_2(n_cols)
    if block > max_block:
        raise ValueError(f"single_pass keeps a whole row in registers: rows of {n_cols} exceed {max_block}")
    _softmax_kernel_single_pass[(n_rows,)](
        x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK=block, LOG=log, num_warps=num_warps
    )


@triton.jit
def _softmax_kernel_online(
    x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr, LOG: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    cols = tl.arange(0, BLOCK_N)
    # one sweep keeps a running max m and a running sum s of exp(x - m), rescaled when m grows
    m = tl.full([BLOCK_N], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        scale = tl.where(m_new == -float("inf"), 0.0, tl.exp(m - m_new))
        s = s * scale + tl.where(mask, tl.exp(x - m_new), 0.0)
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(s * tl.where(m == -float("inf"), 0.0, tl.exp(m - m_row)), axis=0)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
        z = x - m_row
        y = z - tl.log(s_row) if LOG else tl.exp(z) / s_row
        tl.store(y_ptr + row * stride_y + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_online(x2, y2, block_n, log, num_warps):
    """y2 = softmax(x2) over its rows, a program a row sweeping it in tiles of up to `block_n`."""
    n_rows, n_cols = x2.shape
    block = min(block_n, triton.next_power_of_2(n_cols))
    _softmax_kernel_online[(n_rows,)](
        x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK_N=block, LOG=log, num_warps=num_warps
    )


@triton.jit
def _softmax_kernel_multi_row(
    x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    LOG: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(z)
    s = tl.sum(e, axis=1)[:, None]
    y = z - tl.log(s) if LOG else e / s
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_multi_row(x2, y2, rows, log, num_warps, max_block):
    """y2 = softmax(x2) over its rows, `rows` whole rows in each program's registers."""
    n_rows, n_cols = x2.shape
    block = triton.next_power_of_2(n_cols)
    if rows * block > max_block:
        raise ValueError(f"multi_row holds {rows} rows in registers: {n_cols} > {max_block // rows}")
    _softmax_kernel_multi_row[(triton.cdiv(n_rows, rows),)](
        x2, y2, n_rows, n_cols, x2.stride(0), y2.stride(0), ROWS=rows, BLOCK=block, LOG=log,
        num_warps=num_warps,
    )  # fmt: skip


# split_row and deferred exchange each chunk's statistics alike
@triton.jit
def _publish(x, mask, item, row, pm_ptr, ps_ptr, cnt_ptr, RELEASE: tl.constexpr):
    # a chunk's max and sum of exponentials; RELEASE (one launch): then counted in its row's total
    m = tl.max(x, axis=0)
    tl.store(pm_ptr + item, m)
    tl.store(ps_ptr + item, tl.sum(tl.where(mask, tl.exp(x - m), 0.0), axis=0))
    if RELEASE:
        tl.debug_barrier()  # the chunk's statistics are written before the count says so
        tl.atomic_add(cnt_ptr + row, 1, sem="release")


@triton.jit
def _row_stats(pm_ptr, ps_ptr, cnt_ptr, row, n_chunks, parts, WAIT: tl.constexpr):
    # the row's max and sum of exponentials from its chunks'; WAIT (one launch): once all are counted
    if WAIT:
        spins = 0
        while (tl.atomic_add(cnt_ptr + row, 0, sem="acquire") < n_chunks) & (spins < 1000000):
            spins += 1
    # volatile: the other chunks' statistics were written by other SMs, past this one's L1
    pm = tl.load(pm_ptr + row * n_chunks + parts, mask=parts < n_chunks, other=-float("inf"), volatile=True)
    ps = tl.load(ps_ptr + row * n_chunks + parts, mask=parts < n_chunks, other=0.0, volatile=True)
    m_row = tl.max(pm, axis=0)
    return m_row, tl.sum(tl.where(parts < n_chunks, ps * tl.exp(pm - m_row), 0.0), axis=0)


@triton.jit
def _chunk(x_ptr, item, n_chunks, n_cols, n_items, stride_x, cols, BLOCK: tl.constexpr):
    # one BLOCK chunk of a row, in fp32; columns past the row and items past the end read as -inf
    row = item // n_chunks
    c = (item % n_chunks) * BLOCK + cols
    # all false once item >= n_items (clamped first: (n_items - item) * BLOCK would overflow int32)
    mask = (c < n_cols) & (cols < tl.minimum(n_items - item, 1) * BLOCK)
    return tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=-float("inf")).to(tl.float32)


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr, pm_ptr, ps_ptr, cnt_ptr, n_cols, n_chunks, n_items, stride_x, stride_y,
    CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    # split_row. PHASE 0: the whole job in one launch (GPU); 1: chunk statistics only; 2: normalisation
    # only. PREFETCH (PHASE 0): the next item's chunk is loaded before the wait for this row's other
    # chunks, so the SM keeps reading while it waits instead of draining its loads once per round
    cols = tl.arange(0, BLOCK)
    parts = tl.arange(0, CHUNKS_P2)
    step = tl.num_programs(0)
    if PREFETCH and PHASE == 0:
        x_next = _chunk(x_ptr, tl.program_id(0), n_chunks, n_cols, n_items, stride_x, cols, BLOCK)
    for item in range(tl.program_id(0), n_items, step):
        row = item // n_chunks
        c = (item % n_chunks) * BLOCK + cols
        mask = c < n_cols
        if PREFETCH and PHASE == 0:
            x = x_next
        else:
            x = _chunk(x_ptr, item, n_chunks, n_cols, n_items, stride_x, cols, BLOCK)
        if PHASE != 2:
            _publish(x, mask, item, row, pm_ptr, ps_ptr, cnt_ptr, PHASE == 0)
        if PREFETCH and PHASE == 0:
            x_next = _chunk(x_ptr, item + step, n_chunks, n_cols, n_items, stride_x, cols, BLOCK)
        if PHASE != 1:
            m_row, s_row = _row_stats(pm_ptr, ps_ptr, cnt_ptr, row, n_chunks, parts, PHASE == 0)
            z = x - m_row
            y = z - tl.log(s_row) if LOG else tl.exp(z) / s_row
            tl.store(y_ptr + row.to(tl.int64) * stride_y + c, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_kernel_deferred(
    x_ptr, y_ptr, pm_ptr, ps_ptr, cnt_ptr, n_cols, n_chunks, n_items, stride_x, stride_y,
    CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr,
    DEPTH: tl.constexpr,
):  # fmt: skip
    # PHASE 0: the whole job in one launch (GPU); 1: chunk statistics only; 2: normalisation only.
    # Iteration t publishes item t's statistics, then normalises item t - DEPTH * step. That row's
    # chunks were all published by iteration t - DEPTH + 1 <= t (the grid holds a whole row: step >=
    # n_chunks), and every program publishes before it waits, so the waits form no cycle.
    cols = tl.arange(0, BLOCK)
    parts = tl.arange(0, CHUNKS_P2)
    step = tl.num_programs(0)
    lag = DEPTH * step if PHASE == 0 else 0
    for it in range(tl.program_id(0), n_items + lag, step):
        if PHASE != 2:  # noqa: SIM102 (a constexpr's branch, compiled out, around a runtime one)
            if it < n_items:
                row = it // n_chunks
                c = (it % n_chunks) * BLOCK + cols
                mask = c < n_cols
                x = tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=-float("inf"),
                            eviction_policy="evict_last").to(tl.float32)  # fmt: skip
                _publish(x, mask, it, row, pm_ptr, ps_ptr, cnt_ptr, PHASE == 0)
        if PHASE != 1:
            j = it - lag
            if j >= 0:
                row = j // n_chunks
                c = (j % n_chunks) * BLOCK + cols
                mask = c < n_cols
                m_row, s_row = _row_stats(pm_ptr, ps_ptr, cnt_ptr, row, n_chunks, parts, PHASE == 0)
                x = tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)  # fmt: skip
                z = x - m_row
                y = z - tl.log(s_row) if LOG else tl.exp(z) / s_row
                tl.store(y_ptr + row.to(tl.int64) * stride_y + c, y.to(y_ptr.dtype.element_ty), mask=mask,
                         eviction_policy="evict_first")  # fmt: skip


# split_row and deferred launch alike: one waiting launch where every program of the grid can run at
# once (kernelbrain.candidate.programs_per_sm: CTAS_PER_SM, or fewer where the compiled kernel does not
# fit that many; a program waiting on one that never started would spin out its bound, then normalise
# with a row's statistics half made), else two


def _launch_split(x2, y2, block_n, log, num_warps, knob, rounds):
    """y2 = softmax(x2) over its rows, split in chunks of up to `block_n` by `_softmax_kernel`; `knob`:
    that kernel's own constexpr (split_row's prefetch, deferred's depth). `rounds` (split_row): the
    waiting grid holds whole rows, every chunk of a round's rows at once; else (deferred) as many
    programs as run at once, which must hold one row."""
    n_rows, n_cols = x2.shape
    block = min(block_n, triton.next_power_of_2(n_cols))
    n_chunks = triton.cdiv(n_cols, block)
    n_items = n_rows * n_chunks
    pm = torch.empty(n_items, device=x2.device, dtype=torch.float32)
    ps = torch.empty(n_items, device=x2.device, dtype=torch.float32)
    meta = dict(CHUNKS_P2=triton.next_power_of_2(n_chunks), BLOCK=block, LOG=log, **knob, num_warps=num_warps)
    if x2.is_cuda:
        cnt = torch.zeros(n_rows, device=x2.device, dtype=torch.int32)
        run = (x2, y2, pm, ps, cnt, n_cols, n_chunks, n_items, x2.stride(0), y2.stride(0))
        per_sm = candidate.programs_per_sm(_softmax_kernel, *run, cap=CTAS_PER_SM, PHASE=0, **meta)
        slots = candidate.sm_count(x2.device) * per_sm
        if n_chunks <= slots:  # one launch, one read of x (split_row: of a round's rows)
            grid = (min(n_items, n_chunks * (slots // n_chunks) if rounds else slots),)
            _softmax_kernel[grid](*run, PHASE=0, **meta)
            return
    # the interpreter, or programs that cannot all run at once: they must not wait for each other
    for phase in (1, 2):
        _softmax_kernel[(n_items,)](x2, y2, pm, ps, pm, n_cols, n_chunks, n_items, x2.stride(0), y2.stride(0),
                                    PHASE=phase, **meta)  # fmt: skip
