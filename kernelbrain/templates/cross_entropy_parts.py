"""The cross-entropy family's Triton parts (copied into a candidate by `templates.render`, never imported
by the generator). The candidate's module defines `_prologue(v0, v1, v2, v3)` (the elementwise chain on
the logits, over their inputs) and `_epilogue(v0, v1, v2, v3)` (the chain on the loss, v0).

Logits are read as [N, C] through each input's strides (a broadcast input has stride 0: never copied).
Each program takes ROWS rows and walks the classes in BLOCK chunks, keeping per row the running max m
and the sum s of exp(z - m) (rescaled when m grows): one read of the logits, one exp an element. The
target's logit z_t is then loaded by its index, and

    loss = -w[t] * ((z_t - m) - log(s))     0 where t is ignore_index (w[t] = 1 without class weights)

(LOG_SOFTMAX false: the logits are log-probabilities already, loss = -w[t] * z_t). `MODE` 0 writes each
row's loss (through the epilogue); else each program writes the fp32 sums of its rows' losses and
weights, and a second launch adds them up: 1 divided by the total weight (torch's mean), 2 the sum, 3
divided by the row count (a mean of the unreduced losses).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _prologue(v0, v1, v2, v3):  # replaced by the candidate's own
    return v0


@triton.jit
def _epilogue(v0, v1, v2, v3):  # replaced by the candidate's own
    return v0


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
def _ce_rows_kernel(
    dest, x0, x1, x2, x3, target, weight, N, C, s0, s1, s2, s3, t_stride, w_stride, ignore_index,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, N_IN: tl.constexpr,
    PROLOGUE: tl.constexpr, ROUND: tl.constexpr, LOG_SOFTMAX: tl.constexpr, WEIGHTED: tl.constexpr,
    MODE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Programs of ROWS rows. MODE 0: each row's loss through the epilogue, in dest's dtype, at dest[row];
    else the program's fp32 loss sum at dest[pid] and weight sum at dest[P + pid] (P programs)."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < N
    shift = tl.zeros([ROWS], tl.float32)
    log_s = tl.zeros([ROWS], tl.float32)
    if LOG_SOFTMAX:
        m = tl.full([ROWS], -float("inf"), tl.float32)
        s = tl.zeros([ROWS], tl.float32)
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
    w = tl.full([ROWS], 1.0, tl.float32)
    if WEIGHTED:
        w = tl.load(weight + t * w_stride, mask=inside, other=0.0).to(tl.float32)
    loss = tl.where(valid, -logp * w, 0.0)
    w = tl.where(valid, w, 0.0)
    if MODE == 0:
        out = _epilogue(loss, loss, loss, loss)
        tl.store(dest + rows, out.to(dest.dtype.element_ty), mask=rmask)
    else:
        tl.store(dest + pid, tl.sum(loss, axis=0))
        tl.store(dest + tl.num_programs(0) + pid, tl.sum(w, axis=0))


@triton.jit
def _ce_finish_kernel(out_ptr, part, P, n_rows, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """One program: the P partial sums added (in a fixed order), divided as MODE says, the epilogue."""
    acc = tl.zeros([BLOCK], tl.float32)
    w_acc = tl.zeros([BLOCK], tl.float32)
    for p0 in range(0, P, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        acc += tl.load(part + p, mask=p < P, other=0.0)
        if MODE == 1:
            w_acc += tl.load(part + P + p, mask=p < P, other=0.0)
    total = tl.sum(acc, axis=0)
    if MODE == 1:
        total = total / tl.sum(w_acc, axis=0)
    if MODE == 3:
        total = total / n_rows
    total = _epilogue(total, total, total, total)
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


def _named(model, name):
    """The model's parameter or buffer of that state-dict name (the class weights it holds)."""
    found = dict(model.named_parameters())
    found.update(model.named_buffers())
    return found[name]


def _ce_launch(
    xs, target, weight, out_dtype, lp_dtype, ignore_index, mode, log_softmax, prologue, block, rows,
    num_warps,
):  # fmt: skip
    """The loss of the logits `_prologue(*xs)` ([N, C] or [C]) against `target` ([N] or [] class
    indices), with class weights `weight` ([C]) or None; `lp_dtype` the dtype the reference held the
    logits and log-probabilities in (their rounding), `out_dtype` the result's."""
    shape = list(torch.broadcast_shapes(*(x.shape for x in xs)))
    views = [x.expand(shape) for x in xs]
    if len(shape) == 1:
        views = [v.unsqueeze(0) for v in views]
    n_rows, n_cls = views[0].shape
    n_in = len(views)
    pad = views + [views[0]] * (4 - n_in)
    row_strides = [v.stride(0) for v in pad]
    col_strides = {f"C{i}": v.stride(1) for i, v in enumerate(pad)}
    t = target.reshape(n_rows)
    w = weight if weight is not None else t
    round_to = {torch.float16: 1, torch.bfloat16: 2}.get(lp_dtype, 0)
    # a program's tile is at most `block` elements: whole rows up to that many classes, several of them
    # when they are short; longer rows in chunks of `block`
    tile = min(block, triton.next_power_of_2(max(n_cls, 1)))
    rows = min(rows, max(1, block // tile))
    programs = triton.cdiv(n_rows, rows)
    if mode == 0:
        out = torch.empty(target.shape, dtype=out_dtype, device=views[0].device)
        dest = out
    else:
        out = torch.empty((), dtype=out_dtype, device=views[0].device)
        dest = torch.empty(2 * programs, dtype=torch.float32, device=views[0].device)
    if n_rows:
        flags = {"N_IN": n_in, "PROLOGUE": prologue, "ROUND": round_to, "LOG_SOFTMAX": log_softmax}
        flags |= {"WEIGHTED": weight is not None, "MODE": mode, "ROWS": rows, "BLOCK": tile}
        args = (dest, *pad, t, w, n_rows, n_cls, *row_strides, t.stride(0), w.stride(0), ignore_index)
        _ce_rows_kernel[(programs,)](*args, **col_strides, **flags, num_warps=num_warps)
    if mode != 0:
        _ce_finish_kernel[(1,)](out, dest, programs, n_rows, MODE=mode, BLOCK=1024, num_warps=4)
    return out
