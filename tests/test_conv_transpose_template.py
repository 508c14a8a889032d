"""The conv_transpose template family: matched from the traced conv_transpose2d (and nothing else),
every round-0 candidate passes the gate (the seed problem's smoke shape and an irregular variant with
other stride/padding/dilation/groups, a bias and output sizes no block divides), `rows_dense` matches
torch on convolutions that reach every corner of its phase and offset arithmetic, mutations move knobs,
feasibility refuses tiles that do not fit, and a whole in-process run ends with a conv_transpose winner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime.runner import DEFAULT_RUNGS
from kernelbrain.templates import conv_transpose as ct
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_inprocess, run_interpreted

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


def _first(strategy: str) -> dict:
    return next(k for k in ct.ROUND0 if k["strategy"] == strategy)


# other families' problems, which conv_transpose must not match (tests/conftest.py's `analyses` traces them)
OTHER_PROBLEMS = {"softmax": SOFTMAX, "rmsnorm": RMSNORM, "linear": LINEAR}


def problem_variants() -> dict[str, str]:
    """The seed problem and the irregular variant (tests/conftest.py's `problems` reads them)."""
    return {"seed": GROUP_CONV.read_text(), "irregular": IRREGULAR}


def test_matches_conv_transpose2d_and_nothing_else(analyses):
    ops = analyses["seed"]["ops"]
    assert [o["op"] for o in ops] == ["conv_transpose2d"]
    assert ct.matches(ops) == {"n": 1, "c_in": 32, "h": 4, "w": 6, "dtype": "float32"}
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
        {"conv_attr": "up"}, _first("phase_dot"), {"init": ["cin", "cout", "k", "s"], "forward": ["inp"]}
    )
    assert "self.up = nn.ConvTranspose2d(in_channels=cin, out_channels=cout, kernel_size=k, stride=s)" in src
    assert "def forward(self, inp):" in src and "tl.dot(" in src


def test_every_render_is_composed_from_the_parts_module():
    """Every round-0 knob set and every knob set one mutation away (each strategy, prepack, each dot
    precision) renders a module that parses, whose functions (kernels and launcher) are the parts
    module's own, as written there, and that holds no placeholder."""
    sets = reachable_knobs(ct)
    assert {k["strategy"] for k in sets} == set(ct.STRATEGIES)
    assert {ct.fp32_dot(k) for k in sets} == set(ct.FP32_DOTS) and any(k.get("prepack") for k in sets)
    sig = {"init": ["in_channels", "out_channels", "kernel_size"], "forward": ["x"]}
    for knobs in sets:
        src = ct.render({}, knobs, sig)
        found = assert_composed_of_parts(src, ct.PARTS, knobs)
        assert found.kernels == set(ct.KERNEL_PARTS), knobs
        assert found.functions == {*ct.KERNEL_PARTS, *ct.HOST_PARTS}, knobs


@pytest.mark.parametrize("knobs", ct.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize("variant", ["seed", "irregular"])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant, knobs):
    analysis = analyses[variant]
    spec = ct.matches(analysis["ops"])
    assert ct.feasible(spec, knobs)
    source = ct.render(spec, knobs, analysis["signature"])
    args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    assert r["passed"] is True, r
    assert r["max_abs_err"] < 1e-4


