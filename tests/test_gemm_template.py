"""The gemm_epilogue template family: matched from the traced linear -> relu -> div, every round-0
candidate passes the gate (the seed shape, an irregular one, an int divisor taken from the trace with
no constructor parameter), mutations move knobs, feasibility refuses tiles that do not fit, and a whole
in-process run on the seed problem ends with a gemm_epilogue winner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import gemm_epilogue as ge
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
LINEAR = ROOT / "benchmarks" / "problems" / "linear_relu_div.py"
SMOKE = 'KB_SMOKE_SHAPE = {"batch_size": 16, "in_features": 64, "out_features": 32}'
# no dim a multiple of 16 nor of any block: every edge tile is masked
IRREGULAR = 'KB_SMOKE_SHAPE = {"batch_size": 19, "in_features": 75, "out_features": 41}'
# an int divisor written in forward: the recorder keeps it (as "dim"); Model has no divisor parameter,
# the input is 3-D, and the Linear has another name (state_dict keys differ, so the gate copies nothing:
# ModelNew's nn.Linear, built first after the same seed, draws the same weights)
CONST_DIV = """
import torch
import torch.nn as nn

batch, seq, d_in, d_out = 3, 5, 40, 24
KB_SMOKE_SHAPE = {"batch": 3, "seq": 5, "d_in": 40, "d_out": 24}


class Model(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out)

    def forward(self, x):
        return torch.relu(self.proj(x)) / 3


def get_inputs():
    return [torch.rand(batch, seq, d_in)]


def get_init_inputs():
    return [d_in, d_out]
