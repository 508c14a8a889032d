"""The gemv template family: matched from the traced matmul, every round-0 candidate passes the gate
(the seed shape, an irregular one, a 1-D vector, batched by torch.bmm with a (B, K, 1) or an
unsqueezed (B, K) vector), a real batched GEMM and a broadcast vector are still correct, mutations move
knobs, feasibility refuses oversize accumulators, and a whole in-process run on the seed problem ends
with a gemv winner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates import FAMILIES
from kernelbrain.templates.families import gemv
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
MATVEC = ROOT / "benchmarks" / "problems" / "matvec.py"
BMV = ROOT / "tests" / "problems" / "bmv_small.py"
SMOKE = 'KB_SMOKE_SHAPE = {"M": 64, "K": 4096}'
# M = 37 rows is no multiple of any BLOCK_M; K = 3001 is no multiple of any BLOCK_K (nor of 16)
IRREGULAR = 'KB_SMOKE_SHAPE = {"M": 37, "K": 3001}'
# torch.mv spelling with a 1-D vector: y is (M,)
VECTOR = """
import torch
import torch.nn as nn

M, K = 24, 1500
KB_SMOKE_SHAPE = {"M": 24, "K": 1500}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, x):
        return torch.matmul(A, x)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K)]


def get_init_inputs():
    return []