# Runs in a fresh interpreter (TRITON_INTERPRET must be set before triton is imported): each knob set's
# ModelNew against torch's own ConvTranspose2d in float64, over convolutions that reach every corner of
# rows_dense's index arithmetic.
EDGE_RUN = """
import json, sys
import torch
from kernelbrain.child.loading import load_module
from kernelbrain.templates import conv_transpose as ct

sig = {"init": ["in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding",
                "groups", "bias", "dilation"], "forward": ["x"]}
out = []
for knobs in json.loads(sys.argv[1]):
    mod = load_module(ct.render({}, knobs, sig), "cand")
    for case in json.loads(sys.argv[2]):
        torch.manual_seed(0)
        n, h, w = case.pop("x")
        case.setdefault("bias", False)  # ModelNew's default is KernelBench's, not nn.ConvTranspose2d's
        new = mod.ModelNew(**case)
        ref = torch.nn.ConvTranspose2d(**case).double()
        ref.load_state_dict({k: v.double() for k, v in new.conv_transpose2d.state_dict().items()})
        x = torch.randn(n, case["in_channels"], h, w) * 8
        got = new(x)
        want = ref(x.double())
        err = float((got.double() - want).abs().max()) if want.numel() else 0.0
        out.append({"knobs": knobs, "case": case, "shape": list(got.shape), "want": list(want.shape),
                    "err": err, "finite": bool(torch.isfinite(got).all())})
print(json.dumps(out))
"""
# in, out, kernel, stride, padding, output_padding, groups, bias, dilation; x = (n, h, w)
EDGE_CASES = [
    # the seed problem's conv at a tiny size: row phases without taps, 1 or 2 taps per column phase
    dict(
        in_channels=32,
        out_channels=64,
        kernel_size=(3, 5),
        stride=(2, 3),
        padding=(1, 2),
        groups=4,
        dilation=(2, 1),
        x=(1, 3, 5),
    ),
    # stride 5 (phase axis padded to 8), dilation 2 coprime with it, output_padding, bias, 3 output
    # channels per group (a channel block partly masked)
    dict(
        in_channels=4,
        out_channels=6,
        kernel_size=(2, 7),
        stride=(2, 5),
        padding=(0, 4),
        output_padding=(1, 3),
        groups=2,
        bias=True,
        dilation=(3, 2),
        x=(2, 3, 4),
    ),
    # dilation 4 sharing a factor 2 with stride 6: half the column phases take no tap at all
    dict(
        in_channels=4,
        out_channels=4,
        kernel_size=(1, 6),
        stride=(1, 6),
        padding=(0, 1),
        dilation=(1, 4),
        bias=True,
        x=(1, 3, 4),
    ),
    # stride 1 (one phase, nothing padded), padding past the kernel's reach on one side
    dict(in_channels=3, out_channels=5, kernel_size=3, stride=1, padding=(2, 1), x=(1, 5, 6)),
    # kernel smaller than the stride (columns no tap reaches), 1x1 input
    dict(in_channels=2, out_channels=3, kernel_size=(2, 2), stride=(3, 4), x=(2, 1, 1)),
    # a single output column
    dict(in_channels=2, out_channels=2, kernel_size=(3, 1), stride=(2, 2), padding=(1, 0), x=(1, 2, 1)),
]
DENSE_KNOBS = [
    *[k for k in ct.ROUND0 if k["strategy"] == "rows_dense"],
    # narrow tiles: several column blocks per row and several channel blocks per group
    {"strategy": "rows_dense", "block_p": 16, "block_c": 4, "block_k": 1, "num_warps": 1},
    # the three-TF32-dot path (the interpreter computes it in fp32: this checks the indexing, the GPU
    # gate its precision)
    {
        "strategy": "rows_dense",
        "block_p": 64,
        "block_c": 8,
        "block_k": 4,
        "num_warps": 2,
        "fp32_dot": "tf32x3",
    },
    # packed weight tiles with several channel blocks and K steps (partial tiles zero-filled)
    {"strategy": "rows_dense", "block_p": 16, "block_c": 4, "block_k": 1, "num_warps": 1, "prepack": True},
]


def test_rows_dense_matches_torch_on_edge_cases():
    results = run_interpreted(EDGE_RUN, json.dumps(DENSE_KNOBS), json.dumps(EDGE_CASES), timeout=600)
    assert len(results) == len(DENSE_KNOBS) * len(EDGE_CASES)
    for r in results:
        assert r["shape"] == r["want"] and r["finite"] and r["err"] < 1e-4, r