"""

# problem_variants() and OTHER_PROBLEMS (other families' problems) feed conftest's problems/analyses fixtures
OTHER_PROBLEMS = {
    "softmax": ROOT / "benchmarks" / "problems" / "softmax.py",
    "rmsnorm": ROOT / "benchmarks" / "problems" / "rmsnorm.py",
}


def problem_variants() -> dict[str, str]:
    source = LINEAR.read_text()
    assert SMOKE in source
    return {"seed": source, "irregular": source.replace(SMOKE, IRREGULAR), "const_div": CONST_DIV}


def test_matches_linear_relu_div_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert [o["op"] for o in ops] == ["linear", "relu", "div"]
    assert ops[0]["shape"] == [16, 64] and ops[1]["shape"] == [16, 32]
    spec = ge.matches(ops)
    assert spec == {
        "m": 16,
        "k": 64,
        "n": 32,
        "dtype": "float32",
        "epilogue": ["relu", "div"],
        "divisor": None,  # a float divisor is not recorded: it comes from Model's `divisor` parameter
    }
    const = ge.matches(analyses["const_div"]["ops"])
    assert const["divisor"] == 3.0 and const["m"] == 15 and const["k"] == 40 and const["n"] == 24
    assert ge.matches(analyses["softmax"]["ops"]) is None
    assert ge.matches(analyses["rmsnorm"]["ops"]) is None
    lin, relu, div = ops
    assert ge.matches([lin]) is None  # a bare linear: nothing to fuse
    assert ge.matches([relu, div]) is None
    assert ge.matches([lin, relu, {**div, "op": "sigmoid"}]) is None
    assert ge.matches([lin, relu, {**div, "shape": [16, 33]}]) is None
    assert ge.matches([{**lin, "dtype": "int64"}, relu, div]) is None
    assert ge.matches([lin, {**div, "op": "__truediv__"}, relu])["epilogue"] == ["div", "relu"]


def test_constructor_names():
    assert ge.constructor({"init": ["in_features", "out_features", "divisor"], "forward": ["x"]}) == {
        "in": "in_features",
        "out": "out_features",
        "divisor": "divisor",
        "bias": None,
    }
    names = ge.constructor({"init": ["input_size", "hidden_size", "bias", "divide_by"], "forward": ["x"]})
    assert names == {"in": "input_size", "out": "hidden_size", "divisor": "divide_by", "bias": "bias"}
    assert ge.constructor({"init": ["a", "b"], "forward": ["x"]})["in"] == "a"  # KernelBench's order
    spec = {"m": 4, "k": 8, "n": 8, "dtype": "float32", "epilogue": ["relu", "div"], "divisor": None}
    with pytest.raises(ValueError):
        ge.render(spec, ge.ROUND0[0], {"init": ["a", "b"], "forward": ["x"]})  # no divisor anywhere
    src = ge.render(
        spec, ge.ROUND0[0], {"init": ["in_features", "out_features", "divisor"], "forward": ["x"]}
    )
    assert "def __init__(self, in_features, out_features, divisor):" in src
    assert "self.linear = nn.Linear(in_features, out_features)" in src
    assert "tl.dot(" in src and "F.linear" not in src and "torch.relu" not in src
    src = ge.render(
        {**spec, "linear_attr": "fc"}, ge.ROUND0[0], {"init": ["i", "o", "divisor"], "forward": ["x"]}
    )
    assert "self.fc = nn.Linear(i, o)" in src and "self.fc.weight" in src


@pytest.mark.parametrize("knobs", ge.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", "irregular", "const_div"])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = ge.matches(analysis["ops"])
    assert ge.feasible(spec, knobs)
    source = ge.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    assert r["max_abs_err"] < 1e-4


def test_every_reachable_knob_set_renders_from_the_parts_module():
    knob_sets = reachable_knobs(ge)
    assert {k["strategy"] for k in knob_sets} == {"ieee", "tf32x3"}
    signature = {"init": ["in_features", "out_features", "divisor"], "forward": ["x"]}
    for epilogue in (["relu", "div"], ["div", "relu"], ["relu"], ["div"]):
        spec = {"m": 1024, "k": 8192, "n": 8192, "dtype": "float32", "epilogue": epilogue, "divisor": None}
        for knobs in knob_sets:
            source = ge.render(spec, knobs, signature)
            assert_composed_of_parts(source, ge.PARTS, knobs)
            # the strategy and the epilogue reach the kernel as constexprs, from the module's constants
            assert f"STRATEGY = {knobs['strategy']!r}\n" in source and f"EPILOGUE = {epilogue!r}\n" in source


def test_mutations_move_knobs_and_feasibility_refuses_tiles_that_do_not_fit():
    assert set(ge.MUTATIONS) == set(LABELS)
    for knobs in ge.ROUND0:
        for moves in ge.MUTATIONS.values():
            for move, why in moves:
                child = ge.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    ieee = ge.ROUND0[0]
    assert ieee["strategy"] == "ieee"
    assert ge.mutate(ieee, "tf32x3") == {**ieee, "strategy": "tf32x3"}
    assert ge.mutate(ge.mutate(ieee, "tf32x3"), "tf32x3") is None
    assert ge.mutate(ieee, "larger_tiles") == {**ieee, "block_m": 128}
    assert ge.mutate({**ieee, "block_m": 128}, "smaller_tiles") == ieee
    assert ge.mutate(ieee, "more_stages") == {**ieee, "num_stages": 4}
    assert ge.mutate(ieee, "wider_groups") == {**ieee, "group_m": 16}
    assert ge.mutate(ieee, "longer_k") == {**ieee, "block_k": 64}
    assert ge.mutate({**ieee, "num_warps": 16}, "more_warps") is None
    with pytest.raises(ValueError):
        ge.mutate(ieee, "no_such_move")

    primary = {
        "m": 1024,
        "k": 8192,
        "n": 8192,
        "dtype": "float32",
        "epilogue": ["relu", "div"],
        "divisor": None,
    }
    assert all(ge.feasible(primary, k) for k in ge.ROUND0)
    big = {**ieee, "strategy": "tf32x3", "block_m": 128, "block_n": 128, "block_k": 64, "num_stages": 4}
    assert not ge.feasible(primary, big)  # 4 stages of 64 KiB: shared memory overflows
    assert not ge.feasible(
        primary, {**ieee, "block_m": 256, "block_n": 256, "num_warps": 4}
    )  # 512 acc/thread
    assert not ge.feasible(primary, {**ieee, "block_k": 8})  # tl.dot needs >= 16
    assert not ge.feasible(primary, {**ieee, "block_n": 48})  # not a power of two
    # tiles are clamped to the matrix: at the smoke shape even the big tile fits
    assert ge.feasible({**primary, "m": 16, "k": 64, "n": 32}, big)


def test_kb_run_on_the_seed_problem_picks_a_gemm_epilogue_winner(tmp_path):
    state = run_inprocess(LINEAR, tmp_path / "kb.db", max_candidates=3, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"gemm_epilogue"}
    assert state.candidates[state.finished.winner].proposal.family == "gemm_epilogue"
