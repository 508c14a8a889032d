"""The conv family, composed from the traced ATen graph: forward convolutions (1-D, 2-D, 3-D; stride,
padding, dilation, groups, depthwise, 1x1, with and without bias) with the elementwise chain after them
(a bias parameter, a residual input, Mish, GELU, a clamp) in one kernel, against torch through the
interpreter for every round-0 knob set (odd sizes, channel counts off the tiles, a second shape), fp16
and channels-last inputs; a tail after the chain (a min over the channels, a spatial sum, a logsumexp,
a normalisation, staged reductions) as a second launch the same way; what it refuses; the parts every
reachable knob set renders; candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates import compose
from kernelbrain.templates.families import conv, pointwise
from kernelbrain.templates.render import chain, parts_of
from tests.composed import graph_of, load
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess, run_interpreted

ROOT = Path(__file__).resolve().parents[1]
GROUPED = ROOT / "tests" / "problems" / "conv_grouped_mish.py"
DEPTHWISE = ROOT / "tests" / "problems" / "conv_depthwise_gelu.py"
SCALE_MIN = ROOT / "tests" / "problems" / "conv_scale_min.py"
SIGNATURE = {"init": [], "forward": ["x"], "params": []}
RESIDUAL = {"init": [], "forward": ["x", "r"], "params": []}  # a second forward input


class Net(nn.Module):
    """`self.conv = make`, an optional bias parameter `self.b`, and `chain` on the convolution's value y
    (with the second forward input r, where the case has one)."""

    def __init__(self, make: str, chain: str = "y", bias_shape: tuple | None = None) -> None:
        super().__init__()
        self.conv = eval(make, {"nn": nn})
        if bias_shape is not None:
            self.b = nn.Parameter(torch.randn(bias_shape))
        self.chain = chain

    def forward(self, x: torch.Tensor, r: torch.Tensor | None = None) -> torch.Tensor:
        return eval(self.chain, {"torch": torch, "F": F, "y": self.conv(x), "self": self, "r": r})


def init_body(make: str, bias_shape: tuple | None) -> str:
    """Net's constructor as a ModelNew runs it (what `conv.refine` copies from a problem's source)."""
    extra = f"\nself.b = nn.Parameter(torch.randn({bias_shape}))" if bias_shape else ""
    return f"super().__init__()\nself.conv = {make}{extra}"


# (name, the conv, the chain, its bias parameter's shape, the traced shape, a second shape, a residual)
CASES = [
    (
        "2-D stride 2 padding 1 groups 2, bias parameter and Mish",
        "nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)",
        "F.mish(y + self.b) * 2",
        (6, 1, 1),
        (2, 4, 9, 7),
        (1, 4, 5, 6),
        False,
    ),
    (
        "2-D per-dim stride, padding and dilation 2, no bias",
        "nn.Conv2d(3, 20, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=False)",
        "y",
        None,
        (2, 3, 8, 9),
        (1, 3, 5, 4),
        False,
    ),
    (
        "1-D dilated strided, ReLU",
        "nn.Conv1d(3, 17, 3, stride=3, padding=2, dilation=2)",
        "torch.relu(y)",
        None,
        (2, 3, 23),
        (1, 3, 6),
        False,
    ),
    (
        "3-D asymmetric, clamp",
        "nn.Conv3d(3, 16, (3, 2, 3), stride=(2, 1, 1), padding=(1, 0, 1))",
        "torch.clamp(y, -0.5, 0.5)",
        None,
        (1, 3, 5, 6, 7),
        (2, 3, 3, 2, 3),
        False,
    ),
    (
        "depthwise, GELU",
        "nn.Conv2d(6, 6, 3, padding=1, groups=6)",
        "F.gelu(y)",
        None,
        (2, 6, 7, 8),
        (1, 6, 3, 3),
        False,
    ),
    (
        "depthwise with a channel multiplier, stride 2, no bias",
        "nn.Conv2d(4, 8, 3, stride=2, groups=4, bias=False)",
        "y",
        None,
        (2, 4, 9, 9),
        (1, 4, 4, 5),
        False,
    ),
    (
        "pointwise 1x1 with a residual input",
        "nn.Conv2d(9, 9, 1)",
        "torch.sigmoid(y) + r",
        None,
        (2, 9, 5, 7),
        (1, 9, 2, 3),
        True,
    ),
    (
        "channels off the tiles, K over several steps, scaled by a parameter",
        "nn.Conv2d(20, 24, 3, padding=1)",
        "torch.tanh(y) * self.b",
        (24, 1, 1),
        (1, 20, 6, 5),
        (2, 20, 3, 4),
        False,
    ),
]


# the same, a tail after the chain (templates/compose: a second launch over the chain's value)
TAIL_CASES = [
    (
        "2-D, scaled, min over the channels kept (reduce tail)",
        "nn.Conv2d(3, 10, 3, padding=1)",
        "torch.min(y * 1.5, dim=1, keepdim=True)[0]",
        None,
        (2, 3, 7, 6),
        (1, 3, 5, 4),
        False,
    ),
    (
        "3-D, min over the depth (reduce tail)",
        "nn.Conv3d(3, 9, (2, 3, 2), padding=(0, 1, 0))",
        "torch.min(y, dim=2)[0]",
        None,
        (2, 3, 4, 5, 6),
        (1, 3, 3, 2, 3),
        False,
    ),
    (
        "2-D, halved, sum over the spatial dims (reduce tail)",
        "nn.Conv2d(5, 11, (3, 2), stride=2)",
        "(y / 2).sum(dim=[2, 3])",
        None,
        (2, 5, 9, 8),
        (1, 5, 4, 5),
        False,
    ),
    (
        "2-D, bias parameter, logsumexp over the channels (reduce tail)",
        "nn.Conv2d(4, 12, 3)",
        "torch.logsumexp(y + self.b, dim=1, keepdim=True)",
        (12, 1, 1),
        (2, 4, 7, 9),
        (1, 4, 4, 3),
        False,
    ),
    (
        "2-D, x - amax over the channels, scaled by a parameter (normalize tail)",
        "nn.Conv2d(4, 10, 3, padding=1, bias=False)",
        "(y - y.amax(dim=1, keepdim=True)) * self.b",
        (10, 1, 1),
        (2, 4, 5, 7),
        (1, 4, 3, 3),
        False,
    ),
    (
        "2-D, spatial mean kept, then channel sum (staged tail)",
        "nn.Conv2d(3, 9, 3)",
        "y.mean(dim=[2, 3], keepdim=True).sum(dim=1)",
        None,
        (2, 3, 7, 6),
        (1, 3, 4, 5),
        False,
    ),
]
# tails the memory-bound families may not take yet: run where the tail takes them, else refused, the
# refusal naming the op (name -> the conv, the chain, its bias parameter's shape, two shapes, the op)
TAIL_OR_REFUSED = {
    "3-D, min over the depth, softmax (level 2's 24)": (
        "nn.Conv3d(3, 9, (2, 3, 2), padding=(0, 1, 0))",
        "torch.softmax(torch.min(y, dim=2)[0], dim=1)",
        None,
        ((2, 3, 4, 5, 6), (1, 3, 3, 2, 3)),
        "aten._softmax.default after the convolution",
    ),
    "2-D, tanh, scale, bias parameter, max pool (level 2's 82)": (
        "nn.Conv2d(3, 10, 3)",
        "F.max_pool2d(torch.tanh(y) * 2 + self.b, 2)",
        (10, 1, 1),
        ((2, 3, 9, 8), (1, 3, 6, 7)),
        "aten.max_pool2d_with_indices.default after the convolution",
    ),
    "2-D, softplus activation, batch norm in training (level 2's 52)": (
        "nn.Conv2d(3, 10, 3)",
        "F.batch_norm(torch.tanh(F.softplus(y)) * y, None, None, training=True)",
        None,
        ((2, 3, 9, 8), (1, 3, 6, 7)),
        "aten.native_batch_norm.default after the convolution",
    ),
}


def check_case(make: str, chain: str, bias_shape, shapes, residual: bool, tmp_path: Path) -> None:
    with torch.device("meta"):
        traced = Net(make, chain, bias_shape)
        # a residual input has the convolution's output shape
        traced_shapes = [shapes[0]] + ([tuple(traced.conv(torch.empty(shapes[0])).shape)] if residual else [])
    spec = compose.conv.compose(graph_of(traced, *traced_shapes))
    spec = {**spec, "init_params": "", "init_body": init_body(make, bias_shape)}
    torch.manual_seed(0)
    ref = Net(make, chain, bias_shape)
    ref64 = copy.deepcopy(ref).double()
    for knobs in conv.ROUND0:
        source = compose.conv.render(spec, knobs, RESIDUAL if residual else SIGNATURE)
        new = load(source, tmp_path, f"c_{abs(hash(make + chain + str(knobs)))}")
        new = new.ModelNew()
        new.load_state_dict(ref.state_dict())
        for shape in shapes if knobs is conv.ROUND0[0] else shapes[:1]:
            x = torch.randn(shape)
            xs = [x, torch.randn(ref.conv(x).shape)] if residual else [x]
            with torch.no_grad():
                expected = ref64(*(v.double() for v in xs)).float()
                got = new(*xs)
            assert got.shape == expected.shape and got.dtype == expected.dtype, (shape, knobs)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")


def check_tail_case(
    make: str, chain: str, bias_shape, shapes, residual: bool, tmp_path: Path, refusal: str | None = None
) -> None:
    """check_case of a chain with a tail, which the spec must hold; or where no memory-bound family
    takes the tail, its refusal, which must name `refusal`."""
    with torch.device("meta"):
        traced = Net(make, chain, bias_shape)
    try:
        spec = compose.conv.compose(graph_of(traced, shapes[0]))
    except conv.NotConv as e:
        assert refusal is not None and refusal in str(e), e
        return
    assert spec["tail"] is not None and all(compose.conv.feasible(spec, k) for k in conv.ROUND0)
    check_case(make, chain, bias_shape, shapes, residual, tmp_path)


def check_half_and_channels_last(tmp_path: Path) -> None:
    make = "nn.Conv2d(5, 18, 3, padding=1, stride=2)"
    with torch.device("meta"):
        traced = Net(make, "F.relu(y)").half()
    spec = compose.conv.compose(capture_half(traced, (2, 5, 9, 8)))
    assert spec["dtype"] == "float16"
    spec = {**spec, "init_params": "", "init_body": init_body(make, None)}
    torch.manual_seed(0)
    ref = Net(make, "F.relu(y)")
    x = torch.randn(2, 5, 9, 8)
    with torch.no_grad():
        truth = copy.deepcopy(ref).double()(x.double())
    for knobs in [k for k in conv.ROUND0 if compose.conv.feasible(spec, k)]:
        new = load(
            compose.conv.render(spec, knobs, SIGNATURE), tmp_path, f"h_{abs(hash(str(knobs)))}"
        ).ModelNew()
        new.load_state_dict(ref.state_dict())
        new.half()
        with torch.no_grad():
            got = new(x.half())
        assert got.dtype == torch.float16, knobs
        # fp16 operands (their rounding bounds the error), fp32 accumulation, one fp16 rounding
        assert ((got.double() - truth).abs() <= truth.abs() * 2**-8 + 2e-2).all(), knobs
        new.float().load_state_dict(ref.state_dict())  # fp32 weights again, not fp16's rounded
        strided = x.to(memory_format=torch.channels_last)
        with torch.no_grad():
            got = new(strided)
        torch.testing.assert_close(got, truth.float(), rtol=1e-4, atol=1e-4, msg=str(knobs))


def capture_half(model: nn.Module, shape: tuple) -> Graph:
    from kernelbrain.child.graph import capture

    return capture(model, [torch.empty(shape, device="meta", dtype=torch.float16)])


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    found = {
        name: partial(check_case, make, chain, bias, (a, b), residual)
        for name, make, chain, bias, a, b, residual in CASES
    }
    return {**found, "fp16 and channels last": check_half_and_channels_last}


def tail_checks() -> dict:
    """The tail cases, in an interpreter process of their own (`checks`' take long)."""
    found = {
        name: partial(check_tail_case, make, chain, bias, (a, b), residual)
        for name, make, chain, bias, a, b, residual in TAIL_CASES
    }
    for name, (make, chain_text, bias, shapes, refusal) in TAIL_OR_REFUSED.items():
        found[name] = partial(check_tail_case, make, chain_text, bias, shapes, False, refusal=refusal)
    return found


_TAIL_CHECKS = """
import json, sys, tempfile, traceback
from pathlib import Path
from tests.test_conv_template import tail_checks
found = {}
for name, check in tail_checks().items():
    try:
        check(Path(tempfile.mkdtemp()))
        found[name] = None
    except Exception:
        found[name] = traceback.format_exc()[-2000:]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_conv_template", timeout=1500)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_convolution_on_every_round0_knob_set(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


@pytest.fixture(scope="module")
def interpreted_tails() -> dict[str, str | None]:
    return run_interpreted(_TAIL_CHECKS, timeout=1500)


@pytest.mark.parametrize("name", [c[0] for c in TAIL_CASES] + list(TAIL_OR_REFUSED))
def test_a_tail_after_the_chain_on_every_round0_knob_set(interpreted_tails, name):
    assert interpreted_tails[name] is None, interpreted_tails[name]


def test_fp16_and_channels_last_inputs(interpreted):
    assert interpreted["fp16 and channels last"] is None, interpreted["fp16 and channels last"]


class Two(nn.Module):
    def __init__(self, make: str, chain: str) -> None:
        super().__init__()
        self.conv = eval(make, {"nn": nn})
        self.chain = chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return eval(self.chain, {"torch": torch, "F": F, "x": x, "self": self})


@pytest.mark.parametrize(
    ("make", "chain", "why"),
    [
        (
            "nn.Conv2d(4, 4, 3, padding=1)",
            "self.conv(F.conv_transpose2d(x, self.conv.weight))",
            "before the convolution .*conv: a transposed convolution",
        ),
        ("nn.ConvTranspose2d(4, 4, 3)", "self.conv(x)", "a transposed convolution"),
        (
            "nn.Conv2d(4, 4, 3, padding=1, padding_mode='reflect')",
            "self.conv(x)",
            "reflection_pad2d.default before the convolution",
        ),
        ("nn.Conv2d(4, 4, 3)", "self.conv(x.cumsum(1))", "aten.cumsum.default before the convolution"),
        ("nn.Conv2d(4, 4, 3)", "self.conv(x).cumsum(1)", "aten.cumsum.default after the convolution"),
        ("nn.Conv2d(4, 4, 3)", "self.conv(x) * x[:, :, :6, :6]", "after the convolution: aten.slice"),
        ("nn.Linear(8, 8)", "self.conv(x)", "0 convolutions"),
    ],
)
def test_what_it_refuses_is_named(make, chain, why):
    with torch.device("meta"):
        model = Two(make, chain)
    with pytest.raises(conv.NotConv, match=why):
        compose.conv.compose(graph_of(model, (2, 4, 8, 8)))


def test_every_reachable_knob_set_renders_the_parts():
    """Every function a candidate defines is conv_parts' own, but the chain traced from the graph and the
    pointwise helpers it calls (pointwise_parts' own)."""
    make, chain_text, bias = CASES[0][1], CASES[0][2], CASES[0][3]
    spec = compose.conv.compose(graph_of(Net(make, chain_text, bias).to("meta"), CASES[0][4]))
    spec = {**spec, "init_params": "", "init_body": init_body(make, bias)}
    assert spec["helpers"] == ["_tanh", "_log1p", "_softplus", "_mish"]
    traced = chain("_epilogue", spec["epilogue"], spec["epilogue_result"])
    helpers = parts_of(pointwise.PARTS, *spec["helpers"])
    sets = reachable_knobs(conv)
    assert {k["strategy"] for k in sets} == set(conv.STRATEGIES)
    for knobs in sets:
        source = compose.conv.render(spec, knobs, SIGNATURE)
        assert traced in source and helpers in source, knobs
        found = assert_composed_of_parts(source.replace(traced, ""), conv.PARTS, knobs, (pointwise.PARTS,))
        assert found.kernels - set(spec["helpers"]) == {"_mma", "_extra", "_conv_kernel"}, knobs


def test_mutations_cover_every_label_and_stay_feasible():
    from kernelbrain.core.diagnosis import LABELS

    assert set(conv.MUTATIONS) == set(LABELS)
    spec = {"c_out_g": 64, "dtype": "float32"}
    depthwise = {"c_out_g": 1, "dtype": "float32"}
    assert all(compose.conv.feasible(spec, k) for k in conv.ROUND0)
    # narrow groups: only the direct form, which round 0 has
    assert [k["strategy"] for k in conv.ROUND0 if compose.conv.feasible(depthwise, k)] == ["direct", "direct"]
    # one TF32 pass and its ~fp32 form both in round 0 (the gate keeps what meets the reference's error)
    assert {conv.fp32_dot(k) for k in conv.ROUND0 if k["strategy"] != "direct"} == {"tf32", "tf32x3"}
    assert not compose.conv.feasible(
        spec, {**conv.ROUND0[-1], "channels_last": True}
    )  # the direct form's no dot
    as_given = next(k for k in conv.ROUND0 if k.get("channels_last") is False)
    assert conv.mutate(as_given, "channels_last")["channels_last"] is True
    assert conv.mutate(conv.ROUND0[0], "ieee_dot")["fp32_dot"] == "ieee"
    assert conv.mutate(conv.ROUND0[-1], "tf32x3_dot") is None  # the direct form has no dot


def test_every_round0_candidate_of_a_grouped_conv_passes_the_gate(box):
    source = GROUPED.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.conv.refine(
        compose.conv.matches(analysis["ops"], Graph.model_validate(analysis["graph"])), source
    )
    assert spec is not None and spec["groups"] == 2 and spec["extras"] == [["param", "bias"]]
    for knobs in conv.ROUND0:
        assert compose.conv.feasible(spec, knobs), knobs
        new_source = compose.conv.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=300)[0]
        assert reply.passed, (knobs, reply)


def test_a_depthwise_convs_groups_follow_its_channels_through_the_gate(box):
    """groups = in_channels: traced at two shapes, the groups change with x's channels, so they are
    read from the shapes at each call, not kept from the trace."""
    source = DEPTHWISE.read_text()
    analysis = analyse(source, "cpu")
    graph = Graph.model_validate(analysis["graph"])
    assert [s.arg for s in graph.sized] == ["groups"]
    spec = compose.conv.refine(compose.conv.matches(analysis["ops"], graph), source)
    assert spec is not None and spec["spatial"] == 1 and spec["c_in_g"] == spec["c_out_g"] == 1
    feasible = [k for k in conv.ROUND0 if compose.conv.feasible(spec, k)]
    assert {k["strategy"] for k in feasible} == {"direct"}
    for knobs in feasible:
        new_source = compose.conv.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=300)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_convolution_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(GROUPED, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"conv"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_every_round0_candidate_of_a_scale_min_tail_passes_the_gate(box):
    source = SCALE_MIN.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.conv.refine(
        compose.conv.matches(analysis["ops"], Graph.model_validate(analysis["graph"])), source
    )
    assert spec is not None and spec["tail"]["family"] == "reduce"
    for knobs in conv.ROUND0:
        assert compose.conv.feasible(spec, knobs), knobs
        new_source = compose.conv.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=300)[0]
        assert reply.passed, (knobs, reply)
