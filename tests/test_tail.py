"""templates/compose (cut, stages, render): where a compute-bound op's pointwise chain ends, the tail
graph after it (its INPUT 0 the chain's value, its further inputs forward's tensors and parameters), the
family that composes it and the renamed parts that let it sit beside the head's in one module; softmax
and log-softmax over any dim (a logsumexp and its map), a batch norm in training mode (its running
statistics and batch count updated as torch updates them), a layer norm over the trailing dims, an
instance norm of unsqueezed rows (the chain's trailing views moved to the tail), a softmax over
flattened dims, a pooling before a convolution (its prelude), and a later launch reading the head's
value again, against PyTorch through the interpreter at odd sizes; dropout in training mode refused by
name; round-0 candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

import ast
import copy
import itertools
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import INPUT, Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates import compose
from kernelbrain.templates.compose import render as stage_render
from kernelbrain.templates.compose import stages
from kernelbrain.templates.compose.cut import NotTail, split
from kernelbrain.templates.families import contraction
from kernelbrain.templates.render import renamed
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
RESIDUAL_SOFTMAX = ROOT / "tests" / "problems" / "conv_groupnorm_residual_softmax.py"
BATCHNORM_SOFTMAX = ROOT / "tests" / "problems" / "contraction_batchnorm_softmax.py"
# problem -> (the family of its head, the families of its prelude's and its tail's launches in order),
# each gated at round 0
GATED = {
    "conv_transpose_layernorm_gelu.py": (compose.conv_transpose, [], ["layernorm", "pointwise"]),
    "contraction_instancenorm_residual.py": (compose.contraction, [], ["moments", "pointwise"]),
    "pool_conv_transpose_softmax.py": (compose.conv_transpose, ["pool"], ["normalize"]),
    "conv_depthwise_separable.py": (compose.conv, ["conv"], []),
}


def _split(fn, *shapes):
    graph = graph_of(fn, *shapes)
    at = next(i for i, n in enumerate(graph.nodes) if n.op in contraction.CONTRACTIONS)
    return split(graph, at, contraction.VIEWS)


def test_renamed_suffixes_whole_words_only():
    text = "def _launch(x):\n    return _reduce_launch(x) + _launch_more(_launch)\n"
    out = renamed(text, "_t", ["_launch"])
    assert out == "def _launch_t(x):\n    return _reduce_launch(x) + _launch_more(_launch_t)\n"
    assert renamed(text, "_t", []) == text


def test_a_chain_that_reaches_the_output_has_no_tail():
    assert _split(lambda a, b: torch.relu(a @ b) * 2, (5, 4), (4, 6)) is None


def test_the_tail_reads_the_chain_value_first_then_forward_tensors():
    cut = _split(
        lambda a, b, r: (lambda y: (y - y.amax(1, keepdim=True)) * r)(a @ b / 2), (5, 4), (4, 6), (5, 6)
    )
    assert cut is not None
    h, head, rest = cut
    assert head.outputs == [list(h)] and head.nodes[h[0]].op == "aten.div.Tensor"
    inputs = [n for n in rest["graph"].nodes if n.op == INPUT]
    assert inputs[0].outs[0].shape == [5, 6] and rest["sources"] == [["input", 2]]
    composed = stages.compose(rest, "contraction", contraction.VIEWS)
    assert composed["family"] == "normalize" and composed["then"] is None


def test_a_tail_no_family_takes_whole_is_composed_in_segments():
    fn = lambda x, w: F.gelu((lambda s: s - s.mean())(F.linear(x, w).sum(dim=1)))  # noqa: E731
    cut = _split(fn, (5, 4), (6, 4))
    assert cut is not None
    composed = stages.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "reduce" and composed["then"]["family"] == "normalize"
    text = stage_render.render_parts(composed)
    names = [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]
    assert len(names) == len(set(names)) and all(n.endswith(("_tail", "_tail2")) for n in names)
    lines = stage_render.call(composed, ["kb_h"], "kb_h")
    assert "_reduce_launch_tail(" in lines and "_launch_tail2(" in lines


def test_an_op_no_family_takes_is_named():
    cut = _split(lambda a, b: torch.cumsum(a @ b, 1), (5, 4), (4, 6))
    assert cut is not None
    with pytest.raises(NotTail, match=r"aten\.cumsum\.default after the contraction"):
        stages.compose(cut[2], "contraction", contraction.VIEWS)


def test_dropout_in_training_mode_is_refused_as_random_and_identity_dropout_composes():
    fn = lambda x, w: torch.softmax(F.dropout(F.linear(x, w), 0.25, training=True), 1)  # noqa: E731
    with pytest.raises(contraction.NotContraction, match=r"bernoulli.*dropout in training mode"):
        compose.contraction.compose(graph_of(fn, (5, 4), (6, 4)))
    for p, training in ((0.0, True), (0.25, False)):
        fn = lambda x, w, p=p, t=training: torch.softmax(F.dropout(F.linear(x, w), p, training=t), 1)  # noqa: E731
        assert compose.contraction.compose(graph_of(fn, (5, 4), (6, 4)))["tail"]["family"] == "normalize"


def test_a_softmax_is_a_logsumexp_and_its_map_over_any_dim():
    for op, dim in ((torch.softmax, 1), (torch.log_softmax, 0), (torch.softmax, -1)):
        cut = _split(lambda a, b: op(a @ b, dim), (5, 4), (4, 6))  # noqa: B023
        assert cut is not None
        composed = stages.compose(cut[2], "contraction", contraction.VIEWS)
        assert composed["family"] == "normalize" and composed["then"] is None
        assert composed["spec"]["stat"]["dims"] == [dim % 2] and composed["spec"]["stat"]["op"] == 6


def test_a_softmax_over_flattened_dims_viewed_back_is_one_over_those_dims():
    def composed(fn):
        graph = graph_of(fn, (2, 3, 4, 6), (6, 5))
        at = next(i for i, n in enumerate(graph.nodes) if n.op in contraction.CONTRACTIONS)
        return stages.head_and_tail(graph, at, contraction.VIEWS, "contraction")[1]

    rest = composed(lambda a, b: torch.softmax((a @ b).view(2, 3, -1), 2).view(2, 3, 4, 5) * 2)
    assert rest is not None and rest["family"] == "normalize" and rest["spec"]["stat"]["dims"] == [2, 3]
    with pytest.raises(NotTail):  # its value stays flat: no view takes it back
        composed(lambda a, b: torch.softmax((a @ b).view(2, 3, -1), 2) * (a @ b).sum())


def test_a_later_launch_reads_the_head_value_again():
    with torch.device("meta"):
        traced = Residual()
    rest = compose.conv.compose(graph_of(traced, (2, 3, 7, 6)))["tail"]
    assert rest["family"] == "moments" and rest["then"]["family"] == "normalize"
    assert [stages.VALUE, 0] in rest["then"]["sources"]
    lines = stage_render.call(rest, ["kb_h", *("x" for _ in rest["sources"])], "kb_h").splitlines()
    # the norm sets a name of its own; the softmax reads it and kb_h, and sets kb_h last
    assert lines[0].startswith("        kb_v1_tail = _moments_launch_tail(kb_h,")
    assert [i for i, line in enumerate(lines) if line.lstrip().startswith("kb_h =")] == [len(lines) - 1]
    assert any("kb_v1_tail" in line and "kb_h" in line for line in lines[1:])


def test_a_batch_norm_in_training_mode_counts_its_batch_in_its_modules_counter():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).train()
    rest = compose.contraction.compose(graph_of(model, (5, 4)))["tail"]
    assert rest["family"] == "moments" and rest["spec"]["mode"] == "batch"
    assert rest["spec"]["running"] == ["1.running_mean", "1.running_var"]
    assert rest["spec"]["count"] == "1.num_batches_tracked"


def test_a_tail_reading_two_values_of_the_chain_cuts_it_where_both_derive_from():
    cut = _split(lambda a, b: (lambda y: torch.relu(y) * y.sum(1, keepdim=True))(a @ b * 2), (5, 4), (4, 6))
    assert cut is not None
    h, head, rest = cut
    assert head.nodes[h[0]].op == "aten.mul.Tensor"  # the scale stays in the head, relu goes to the tail
    assert [n.op for n in rest["graph"].nodes[1:]] == [
        "aten.relu.default",
        "aten.sum.dim_IntList",
        "aten.mul.Tensor",
    ]


def test_a_norm_is_a_moments_stage_reading_its_weights_by_name():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GroupNorm(2, 6), torch.nn.Hardtanh())
    cut = _split(model, (5, 4))
    assert cut is not None
    composed = stages.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "moments" and composed["then"]["family"] == "pointwise"
    assert composed["spec"]["mode"] == "group" and composed["spec"]["weight"] == "1.weight"
    lines = stage_render.call(composed, ["kb_h", *("x" for _ in composed["sources"])], "kb_h")
    assert "_moments_launch_tail(kb_h, 'group', 2, self[1].weight, self[1].bias" in lines
    assert "_launch_tail2(" in lines
    names = [
        n.name for n in ast.parse(stage_render.render_parts(composed)).body if isinstance(n, ast.FunctionDef)
    ]
    assert len(names) == len(set(names)) and all(n.endswith(("_tail", "_tail2")) for n in names)


def test_views_that_end_the_chain_go_to_the_tail_where_it_cannot_start_viewed():
    fn = lambda x, w, y: (_instance_norm_of_rows(F.linear(x, w)) + y) * y  # noqa: E731
    graph = graph_of(fn, (5, 4), (6, 4), (5, 6))
    at = next(i for i, n in enumerate(graph.nodes) if n.op in contraction.CONTRACTIONS)
    viewed = split(graph, at, contraction.VIEWS)
    assert viewed is not None and graph.nodes[viewed[0][0]].op == "aten.view.default"
    with pytest.raises(NotTail):  # h viewed [1, 5, 1, 6]: nothing takes the view back
        stages.compose(viewed[2], "contraction", contraction.VIEWS)
    head, composed = stages.head_and_tail(graph, at, contraction.VIEWS, "contraction")
    assert head.meta(tuple(head.outputs[0])).shape == [5, 1, 1, 6]  # the latest view moved, no more
    assert composed is not None and composed["family"] == "moments"
    assert composed["spec"]["mode"] == "instance" and composed["then"]["family"] == "pointwise"
    assert (composed["spec"]["pre"], composed["spec"]["post"]) == ("", ".squeeze(1)" * 2)


def test_a_pooling_is_cut_after_its_squeezes_and_the_chain_goes_to_the_next_stage():
    fn = lambda x, w: F.gelu(F.avg_pool1d(F.linear(x, w).unsqueeze(1), 2).squeeze(1)).amax(1)  # noqa: E731
    cut = _split(fn, (5, 4), (6, 4))
    assert cut is not None
    composed = stages.compose(cut[2], "contraction", contraction.VIEWS)
    assert composed["family"] == "pool" and composed["spec"]["post"] == [["squeeze", -2], ["squeeze", 1]]
    assert composed["then"]["family"] == "reduce"


class Residual(nn.Module):
    """Level 2's 92 with a softmax: conv, group norm, tanh, hardswish, the conv's value added back,
    softmax over the channels."""

    INIT = "super().__init__()\nself.conv = nn.Conv2d(3, 10, 3)\nself.gn = nn.GroupNorm(5, 10)"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 10, 3)
        self.gn = nn.GroupNorm(5, 10)
        with torch.no_grad():  # not the identity torch initialises them to
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.softmax(y + F.hardswish(torch.tanh(self.gn(y))), dim=1)


class ResidualLogsumexp(Residual):
    """Level 2's 92 itself: the residual sum's logsumexp over the channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.logsumexp(y + F.hardswish(torch.tanh(self.gn(y))), dim=1, keepdim=True)


