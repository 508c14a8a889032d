"""The conv_transpose template family, composed from the traced graph: transposed convolutions in 1-D,
2-D and 3-D (stride, padding, output padding, dilation, groups, with and without bias; odd sizes,
stride past the kernel, narrow groups) with the elementwise chain after them fused and a tail after that,
against torch in float64 through the interpreter; the measured 2-D strategies still serve a plain 2-D
one (every round-0 candidate of the seed problem and an irregular variant passes the gate, `rows_dense`
matches torch on convolutions that reach every corner of its phase and offset arithmetic); what it
refuses, named; the parts every reachable knob set renders; mutations and feasibility; a whole `kb run`
on a 3-D problem with a fused chain."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelbrain.child.analysis import analyse
from kernelbrain.child.graph import capture
from kernelbrain.core.diagnosis import LABELS
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime.runner import DEFAULT_RUNGS
from kernelbrain.templates import compose
from kernelbrain.templates.decompose import expand
from kernelbrain.templates.families import conv, pointwise
from kernelbrain.templates.families import conv_transpose as ct
from kernelbrain.templates.render import chain
from tests.composed import graph_of, load
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
GROUP_CONV = ROOT / "benchmarks" / "problems" / "group_conv.py"
CONVT3D = ROOT / "tests" / "problems" / "convt3d_bias_hardswish.py"
SIGNATURE = {"init": [], "forward": ["x"], "params": []}
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
# other families' problems, which conv_transpose must not match (tests/conftest.py's `analyses` traces them)
OTHER_PROBLEMS = {
    name: ROOT / "benchmarks" / "problems" / f"{name}.py"
    for name in ("softmax", "rmsnorm", "linear_relu_div")
}
OTHER_PROBLEMS["conv"] = ROOT / "tests" / "problems" / "conv_grouped_mish.py"


def problem_variants() -> dict[str, str]:
    """The seed problem and the irregular variant (tests/conftest.py's `problems` reads them)."""
    return {"seed": GROUP_CONV.read_text(), "irregular": IRREGULAR}


def spec_of(analysis: dict, source: str) -> dict | None:
    """The family's spec as the expert generator makes it: matched on the expanded graph, refined."""
    spec = compose.conv_transpose.matches(analysis["ops"], expand(Graph.model_validate(analysis["graph"])))
    return None if spec is None else compose.conv_transpose.refine(spec, source)


class Net(nn.Module):
    """`self.conv = make`, an optional bias parameter `self.b`, and `chain` on the convolution's value y."""

    def __init__(self, make: str, chain: str = "y", bias_shape: tuple | None = None) -> None:
        super().__init__()
        self.conv = eval(make, {"nn": nn})
        if bias_shape is not None:
            self.b = nn.Parameter(torch.randn(bias_shape))
        self.chain = chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return eval(self.chain, {"torch": torch, "F": F, "y": self.conv(x), "self": self})


def net_spec(make: str, chain: str, bias_shape: tuple | None, shape: tuple) -> dict:
    """Net's spec, traced on the meta device, with Net's constructor as a ModelNew runs it."""
    with torch.device("meta"):
        spec = compose.conv_transpose.compose(graph_of(Net(make, chain, bias_shape), shape))
    extra = f"\nself.b = nn.Parameter(torch.randn({bias_shape}))" if bias_shape else ""
    return {**spec, "init_params": "", "init_body": f"super().__init__()\nself.conv = {make}{extra}"}


def check_case(make: str, chain: str, bias_shape, shapes, knob_sets, tmp_path: Path) -> None:
    """Every knob set of `knob_sets` (None: every feasible round-0 set) against torch in float64, at the
    traced shape and, for the first set, a second shape."""
    spec = net_spec(make, chain, bias_shape, shapes[0])
    sets = (
        [k for k in ct.ROUND0 if compose.conv_transpose.feasible(spec, k)] if knob_sets is None else knob_sets
    )
    assert sets and all(compose.conv_transpose.feasible(spec, k) for k in sets), sets
    torch.manual_seed(0)
    ref = Net(make, chain, bias_shape)
    ref64 = copy.deepcopy(ref).double()
    for i, knobs in enumerate(sets):
        new = load(compose.conv_transpose.render(spec, knobs, SIGNATURE), tmp_path, f"c{i}").ModelNew()
        new.load_state_dict(ref.state_dict())
        for shape in shapes if i == 0 else shapes[:1]:
            x = torch.randn(shape) * 4
            with torch.no_grad():
                want = ref64(x.double())
                got = new(x)
            assert got.shape == want.shape and got.dtype == torch.float32, (shape, knobs)
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")


# (name, the transposed conv, the chain, its bias parameter's shape, two shapes, the knob sets: None for
# every feasible round-0 set at the case's dimensionality)
ND_DOT = {"strategy": "nd_dot", "phase_w": True, "block_m": 32, "block_n": 16, "block_k": 16, "num_warps": 2}
ND_DOT |= {"num_stages": 1, "fp32_dot": "ieee"}
ND_CASES = [
    (
        "1-D stride 3, padding, output padding 2, dilation 2, ReLU",
        "nn.ConvTranspose1d(3, 10, 4, stride=3, padding=1, output_padding=2, dilation=2)",
        "torch.relu(y)",
        None,
        ((2, 3, 7), (1, 3, 2)),
        None,
    ),
    (
        "1-D stride past the kernel, 2 groups of 4 channels, no bias",
        "nn.ConvTranspose1d(4, 8, 2, stride=5, output_padding=3, groups=2, bias=False)",
        "y",
        None,
        ((2, 4, 5), (1, 4, 1)),
        None,
    ),
    (
        "2-D per-dim stride, padding, output padding, dilation, groups; bias parameter, sigmoid",
        "nn.ConvTranspose2d(6, 16, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2,"
        " dilation=(2, 1))",
        "torch.sigmoid(y + self.b) * 2",
        (16, 1, 1),
        ((2, 6, 3, 4), (1, 6, 2, 1)),
        [*ct.ROUND0_ND[2], {**ND_DOT, "dims": 2, "phase_w": False}],
    ),
    (
        "3-D per-dim stride, padding, output padding, dilation, groups; HardSwish",
        "nn.ConvTranspose3d(4, 16, (3, 2, 3), stride=(2, 1, 3), padding=(1, 0, 1), output_padding=(1, 0, 2),"
        " groups=2, dilation=(1, 2, 1))",
        "F.hardswish(y)",
        None,
        ((2, 4, 2, 3, 3), (1, 4, 1, 2, 2)),
        [ct.ROUND0_ND[3][0], ct.ROUND0_ND[3][2], ct.ROUND0_ND[3][3], {**ND_DOT, "dims": 3}],
    ),
    (
        "3-D narrow groups (3 output channels each), stride 2, no bias",
        "nn.ConvTranspose3d(4, 6, 2, stride=2, groups=2, bias=False)",
        "y * 0.5",
        None,
        ((2, 4, 2, 3, 2), (1, 4, 1, 1, 3)),
        None,
    ),
    (
        "3-D then logsumexp over the channels (a tail)",
        "nn.ConvTranspose3d(3, 8, 3, stride=2, padding=1)",
        "torch.logsumexp(y * 2, dim=1, keepdim=True)",
        None,
        ((1, 3, 2, 3, 2), (2, 3, 1, 2, 2)),
        [ct.ROUND0_ND[3][0], ct.ROUND0_ND[3][3]],
    ),
    (
        "2-D plain, the 2-D strategies and the nd ones (a tail: a spatial sum)",
        "nn.ConvTranspose2d(4, 10, 3, stride=2)",
        "y.sum(dim=[2, 3])",
        None,
        ((1, 4, 3, 4), (2, 4, 2, 1)),
        [ct.ROUND0_2D[0], ct.ROUND0_2D[4], ct.ROUND0_ND[2][0]],
    ),
]

# Convolutions that reach every corner of rows_dense's index arithmetic: nn.ConvTranspose2d's arguments
# and x's shape (n, h, w)
EDGE_CASES = [
    # the seed problem's conv at a tiny size: row phases without taps, 1 or 2 taps per column phase
    (
        dict(in_channels=32, out_channels=64, kernel_size=(3, 5), stride=(2, 3), padding=(1, 2), groups=4),
        dict(dilation=(2, 1)),
        (1, 3, 5),
    ),
    # stride 5 (phase axis padded to 8), dilation 2 coprime with it, output_padding, bias, 3 output
    # channels per group (a channel block partly masked)
    (
        dict(in_channels=4, out_channels=6, kernel_size=(2, 7), stride=(2, 5), padding=(0, 4)),
        dict(output_padding=(1, 3), groups=2, bias=True, dilation=(3, 2)),
        (2, 3, 4),
    ),
    # dilation 4 sharing a factor 2 with stride 6: half the column phases take no tap at all
    (
        dict(in_channels=4, out_channels=4, kernel_size=(1, 6), stride=(1, 6), padding=(0, 1)),
        dict(dilation=(1, 4), bias=True),
        (1, 3, 4),
    ),
    # stride 1 (one phase, nothing padded), padding past the kernel's reach on one side
    (dict(in_channels=3, out_channels=5, kernel_size=3, stride=1, padding=(2, 1)), {}, (1, 5, 6)),
    # kernel smaller than the stride (columns no tap reaches), 1x1 input
    (dict(in_channels=2, out_channels=3, kernel_size=(2, 2), stride=(3, 4)), {}, (2, 1, 1)),
    # a single output column
    (dict(in_channels=2, out_channels=2, kernel_size=(3, 1), stride=(2, 2), padding=(1, 0)), {}, (1, 2, 1)),
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


def check_half(tmp_path: Path) -> None:
    """Both nd forms on fp16: the operands' rounding bounds the error, fp32 accumulation, one rounding."""
    make = "nn.ConvTranspose3d(4, 16, 3, stride=2, padding=1, output_padding=1)"
    with torch.device("meta"):
        traced = Net(make, "torch.relu(y)").half()
    spec = compose.conv_transpose.compose(
        capture(traced, [torch.empty((2, 4, 2, 3, 3), device="meta", dtype=torch.float16)])
    )
    assert spec["dtype"] == "float16"
    spec = {**spec, "init_params": "", "init_body": f"super().__init__()\nself.conv = {make}"}
    torch.manual_seed(0)
    ref = Net(make, "torch.relu(y)")
    x = torch.randn(2, 4, 2, 3, 3)
    truth = copy.deepcopy(ref).double()(x.double())
    for i, knobs in enumerate((ct.ROUND0_ND[3][0], ct.ROUND0_ND[3][3])):
        new = load(compose.conv_transpose.render(spec, knobs, SIGNATURE), tmp_path, f"h{i}").ModelNew()
        new.load_state_dict(ref.state_dict())
        with torch.no_grad():
            got = new.half()(x.half())
        assert got.dtype == torch.float16, knobs
        assert ((got.double() - truth).abs() <= truth.abs() * 2**-8 + 2e-2).all(), knobs


def check_edge(args: dict, more: dict, x: tuple, tmp_path: Path) -> None:
    make = f"nn.ConvTranspose2d(**{ {**args, **more}!r})"
    n, h, w = x
    check_case(make, "y", None, ((n, args["in_channels"], h, w),), DENSE_KNOBS, tmp_path)


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    found = {
        name: partial(check_case, make, chain_text, bias, shapes, sets)
        for name, make, chain_text, bias, shapes, sets in ND_CASES
    }
    for i, (args, more, x) in enumerate(EDGE_CASES):
        found[f"rows_dense edge {i}"] = partial(check_edge, args, more, x)
    return {**found, "fp16": check_half}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_conv_transpose_template", timeout=900)


@pytest.mark.parametrize("name", [c[0] for c in ND_CASES])
def test_every_dimensionality_with_its_chain_matches_torch(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_fp16_operands(interpreted):
    assert interpreted["fp16"] is None, interpreted["fp16"]


@pytest.mark.parametrize("case", range(len(EDGE_CASES)))
def test_rows_dense_matches_torch_on_edge_cases(interpreted, case):
    assert interpreted[f"rows_dense edge {case}"] is None, interpreted[f"rows_dense edge {case}"]


def test_matches_the_transposed_convolution_and_nothing_else(analyses, problems):
    spec = spec_of(analyses["seed"], problems["seed"])
    assert spec is not None and ct.plain_2d(spec)
    assert (spec["stride"], spec["padding"], spec["dilation"]) == ([2, 3], [1, 2], [2, 1])
    assert (spec["output_padding"], spec["groups"], spec["c_in_g"], spec["c_out_g"]) == ([0, 0], 4, 8, 16)
    assert spec["weight"] == ["param", "conv_transpose2d.weight"] and spec["bias"] is None
    assert "self.conv_transpose2d = nn.ConvTranspose2d(" in spec["init_body"]
    irregular = spec_of(analyses["irregular"], problems["irregular"])
    assert irregular["bias"] == ["param", "conv_transpose2d.bias"] and irregular["groups"] == 3
    for other in OTHER_PROBLEMS:
        assert spec_of(analyses[other], OTHER_PROBLEMS[other].read_text()) is None, other


def test_render_reads_the_models_tensors_and_calls_no_torch_conv(analyses, problems):
    spec = spec_of(analyses["seed"], problems["seed"])
    for knobs in (ct.ROUND0_2D[0], ct.ROUND0_ND[2][0]):
        src = compose.conv_transpose.render(spec, knobs, analyses["seed"]["signature"])
        assert "(\n            x, " in src or "(x, " in src, knobs
        assert "self.conv_transpose2d.weight, None, " in src, knobs
        assert "STRIDE, PADDING, DILATION, OUTPUT_PADDING, GROUPS" in src, knobs
        assert "conv_transpose2d(x" not in src and "F.conv" not in src and "torch.conv" not in src
        assert "STRIDE = [2, 3]\n" in src and "OUTPUT_PADDING = [0, 0]\n" in src and "GROUPS = 4\n" in src


def test_every_render_is_composed_from_the_parts_module():
    """Every round-0 knob set and every knob set one mutation away renders a module that parses, whose
    functions are the parts modules' own, as written there (the traced chain aside): the 2-D strategies
    for a plain 2-D spec, the nd ones for a 3-D spec with a chain and a 2-D one."""
    sets = reachable_knobs(ct)
    assert {k["strategy"] for k in sets} == set(ct.STRATEGIES)
    assert {ct.fp32_dot(k) for k in sets} == set(ct.FP32_DOTS) and any(k.get("prepack") for k in sets)
    assert {k["phase_w"] for k in sets if k["strategy"] in ct.STRATEGIES_ND} == {True, False}
    plain = net_spec("nn.ConvTranspose2d(4, 16, 3, stride=2)", "y", None, (1, 4, 3, 3))
    chained = net_spec(
        "nn.ConvTranspose3d(4, 16, 3, stride=2)", "F.mish(y + self.b)", (16, 1, 1, 1), (1, 4, 2, 2, 2)
    )
    assert chained["helpers"] == ["_tanh", "_log1p", "_softplus", "_mish"]
    for knobs in sets:
        if knobs["strategy"] in ct.STRATEGIES_2D:
            found = assert_composed_of_parts(
                compose.conv_transpose.render(plain, knobs, SIGNATURE), ct.PARTS, knobs, (pointwise.PARTS,)
            )
            assert found.kernels == set(ct.KERNEL_PARTS), knobs
            assert found.functions == {*ct.KERNEL_PARTS, *ct.HOST_PARTS}, knobs
            continue
        for spec in (chained, {**plain, "spatial": knobs["dims"]}):
            src = compose.conv_transpose.render(spec, knobs, SIGNATURE)
            traced = chain("_epilogue", spec["epilogue"], spec["epilogue_result"])
            assert traced in src, knobs
            found = assert_composed_of_parts(
                src.replace(traced, ""), ct.PARTS, knobs, (pointwise.PARTS, conv.PARTS)
            )
            assert found.kernels - set(spec["helpers"]) == {
                *ct.CONV_PARTS,
                "_convt_nd_tap",
                "_convt_nd_kernel",
            }
            assert found.functions - found.kernels == {"_convt_nd_launch"}, knobs


@pytest.mark.parametrize("variant", ["seed", "irregular"])
def test_round0_candidates_pass_the_gate(box, problems, analyses, variant):
    """Round 0 of a plain 2-D transposed convolution is the measured 2-D sets, in their order, then the
    2-D nd ones. Each 2-D set passes the gate on both variants, the first nd set on the irregular one
    (the nd sets' own correctness: test_every_dimensionality_with_its_chain_matches_torch)."""
    analysis = analyses[variant]
    spec = spec_of(analysis, problems[variant])
    nd = [
        k for k in ct.ROUND0_ND[2] if compose.conv_transpose.feasible(spec, k)
    ]  # the irregular one's 3-channel groups: FMA
    assert nd and [k for k in ct.ROUND0 if compose.conv_transpose.feasible(spec, k)] == ct.ROUND0_2D + nd
    for knobs in ct.ROUND0_2D + (nd[:1] if variant == "irregular" else []):
        source = compose.conv_transpose.render(spec, knobs, analysis["signature"])
        args = {"problem_source": problems[variant], "cand_source": source, "device": "cpu", "seeds": 3}
        r = box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
        assert r["passed"] is True, (knobs, r)
        assert r["max_abs_err"] < 1e-4


class Two(nn.Module):
    def __init__(self, make: str, chain: str) -> None:
        super().__init__()
        self.conv = eval(make, {"nn": nn})
        self.chain = chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return eval(self.chain, {"torch": torch, "F": F, "x": x, "self": self})


@pytest.mark.parametrize(
    ("make", "chain_text", "why"),
    [
        ("nn.ConvTranspose2d(4, 4, 3)", "self.conv(self.conv(x))", "2 convolutions"),
        ("nn.Conv2d(4, 4, 3)", "self.conv(x)", "aten.convolution.default, not a transposed convolution"),
        ("nn.ConvTranspose2d(4, 4, 3)", "self.conv(x.cumsum(1))", "cumsum.default before the transposed"),
        ("nn.ConvTranspose2d(4, 4, 3)", "self.conv(x).cumsum(1)", "aten.cumsum.default after the transposed"),
        (
            "nn.ConvTranspose2d(4, 4, 3)",
            "self.conv(x) * x.sum()",
            "after the transposed convolution: aten.sum",
        ),
        (
            "nn.ConvTranspose2d(4, 4, 3)",
            "F.conv_transpose2d(x, self.conv.weight * 2)",
            "a weight made by aten.mul.Tensor",
        ),
        ("nn.Linear(8, 8)", "self.conv(x)", "0 convolutions"),
    ],
)
def test_what_it_refuses_is_named(make, chain_text, why):
    with torch.device("meta"):
        model = Two(make, chain_text)
    with pytest.raises(ct.NotConvTranspose, match=why):
        compose.conv_transpose.compose(graph_of(model, (2, 4, 8, 8)))


def _first(strategy: str) -> dict:
    return next(k for k in ct.ROUND0 if k["strategy"] == strategy)


def test_mutations_move_knobs_and_feasibility_refuses_tiles_that_do_not_fit():
    assert set(ct.MUTATIONS) == set(LABELS)
    for knobs in ct.ROUND0:
        for moves in ct.MUTATIONS.values():
            for move, why in moves:
                child = ct.mutate(knobs, move)
                assert why and (child is None or child != knobs), (knobs, move)
                # a move never crosses between the 2-D and the nd strategies
                nd = knobs["strategy"] in ct.STRATEGIES_ND
                assert child is None or (child["strategy"] in ct.STRATEGIES_ND) == nd, (knobs, move)
    direct = _first("direct")
    assert ct.mutate(direct, "phase") == {**direct, "strategy": "phase"}
    assert ct.mutate(ct.mutate(direct, "phase"), "phase") is None
    assert ct.mutate(direct, "dot") == {**direct, "strategy": "phase_dot", "block_k": 16}
    assert ct.mutate(_first("phase_dot"), "dot") is None
    assert ct.mutate(direct, "larger_tiles") == {**direct, "block_p": 512}
    assert ct.mutate(direct, "wider_channels") == {**direct, "block_c": 32}
    assert ct.mutate({**direct, "num_warps": 16}, "more_warps") is None
    rows = ct.mutate(direct, "rows")
    assert rows == {**direct, "strategy": "rows", "block_k": 1} and ct.mutate(rows, "rows") is None
    dense = ct.mutate(rows, "rows_dense")
    assert dense == {**rows, "strategy": "rows_dense", "block_k": 8}
    tf32 = ct.mutate(dense, "tf32x3_dot")
    assert tf32 == {**dense, "fp32_dot": "tf32x3"} and ct.mutate(tf32, "ieee_dot") == {
        **dense,
        "fp32_dot": "ieee",
    }
    assert ct.mutate(direct, "tf32x3_dot") is None and ct.mutate(direct, "contiguous_w") is None
    assert ct.mutate(dense, "prepack") == {**dense, "prepack": True} and ct.mutate(direct, "prepack") is None
    assert ct.ROUND0[0]["strategy"] == "rows_dense"  # measured first under a short budget
    with pytest.raises(ValueError):
        ct.mutate(direct, "no_such_move")

    nd = ct.ROUND0_ND[3][0]
    assert ct.mutate(nd, "contiguous_w") == {**nd, "phase_w": False}
    assert ct.mutate(ct.mutate(nd, "contiguous_w"), "phase") == nd and ct.mutate(nd, "phase") is None
    assert ct.mutate(nd, "more_stages") == {**nd, "num_stages": 4} and ct.mutate(nd, "rows_dense") is None
    assert ct.mutate(nd, "ieee_dot") == {**nd, "fp32_dot": "ieee"}
    fma = ct.ROUND0_ND[3][3]
    assert ct.mutate(fma, "dot")["strategy"] == "nd_dot" and ct.mutate(fma, "longer_k") is None

    # a plain 2-D spec: every 2-D set and the 2-D nd sets; with a chain, only the nd sets
    plain = net_spec("nn.ConvTranspose2d(32, 64, (3, 5), stride=(2, 3), groups=4)", "y", None, (2, 32, 8, 8))
    assert [k for k in ct.ROUND0 if compose.conv_transpose.feasible(plain, k)] == ct.ROUND0_2D + ct.ROUND0_ND[
        2
    ]
    fused = {**plain, "epilogue": ["v4 = v0 * 2.0"], "epilogue_result": "v4"}
    assert [k for k in ct.ROUND0 if compose.conv_transpose.feasible(fused, k)] == ct.ROUND0_ND[2]
    for dims in (1, 3):  # the sets of the spec's own dimensionality only
        assert [
            k for k in ct.ROUND0 if compose.conv_transpose.feasible({**plain, "spatial": dims}, k)
        ] == ct.ROUND0_ND[dims]
    narrow = {**plain, "spatial": 3, "c_out_g": 4}  # narrow groups: the FMA form only
    assert {k["strategy"] for k in ct.ROUND0 if compose.conv_transpose.feasible(narrow, k)} == {"nd_fma"}
    dot = _first("phase_dot")
    assert not compose.conv_transpose.feasible(plain, {**dot, "block_k": 8})  # tl.dot needs >= 16
    assert not compose.conv_transpose.feasible(plain, {**dot, "block_p": 48})  # not a power of two
    assert not compose.conv_transpose.feasible(
        plain, {**dot, "block_p": 512, "block_c": 128, "num_warps": 4}
    )  # 512 acc/thread
    assert not compose.conv_transpose.feasible(
        plain, {**direct, "block_k": 64, "num_warps": 4}
    )  # the K x C x P product spills
    assert not compose.conv_transpose.feasible(plain, {**direct, "strategy": "winograd"})
    assert not compose.conv_transpose.feasible(plain, {**dense, "fp32_dot": "tf32"})  # plain TF32 misses 1e-4
    assert not compose.conv_transpose.feasible(plain, {**direct, "prepack": True})  # nothing to pack
    nd2 = ct.ROUND0_ND[2][0]
    assert not compose.conv_transpose.feasible(
        plain, {**nd2, "block_m": 512, "block_n": 128}
    )  # the accumulator spills
    assert not compose.conv_transpose.feasible(plain, {**nd2, "block_k": 8})  # tl.dot needs >= 16
    assert not compose.conv_transpose.feasible(
        plain, {**nd2, "num_stages": 8, "block_k": 128}
    )  # past shared memory


@pytest.mark.long
def test_kb_run_on_a_3d_transposed_convolution_with_its_chain(tmp_path):
    """A whole run on a problem no 2-D strategy serves: the candidate is an nd one, its chain fused."""
    analysis = analyse(CONVT3D.read_text(), "cpu")
    spec = spec_of(analysis, CONVT3D.read_text())
    assert spec["spatial"] == 3 and spec["extras"] == [["param", "bias"]] and spec["epilogue"]
    state = run_inprocess(CONVT3D, tmp_path / "kb.db", max_candidates=1, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"conv_transpose"}
    assert state.finished is not None and state.finished.winner
    winner = state.candidates[state.finished.winner]
    assert isinstance(winner.gate, GatePassed) and winner.proposal.strategy == "nd_dot"
    assert state.finished.winner_rung == len(DEFAULT_RUNGS["cpu"]) - 1  # measured at every rung
