"""Row softmax / log-softmax over one dimension.

    y_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j     (log: x_i - m - log sum_j exp(x_j - m))

Strategy axes: the whole row in registers (one read of x), an online single-sweep max/sum over tiles
(any row length, two reads), several short rows per program (fewer, fatter programs), a row split
over co-resident programs (rows too long for one program's registers, still one read), and num_warps.

`split_row`: each program holds one BLOCK_N chunk of a row in registers, publishes the chunk's max
and sum of exponentials, waits (an atomic counter per row) until every chunk of its row has done so,
then normalises its chunk from registers: x is read once and y written once, the floor's bytes. A
program may only wait for programs that are running, so the grid is persistent and no larger than
the GPU holds at once (CTAS_PER_SM programs per multiprocessor, fewer where the compiled kernel's
registers or shared memory fit fewer), in rounds that each cover whole rows; the wait is bounded, so
a violated assumption shows as a wrong result (the gate rejects it), never as a hang. Under the
interpreter programs run one after another and cannot wait for each other: there the same kernel
runs in two launches (chunk statistics, then normalisation). Knob `prefetch`: load the program's
next chunk before waiting on the current row (twice the registers, so fewer programs fit an SM, but
the SM keeps reading while it waits).

`deferred`: the same split and exchange without the rounds. A program publishes the statistics of
the chunk it just read and then normalises the chunk it read DEPTH items earlier, whose row is
complete by then: no program waits for the row it is reading, so the SM never drains its loads. The
earlier chunk is read again, from L2 (its first read asks L2 to keep it, the second and y's store to
evict first); the grid's DEPTH items in flight are sized to fit there.
"""

from __future__ import annotations

from typing import Any

from kernelbrain.core.graph import Graph
from kernelbrain.templates import model_source

FAMILY = "row_softmax"
# elements a program may hold in registers; past this Triton spends minutes compiling a kernel that spills
MAX_BLOCK = 32768

