"""How the reduce family lays a reduction out, from the broadcast shape, the reduced axes and each input's
strides alone (plain Python, no torch, no Triton): `reduce.feasible` plans at the traced shape, and a
candidate plans at each call's shape, with these functions copied into it (templates.render).

The view is [outer, high, R, inner]: kept axes before the reduced ones (all kept axes where the reduced
ones lie apart), the reduced axes, kept axes after. Each input is read in place through its own strides
on those four axes, a broadcast axis at stride 0: a loss's targets of shape (N,) beside predictions of
(M, N) are never expanded in memory. Where an input's reduced axes cannot be walked by one stride (a
broadcast among them: those targets in a full reduction; reduced axes apart), they are cut at the last
such place: the trailing run is R, the axes before it `high`, and each (kept, high) position takes a
partial of its own, combined by a second launch; only a run of LONG_RUN elements or more stands alone.
An input still not read so (a cut elsewhere, kept axes that do not merge, a cut in an argmax or a
logsumexp, which never take partials) is copied once, laid out [kept, reduced] contiguously.

Accuracy. Each lane of a program's [BLOCK_K, BLOCK_R] accumulator adds its elements one after another in
fp32 (the lanes are then summed as a tree), and so does each lane of the second launch over the partials.
A serial sum of n terms errs by up to about n x 2^-24 of the terms' magnitudes, and terms far below the
running sum's last bit vanish. On the gate's wide-range draws (magnitudes log-uniform over 1e-2..100) a
hinge loss summed serially (numpy, fp32) erred 2e-6 relative at 2^14 terms, 5e-6 at 2^16, 2e-5 at 2^18
and 3.5e-3 at 2^20; on the H200 (KernelBench's 100_HingeLoss, 2^30 terms) lanes of 2^20 and 2^21 terms
erred 3e-3 and 7e-3, lanes of 2^13 7e-8 (the gate allows 1e-4). MAX_SERIAL = 2^14 bounds a lane's serial
terms over both launches together: a worst case of 1e-3, measured errors 50 times inside the tolerance.
A sum, a product and a logsumexp round; a max, a min and their indices are exact and not bounded.
"""

from __future__ import annotations

MAX_SERIAL = 16384  # serial fp32 terms a lane, both launches together (templates/reduce_plan.py)
LONG_RUN = 1024  # the shortest trailing run of reduced elements that takes partials of its own
SECOND_TILE = 2048  # the second launch's tile: up to 128 kept positions x partials
# the shortest chunk of R a split makes: partials at most 1/64 of what the first launch reads (a middle
# axis's tiles hold few rows of R: two tiles alone would allow a partial every second row)
MIN_CHUNK = 64