"""

# problem_variants() and OTHER_PROBLEMS (other families' problems) feed conftest's problems/analyses fixtures
OTHER_PROBLEMS = {
    "softmax": ROOT / "benchmarks" / "problems" / "softmax.py",
    "rmsnorm": ROOT / "benchmarks" / "problems" / "rmsnorm.py",
}


def problem_variants() -> dict[str, str]:
    source = MATVEC.read_text()
    assert SMOKE in source
    bmv = BMV.read_text()
    assert "return torch.bmm(A, x)" in bmv and "torch.rand(batch, K, 1)" in bmv
    return {
        "seed": source,
        "irregular": source.replace(SMOKE, IRREGULAR),
        "vector": VECTOR,
        "batched": bmv,  # 3 batches of (19, 333) by (333, 1)
        # x (B, K): Model unsqueezes it to (B, K, 1) and squeezes the product back to (B, M)
        "batched_column": bmv.replace("torch.bmm(A, x)", "torch.bmm(A, x.unsqueeze(-1)).squeeze(-1)").replace(
            "torch.rand(batch, K, 1)", "torch.rand(batch, K)"
        ),
        # a real batched GEMM (N = 5) and one vector broadcast over the batches: matched, served correctly
        "batched_gemm": bmv.replace("torch.rand(batch, K, 1)", "torch.rand(batch, K, 5)"),
        "broadcast": bmv.replace("torch.rand(batch, K, 1)", "torch.rand(K)").replace(
            "torch.bmm", "torch.matmul"
        ),
    }


def test_matches_the_traced_matmul_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert ops == [
        {"op": "matmul", "ndim": 2, "shape": [64, 4096], "dtype": "float32", "other_shape": [4096, 1]}
    ]
    assert gemv.matches(ops) == {"m": 64, "k": 4096, "batch": 1, "dtype": "float32"}
    assert gemv.matches(analyses["irregular"]["ops"])["k"] == 3001
    assert gemv.matches(analyses["vector"]["ops"])["m"] == 24
    assert gemv.matches(analyses["batched"]["ops"]) == {"m": 19, "k": 333, "batch": 3, "dtype": "float32"}
    assert gemv.matches(analyses["batched_column"]["ops"])["column"] is True
    for name in ("softmax", "rmsnorm"):
        assert [f.FAMILY for f in FAMILIES if f.matches(analyses[name]["ops"])] != ["gemv"], name
        assert gemv.matches(analyses[name]["ops"]) is None
    for name in ("batched", "batched_column", "batched_gemm", "broadcast"):
        assert [f.FAMILY for f in FAMILIES if f.matches(analyses[name]["ops"])] == ["gemv"], name
    # near misses: a 4-D matmul, integer operands, matmul followed by more work
    x = {"op": "matmul", "ndim": 2, "shape": [4, 8], "dtype": "float32"}
    assert gemv.matches([{**x, "ndim": 4, "shape": [2, 2, 4, 8]}]) is None
    assert gemv.matches([{**x, "dtype": "int64"}]) is None
    assert gemv.matches([x, {"op": "relu", "ndim": 2, "shape": [4, 1], "dtype": "float32"}]) is None
    assert gemv.matches([{**x, "op": "__matmul__"}]) is not None
    # the second operand: a vector or a few columns with A's K; a GEMM's N, or another K, is not gemv
    assert gemv.matches([{**x, "other_shape": [8]}]) is not None
    assert gemv.matches([{**x, "other_shape": [8, 16]}]) is not None
    assert gemv.matches([{**x, "other_shape": [8, 17]}]) is None
    assert gemv.matches([{**x, "other_shape": [4, 1]}]) is None
    # the (B, K) spelling only with its own unsqueeze before and squeeze after, both at the last dim
    bmm = {"op": "bmm", "ndim": 3, "shape": [2, 4, 8], "dtype": "float32"}
    unsq = {"op": "unsqueeze", "ndim": 2, "shape": [2, 8], "dtype": "float32", "dim": -1}
    sq = {"op": "squeeze", "ndim": 3, "shape": [2, 4, 1], "dtype": "float32", "dim": 2}
    assert gemv.matches([unsq, bmm, sq])["column"] is True
    assert gemv.matches([{**unsq, "dim": 1}, bmm, sq]) is None  # x (B, 1, K): a row, not a column
    assert gemv.matches([{**unsq, "shape": [2, 4]}, bmm, sq]) is None  # not bmm's vector
    assert gemv.matches([unsq, bmm]) is None
    assert gemv.matches([unsq, bmm, {**sq, "dim": 0}]) is None


# every knob set on the shapes round 0 must serve; the other matched forms with one knob set per strategy
CASES = [
    (v, k) for v in ("seed", "irregular", "vector", "batched", "batched_column") for k in gemv.ROUND0
] + [(v, gemv.ROUND0[i]) for v in ("batched_gemm", "broadcast") for i in (0, 1)]


@pytest.mark.parametrize(
    ("variant", "knobs"), CASES, ids=[f"{v}-" + "-".join(str(x) for x in k.values()) for v, k in CASES]
)
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = gemv.matches(analysis["ops"])
    assert gemv.feasible(spec, knobs)
    source = gemv.render(spec, knobs, analysis["signature"])
    assert "torch.matmul" not in source and ".matmul(" not in source and "bmm(" not in source
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    assert r["max_rel_err"] < 1e-4


def test_every_reachable_knob_set_renders_from_the_parts_module():
    knob_sets = reachable_knobs(gemv)
    assert {k["strategy"] for k in knob_sets} == {"row_blocks", "split_k"}
    specs = [
        {"m": 2048, "k": 1048576, "batch": 1, "dtype": "float32"},
        {"m": 19, "k": 333, "batch": 3, "dtype": "float32", "column": True},
    ]
    for spec in specs:
        for knobs in knob_sets:
            source = gemv.render(spec, knobs, {"init": [], "forward": ["A", "x"]})
            assert_composed_of_parts(source, gemv.PARTS, knobs)
            assert "_gemv_kernel" in source and "_sum_splits_kernel" in source
            split = knobs.get("split_k", 1) if knobs["strategy"] == "split_k" else 1
            assert f"SPLIT_K = {split}\n" in source and f"BLOCK_K = {knobs['block_k']}\n" in source


def test_mutations_move_knobs_and_feasibility_refuses_oversize_tiles():
    assert set(gemv.MUTATIONS) == set(LABELS)
    for knobs in gemv.ROUND0:
        for moves in gemv.MUTATIONS.values():
            for move, why in moves:
                child = gemv.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    rows = {"strategy": "row_blocks", "block_m": 8, "block_k": 1024, "num_warps": 8}
    split = {"strategy": "split_k", "block_m": 16, "block_k": 512, "split_k": 16, "num_warps": 4}
    assert gemv.mutate(rows, "more_splits") == {**rows, "strategy": "split_k", "split_k": 4}
    assert gemv.mutate(split, "more_splits") == {**split, "split_k": 32}
    assert gemv.mutate(split, "single_pass") == rows | {"block_m": 16, "block_k": 512, "num_warps": 4}
    assert gemv.mutate(rows, "single_pass") is None
    assert gemv.mutate({**split, "split_k": 2}, "fewer_splits")["strategy"] == "row_blocks"
    assert gemv.mutate(rows, "more_rows") == {**rows, "block_m": 16, "block_k": 512}  # same tile size
    assert gemv.mutate(rows, "smaller_tiles") == {**rows, "block_k": 512}
    assert gemv.mutate(rows, "more_warps") == {**rows, "num_warps": 16}
    assert gemv.mutate({**rows, "num_warps": 16}, "more_warps") is None
    assert gemv.mutate({**rows, "num_warps": 1}, "fewer_warps") is None
    with pytest.raises(ValueError):
        gemv.mutate(rows, "no_such_move")

    primary = {"m": 2048, "k": 1048576, "dtype": "float32"}
    assert all(gemv.feasible(primary, k) for k in gemv.ROUND0)
    assert not gemv.feasible(primary, {**rows, "block_m": 32, "block_k": 1024})  # 32768 > MAX_TILE
    assert not gemv.feasible(primary, {**rows, "block_m": 4, "block_k": 4096, "num_warps": 4})  # 128/thread
    assert not gemv.feasible(primary, {**split, "split_k": 1})
    # a tile is never taller than the matrix: at M = 2 only two rows count
    assert gemv.feasible({**primary, "m": 2}, {**rows, "block_m": 64, "block_k": 4096})


def test_kb_run_on_the_seed_problem_picks_a_gemv_winner(tmp_path):
    state = run_inprocess(MATVEC, tmp_path / "kb.db", max_candidates=3, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"gemv"}
    assert state.candidates[state.finished.winner].proposal.family == "gemv"


def test_a_family_that_the_files_own_shape_does_not_match_is_not_used():
    """On CPU the rungs time a fitted shape: a GEMM fitted down to a few columns looks like gemv there,
    but the file's own shape (the analysis's primary_ops) is a GEMM, so no gemv kernel is proposed."""
    from kernelbrain.core.events import ProblemAnalysed
    from kernelbrain.generators.base import GenerationError
    from kernelbrain.generators.expert import ExpertGenerator

    def product(m: int, k: int, n: int) -> list[dict]:
        return [{"op": "matmul", "ndim": 2, "shape": [m, k], "dtype": "float32", "other_shape": [k, n]}]

    def analysis(primary: list[dict]) -> ProblemAnalysed:
        ops = product(16, 64, 4)
        sig = {"init": [], "forward": ["A", "B"]}
        return ProblemAnalysed(
            ops=ops, families=[], flops=1, bytes=1, shapes=["d"], signature=sig, primary_ops=primary
        )

    gen = ExpertGenerator()
    assert gen.match_family(analysis([]))[0] is gemv  # a GPU run: the traced shape is the file's
    assert gen.match_family(analysis(product(2048, 8192, 4)))[0] is gemv
    with pytest.raises(GenerationError, match="no offline template"):
        gen.match_family(analysis(product(2048, 8192, 4096)))