def test_mutations_move_knobs_and_feasibility_refuses_tiles_that_do_not_fit():
    assert set(ct.MUTATIONS) == set(LABELS)
    for knobs in ct.ROUND0:
        for moves in ct.MUTATIONS.values():
            for move, why in moves:
                child = ct.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
    direct = _first("direct")
    assert ct.mutate(direct, "phase") == {**direct, "strategy": "phase"}
    assert ct.mutate(ct.mutate(direct, "phase"), "phase") is None
    assert ct.mutate(direct, "dot") == {**direct, "strategy": "phase_dot", "block_k": 16}
    assert ct.mutate(_first("phase_dot"), "dot") is None
    assert ct.mutate(direct, "larger_tiles") == {**direct, "block_p": 512}
    assert ct.mutate(direct, "smaller_tiles") == {**direct, "block_p": 128}
    assert ct.mutate(direct, "wider_channels") == {**direct, "block_c": 32}
    assert ct.mutate({**direct, "num_warps": 16}, "more_warps") is None
    rows = ct.mutate(direct, "rows")
    assert rows == {**direct, "strategy": "rows", "block_k": 1} and ct.mutate(rows, "rows") is None
    dense = ct.mutate(rows, "rows_dense")
    assert (
        dense == {**rows, "strategy": "rows_dense", "block_k": 8} and ct.mutate(dense, "rows_dense") is None
    )
    assert ct.mutate(dense, "longer_k") == {**dense, "block_k": 16}
    tf32 = ct.mutate(dense, "tf32x3_dot")
    assert tf32 == {**dense, "fp32_dot": "tf32x3"} and ct.mutate(tf32, "tf32x3_dot") is None
    assert ct.mutate(tf32, "ieee_dot") == {**dense, "fp32_dot": "ieee"}
    assert ct.mutate(dense, "ieee_dot") is None  # ieee is the default
    assert ct.mutate(direct, "tf32x3_dot") is None  # FMA outer products take no dot precision
    assert ct.mutate(dense, "prepack") == {**dense, "prepack": True}
    assert ct.mutate({**dense, "prepack": True}, "prepack") is None and ct.mutate(direct, "prepack") is None
    assert {k["strategy"] for k in ct.ROUND0} == set(ct.STRATEGIES)
    assert ct.ROUND0[0]["strategy"] == "rows_dense"  # measured first under a short budget
    with pytest.raises(ValueError):
        ct.mutate(direct, "no_such_move")

    spec = {"n": 16, "c_in": 32, "h": 128, "w": 256, "dtype": "float32"}
    assert all(ct.feasible(spec, k) for k in ct.ROUND0)
    dot = _first("phase_dot")
    assert not ct.feasible(spec, {**dot, "block_k": 8})  # tl.dot needs >= 16
    assert not ct.feasible(spec, {**dot, "block_p": 48})  # not a power of two
    assert not ct.feasible(spec, {**dot, "block_p": 512, "block_c": 128, "num_warps": 4})  # 512 acc/thread
    assert not ct.feasible(spec, {**direct, "block_k": 64, "num_warps": 4})  # the K x C x P product spills
    assert not ct.feasible(spec, {**direct, "strategy": "winograd"})
    assert not ct.feasible(spec, {**rows, "block_p": 1024, "block_c": 64})  # one phase's acc spills
    assert not ct.feasible(spec, {**dense, "block_p": 1024, "block_c": 64, "num_warps": 4})  # acc spills
    assert ct.feasible(spec, {**dense, "block_c": 4})  # widened to tl.dot's 16 rows at launch
    assert not ct.feasible(spec, {**dense, "block_p": 8})
    assert not ct.feasible(spec, {**dense, "fp32_dot": "tf32"})  # plain TF32 misses 1e-4
    assert not ct.feasible(spec, {**direct, "prepack": True})  # nothing to pack


@pytest.mark.long
def test_kb_run_picks_a_conv_transpose_winner(tmp_path):
    problem = tmp_path / "irregular_conv.py"
    problem.write_text(IRREGULAR)
    # one candidate: an interpreted conv call takes ~1.6 s, and two near-equal round-0 candidates
    # cost a duel of 12+ pairs at each rung (minutes); choosing among candidates is test_scheduler's.
    state = run_inprocess(problem, tmp_path / "kb.db", max_candidates=1, rungs=QUICK_RUNGS)
    assert state.finished.winner
    assert {c.proposal.family for c in state.candidates.values()} == {"conv_transpose"}
    assert state.candidates[state.finished.winner].proposal.family == "conv_transpose"
    assert state.finished.winner_rung == len(DEFAULT_RUNGS["cpu"]) - 1  # measured at every rung
