"""The normalize family (reduce-then-map), composed from the traced ATen graph: its statistics over a
trailing, middle and full set of axes combined with the inputs, against the reference through the
interpreter on round-0 knob sets; what it refuses; every round-0 candidate of a problem of kb's
own through the real gate; a whole `kb run`."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import normalize, pointwise, reduce
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "tests" / "problems" / "normalize_rows.py"
SIGNATURE = {"init": [], "forward": ["x", "y"], "params": []}


CASES = [
    ("L1 rows", lambda x, y: x / torch.mean(torch.abs(x), dim=1, keepdim=True)),
    ("RMS last, times y", lambda x, y: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * y),
    ("centred by the max", lambda x, y: x - x.amax(dim=1, keepdim=True)),
    ("log-softmax as x - logsumexp", lambda x, y: x - torch.logsumexp(x, dim=1, keepdim=True)),
    ("over everything", lambda x, y: x / x.abs().sum()),
    ("two axes apart", lambda x, y: (x - x.mean(dim=(0, 2), keepdim=True)) * 2),
    ("L2 of a chain", lambda x, y: (x + y) / torch.norm(x + y, dim=2, keepdim=True)),
]


# Every round-0 knob set on the first case and on the reduction over everything; two on each other: the
# one of several rows a program, and one of a row a program in turn. At (5, 33, 7) the split knob set does
# not split (the reduced length is far below two chunks a split) and BLOCK_R clips to it, so the row-a-
# program knob sets take one path.
EVERY_KNOB_SET = ("L1 rows", "over everything")
ONE_ROW = [k for k in normalize.ROUND0 if k["block_k"] == 1]
MANY_ROWS = [k for k in normalize.ROUND0 if k["block_k"] > 1]


def check_case(fn, knob_sets: list[dict], tmp_path: Path) -> None:
    spec = normalize.compose(graph_of(fn, (5, 33, 7), (5, 33, 7)))
    torch.manual_seed(0)
    x, y = torch.randn(5, 33, 7), torch.randn(5, 33, 7)
    expected = fn(x, y)
    for i, knobs in enumerate(knob_sets):
        got = load(normalize.render(spec, knobs, SIGNATURE), tmp_path, f"cand{i}").ModelNew()(x, y)
        assert got.shape == expected.shape and got.dtype == expected.dtype, knobs
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=str(knobs))


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    rest = [name for name, _ in CASES if name not in EVERY_KNOB_SET]
    return {
        name: partial(
            check_case,
            fn,
            normalize.ROUND0
            if name in EVERY_KNOB_SET
            else [ONE_ROW[rest.index(name) % len(ONE_ROW)], MANY_ROWS[rest.index(name) % len(MANY_ROWS)]],
        )
        for name, fn in CASES
    }


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_normalize_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_case_on_round0_knob_sets(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: x.sum(dim=1), "a reduction alone"),
        (lambda x: x / x.sum(dim=1)[:, None], "without keepdim"),
        (lambda x: (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True), "aten.std"),
        (lambda x: x * x.argmax(dim=1, keepdim=True), "index"),
        (lambda x: torch.relu(x), "0 reductions"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    with pytest.raises((normalize.NotNormalize, reduce.NotReduction, pointwise.NotPointwise), match=why):
        normalize.compose(graph_of(fn, (4, 8)))


def test_every_round0_candidate_passes_the_gate(box):
    source = ROWS.read_text()
    analysis = analyse(source, "cpu")
    spec = normalize.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None
    for knobs in normalize.ROUND0:
        candidate = normalize.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=candidate, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_normalisation_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(ROWS, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"normalize"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