def _cdiv(a, b):
    return -(-a // b)


def _pow2(n):
    out = 1
    while out < n:
        out *= 2
    return out


def _size(shape, axes):
    out = 1
    for d in axes:
        out *= shape[d]
    return out


def _cuts(shape, axes, strides):
    """The places j in `axes` where axis j-1 and axis j cannot be read as one axis through `strides`."""
    return [j for j in range(1, len(axes)) if strides[axes[j - 1]] != strides[axes[j]] * shape[axes[j]]]


def _last(strides, axes):
    """The stride of `axes` read as one axis (that of the innermost; 0 where there is none)."""
    return strides[axes[-1]] if axes else 0


def plan_reduction(shape, dims, strides, block_k, block_r, split, op):
    """The launch of a reduction of `shape` over `dims` (sorted; all axes where empty) of inputs with
    `strides` (each over `shape`, 0 along a broadcast axis), at the knobs: which inputs to copy (permuted
    to `order`, contiguous) and each input's [outer, high, R, inner] strides after that; the tile; the
    split of R (`split` chunks a kept position, shared among its high positions, fewer where R is short,
    more where a sum's lanes would add over MAX_SERIAL terms: `raised`); the second launch's tile where
    there are partials; `serial`, the terms a lane adds serially over both launches; `wide`, whether an
    offset needs int64."""
    nd = len(shape)
    kept = [d for d in range(nd) if d not in dims]
    if not dims or dims == list(range(dims[0], dims[-1] + 1)):
        outer = [d for d in kept if not dims or d < dims[0]]
        inner = [d for d in kept if dims and d > dims[-1]]
    else:  # reduced axes apart: laid out last
        outer, inner = kept, []
    order = outer + list(dims) + inner
    outer, inner = [d for d in outer if shape[d] != 1], [d for d in inner if shape[d] != 1]
    red = [d for d in dims if shape[d] != 1]
    cuts = [_cuts(shape, red, s) for s in strides]
    high = max([c[-1] for c in cuts if c], default=0)
    if high and (op >= 4 or _size(shape, red[high:]) < LONG_RUN):
        high = 0
    copy = []
    canon = [0] * nd  # a copy's strides: contiguous in `order`
    step = 1
    for d in reversed(order):
        canon[d] = step
        step *= shape[d]
    fours = []
    for given, c in zip(strides, cuts, strict=True):
        moved = bool(_cuts(shape, outer, given) or _cuts(shape, inner, given) or [j for j in c if j != high])
        copy.append(moved)
        s = canon if moved else given
        fours.append([_last(s, outer), _last(s, red[:high]), _last(s, red[high:]), _last(s, inner)])
    n_outer, n_high, n_red, n_inner = (_size(shape, a) for a in (outer, red[:high], red[high:], inner))
    n_kept = n_outer * n_inner
    cols = n_inner > 1
    if cols:  # neighbouring kept positions are neighbours in memory: tile them, R across the tile's rows
        tile = block_k * block_r
        block_k = min(block_r, _pow2(n_inner))
        block_r = max(1, tile // block_k)
    block_r = min(block_r, _pow2(max(n_red, 1)))
    blocks = n_outer * _cdiv(n_inner, block_k) if cols else _cdiv(n_kept, block_k)
    chunks = 1
    if op < 4 and split > 1:  # each (kept, high) position's share, a chunk two tiles and MIN_CHUNK at least
        chunks = max(1, min(_cdiv(split, n_high), n_red // max(2 * block_r, MIN_CHUNK)))
    chunk = _cdiv(_cdiv(max(n_red, 1), chunks), block_r) * block_r
    raised = op in (0, 3) and chunk // block_r > MAX_SERIAL  # a sum or a product: split further
    if raised:
        chunk = _cdiv(_cdiv(n_red, _cdiv(n_red, MAX_SERIAL * block_r)), block_r) * block_r
    chunks = _cdiv(max(n_red, 1), chunk)
    parts = n_high * chunks
    block_k2 = min(128, _pow2(n_kept))
    block_r2 = min(max(1, SECOND_TILE // block_k2), _pow2(parts))
    serial = chunk // block_r + (_cdiv(parts, block_r2) if parts > 1 else 0)
    # the largest offset a lane forms (a masked one too: a row past K, a step past R) and scalar bound
    rows = n_outer if cols else n_kept + block_k
    reach = [
        (rows - 1) * f[0] + (n_high - 1) * f[1] + (n_red + block_r) * f[2] + (n_inner + block_k) * f[3]
        for f in fours
    ]
    reach += [(parts + 1) * n_kept + block_k, n_red + chunk + block_r]
    return {
        "order": order,
        "copy": copy,
        "strides": fours,
        "K": n_kept,
        "H": n_high,
        "R": n_red,
        "inner": n_inner,
        "n": n_high * n_red,
        "cols": cols,
        "block_k": block_k,
        "block_r": block_r,
        "blocks": blocks,
        "chunks": chunks,
        "chunk": chunk,
        "parts": parts,
        "block_k2": block_k2,
        "block_r2": block_r2,
        "serial": serial,
        "raised": raised,
        "wide": max(reach) >= 2**31,
    }
