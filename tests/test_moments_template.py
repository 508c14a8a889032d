"""The moments family, composed from the traced ATen graph: batch norm (in eval mode, as kb times
references, by its running statistics; in training mode, by the batch's, the running statistics and
the batch count updated as torch updates them), group norm and instance norm, with and without their
affine parameters, against the reference through the interpreter for every round-0 knob set (odd
sizes, a second shape, a shifted input); what it refuses; candidates through the real gate; a whole
`kb run`."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from kernelbrain.child.analysis import analyse
from kernelbrain.child.graph import capture
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import moments
from tests.composed import load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
GROUP = ROOT / "tests" / "problems" / "moments_group.py"
SIGNATURE = {"init": ["c"], "forward": ["x"], "params": ["c"]}


class Wrapped(nn.Module):
    """The norm under a prefix, as a problem's `self.norm = nn.BatchNorm2d(c)` puts it."""

    def __init__(self, c: int, make: str) -> None:
        super().__init__()
        self.norm = eval(make, {"nn": nn, "c": c})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


CASES = [
    ("batch norm, eval", "nn.BatchNorm2d(c)", False),
    ("batch norm, eval, no affine", "nn.BatchNorm2d(c, affine=False, eps=1e-3)", False),
    ("batch norm, training, running statistics", "nn.BatchNorm2d(c, momentum=0.3)", True),
    ("batch norm, training, no running statistics", "nn.BatchNorm1d(c, track_running_stats=False)", True),
    ("group norm", "nn.GroupNorm(3, c)", False),
    ("group norm, one group, no affine", "nn.GroupNorm(1, c, affine=False)", False),
    ("instance norm", "nn.InstanceNorm2d(c)", False),
    ("instance norm, affine", "nn.InstanceNorm1d(c, affine=True)", False),
    # rows of features, as after a Linear: a statistic a channel or group with no spatial extent, many
    # statistics a program
    ("batch norm of rows, training", "nn.BatchNorm1d(c, momentum=0.2)", True),
    ("group norm of rows, a channel a group", "nn.GroupNorm(6, c)", False),
    ("group norm of rows, two groups", "nn.GroupNorm(2, c)", False),
]
ROWS = ((37, 6), (5, 6))


def check_case(name: str, make: str, training: bool, tmp_path: Path) -> None:
    shapes = ((3, 6, 7, 5), (4, 6, 9, 3)) if "1d" not in make else ((3, 6, 35), (5, 6, 11))
    shapes = ROWS if "of rows" in name else shapes
    with torch.device("meta"):
        traced = Wrapped(6, make).train(training)
    spec = moments.compose(capture(traced, [torch.empty(shapes[0], device="meta")]))
    spec = {**spec, "init_params": "c", "init_body": f"super().__init__()\nself.norm = {make}"}
    for knobs in moments.ROUND0:
        torch.manual_seed(0)
        ref = Wrapped(6, make).train(training)
        with torch.no_grad():  # parameters and running statistics away from their defaults
            for t in [*ref.parameters(), *(b for b in ref.buffers() if b.is_floating_point())]:
                t.copy_(torch.rand_like(t) + 0.5)
        new = load(moments.render(spec, knobs, SIGNATURE), tmp_path, f"m_{abs(hash(make + str(knobs)))}")
        new = new.ModelNew(6).train(training)
        new.load_state_dict(ref.state_dict())
        truth = copy.deepcopy(ref).double()  # fp32's own statistics cancel where a group is one element
        for shape in shapes:
            x = torch.randn(shape) * 3 + 2
            ref(x)  # its running statistics, compared below
            want = truth(x.double()).float()
            torch.testing.assert_close(new(x), want, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")
        for (name, want), got in zip(ref.state_dict().items(), new.state_dict().values(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    return {name: partial(check_case, name, make, training) for name, make, training in CASES}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_moments_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_norm_on_every_round0_knob_set(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        ("nn.Sequential(nn.BatchNorm2d(c), nn.ReLU())", "ops after the norm"),
        ("nn.Sequential(nn.GroupNorm(3, c), nn.GroupNorm(2, c))", "2 batch-statistics norms"),
        ("nn.Sequential(nn.ReLU(), nn.BatchNorm2d(c))", "not a forward input"),
        ("nn.LayerNorm([6, 4, 4])", "0 batch-statistics norms"),
    ],
)
def test_what_it_refuses_is_named(make, why):
    with torch.device("meta"):
        model = Wrapped(6, make).eval()
    with pytest.raises(moments.NotMoments, match=why):
        moments.compose(capture(model, [torch.empty(2, 6, 4, 4, device="meta")]))


def test_every_round0_candidate_of_a_group_norm_passes_the_gate(box):
    source = GROUP.read_text()
    analysis = analyse(source, "cpu")
    graph = Graph.model_validate(analysis["graph"])
    assert {s.arg for s in graph.sized} == {"N", "C", "HxW"}  # its own shape is not the CPU one
    spec = moments.refine(moments.matches(analysis["ops"], graph), source)
    assert spec is not None and spec["mode"] == "group" and spec["weight"] == "gn.weight"
    for knobs in moments.ROUND0:
        new_source = moments.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


ONE_EACH = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.gn = nn.GroupNorm(features, features)

    def forward(self, x):
        return self.gn(x)

def get_inputs():
    return [torch.randn(37, 6) * 3 + 2]

def get_init_inputs():
    return [6]
"""


def test_a_group_of_one_element_passes_the_gate(box):
    """Rows of features with a group a feature: the outputs are the bias on every draw, exactly, while
    the float64 truth moves by its rounding. The same outputs for fresh inputs are right, not a cache."""
    analysis = analyse(ONE_EACH, "cpu")
    spec = moments.refine(moments.matches(analysis["ops"], Graph.model_validate(analysis["graph"])), ONE_EACH)
    new_source = moments.render(spec, moments.ROUND0[0], analysis["signature"])
    request = GateRequest(problem_source=ONE_EACH, cand_source=new_source, device="cpu", seeds=3)
    reply = box.call(request, timeout_s=120)[0]
    assert reply.passed, reply


def test_kb_run_on_a_group_norm_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(GROUP, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"moments"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
