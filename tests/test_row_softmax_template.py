"""The row_softmax family's split_row strategy: a row too long for one program's registers is split
over programs that exchange their chunk's max and sum. On CPU the interpreter runs the two-launch form
of the same kernel (programs there cannot wait for each other); the gate checks its numbers, and the
feasibility and mutation rules decide when the strategy is offered. The one-launch form (with and
without prefetch) runs here too, with its waits preset to pass."""

from __future__ import annotations

import json

import pytest
import triton

from kernelbrain import candidate
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import row_softmax as rs
from kernelbrain.templates.families.row_softmax import parts as parts_module
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import run_interpreted

SIGNATURE = {"init": [], "forward": ["x"]}


def long_rows(op: str) -> str:
    # 20000 columns: 3 chunks of 8192 (the last one partial) or 2 of 16384
    return f"""
import torch
import torch.nn as nn

batch_size, dim = 3, 20000
KB_SMOKE_SHAPE = {{"batch_size": 3, "dim": 20000}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.{op}(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""


SPLIT = [k for k in rs.ROUND0 if k["strategy"] == "split_row"]
DEFERRED = {"strategy": "deferred", "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8, "depth": 1}
# the prefetching form: on CPU its two-launch path, and its source is checked below
PREFETCHED = rs.mutate(SPLIT[0], "prefetch")


@pytest.mark.parametrize(
    "knobs",
    [*SPLIT, PREFETCHED, DEFERRED],
    ids=lambda k: f"{k['strategy']}-block{k['block_n']}-prefetch{k.get('prefetch', False)}",
)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_split_row_passes_the_gate(box, op, knobs):
    spec = {"log": op == "log_softmax", "dim": 1, "ndim": 2, "n_cols": 20000}
    assert rs.feasible(spec, knobs)
    source = rs.render(spec, knobs, SIGNATURE)
    args = {"problem_source": long_rows(op), "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    assert r["max_abs_err"] < 1e-4


def test_split_row_is_offered_only_for_rows_it_can_split():
    knobs = SPLIT[0]
    assert knobs["block_n"] == 8192
    assert not rs.feasible({"n_cols": 1000}, knobs)  # one chunk: a whole-row strategy does it
    assert rs.feasible({"n_cols": 393216}, knobs)  # the seed problem's rows: 48 chunks
    assert not rs.feasible({"n_cols": 393216}, {**knobs, "block_n": 1024})  # 384 chunks cannot all run
    assert not rs.feasible({"n_cols": None}, knobs)
    # the diagnosis that ends every other strategy's search on long rows now has a move
    online = {"strategy": "online", "block_n": 1024, "num_warps": 4}
    moves = dict(rs.MUTATIONS["memory-bound near peak"])
    assert "split_row" in moves
    child = rs.mutate(online, "split_row")
    assert child["strategy"] == "split_row" and rs.feasible({"n_cols": 393216}, child)
    assert rs.mutate(child, "split_row") is None
    assert rs.mutate(child, "larger_tiles")["block_n"] == 16384
    assert rs.mutate({**child, "block_n": rs.MAX_BLOCK}, "larger_tiles") is None
    # prefetch holds two chunks: half the programs per SM; once only, and only for split_row
    assert rs.mutate(child, "prefetch") == {
        **child,
        "prefetch": True,
        "ctas_per_sm": child["ctas_per_sm"] // 2,
    }
    assert rs.mutate(PREFETCHED, "prefetch") is None and rs.mutate(online, "prefetch") is None


def test_split_row_source_waits_only_on_the_gpu_and_boundedly():
    src = rs.render({"log": False, "dim": -1, "ndim": 2, "n_cols": 393216}, SPLIT[0], SIGNATURE)
    compile(src, "<split_row>", "exec")
    assert f"CTAS_PER_SM = {SPLIT[0]['ctas_per_sm']}" in src and SPLIT[0]["ctas_per_sm"] == 4
    assert 'sem="release"' in src and 'sem="acquire"' in src
    assert "spins < " in src  # a violated co-residency assumption ends as a wrong result, not a hang
    assert "if x2.is_cuda" in src  # the interpreter never takes the waiting path


@pytest.mark.parametrize("strategy", ["split_row", "deferred"])
def test_the_waiting_grid_holds_only_programs_the_compiled_kernel_fits(strategy):
    # H200: 65536 registers and 228 KiB of shared memory a multiprocessor (227 KiB at most for one
    # program). split_row at 8192 x 8 warps took 64 registers a thread on the H200 (session 4's ncu);
    # compiled here it takes 64 to 111 by the Triton and ptxas versions and the arguments' alignment.
    # At 111 an SM holds 2 programs, not the 4 asked for: a grid of 4 would wait on programs never run
    knobs = {"strategy": strategy, "block_n": 8192, "ctas_per_sm": 4, "num_warps": 8, "depth": 1}
    spec = {"log": False, "dim": -1, "ndim": 2, "n_cols": 393216}
    h200 = {"max_regs": 65536, "max_shared": 232448}
    assert candidate.programs_fitting(111, 0, 8, **h200) == 2  # 14 blocks of 256 registers a warp
    assert candidate.programs_fitting(61, 0, 8, **h200) == 4  # 64 a thread: exactly 4 x 8 warps
    assert candidate.programs_fitting(64, 0, 16, **h200) == 2  # and 2048 threads an SM
    assert candidate.programs_fitting(48, 0, 4, **h200) == 10
    assert candidate.programs_fitting(32, 100_000, 4, **h200) == 2  # shared memory binds
    assert candidate.programs_fitting(32, 116_224, 4, **h200) == 1  # with the KiB each program reserves
    assert (
        candidate.programs_fitting(136, 0, 2, **h200) == 6
    )  # registers come from each quarter of the SM: not 7
    assert candidate.programs_fitting(16, 0, 1, **h200) == 32  # never more than 32 programs an SM
    src = rs.render(spec, knobs, SIGNATURE)
    # the candidate asks kb's candidate API, which compiles the kernel for the arguments and fits it
    assert "candidate.programs_per_sm(_softmax_kernel, *run, cap=CTAS_PER_SM, PHASE=0, **meta)" in src


def test_split_row_prefetch_loads_the_next_chunk_before_waiting():
    spec = {"log": False, "dim": -1, "ndim": 2, "n_cols": 393216}
    plain, pre = rs.render(spec, SPLIT[0], SIGNATURE), rs.render(spec, PREFETCHED, SIGNATURE)
    assert "PREFETCH = False" in plain and "PREFETCH = True" in pre
    publish, stats, body = (
        pre[pre.index(f"def {f}(") :] for f in ("_publish", "_row_stats", "_softmax_kernel")
    )
    assert 'sem="release"' in publish[: publish.index("@triton.jit")]  # the release is _publish's
    assert "while (" in stats[: stats.index("@triton.jit")]  # the wait is _row_stats's
    # the next chunk's load sits between this chunk's release and the wait
    release, load, wait = (body.index(t) for t in ("_publish(", "item + step", "_row_stats("))
    assert release < load < wait


# The waiting path (PHASE 0) runs only on a GPU in kb; here it runs through the interpreter with every
# row's count preset to "all chunks published" (by a PHASE 1 launch's statistics), so no program waits,
# on a grid smaller than the work: each program takes several items, and prefetches past the last one.
PHASE0 = """
import json, sys, torch
from kernelbrain import candidate
from kernelbrain.child.loading import load_module
from kernelbrain.templates.families import row_softmax as rs

