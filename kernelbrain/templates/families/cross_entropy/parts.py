"""The cross-entropy family's Triton parts (copied into a candidate by `templates.render`, never imported
by the generator). The candidate's module defines `_prologue(v0, v1, v2, v3)` (the elementwise chain on
the logits, over their inputs) and `_epilogue(v0, v1, v2, v3)` (the chain on the loss, v0).

Logits are read as [N, C] through each input's strides (a broadcast input has stride 0: never copied).
Each program takes ROWS rows and walks the classes in BLOCK chunks, keeping per row the running max m
and the sum s of exp(z - m) (rescaled when m grows): one read of the logits, one exp an element. The
target's logit z_t is then loaded by its index, and

    loss = -w[t] * ((z_t - m) - log(s))     0 where t is ignore_index (w[t] = 1 without class weights)

(LOG_SOFTMAX false: the logits are log-probabilities already, loss = -w[t] * z_t). `MODE` 0 writes each
row's loss (through the epilogue); else at most MAX_PROGRAMS programs each sum their rows' losses and
weights in fp32, and the last one to finish adds up all programs' sums in a fixed order (one launch,
the same result every run): 1 divided by the total weight (torch's mean), 2 the sum, 3 divided by the
row count (a mean of the unreduced losses).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelbrain.templates.families.pointwise.parts import chain_stub

# the candidate's own chains replace these (render.chain)
_prologue = _epilogue = chain_stub


@triton.jit
def _rounded(v, ROUND: tl.constexpr):
    """v as the reference holds it: rounded to fp16 (ROUND 1) or bf16 (2), back in fp32."""
    if ROUND == 1:
        v = v.to(tl.float16).to(tl.float32)
    if ROUND == 2:
        v = v.to(tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def _logits(
    x0, x1, x2, x3, r, c, mask, s0, s1, s2, s3,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
    N_IN: tl.constexpr, PROLOGUE: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """The logits at rows r, classes c (any broadcast shapes), in fp32: the inputs loaded through their
    row strides s* and class strides C*, then the prologue, rounded as the reference stored it."""
    v0 = tl.load(x0 + r * s0 + c * C0, mask=mask, other=0.0).to(tl.float32)
    v1 = v0
    v2 = v0
    v3 = v0
    if N_IN > 1:
        v1 = tl.load(x1 + r * s1 + c * C1, mask=mask, other=0.0).to(tl.float32)
    if N_IN > 2:
        v2 = tl.load(x2 + r * s2 + c * C2, mask=mask, other=0.0).to(tl.float32)
    if N_IN > 3:
        v3 = tl.load(x3 + r * s3 + c * C3, mask=mask, other=0.0).to(tl.float32)
    v = v0
    if PROLOGUE:
        v = _rounded(_prologue(v0, v1, v2, v3), ROUND)
    return v


@triton.jit
def _row_losses(
    x0, x1, x2, x3, target, weight, rows, rmask, C, s0, s1, s2, s3, t_stride, w_stride, ignore_index,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, N_IN: tl.constexpr,
    PROLOGUE: tl.constexpr, ROUND: tl.constexpr, LOG_SOFTMAX: tl.constexpr, WEIGHTED: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """The fp32 losses and weights of `rows` (0, 0 where ignored or past the end)."""
    shift = tl.zeros(rows.shape, tl.float32)
    log_s = tl.zeros(rows.shape, tl.float32)
    if LOG_SOFTMAX:
        m = tl.full(rows.shape, -float("inf"), tl.float32)
        s = tl.zeros(rows.shape, tl.float32)
        for c0 in range(0, C, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            mask = rmask[:, None] & (cols < C)[None, :]
            z = _logits(
                x0, x1, x2, x3, rows[:, None], cols[None, :], mask, s0, s1, s2, s3,
                C0, C1, C2, C3, N_IN, PROLOGUE, ROUND,
            )  # fmt: skip
            z = tl.where(mask, z, -float("inf"))
            new_m = tl.maximum(m, tl.max(z, axis=1))
            # a row all -inf so far: nothing to rescale, and exp(-inf - -inf) would be nan
            base = tl.where(new_m == -float("inf"), 0.0, new_m)
            s = s * tl.exp(m - base) + tl.sum(tl.exp(z - base[:, None]), axis=1)
            m = new_m
        shift = m
        log_s = tl.log(s)
    t = tl.load(target + rows * t_stride, mask=rmask, other=0).to(tl.int64)
    valid = rmask & (t != ignore_index)
    inside = valid & (t >= 0) & (t < C)  # out of range: torch's error, never a read out of bounds here
    z_t = _logits(
        x0, x1, x2, x3, rows, t, inside, s0, s1, s2, s3, C0, C1, C2, C3, N_IN, PROLOGUE, ROUND
    )  # fmt: skip
    logp = z_t
    if LOG_SOFTMAX:
        logp = _rounded((z_t - shift) - log_s, ROUND)
    w = tl.full(rows.shape, 1.0, tl.float32)
    if WEIGHTED:
        w = tl.load(weight + t * w_stride, mask=inside, other=0.0).to(tl.float32)
    return tl.where(valid, -logp * w, 0.0), tl.where(valid, w, 0.0)


@triton.jit
def _ce_kernel(
    dest, work, x0, x1, x2, x3, target, weight, N, C, n_blocks, s0, s1, s2, s3, t_stride, w_stride,
    ignore_index, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
    N_IN: tl.constexpr, PROLOGUE: tl.constexpr, ROUND: tl.constexpr, LOG_SOFTMAX: tl.constexpr,
    WEIGHTED: tl.constexpr, MODE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    FINISH: tl.constexpr,
):  # fmt: skip
    """Programs each taking blocks of ROWS rows, every num_programs-th. MODE 0: each row's loss through
    the epilogue at dest[row]. Else each program's fp32 loss and weight sums go to work[pid] and
    work[P + pid] (P programs), and the last program to count itself in at work[2P] adds them up in a
    fixed order, divides as MODE says, and writes the epilogue's value to dest."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    loss_sum = tl.zeros([ROWS], tl.float32)
    w_sum = tl.zeros([ROWS], tl.float32)
    for blk in range(pid, n_blocks, programs):
        rows = blk * ROWS + tl.arange(0, ROWS).to(tl.int64)  # blk: an int in the interpreter
        rmask = rows < N
        loss, w = _row_losses(
            x0, x1, x2, x3, target, weight, rows, rmask, C, s0, s1, s2, s3, t_stride, w_stride,
            ignore_index, C0, C1, C2, C3, N_IN, PROLOGUE, ROUND, LOG_SOFTMAX, WEIGHTED, BLOCK,
        )  # fmt: skip
        if MODE == 0:
            out = _epilogue(loss, loss, loss, loss)
            tl.store(dest + rows, out.to(dest.dtype.element_ty), mask=rmask)
        else:
            loss_sum += loss
            w_sum += w
    if MODE != 0:
        tl.store(work + pid, tl.sum(loss_sum, axis=0))
        tl.store(work + programs + pid, tl.sum(w_sum, axis=0))
        tl.debug_barrier()  # this program's sums are written before the count says so
        if tl.atomic_add(work + 2 * programs, 1.0, sem="acq_rel") == programs - 1:
            # volatile: the other programs' sums were written by other SMs, past this one's L1
            acc = tl.zeros([FINISH], tl.float32)
            w_acc = tl.zeros([FINISH], tl.float32)
            for p0 in range(0, programs, FINISH):
                p = p0 + tl.arange(0, FINISH)
                acc += tl.load(work + p, mask=p < programs, other=0.0, volatile=True)
                w_acc += tl.load(work + programs + p, mask=p < programs, other=0.0, volatile=True)
            total = tl.sum(acc, axis=0)
            if MODE == 1:
                total = total / tl.sum(w_acc, axis=0)
            if MODE == 3:
                total = total / N
            total = _epilogue(total, total, total, total)
            tl.store(dest, total.to(dest.dtype.element_ty))