class SoftmaxPools(nn.Module):
    """Level 2's 6 in 2-D: conv, softmax over the channels, two max pools."""

    INIT = "super().__init__()\nself.conv = nn.Conv2d(3, 5, 3)"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.max_pool2d(torch.softmax(self.conv(x), dim=1), 2), 2)


class ConvBatchNorm(nn.Module):
    """A conv, a batch norm in training mode (running statistics, its batch counted), hardtanh."""

    INIT = "super().__init__()\nself.conv = nn.Conv2d(3, 6, 3)\nself.bn = nn.BatchNorm2d(6, momentum=0.3)"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.bn = nn.BatchNorm2d(6, momentum=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(self.bn(self.conv(x)), -1.0, 1.0)


class LinearBatchNormSoftmax(nn.Module):
    """Level 2's 84 in training mode: linear, batch norm by the batch's statistics, scale, softmax."""

    INIT = (
        "super().__init__()\nself.gemm = nn.Linear(11, 23)\nself.bn = nn.BatchNorm1d(23, momentum=0.3)\n"
        "self.scale = nn.Parameter(torch.ones(1))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.gemm = nn.Linear(11, 23)
        self.bn = nn.BatchNorm1d(23, momentum=0.3)
        self.scale = nn.Parameter(torch.full((1,), 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scale * self.bn(self.gemm(x)), dim=1)


class ConvTransposeLayerNorm(nn.Module):
    """Level 2's 34: a 3-D transposed convolution, a layer norm over the last dim, GELU, a scale."""

    INIT = (
        "super().__init__()\nself.ct = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1)\n"
        "self.ln = nn.LayerNorm(5)"
    )

    def __init__(self) -> None:
        super().__init__()
        self.ct = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1)
        self.ln = nn.LayerNorm(5)
        with torch.no_grad():  # not the identity torch initialises them to
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.ln(self.ct(x))) * 1.5


class PooledConvTransposeSoftmax(nn.Module):
    """Level 2's 38: an average pool before a 3-D transposed convolution (a launch of its own that makes
    the convolution's input), clamp, a softmax over the flattened spatial dims, a scale per channel."""

    INIT = (
        "super().__init__()\nself.ct = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, output_padding=1)\n"
        "self.scale = nn.Parameter(torch.ones(1, 4, 1, 1, 1))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.ct = nn.ConvTranspose3d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.scale = nn.Parameter(torch.linspace(0.5, 2.0, 4).view(1, 4, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clamp(self.ct(F.avg_pool3d(x, 2)), -0.2, 0.4)
        b, c, d, h, w = y.shape
        return torch.softmax(y.view(b, c, -1), dim=2).view(b, c, d, h, w) * self.scale


class PooledConv(nn.Module):
    """A max pool and a relu before a 2-D convolution (launches of their own that make its input)."""

    INIT = "super().__init__()\nself.conv = nn.Conv2d(3, 8, 3)"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(torch.relu(F.max_pool2d(x, 2))))


class DepthwiseSeparable(nn.Module):
    """Level 1's 86: a depthwise 3x3 convolution (the prelude), then a pointwise 1x1 one (the head: more
    multiply-adds); then a 1x1 convolution back to fewer channels (a convolution in the tail)."""

    INIT = (
        "super().__init__()\nself.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)\n"
        "self.pw = nn.Conv2d(4, 12, 1)\nself.back = nn.Conv2d(12, 3, 1, bias=False)"
    )

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pw = nn.Conv2d(4, 12, 1)
        self.back = nn.Conv2d(12, 3, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.back(torch.relu(self.pw(self.dw(x))))


# name -> (the model, the family of its head, its input's shapes: traced, then one more)
MODELS: dict[str, tuple[type[nn.Module], object, list[tuple[int, ...]]]] = {
    "conv, group norm, tanh, hardswish, the conv added back, softmax over channels": (
        Residual,
        compose.conv,
        [(2, 3, 7, 6), (1, 3, 5, 9)],
    ),
    "conv, group norm, tanh, hardswish, the conv added back, logsumexp (level 2's 92)": (
        ResidualLogsumexp,
        compose.conv,
        [(2, 3, 7, 6)],
    ),
    "conv, softmax over channels, two max pools": (SoftmaxPools, compose.conv, [(2, 3, 11, 10)]),
    "conv, batch norm in training mode, hardtanh": (
        ConvBatchNorm,
        compose.conv,
        [(3, 3, 7, 6), (2, 3, 5, 9)],
    ),
    "linear, batch norm in training mode, scale, softmax": (
        LinearBatchNormSoftmax,
        compose.contraction,
        [(7, 11)],
    ),
    "3-D transposed conv, layer norm over the last dim, gelu, scale (level 2's 34)": (
        ConvTransposeLayerNorm,
        compose.conv_transpose,
        [(2, 3, 3, 2, 3), (1, 3, 2, 3, 3)],
    ),
    "avg pool, 3-D transposed conv, clamp, softmax over flattened dims, scale (level 2's 38)": (
        PooledConvTransposeSoftmax,
        compose.conv_transpose,
        [(2, 3, 4, 6, 5), (1, 3, 5, 4, 6)],
    ),
    "max pool, relu, conv, tanh": (PooledConv, compose.conv, [(2, 3, 11, 10), (1, 3, 9, 13)]),
    "depthwise conv, pointwise conv, relu, 1x1 conv (level 1's 86, one more)": (
        DepthwiseSeparable,
        compose.conv,
        [(2, 4, 7, 5), (1, 4, 6, 9)],
    ),
}


def _instance_norm_of_rows(x: torch.Tensor) -> torch.Tensor:
    """Level 2's 28: InstanceNorm2d of [batch, 1, 1, features], squeezed back."""
    return F.instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)


# name -> (a function of forward's tensors, their shapes)
FUNCTIONS = {
    "linear, softmax over the rows": (
        lambda x, w, b: torch.softmax(F.linear(x, w, b), 1),
        [(7, 9), (13, 9), (13,)],
    ),
    "matmul, minus its row sums broadcast (reduce, then a map reading h again)": (
        lambda a, b: (lambda y: y - y.sum(1))(a @ b),
        [(7, 5), (5, 7)],
    ),
    "matmul, scale, relu times the row sums (a tail reading two values of the chain)": (
        lambda a, b: (lambda y: torch.relu(y) * y.sum(1, keepdim=True))(a @ b * 2),
        [(7, 5), (5, 9)],
    ),
    "linear, instance norm of its rows unsqueezed to 4-D, residual add, multiply (level 2's 28)": (
        lambda x, w, b, y: (_instance_norm_of_rows(F.linear(x, w, b)) + y) * y,
        [(5, 9), (13, 9), (13,), (5, 13)],
    ),
    "matmul, log-softmax over dim 0, row max": (
        lambda a, b: torch.log_softmax(a @ b, 0).amax(1),
        [(9, 5), (5, 14)],
    ),
}


def _model_case(name: str, folder: Path) -> None:
    """The model's candidate at one knob set of its head, in the model's mode (a training-mode one's
    running statistics and batch count checked too, after two calls), against float64 eager."""
    cls, family, shapes = MODELS[name]
    training = cls in (ConvBatchNorm, LinearBatchNormSoftmax)
    with torch.device("meta"):
        traced = cls().train(training)
    spec = family.compose(graph_of(traced, shapes[0]))
    assert spec["tail"] is not None or spec["prelude"] is not None
    spec = {**spec, "init_params": "", "init_body": cls.INIT}
    torch.manual_seed(0)
    ref = cls().train(training)
    with torch.no_grad():  # running statistics away from their defaults
        for b in ref.buffers():
            if b.is_floating_point():
                b.copy_(torch.rand_like(b) + 0.5)
    ref64 = copy.deepcopy(ref).double()
    knobs = next(k for k in family.ROUND0[1:] if family.feasible(spec, k))
    source = family.render(spec, knobs, {"init": [], "forward": ["x"], "params": []})
    new = load(source, folder, f"t_{abs(hash(name))}").ModelNew().train(training)
    new.load_state_dict(ref.state_dict())
    for shape in shapes:
        x = torch.randn(shape) * 2 + 1
        with torch.no_grad():
            want, got = ref64(x.double()), new(x)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=f"{name} {shape}")
    for (key, want), got in zip(ref64.state_dict().items(), new.state_dict().values(), strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5, msg=f"{name} {key}")