# split_row first: where it is feasible (rows past MAX_BLOCK) it is the one-read strategy, and a short
# search budget may end before the last round-0 candidates are measured (why these two split_row sets:
# docs/templates.md, "row_softmax")
ROUND0: list[dict[str, Any]] = [
    {"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8},
    {"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 2, "num_warps": 16, "prefetch": True},
    {"strategy": "single_pass", "num_warps": 4},
    {"strategy": "online", "block_n": 1024, "num_warps": 4},
    {"strategy": "online", "block_n": 4096, "num_warps": 8},
    {"strategy": "multi_row", "rows": 4, "num_warps": 4},
    {"strategy": "online", "block_n": 8192, "num_warps": 16},
]
# deferred keeps CTAS_PER_SM x SMs x (DEPTH + 1) chunks in L2 between a chunk's two reads: 4 x 132 x 2
# chunks of 32 KiB are 35 MB of the H200's 50 MB
# split_row: a row spans at least this many chunks (else a whole-row strategy does it in one program)
# and at most this many (every chunk of a row must be running at once, on GPUs with >= 64 SMs)
MIN_CHUNKS, MAX_CHUNKS = 2, 64

# bottleneck label -> (move, why); a move maps the parent's knobs to the child's
MUTATIONS: dict[str, list[tuple[str, str]]] = {
    "memory-bound near peak": [
        ("single_pass", "at the bandwidth roof only fewer bytes help: read each row once"),
        ("split_row", "rows too long for one program: split each over co-resident programs, read once"),
        ("deferred", "rows too long for one program: split them, read each chunk again from L2, never wait"),
    ],
    "latency or occupancy-limited": [
        ("deferred", "split_row waits for each round's rows: normalise an earlier, finished row instead"),
        ("prefetch", "split_row: load the next chunk before waiting on this row's other chunks"),
        ("more_warps", "more warps per row hide more load latency"),
        ("more_rows", "more rows per program keep more loads in flight"),
    ],
    "launch-bound": [("more_rows", "fewer, fatter programs amortise launch and scheduling cost")],
    "register spills": [("smaller_tiles", "smaller tiles lower register pressure")],
    "compute-bound": [("fewer_warps", "exp is cheap; fewer warps cut reduction overhead")],
    "memory-bound with poor coalescing": [("larger_tiles", "wider tiles make longer contiguous loads")],
}


def matches(ops: list[dict], graph: Graph | None = None) -> dict | None:
    names = [o["op"] for o in ops]
    kinds = [n for n in names if n in {"softmax", "log_softmax"}]
    if len(kinds) != 1 or any(n not in {"softmax", "log_softmax", "contiguous"} for n in names):
        return None
    op = next(o for o in ops if o["op"] == kinds[0])
    if op.get("dtype") not in {"float32", "float16", "bfloat16"}:
        return None
    dim = int(op.get("dim", -1))
    shape = op.get("shape") or []
    n_cols = int(shape[dim]) if shape else None
    return {"log": kinds[0] == "log_softmax", "dim": dim, "ndim": int(op.get("ndim", 2)), "n_cols": n_cols}


def feasible(spec: dict, knobs: dict[str, Any]) -> bool:
    """Strategies that hold whole rows in registers only fit rows up to MAX_BLOCK elements."""
    n = spec.get("n_cols")
    if knobs["strategy"] in {"split_row", "deferred"}:
        if knobs.get("depth", 1) < 1:  # deferred normalises items behind the one it reads, never ahead
            return False
        # deferred's grid need only hold one row (not a round of them): CTAS_PER_SM programs an SM
        most = MAX_CHUNKS * (knobs["ctas_per_sm"] if knobs["strategy"] == "deferred" else 1)
        return n is not None and MIN_CHUNKS <= -(-n // knobs["block_n"]) <= most
    if n is None or knobs["strategy"] == "online":
        return True
    block = 1 << max(0, (n - 1).bit_length())
    return block * knobs.get("rows", 1) <= MAX_BLOCK


def mutate(knobs: dict[str, Any], move: str) -> dict[str, Any] | None:
    k = dict(knobs)
    if move == "single_pass":
        return (
            None
            if k["strategy"] == "single_pass"
            else {"strategy": "single_pass", "num_warps": k["num_warps"]}
        )
    if move == "split_row":
        if k["strategy"] == "split_row":
            return None
        return {"strategy": "split_row", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8}
    if move == "deferred":
        if k["strategy"] == "deferred":
            return None
        # from split_row it keeps the split and the occupancy; its chunks stay in L2, not in registers
        split = {"block_n": 8192, "ctas_per_sm": 4, "num_warps": 8}
        if k["strategy"] == "split_row":
            split = {key: k[key] for key in split}
        return {"strategy": "deferred", **split, "depth": 1}
    if move == "prefetch":
        ok = k["strategy"] == "split_row" and not k.get("prefetch", False)
        return {**k, "prefetch": True, "ctas_per_sm": max(1, k["ctas_per_sm"] // 2)} if ok else None
    if move == "more_warps":
        return {**k, "num_warps": min(16, k["num_warps"] * 2)} if k["num_warps"] < 16 else None
    if move == "fewer_warps":
        return {**k, "num_warps": k["num_warps"] // 2} if k["num_warps"] > 1 else None
    if move == "more_rows":
        rows = k.get("rows", 1) * 2
        return {"strategy": "multi_row", "rows": rows, "num_warps": k["num_warps"]} if rows <= 32 else None
    if move in {"smaller_tiles", "larger_tiles"}:
        if k["strategy"] in {"split_row", "deferred"}:
            bn = k["block_n"] // 2 if move == "smaller_tiles" else k["block_n"] * 2
            return {**k, "block_n": bn} if 1024 <= bn <= MAX_BLOCK else None
        if k["strategy"] != "online":
            return {"strategy": "online", "block_n": 2048, "num_warps": k["num_warps"]}
        bn = k["block_n"] // 2 if move == "smaller_tiles" else k["block_n"] * 2
        return {**k, "block_n": bn} if 128 <= bn <= 16384 else None
    raise ValueError(f"unknown move {move!r}")


# split_row and deferred exchange each chunk's statistics alike
_ROW_EXCHANGE = """
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
"""

# split_row and deferred launch alike: one waiting launch where every program of the grid can run at
# once, else two
_SPLIT_LAUNCH = """\
_RESIDENT = {}


def _fit(n_regs, shared, num_warps, max_regs, max_shared):
    # programs of a kernel one SM holds at once: registers go out by warp in blocks of 256 from each of
    # the SM's 4 quarters; each program takes 1 KiB of shared memory beyond its own (max_shared, the
    # most one program may have, is the SM's less that KiB); at most 2048 threads and 32 programs
    per_warp = -(-n_regs * 32 // 256) * 256
    by_regs = max_regs // 4 // max(per_warp, 1) * 4 // num_warps
    by_shared = (max_shared + 1024) // (shared + 1024)
    return min(by_regs, by_shared, 2048 // (32 * num_warps), 32)


def _resident(run, meta):
    # CTAS_PER_SM, or fewer where the compiled kernel does not fit that many (its registers depend on
    # the Triton and ptxas versions and on the arguments' alignment): a program waiting on one that
    # never started would spin out its bound, then normalise with a row's statistics half made.
    # Keyed as Triton specialises a kernel: pointers 16-byte aligned or not, integers divisible by
    # 16, equal to 1 or past 32 bits
    x2 = run[0]
    ptrs = tuple(t.data_ptr() % 16 == 0 for t in run[:5])
    ints = tuple((v % 16 == 0, v == 1, v >= 2**31) for v in run[5:])
    key = (x2.device.index, x2.dtype, run[1].dtype, ptrs, ints, tuple(sorted(meta.items())))
    if key not in _RESIDENT:
        k = _softmax_kernel.warmup(*run, PHASE=0, grid=(1,), **meta)
        k._init_handles()
        props = triton.runtime.driver.active.utils.get_device_properties(x2.device.index)
        fit = _fit(k.n_regs, k.metadata.shared, meta["num_warps"], props["max_num_regs"],
                   props["max_shared_mem"])
        _RESIDENT[key] = max(1, min(CTAS_PER_SM, fit))
    return _RESIDENT[key]


def _launch(x2, y2):
    n_rows, n_cols = x2.shape
    block = min(BLOCK_N, triton.next_power_of_2(n_cols))
    n_chunks = triton.cdiv(n_cols, block)
    n_items = n_rows * n_chunks
    pm = torch.empty(n_items, device=x2.device, dtype=torch.float32)
    ps = torch.empty(n_items, device=x2.device, dtype=torch.float32)
    meta = dict(CHUNKS_P2=triton.next_power_of_2(n_chunks), BLOCK=block, LOG=LOG, @KNOB@,
                num_warps=NUM_WARPS)
    if x2.is_cuda:
        cnt = torch.zeros(n_rows, device=x2.device, dtype=torch.int32)
        run = (x2, y2, pm, ps, cnt, n_cols, n_chunks, n_items, x2.stride(0), y2.stride(0))
        slots = torch.cuda.get_device_properties(x2.device).multi_processor_count * _resident(run, meta)
        if n_chunks <= slots:  # @WHY@
            grid = (@GRID@,)
            _softmax_kernel[grid](*run, PHASE=0, **meta)
            return
    # the interpreter, or programs that cannot all run at once: they must not wait for each other
    for phase in (1, 2):
        _softmax_kernel[(n_items,)](x2, y2, pm, ps, pm, n_cols, n_chunks, n_items, x2.stride(0), y2.stride(0),
                                    PHASE=phase, **meta)
"""

_KERNELS = {
    "single_pass": """
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    e = tl.exp(z)
    s = tl.sum(e, axis=0)
    y = z - tl.log(s) if LOG else e / s
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x2, y2):
    n_rows, n_cols = x2.shape
    block = triton.next_power_of_2(n_cols)
    if block > MAX_BLOCK:
        raise ValueError(f"single_pass keeps a whole row in registers: rows of {n_cols} exceed {MAX_BLOCK}")
    _softmax_kernel[(n_rows,)](x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK=block, LOG=LOG,
                               num_warps=NUM_WARPS)
""",
    "online": """
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr, LOG: tl.constexpr):
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


def _launch(x2, y2):
    n_rows, n_cols = x2.shape
    block = min(BLOCK_N, triton.next_power_of_2(n_cols))
    _softmax_kernel[(n_rows,)](x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK_N=block, LOG=LOG,
                               num_warps=NUM_WARPS)
""",
    "multi_row": """
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                    LOG: tl.constexpr):
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


def _launch(x2, y2):
    n_rows, n_cols = x2.shape
    block = triton.next_power_of_2(n_cols)
    if ROWS * block > MAX_BLOCK:
        raise ValueError(f"multi_row holds {ROWS} rows in registers: {n_cols} > {MAX_BLOCK // ROWS}")
    _softmax_kernel[(triton.cdiv(n_rows, ROWS),)](x2, y2, n_rows, n_cols, x2.stride(0), y2.stride(0),
                                                  ROWS=ROWS, BLOCK=block, LOG=LOG, num_warps=NUM_WARPS)
""",
    "split_row": _ROW_EXCHANGE
    + """
@triton.jit
def _chunk(x_ptr, item, n_chunks, n_cols, n_items, stride_x, cols, BLOCK: tl.constexpr):
    # one BLOCK chunk of a row, in fp32; columns past the row and items past the end read as -inf
    row = item // n_chunks
    c = (item % n_chunks) * BLOCK + cols
    # all false once item >= n_items (clamped first: (n_items - item) * BLOCK would overflow int32)
    mask = (c < n_cols) & (cols < tl.minimum(n_items - item, 1) * BLOCK)
    return tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=-float("inf")).to(tl.float32)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, pm_ptr, ps_ptr, cnt_ptr, n_cols, n_chunks, n_items, stride_x, stride_y,
                    CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr,
                    PREFETCH: tl.constexpr):
    # PHASE 0: the whole job in one launch (GPU); 1: chunk statistics only; 2: normalisation only.
    # PREFETCH (PHASE 0): the next item's chunk is loaded before the wait for this row's other chunks,
    # so the SM keeps reading while it waits instead of draining its loads once per round
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


"""
    + _SPLIT_LAUNCH.replace("@KNOB@", "PREFETCH=PREFETCH")
    .replace("@WHY@", "every chunk of a round's rows runs at once: one launch, one read of x")
    .replace("@GRID@", "min(n_items, n_chunks * (slots // n_chunks))"),
    "deferred": _ROW_EXCHANGE
    + """
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, pm_ptr, ps_ptr, cnt_ptr, n_cols, n_chunks, n_items, stride_x, stride_y,
                    CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr, PHASE: tl.constexpr,
                    DEPTH: tl.constexpr):
    # PHASE 0: the whole job in one launch (GPU); 1: chunk statistics only; 2: normalisation only.
    # Iteration t publishes item t's statistics, then normalises item t - DEPTH * step. That row's
    # chunks were all published by iteration t - DEPTH + 1 <= t (the grid holds a whole row: step >=
    # n_chunks), and every program publishes before it waits, so the waits form no cycle.
    cols = tl.arange(0, BLOCK)
    parts = tl.arange(0, CHUNKS_P2)
    step = tl.num_programs(0)
    lag = DEPTH * step if PHASE == 0 else 0
    for it in range(tl.program_id(0), n_items + lag, step):
        if PHASE != 2:
            if it < n_items:
                row = it // n_chunks
                c = (it % n_chunks) * BLOCK + cols
                mask = c < n_cols
                x = tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=-float("inf"),
                            eviction_policy="evict_last").to(tl.float32)
                _publish(x, mask, it, row, pm_ptr, ps_ptr, cnt_ptr, PHASE == 0)
        if PHASE != 1:
            j = it - lag
            if j >= 0:
                row = j // n_chunks
                c = (j % n_chunks) * BLOCK + cols
                mask = c < n_cols
                m_row, s_row = _row_stats(pm_ptr, ps_ptr, cnt_ptr, row, n_chunks, parts, PHASE == 0)
                x = tl.load(x_ptr + row.to(tl.int64) * stride_x + c, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                z = x - m_row
                y = z - tl.log(s_row) if LOG else tl.exp(z) / s_row
                tl.store(y_ptr + row.to(tl.int64) * stride_y + c, y.to(y_ptr.dtype.element_ty), mask=mask,
                         eviction_policy="evict_first")


"""
    + _SPLIT_LAUNCH.replace("@KNOB@", "DEPTH=DEPTH")
    .replace("@WHY@", "every program runs at once and the grid holds a whole row: one launch")
    .replace("@GRID@", "min(n_items, slots)"),
}


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    init_args = model_source.init_args(signature, "".join(f", {a}" for a in signature["init"]))
    x = signature["forward"][0]
    rest = "".join(f", {a}" for a in signature["forward"][1:])
    consts = [f"LOG = {spec['log']}", f"NUM_WARPS = {knobs['num_warps']}", f"MAX_BLOCK = {MAX_BLOCK}"]
    if "block_n" in knobs:
        consts.append(f"BLOCK_N = {knobs['block_n']}")
    if "ctas_per_sm" in knobs:
        consts.append(f"CTAS_PER_SM = {knobs['ctas_per_sm']}")
    if "rows" in knobs:
        consts.append(f"ROWS = {knobs['rows']}")
    if "depth" in knobs:
        consts.append(f"DEPTH = {knobs['depth']}")
    if knobs["strategy"] == "split_row":
        # knob sets recorded before the prefetch knob existed ran without it
        consts.append(f"PREFETCH = {bool(knobs.get('prefetch', False))}")
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    title = f"Row {'log-' if spec['log'] else ''}softmax over dim {spec['dim']}"
    return f'''"""{title}: kernelbrain row_softmax template ({knob_text})."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{chr(10).join(consts)}
DIM = {spec["dim"]}
{_KERNELS[knobs["strategy"]]}

class ModelNew(nn.Module):
    def __init__(self{init_args}):
        super().__init__()

    def forward(self, {x}{rest}):
        dim = DIM % {x}.dim()
        # reduce over the last axis of a contiguous view: move the softmax dim last when it is not
        xt = {x}.movedim(dim, -1).contiguous()
        x2 = xt.reshape(-1, xt.shape[-1])
        y2 = torch.empty_like(x2)
        _launch(x2, y2)
        return y2.reshape(xt.shape).movedim(-1, dim)
'''
