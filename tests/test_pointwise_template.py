"""The pointwise family, composed from the traced ATen graph: which graphs it takes and which it refuses
(naming why), the composed chain's values against the reference through the interpreter (every op of
its table, odd sizes, size-1 axes, broadcast and non-contiguous inputs, fp16), candidates through the
real gate, and a whole `kb run` on a problem no hand-written family covers."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import pointwise, reduce
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ROOT / "tests" / "problems" / "pointwise_chain.py"


def problem(forward: str, n_inputs: int = 1, init: str = "", shapes: str = "(5, 37)") -> str:
    """A KernelBench-format source whose forward returns `forward` of x0, x1, ..."""
    names = ", ".join(f"x{i}" for i in range(n_inputs))
    inputs = ", ".join(f"torch.randn{shapes}" for _ in range(n_inputs))
    return f"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self{init}):
        super().__init__()

    def forward(self, {names}):
        return {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


# (forward expression, number of inputs): every entry of the op table at least once
CHAINS = [
    ("F.leaky_relu(x0, 0.3)", 1),
    ("F.elu(x0, alpha=1.5)", 1),
    ("torch.selu(x0)", 1),
    ("F.celu(x0, alpha=0.7)", 1),
    ("F.gelu(x0) + F.gelu(x0, approximate='tanh')", 1),
    ("F.softplus(x0, beta=2.0, threshold=5.0)", 1),
    ("F.mish(x0) - F.silu(x0)", 1),
    ("F.logsigmoid(x0)", 1),
    ("F.hardswish(x0) * F.hardsigmoid(x0)", 1),
    ("F.relu6(x0) + F.hardtanh(x0, -0.5, 0.5)", 1),
    ("F.threshold(x0, 0.1, -2.0)", 1),
    ("torch.tanh(x0) + torch.sigmoid(x0) + torch.relu(x0)", 1),
    ("torch.exp(-x0.abs()) + torch.log1p(x0.abs()) + torch.expm1(x0 / 10)", 1),
    ("torch.sqrt(x0.abs() + 1) * torch.rsqrt(x0 * x0 + 1)", 1),
    ("torch.sin(x0) * torch.cos(x0) + torch.erf(x0)", 1),
    ("torch.floor(x0) + torch.ceil(x0) + torch.sign(x0)", 1),
    ("torch.pow(x0, 3) + x0 ** 2 + torch.pow(x0.abs() + 1, 0.5) + torch.pow(x0.abs() + 1, 1.7)", 1),
    ("torch.pow(x0, x1.round())", 2),
    ("torch.clamp(x0, min=-1.0, max=2.0) + torch.clamp(x1, min=0.5)", 2),
    ("torch.where(x0 > x1, x0 - x1, 2 * x1) / (1 + x0.abs())", 2),
    ("torch.maximum(x0, x1) - torch.minimum(x0, x1) + 1 - x0", 2),
    ("((x0 > 0) & (x1 < 0)).float() * x0 + torch.logical_not(x1 > 0).float()", 2),
    ("(x0 * x1 + x2) / (x3.abs() + 1)", 4),
    ("x0.half().float() + x0.reciprocal().clamp(-5, 5) + torch.square(x0)", 1),
]


def composed(source: str, tmp_path: Path, knobs: dict | None = None) -> tuple[ModuleType, ModuleType]:
    """The problem and its pointwise candidate (round 0's first knob set unless `knobs`), as modules."""
    analysis = analyse(source, "cpu")
    spec = pointwise.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None
    candidate = pointwise.render(spec, knobs or pointwise.ROUND0[0], analysis["signature"])
    return load(source, tmp_path, "problem"), load(candidate, tmp_path, "candidate")


def wide(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Signed values up to ~30, some exactly zero: both branches of every where/threshold."""
    x = torch.randn(*shape) * torch.tensor([0.1, 1.0, 30.0])[torch.randint(0, 3, shape)]
    x.view(-1)[::11] = 0.0
    return x.to(dtype)


def same(expected: torch.Tensor, got: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def check_chain(forward: str, n: int, tmp_path: Path) -> None:
    prob, cand = composed(problem(forward, n), tmp_path)
    torch.manual_seed(0)
    xs = [wide(3, 41, 7) for _ in range(n)]
    same(prob.Model()(*xs), cand.ModelNew()(*xs))


VIEWS = problem("x0.unsqueeze(1) * x1 + x2.t() - torch.sigmoid(x2.permute(1, 0)) + x1", 3).replace(
    "return [torch.randn(5, 37), torch.randn(5, 37), torch.randn(5, 37)]",
    "return [torch.randn(37), torch.randn(37, 23), torch.randn(23, 37)]",
)
assert "randn(23, 37)" in VIEWS


def check_views_of_inputs(tmp_path: Path) -> None:
    """Inputs reached through unsqueeze, t and permute (a diagonal matrix's product is x0.unsqueeze(1) *
    x1): each a slot of its own, the candidate taking the same view, at the traced shape and another."""
    prob, cand = composed(VIEWS, tmp_path)
    for m, n in ((37, 23), (41, 19)):
        xs = [wide(m), wide(m, n), wide(n, m)]
        same(prob.Model()(*xs), cand.ModelNew()(*xs))


def check_round0_strategy(knobs: dict, tmp_path: Path) -> None:
    """One round-0 knob set on contiguous inputs of the output's shape (the flat kernels' path, the
    persistent loop's included), at a size of several tiles with a partial last one."""
    prob, cand = composed(problem("torch.tanh(x0) * x1 - x0", 2, shapes="(3, 2501)"), tmp_path, knobs)
    torch.manual_seed(2)
    xs = [wide(3, 2501), wide(3, 2501)]
    same(prob.Model()(*xs), cand.ModelNew()(*xs))


def round0_name(knobs: dict) -> str:
    return "round0:" + "-".join(str(v) for v in knobs.values())


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    found = {forward: partial(check_chain, forward, n) for forward, n in CHAINS}
    found |= {round0_name(k): partial(check_round0_strategy, k) for k in pointwise.ROUND0}
    return {**found, "broadcast": check_broadcast_strided_and_half_inputs, "views": check_views_of_inputs}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_pointwise_template")


@pytest.mark.parametrize(("forward", "n"), CHAINS, ids=[c[0][:40] for c in CHAINS])
def test_every_op_of_the_table_computes_what_the_reference_does(interpreted, forward, n):
    assert interpreted[forward] is None, interpreted[forward]


@pytest.mark.parametrize("knobs", pointwise.ROUND0, ids=round0_name)
def test_every_round0_strategy_runs_under_the_interpreter(interpreted, knobs):
    """Every strategy round 0 proposes runs on CPU too (the persistent loop's tile is an int there)."""
    assert interpreted[round0_name(knobs)] is None, interpreted[round0_name(knobs)]


def test_views_of_inputs_are_slots_of_their_own(interpreted):
    assert interpreted["views"] is None, interpreted["views"]


def test_broadcast_strided_and_half_inputs(interpreted):
    assert interpreted["broadcast"] is None, interpreted["broadcast"]


def check_broadcast_strided_and_half_inputs(tmp_path: Path) -> None:
    prob, cand = composed(problem("torch.tanh(x0) * x1 + F.softplus(x2)", 3, shapes="(4, 1, 9)"), tmp_path)
    ref, new = prob.Model(), cand.ModelNew()
    torch.manual_seed(1)
    cases = [
        [wide(4, 6, 9), wide(1, 6, 1), wide(9)],  # broadcast along the middle and leading axes
        [wide(9, 6, 4).permute(2, 1, 0), wide(6, 4).t()[:, :, None], wide(1, 1, 9)],  # non-contiguous
        [wide(1, 1, 1), wide(5, 1, 3, 1, 2, 1), wide(2, 1)],  # size-1 axes, six dims
        [wide(0, 3), wide(3), wide(1)],  # empty
        [wide(3, 2, 1500), wide(1500), wide(3, 1, 1)],  # a last axis over a tile: two column blocks a row
        [wide(700, 3), wide(3), wide(700, 1)],  # a short last axis: many rows a tile, the last tile partial
    ]
    for xs in cases:
        same(ref(*xs), new(*xs))
    half = [wide(3, 50, dtype=torch.float16), wide(50, dtype=torch.float16), wide(3, 1, dtype=torch.float16)]
    # one rounding, where the reference rounds after each op: against the float64 truth, no worse than the
    # reference by more than half an fp16 ulp
    truth = ref(*(x.double() for x in half))
    got, expected = new(*half), ref(*half)
    assert got.dtype == torch.float16
    ulp = truth.abs().clamp_min(2**-14) * 2**-10
    assert ((got.double() - truth).abs() <= (expected.double() - truth).abs() + ulp / 2).all()


@pytest.mark.parametrize("knobs", pointwise.ROUND0, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_every_round0_candidate_passes_the_gate(box, knobs):
    source = CHAIN.read_text()
    analysis = analyse(source, "cpu")
    spec = pointwise.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and pointwise.feasible(spec, knobs)
    candidate = pointwise.render(spec, knobs, analysis["signature"])
    request = GateRequest(problem_source=source, cand_source=candidate, device="cpu", seeds=3)
    reply = box.call(request, timeout_s=120)[0]
    assert reply.passed, reply


@pytest.mark.parametrize(
    ("fn", "shapes", "why"),
    [
        (lambda x: x.sum(dim=1), [(4, 8)], "aten.sum.dim_IntList"),
        (lambda x: torch.cumsum(x, 0), [(4, 8)], "aten.cumsum.default"),
        (lambda x, y: x @ y, [(4, 8), (8, 2)], "aten.mm.default"),
        (lambda x: x.t() * 2, [(4, 8)], "aten.t.default"),
        (lambda x: x.view(8, 4) + 1, [(4, 8)], "changing a shape"),
        (lambda x: x > 0, [(4, 8)], "an output of bool"),
        (lambda x: (x, x + 1), [(4, 8)], "2 outputs"),
        (lambda *xs: sum(xs), [(4, 8)] * 5, "more than 4 inputs"),
    ],
)
def test_what_it_refuses_is_named(fn, shapes, why):
    with pytest.raises(pointwise.NotPointwise, match=why):
        pointwise.compose(graph_of(fn, *shapes))


class Scaled(torch.nn.Module):
    def __init__(self, buffer: bool) -> None:
        super().__init__()
        if buffer:
            self.register_buffer("scale", torch.ones(8, device="meta"))
        else:
            self.scale = torch.nn.Parameter(torch.ones(8, device="meta"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_parameter_is_refused_and_dead_ops_are_left_out():
    for buffer in (False, True):
        with pytest.raises(pointwise.NotPointwise, match="parameter scale"):
            pointwise.compose(graph_of(Scaled(buffer), (4, 8)))

    def dead(x: torch.Tensor) -> torch.Tensor:
        x.sum()  # traced, never used
        return torch.relu(x)

    spec = pointwise.compose(graph_of(dead, (4, 8)))
    assert spec["body"] == ["v4 = tl.maximum(v0, 0.0)"] and spec["helpers"] == []


def test_kb_run_on_a_chain_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(CHAIN, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert state.analysis is not None and state.analysis.graph is not None
    assert {c.proposal.family for c in state.candidates.values()} == {"pointwise"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_mutations_step_tiles_and_warps_within_their_limits():
    first = pointwise.ROUND0[0]  # block 1024, 4 warps
    assert pointwise.mutate(first, "larger_tiles") == {**first, "block": 2048}
    assert pointwise.mutate(first, "fewer_warps") == {**first, "num_warps": 2}
    assert pointwise.mutate(first, "persistent") == {**first, "strategy": "persistent", "ctas_per_sm": 4}
    top = {"strategy": "persistent", "block": 16384, "num_warps": 16, "ctas_per_sm": 4}
    assert [pointwise.mutate(top, m) for m in ("larger_tiles", "more_warps", "persistent")] == [None] * 3
    rows = reduce.ROUND0[0]  # block_r 1024, split 1
    assert reduce.mutate(rows, "smaller_tiles") == {**rows, "block_r": 512}
    assert reduce.mutate(rows, "more_split") == {**rows, "strategy": "split", "split": 16}
    assert reduce.mutate(rows, "persistent") is None