def _fn_case(name: str, folder: Path) -> None:
    fn, shapes = FUNCTIONS[name]
    spec = compose.contraction.compose(graph_of(fn, *shapes))
    assert spec["tail"] is not None
    signature = {"init": [], "forward": ["a", "b", "c", "d"][: len(shapes)], "params": []}
    torch.manual_seed(0)
    xs = [torch.randn(s) * 2 for s in shapes]
    new = load(
        compose.contraction.render(spec, contraction.ROUND0[1], signature), folder, f"f_{abs(hash(name))}"
    )
    torch.testing.assert_close(
        new.ModelNew()(*xs).double(), fn(*(x.double() for x in xs)), rtol=1e-4, atol=1e-4, msg=name
    )


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    return {name: partial(_model_case, name) for name in MODELS} | {
        name: partial(_fn_case, name) for name in FUNCTIONS
    }


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_tail")


@pytest.mark.parametrize("name", list(checks()))
def test_every_tail_against_eager(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_kb_run_on_a_softmax_of_a_residual_after_a_norm(tmp_path):
    state = run_inprocess(RESIDUAL_SOFTMAX, tmp_path / "kb.db", max_candidates=1, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"conv"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_a_batch_norm_and_softmax_tail_passes_the_gate(box):
    source = BATCHNORM_SOFTMAX.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.contraction.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and stages.describe(spec["tail"]).startswith("moments")
    assert spec["tail"]["then"]["family"] == "normalize" and spec["tail"]["spec"]["mode"] == "batch"
    spec = compose.contraction.refine(spec, source)
    assert spec is not None
    new_source = compose.contraction.render(spec, contraction.ROUND0[1], analysis["signature"])
    request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
    reply = box.call(request, timeout_s=120)[0]
    assert reply.passed, reply


def _launches(composed: dict | None) -> list[str]:
    """The families of a prelude's or a tail's launches, in order."""
    return [] if composed is None else [composed["family"], *_launches(composed["then"])]


@pytest.mark.parametrize("name", list(GATED))
def test_the_round0_candidate_passes_the_gate(box, name):
    source = (ROOT / "tests" / "problems" / name).read_text()
    family, before, after = GATED[name]
    analysis = analyse(source, "cpu")
    spec = family.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None
    assert [_launches(spec.get("prelude")), _launches(spec["tail"])] == [before, after]
    spec = family.refine(spec, source)
    assert spec is not None
    knobs = next(k for k in family.ROUND0 if family.feasible(spec, k))
    new_source = family.render(spec, knobs, analysis["signature"])
    # its plan: the prelude's launches, the head's, the tail's, each reading what one before it wrote
    plan = family.plan(spec, knobs, analysis["signature"])
    assert [p.family for p in plan] == [*before, family.FAMILY, *after]
    assert [p.stage for p in plan] == ["prelude"] * len(before) + ["head"] + ["tail"] * len(after)
    assert plan[-1].writes == "kb_h" and all(p.writes in new_source for p in plan)
    assert all(later.reads[0] == earlier.writes for earlier, later in itertools.pairwise(plan))
    request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
    reply = box.call(request, timeout_s=120)[0]
    assert reply.passed, reply
