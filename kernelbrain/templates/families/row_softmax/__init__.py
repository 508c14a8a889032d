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
from kernelbrain.templates import sizing
from kernelbrain.templates.render import constants, knob_text, module, parts_of, plain_model

FAMILY = "row_softmax"
PARTS = f"{__name__}.parts"  # the kernels and launchers, one of each per strategy
MAX_BLOCK = sizing.MAX_BLOCK

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
    return sizing.next_pow2(n) * knobs.get("rows", 1) <= MAX_BLOCK


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
    if move in sizing.WARP_MOVES:
        return sizing.warps(k, move)
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


# each strategy's parts, in the candidate's order, and its launcher's call from ModelNew.forward
_PARTS: dict[str, tuple[str, ...]] = {
    "single_pass": ("_softmax_kernel_single_pass", "_launch_single_pass"),
    "online": ("_softmax_kernel_online", "_launch_online"),
    "multi_row": ("_softmax_kernel_multi_row", "_launch_multi_row"),
    "split_row": ("_publish", "_row_stats", "_chunk", "_softmax_kernel"),
    "deferred": ("_publish", "_row_stats", "_softmax_kernel_deferred"),
}
_SPLIT_LAUNCH = ("_launch_split",)
_CALLS = {
    "single_pass": "_launch_single_pass(x2, y2, LOG, NUM_WARPS, MAX_BLOCK)",
    "online": "_launch_online(x2, y2, BLOCK_N, LOG, NUM_WARPS)",
    "multi_row": "_launch_multi_row(x2, y2, ROWS, LOG, NUM_WARPS, MAX_BLOCK)",
    "split_row": "_launch_split(x2, y2, BLOCK_N, LOG, NUM_WARPS, dict(PREFETCH=PREFETCH), rounds=True)",
    "deferred": "_launch_split(x2, y2, BLOCK_N, LOG, NUM_WARPS, dict(DEPTH=DEPTH), rounds=False)",
}


def render(spec: dict, knobs: dict[str, Any], signature: dict[str, list[str]]) -> str:
    x = signature["forward"][0]
    strategy = knobs["strategy"]
    consts: dict[str, Any] = {"LOG": spec["log"], "NUM_WARPS": knobs["num_warps"], "MAX_BLOCK": MAX_BLOCK}
    for knob in ("block_n", "ctas_per_sm", "rows", "depth"):
        if knob in knobs:
            consts[knob.upper()] = knobs[knob]
    if strategy == "split_row":
        # knob sets recorded before the prefetch knob existed ran without it
        consts["PREFETCH"] = bool(knobs.get("prefetch", False))
    title = f"Row {'log-' if spec['log'] else ''}softmax over dim {spec['dim']}"
    split = strategy in {"split_row", "deferred"}
    lines = f"""\
        dim = DIM % {x}.dim()
        # reduce over the last axis of a contiguous view: move the softmax dim last when it is not
        xt = {x}.movedim(dim, -1).contiguous()
        x2 = xt.reshape(-1, xt.shape[-1])
        y2 = torch.empty_like(x2)
        {_CALLS[strategy]}
        return y2.reshape(xt.shape).movedim(-1, dim)
"""
    model = plain_model(signature, lines, default="")
    return module(
        f"{title}: kernelbrain row_softmax template ({knob_text(knobs)}).",
        constants(**consts) + constants(DIM=spec["dim"]),
        parts_of(PARTS, *_PARTS[strategy]),
        # the split launcher warms up and launches `_softmax_kernel`: deferred's kernel under that name
        "_softmax_kernel = _softmax_kernel_deferred\n" if strategy == "deferred" else "",
        parts_of(PARTS, *_SPLIT_LAUNCH) if split else "",
        model,
    )
