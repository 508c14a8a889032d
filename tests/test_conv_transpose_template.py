"""The conv_transpose template family: matched from the traced conv_transpose2d (and nothing else),
every round-0 candidate passes the gate (the seed problem's smoke shape and an irregular variant with
other stride/padding/dilation/groups, a bias and output sizes no block divides), mutations move knobs,
feasibility refuses tiles that do not fit, and a whole in-process run ends with a conv_transpose winner."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.diagnosis import LABELS
from kernelbrain.problem import read_problem
from kernelbrain.sandbox import Sandbox
from kernelbrain.templates import conv_transpose as ct
from tests.runs import run_inprocess

ROOT = Path(__file__).resolve().parents[1]
GROUP_CONV = ROOT / "benchmarks" / "problems" / "group_conv.py"
SOFTMAX = ROOT / "benchmarks" / "problems" / "softmax.py"
RMSNORM = ROOT / "benchmarks" / "problems" / "rmsnorm.py"
LINEAR = ROOT / "benchmarks" / "problems" / "linear_relu_div.py"
# stride (3, 2), padding (2, 0), dilation (1, 3), 3 groups of 2 -> 3 channels, a bias, square kernel
# given as an int; output 1 x 9 x 17 x 14: no dimension a multiple of any block
IRREGULAR = """
import torch
import torch.nn as nn

batch_size, in_channels, out_channels, kernel_size = 2, 6, 9, 3
height, width = 6, 5
stride, padding, dilation, groups, bias = (3, 2), (2, 0), (1, 3), 3, True
KB_SMOKE_SHAPE = {"batch_size": 2, "height": 6, "width": 5}


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=False):
        super().__init__()
        self.conv_transpose2d = nn.ConvTranspose2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
            groups=groups, bias=bias,
        )

    def forward(self, x):
        return self.conv_transpose2d(x)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias]
"""


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("conv_problems")
    (tmp / "irregular.py").write_text(IRREGULAR)
    return {"seed": read_problem(GROUP_CONV), "irregular": read_problem(tmp / "irregular.py")}


@pytest.fixture(scope="module")
def analyses(box: Sandbox, problems: dict[str, str]) -> dict[str, dict]:
    sources = {
        **problems,
        "softmax": SOFTMAX.read_text(),
        "rmsnorm": RMSNORM.read_text(),
        "linear": LINEAR.read_text(),
    }
    return {
        name: box.call("analyse", {"problem_source": src, "device": "cpu"}, timeout_s=120)[0]
        for name, src in sources.items()
    }


def test_matches_conv_transpose2d_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert [o["op"] for o in ops] == ["conv_transpose2d"]
    assert ct.matches(ops) == {"n": 2, "c_in": 32, "h": 8, "w": 12, "dtype": "float32"}
    assert ct.matches(analyses["irregular"]["ops"])["c_in"] == 6
    for other in ("softmax", "rmsnorm", "linear"):
        assert ct.matches(analyses[other]["ops"]) is None, other
    (conv,) = ops
    assert ct.matches([conv, {**conv, "op": "relu"}]) is None  # an epilogue: not this family
    assert ct.matches([{**conv, "op": "conv2d"}]) is None
    assert ct.matches([{**conv, "dtype": "int64"}]) is None
    assert ct.matches([{**conv, "shape": [2, 32, 8], "ndim": 3}]) is None
    assert ct.matches([{"op": "contiguous", "shape": [2, 32, 8, 12]}, conv]) is not None
    assert analyses["seed"]["signature"]["init"][:3] == ["in_channels", "out_channels", "kernel_size"]


def test_render_keeps_the_module_and_calls_no_torch_conv():
    sig = {
        "init": [
            "in_channels",
            "out_channels",
            "kernel_size",
            "stride",
            "padding",
            "dilation",
            "groups",
            "bias",
        ],
        "forward": ["x"],
    }
    src = ct.render({}, ct.ROUND0[0], sig)
    assert "self.conv_transpose2d = nn.ConvTranspose2d(" in src
    assert "conv_transpose2d(x" not in src and "F.conv" not in src
    # KernelBench's positional order when the names are not ConvTranspose2d's
    src = ct.render(
        {"conv_attr": "up"}, ct.ROUND0[3], {"init": ["cin", "cout", "k", "s"], "forward": ["inp"]}
    )
    assert "self.up = nn.ConvTranspose2d(in_channels=cin, out_channels=cout, kernel_size=k, stride=s)" in src
    assert "def forward(self, inp):" in src and "tl.dot(" in src


@pytest.mark.parametrize("knobs", ct.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", "irregular"])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = ct.matches(analysis["ops"])
    assert ct.feasible(spec, knobs)
    source = ct.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call("gate", args, timeout_s=300)[0]
    assert r["passed"] is True, r
    assert r["max_abs_err"] < 1e-4


def test_mutations_move_knobs_and_feasibility_refuses_tiles_that_do_not_fit():
    assert set(ct.MUTATIONS) == set(LABELS)
    for knobs in ct.ROUND0:
        for moves in ct.MUTATIONS.values():
            for move, why in moves:
                child = ct.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    direct = ct.ROUND0[0]
    assert direct["strategy"] == "direct"
    assert ct.mutate(direct, "phase") == {**direct, "strategy": "phase"}
    assert ct.mutate(ct.mutate(direct, "phase"), "phase") is None
    assert ct.mutate(direct, "dot") == {**direct, "strategy": "phase_dot", "block_k": 16}
    assert ct.mutate(ct.ROUND0[3], "dot") is None
    assert ct.mutate(direct, "larger_tiles") == {**direct, "block_p": 512}
    assert ct.mutate(direct, "smaller_tiles") == {**direct, "block_p": 128}
    assert ct.mutate(direct, "wider_channels") == {**direct, "block_c": 32}
    assert ct.mutate({**direct, "num_warps": 16}, "more_warps") is None
    rows = ct.mutate(direct, "rows")
    assert rows == {**direct, "strategy": "rows", "block_k": 1} and ct.mutate(rows, "rows") is None
    assert {k["strategy"] for k in ct.ROUND0} == set(ct.STRATEGIES)
    with pytest.raises(ValueError):
        ct.mutate(direct, "no_such_move")

    spec = {"n": 16, "c_in": 32, "h": 128, "w": 256, "dtype": "float32"}
    assert all(ct.feasible(spec, k) for k in ct.ROUND0)
    dot = ct.ROUND0[3]
    assert not ct.feasible(spec, {**dot, "block_k": 8})  # tl.dot needs >= 16
    assert not ct.feasible(spec, {**dot, "block_p": 48})  # not a power of two
    assert not ct.feasible(spec, {**dot, "block_p": 512, "block_c": 128, "num_warps": 4})  # 512 acc/thread
    assert not ct.feasible(spec, {**direct, "block_k": 64, "num_warps": 4})  # the K x C x P product spills
    assert not ct.feasible(spec, {**direct, "strategy": "winograd"})
    assert not ct.feasible(spec, {**rows, "block_p": 1024, "block_c": 64})  # one phase's acc spills


def test_kb_run_picks_a_conv_transpose_winner(tmp_path):
    problem = tmp_path / "irregular_conv.py"
    problem.write_text(IRREGULAR)
    state = run_inprocess(problem, tmp_path / "kb.db", max_candidates=2)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"conv_transpose"}
    assert state.candidates[state.finished.winner].proposal.family == "conv_transpose"
