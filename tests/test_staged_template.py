"""The staged family, composed from the traced ATen graph: reductions in sequence, each reading the
inputs and the reductions before it (a cosine-similarity loss, a triplet margin loss, a centred sum of
squares), against the reference through the interpreter at the traced shape and another; what it
refuses; candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import staged
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
COSINE = ROOT / "tests" / "problems" / "staged_cosine.py"
SIGNATURE = {"init": [], "forward": ["x0", "x1", "x2"], "params": []}

CASES = [
    ("cosine similarity loss", lambda a, b, c: torch.mean(1 - F.cosine_similarity(a, b, dim=1)), 4),
    ("triplet margin loss", lambda a, b, c: F.triplet_margin_loss(a, b, c, margin=0.5), 3),
    ("centred sum of squares", lambda a, b, c: ((a - a.mean(dim=1, keepdim=True)) ** 2).sum(dim=1), 2),
]


def check_case(fn, stages: int, tmp_path: Path) -> None:
    spec = staged.compose(graph_of(fn, (5, 37), (5, 37), (5, 37)))
    assert len(spec["stages"]) == stages
    torch.manual_seed(0)
    for shape, knob_sets in (((5, 37), staged.ROUND0), ((9, 300), staged.ROUND0[:1])):
        a, b, c = torch.randn(shape), torch.randn(shape), torch.randn(shape)
        expected = fn(a, b, c)
        for knobs in knob_sets:
            new = load(
                staged.render(spec, knobs, SIGNATURE), tmp_path, f"s_{abs(hash(str(spec) + str(knobs)))}"
            )
            got = new.ModelNew()(a, b, c)
            assert got.shape == expected.shape and got.dtype == expected.dtype, (shape, knobs)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    return {name: partial(check_case, fn, stages) for name, fn, stages in CASES}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_staged_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_staged_reduction_on_every_round0_knob_set(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda a: a.sum(dim=1), "1 reductions"),
        (lambda a: a.sum(dim=1) + a.amax(dim=1), "the reduced value with what it reduced"),
        (lambda a: a / a.norm(dim=1, keepdim=True) + a.sum(dim=0), "the reduced value with what it reduced"),
        (lambda a: torch.max(a, dim=1)[1].float().sum() + a.sum(), "second result"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    with pytest.raises(ValueError, match=why):
        staged.compose(graph_of(fn, (4, 8)))


def test_every_round0_candidate_of_a_cosine_loss_passes_the_gate(box):
    source = COSINE.read_text()
    analysis = analyse(source, "cpu")
    spec = staged.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and len(spec["stages"]) == 4
    for knobs in staged.ROUND0:
        new_source = staged.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_cosine_loss_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(COSINE, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"staged"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
