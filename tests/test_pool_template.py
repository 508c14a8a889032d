"""The pool family, composed from the traced ATen graph: max and average pooling over 1, 2 and 3 axes
with stride, padding, dilation, ceil mode, count_include_pad and divisor_override, with chains before
and after, against the reference through the interpreter on round-0 knob sets (odd sizes, size-1
axes, a second shape, non-contiguous and fp16 inputs); what it refuses; candidates through the real
gate; a whole `kb run`."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import pointwise, pool
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
GATED = ROOT / "tests" / "problems" / "pool_gated_max.py"
SIGNATURE = {"init": [], "forward": ["x0"], "params": []}


def candidate(spec: dict, knobs: dict, tmp_path: Path) -> ModuleType:
    return load(pool.render(spec, knobs, SIGNATURE), tmp_path, f"cand_{abs(hash(str(knobs) + str(spec)))}")


# (name, fn, the traced shape, a second shape): odd sizes, size-1 axes
CASES = [
    ("max 1-D dilated", lambda x: F.max_pool1d(x, 3, 2, 1, 2), (2, 3, 17), (1, 1, 9)),
    ("max 2-D", lambda x: F.max_pool2d(x, 4, 1, 1), (2, 2, 11, 9), (1, 2, 5, 4)),
    (
        "max 2-D ceil, asymmetric",
        lambda x: F.max_pool2d(x, (2, 3), (2, 1), (1, 0), ceil_mode=True),
        (2, 3, 9, 8),
        (3, 1, 4, 5),
    ),
    (
        "max 3-D ceil dilated",
        lambda x: F.max_pool3d(x, 3, 2, 1, 2, ceil_mode=True),
        (1, 2, 9, 6, 7),
        (1, 1, 6, 5, 5),
    ),
    ("avg 1-D", lambda x: F.avg_pool1d(x, 4, 1, 2), (2, 3, 17), (4, 1, 6)),
    (
        "avg 2-D no pad count, ceil",
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        (2, 3, 17, 16),
        (1, 1, 5, 7),
    ),
    (
        "avg 3-D divisor",
        lambda x: F.avg_pool3d(x, (2, 3, 2), (1, 2, 2), 1, divisor_override=5),
        (1, 2, 6, 7, 5),
        (1, 1, 3, 4, 3),
    ),
    (
        "chains around",
        lambda x: torch.sigmoid(F.max_pool2d(torch.relu(x) * 2, 2)) + 1,
        (2, 3, 17, 15),
        (2, 2, 4, 4),
    ),
]


def check_case(fn, shapes, first: list[dict], tmp_path: Path) -> None:
    spec = pool.compose(graph_of(fn, shapes[0]))
    torch.manual_seed(0)
    for shape, knob_sets in zip(shapes, (first, pool.ROUND0[:1]), strict=True):
        x = torch.randn(shape)
        expected = fn(x)
        for knobs in knob_sets:
            got = candidate(spec, knobs, tmp_path).ModelNew()(x)
            assert got.shape == expected.shape and got.dtype == expected.dtype, (shape, knobs)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")


def check_strided_and_half(tmp_path: Path) -> None:
    def fn(x):
        return F.avg_pool2d(x, 3, 1, 1)

    new = candidate(pool.compose(graph_of(fn, (2, 3, 8, 9))), pool.ROUND0[0], tmp_path).ModelNew()
    x = torch.randn(2, 9, 8, 3).permute(0, 3, 2, 1)  # channels last, strided
    torch.testing.assert_close(new(x), fn(x), rtol=1e-4, atol=1e-4)
    h = torch.randn(2, 3, 8, 9, dtype=torch.float16)
    got, truth = new(h), fn(h.double())
    assert got.dtype == torch.float16
    assert ((got.double() - truth).abs() <= truth.abs() * 2**-10 + 1e-3).all()  # one fp16 rounding


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    # Every round-0 knob set on the first case; one on each other, in turn. The knob sets differ in BLOCK,
    # which clips to the output row (a row of these sizes is one block whatever the knob set), and in
    # num_warps, which the interpreter does not read.
    n = len(pool.ROUND0)
    found = {
        name: partial(check_case, fn, (a, b), pool.ROUND0 if i == 0 else [pool.ROUND0[(i - 1) % n]])
        for i, (name, fn, a, b) in enumerate(CASES)
    }
    return {**found, "layouts": check_strided_and_half}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_pool_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_pooling_on_round0_knob_sets(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_strided_and_half_inputs(interpreted):
    assert interpreted["layouts"] is None, interpreted["layouts"]


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), "2 poolings"),
        (lambda x: F.max_pool2d(x, 2, return_indices=True)[1].float(), "the indices"),
        (lambda x: F.max_pool2d(x, 2) * x[:, :, :15, :15], "with what it pooled"),
        (lambda x: F.adaptive_avg_pool2d(x, 3), "0 poolings"),
        (lambda x: F.avg_pool2d(x, 30), "900 taps"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    with pytest.raises((pool.NotPool, pointwise.NotPointwise), match=why):
        pool.compose(graph_of(fn, (2, 3, 30, 30)))


def test_every_round0_candidate_of_a_gated_max_pooling_passes_the_gate(box):
    source = GATED.read_text()
    analysis = analyse(source, "cpu")
    spec = pool.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["spatial"] == 3 and spec["ceil"] and spec["prologue"]
    for knobs in pool.ROUND0:
        new_source = pool.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_pooling_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(GATED, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"pool"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