# programs of a reduced loss: each one's sums are added up by the last, in one FINISH-wide sweep
MAX_PROGRAMS = 1024


def _ce_launch(
    xs, target, weight, out_dtype, lp_dtype, ignore_index, mode, log_softmax, prologue, block, rows,
    num_warps,
):  # fmt: skip
    """The loss of the logits `_prologue(*xs)` ([N, C] or [C]) against `target` ([N] or [] class
    indices), with class weights `weight` ([C]) or None; `lp_dtype` the dtype the reference held the
    logits and log-probabilities in (their rounding), `out_dtype` the result's. Lean on the host: the
    loss of a small batch takes less time on the GPU than its launch on the CPU."""
    if len(xs) > 1:
        shape = torch.broadcast_shapes(*(v.shape for v in xs))
        xs = [v if v.shape == shape else v.expand(shape) for v in xs]
    x = xs[0]
    if x.dim() == 1:  # one row; its stride 0
        n_rows, n_cls = 1, x.shape[0]
        strides = [(0, v.stride(0)) for v in xs]
        t_stride = 0
    else:
        n_rows, n_cls = x.shape
        strides = [v.stride() for v in xs]
        t_stride = target.stride(0)
    n_in = len(xs)
    strides += [strides[0]] * (4 - n_in)
    w, w_stride = (weight, weight.stride(0)) if weight is not None else (target, 0)
    # a program's tile is at most `block` elements: whole rows up to that many classes, several of them
    # when they are short; longer rows in chunks of `block`
    tile = min(block, triton.next_power_of_2(n_cls))
    rows = min(rows, max(1, block // tile))
    n_blocks = triton.cdiv(n_rows, rows)
    if mode == 0:
        out = torch.empty(target.shape, dtype=out_dtype, device=x.device)
        programs = n_blocks
        work = out
    else:
        out = torch.empty((), dtype=out_dtype, device=x.device)
        programs = min(n_blocks, MAX_PROGRAMS)
        work = torch.zeros(2 * programs + 1, dtype=torch.float32, device=x.device)  # the count last
    if n_rows == 0:  # no rows: torch's empty sum, or its 0 / 0
        return out.fill_(float("nan") if mode in (1, 3) else 0.0)
    _ce_kernel[(programs,)](
        out, work, *xs, *([x] * (4 - n_in)), target, w, n_rows, n_cls, n_blocks,
        strides[0][0], strides[1][0], strides[2][0], strides[3][0], t_stride, w_stride, ignore_index,
        C0=strides[0][1], C1=strides[1][1], C2=strides[2][1], C3=strides[3][1], N_IN=n_in,
        PROLOGUE=prologue, ROUND=1 if lp_dtype == torch.float16 else 2 if lp_dtype == torch.bfloat16 else 0,
        LOG_SOFTMAX=log_softmax, WEIGHTED=weight is not None, MODE=mode, ROWS=rows, BLOCK=tile,
        FINISH=MAX_PROGRAMS, num_warps=num_warps,
    )  # fmt: skip
    return out