knobs, grid = json.loads(sys.argv[1]), int(sys.argv[2])
log = knobs["strategy"] == "deferred"  # each strategy through one of the two forms
m = load_module(rs.render({"log": log, "dim": -1, "ndim": 2, "n_cols": 1000}, knobs,
                          {"init": [], "forward": ["x"]}), "cand")
torch.manual_seed(0)
x = torch.randn(5, 1000) * 4
y = torch.full_like(x, float("nan"))
n_chunks, n_items = 4, 20
pm, ps = torch.empty(n_items), torch.empty(n_items)
meta = dict(CHUNKS_P2=4, BLOCK=256, LOG=log, num_warps=4)
if knobs["strategy"] == "split_row":
    stats, one = {"PREFETCH": False}, {"PREFETCH": knobs["prefetch"]}
else:
    stats = one = {"DEPTH": knobs["depth"]}
args = (x, y, pm, ps)
m._softmax_kernel[(n_items,)](*args, pm, 1000, n_chunks, n_items, 1000, 1000, PHASE=1, **stats, **meta)
cnt = torch.full((5,), n_chunks, dtype=torch.int32)
m._softmax_kernel[(grid,)](*args, cnt, 1000, n_chunks, n_items, 1000, 1000, PHASE=0, **one, **meta)
ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
# relative where log values reach -40
err = ((y.double() - ref).abs() / ((ref.abs() + 1) if log else 1)).max().item()
print(json.dumps({"err": err, "cnt": cnt.tolist()}))
"""
SMALL = {"block_n": 256, "ctas_per_sm": 1, "num_warps": 4}


@pytest.mark.parametrize("depth", [1, 2])
def test_deferred_one_launch_path_normalises_every_item_it_lags_behind(depth):
    # 6 programs over 20 items: each publishes its items and normalises the one DEPTH iterations back,
    # the last ones in the lag's extra iterations (a program whose normalisations were cut short
    # leaves NaN behind)
    knobs = {"strategy": "deferred", **SMALL, "depth": depth}
    out = run_interpreted(PHASE0, json.dumps(knobs), "6")
    assert out["err"] < 1e-6, out
    assert out["cnt"] == [8] * 5, out


def test_deferred_is_offered_where_split_row_is_and_reads_twice_through_l2():
    spec = {"log": False, "dim": -1, "ndim": 2, "n_cols": 393216}
    online = next(k for k in rs.ROUND0 if k["strategy"] == "online")
    child = rs.mutate(online, "deferred")
    assert child["strategy"] == "deferred" and rs.feasible(spec, child)
    assert rs.mutate(child, "deferred") is None
    assert not rs.feasible({**spec, "n_cols": 8192}, child)  # one chunk: a whole-row strategy does it
    assert not rs.feasible(spec, {**child, "depth": 0})
    # 96 chunks of 4096: more than split_row's rounds hold, but 2 programs an SM on >= 64 SMs hold a row
    small = {**child, "block_n": 4096, "ctas_per_sm": 2}
    assert rs.feasible(spec, small) and not rs.feasible(spec, {**small, "strategy": "split_row"})
    assert not rs.feasible(spec, {**small, "ctas_per_sm": 1})
    assert rs.mutate(child, "smaller_tiles")["block_n"] == child["block_n"] // 2
    src = rs.render(spec, child, SIGNATURE)
    assert "DEPTH = 1" in src and "CTAS_PER_SM = 4" in src and "PREFETCH" not in src
    body = src[src.index("def _softmax_kernel") :]
    # published before the wait on an earlier row; the first read kept in L2, the second let go
    assert body.index("_publish(") < body.index("_row_stats(")
    assert 'eviction_policy="evict_last"' in body and body.count('eviction_policy="evict_first"') == 2
    assert "spins < " in src and 'sem="release"' in src and "if x2.is_cuda" in src


@pytest.mark.parametrize("prefetch", [False, True])
def test_split_row_one_launch_path_with_and_without_prefetch(prefetch):
    knobs = {"strategy": "split_row", **SMALL, "prefetch": prefetch}
    out = run_interpreted(PHASE0, json.dumps(knobs), "3")
    assert out["err"] < 1e-6, out  # every row normalised (NaN would fail too)
    assert out["cnt"] == [8] * 5, out  # each of a row's 4 chunks published once, in the one launch


def test_every_reachable_knob_set_renders_from_the_parts_module():
    # every knob set any chain of mutations reaches: each kernel and launcher is the parts module's own
    reached = reachable_knobs(rs, depth=None)
    assert {k["strategy"] for k in reached} == {"single_pass", "online", "multi_row", "split_row", "deferred"}
    for knobs in reached:
        for log in (False, True):
            spec = {"log": log, "dim": -1, "ndim": 2, "n_cols": 393216}
            source = rs.render(spec, knobs, SIGNATURE)
            found = assert_composed_of_parts(source, rs.PARTS, knobs)
            assert "_softmax_kernel" in source, knobs
            for name in found.kernels:
                assert isinstance(getattr(parts_module, name), triton.runtime.JITFunction), (knobs, name)
