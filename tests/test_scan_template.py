"""The scan family, composed from the traced ATen graph: cumulative sums and products along a leading,
middle and trailing axis, reversed by flips, exclusive by a fill concatenated before or after, masked,
with slices of other axes and chains around it, against the reference through the interpreter on round-0
knob sets (odd sizes, size-1 axes, a second shape, non-contiguous and fp16 inputs); what it
refuses; candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelbrain.child.analysis import analyse
from kernelbrain.child.graph import capture
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.families import pointwise, scan
from tests.composed import Lambda, graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = ROOT / "tests" / "problems" / "scan_masked_suffix.py"
SIGNATURE = {"init": [], "forward": ["x0", "x1"], "params": []}


def candidate(spec: dict, knobs: dict, tmp_path: Path) -> ModuleType:
    return load(scan.render(spec, knobs, SIGNATURE), tmp_path, f"cand_{abs(hash(str(knobs) + str(spec)))}")


def _exclusive(x: torch.Tensor, d: int) -> torch.Tensor:  # KernelBench's form: a zero, then the scan
    head = torch.zeros_like(x.select(d, 0).unsqueeze(d))
    return torch.cat((head, torch.cumsum(x.narrow(dim=d, start=0, length=x.size(d) - 1), dim=d)), dim=d)


# (name, fn of (x, y): y a second float input); traced at (5, 37, 9), checked there and at (2, 64, 1)
CASES = [
    ("cumsum middle", lambda x, y: torch.cumsum(x, 1)),
    ("cumsum last", lambda x, y: torch.cumsum(x, -1)),
    ("cumsum first with a chain after", lambda x, y: torch.cumsum(x, 0) * 2 - 1),
    ("cumprod middle", lambda x, y: torch.cumprod(x / 4 + 1, dim=1)),
    ("reverse by flips", lambda x, y: torch.cumsum(x.flip(1), 1).flip(1)),
    ("exclusive, fill after the scan", lambda x, y: _exclusive(x, 1)),
    (
        "exclusive, fill before, rows sliced",
        lambda x, y: torch.cumsum(
            torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:-1], 1
        ),
    ),
    (
        "fill of ones behind, then a flip",
        lambda x, y: torch.cat((torch.cumprod((x / 4 + 1)[:, 2:], 1), torch.ones_like(x[:, :2])), 1).flip(1),
    ),
    ("product of two inputs, scanned", lambda x, y: torch.cumsum(x * y + y, dim=2)),
]


# Every round-0 knob set on the first case; the others on two. The round-0 knob sets differ in BLOCK_K
# (1 or 4) and in BLOCK_R, which clips to the scan's length where the rows are contiguous and swaps with
# BLOCK_K where they are not: ROUND0[0] and ROUND0[2] take both kinds of path (one chunk or several
# carried; one row a program or several), the others repeat ROUND0[0]'s with wider blocks.
DISTINCT = [scan.ROUND0[0], scan.ROUND0[2]]


def check_case(fn, first: list[dict], tmp_path: Path) -> None:
    spec = scan.compose(graph_of(fn, (5, 37, 9), (5, 37, 9)))
    torch.manual_seed(0)
    for shape, knob_sets in (((5, 37, 9), first), ((2, 64, 1), scan.ROUND0[:1])):
        x, y = torch.randn(shape), torch.randn(shape)
        expected = fn(x, y)
        for knobs in knob_sets:
            got = candidate(spec, knobs, tmp_path).ModelNew()(x, y)
            assert got.shape == expected.shape and got.dtype == expected.dtype, (shape, knobs)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"{shape} {knobs}")


def check_mask_strided_and_half(tmp_path: Path) -> None:
    def fn(x, m):
        return torch.cumsum(x * m, dim=1)

    metas = [torch.empty(4, 30, device="meta"), torch.empty(4, 30, device="meta", dtype=torch.bool)]
    spec = scan.compose(capture(Lambda(fn), metas))
    for knobs in (scan.ROUND0[0], scan.ROUND0[2]):
        new = candidate(spec, knobs, tmp_path).ModelNew()
        torch.manual_seed(1)
        x, m = torch.randn(30, 4).t(), torch.rand(4, 30) > 0.5  # x strided
        torch.testing.assert_close(new(x, m), fn(x, m), rtol=1e-4, atol=1e-4)
        m1 = torch.rand(1, 30) > 0.5  # a broadcast mask, a size-1 axis
        torch.testing.assert_close(new(x, m1), fn(x, m1), rtol=1e-4, atol=1e-4)
    half = scan.compose(graph_of(lambda x: torch.cumsum(x, 1), (3, 200)))
    h = torch.randn(3, 200, dtype=torch.float16)
    got, truth = candidate(half, scan.ROUND0[0], tmp_path).ModelNew()(h, h), torch.cumsum(h.double(), 1)
    assert got.dtype == torch.float16
    assert ((got.double() - truth).abs() <= truth.abs() * 2**-10 + 1e-2).all()  # one fp16 rounding


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    found = {
        name: partial(check_case, fn, scan.ROUND0 if i == 0 else DISTINCT)
        for i, (name, fn) in enumerate(CASES)
    }
    return {**found, "layouts": check_mask_strided_and_half}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_scan_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_scan_on_round0_knob_sets(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_bool_mask_strided_broadcast_and_half_inputs(interpreted):
    assert interpreted["layouts"] is None, interpreted["layouts"]


def test_a_slice_bound_follows_the_axis_it_was_traced_on():
    spec = scan.compose(graph_of(lambda x: _exclusive(x, 1), (4, 50)))
    assert spec["before"] == [["slice", [0, 0], [1, -1]]]  # x.size(1) - 1: one short of the end
    assert spec["after"] == [["cat", 1, 0.0, True]]


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: torch.cumsum(x, 1) + torch.cumsum(x, 0), "2 scans"),
        (lambda x: torch.cumsum(x.flip(0), 1), "a flip of an axis"),
        (lambda x: torch.cumsum(x, 1) * x, "with what it scanned"),
        (lambda x: torch.cat((torch.cumsum(x, 1), x), 1), "two computed tensors"),
        (lambda x: torch.logcumsumexp(x, 1), "0 scans"),
        (lambda x: torch.cumsum(torch.sort(x, 1)[0], 1), "aten.sort"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    with pytest.raises((scan.NotScan, pointwise.NotPointwise), match=why):
        scan.compose(graph_of(fn, (4, 8)))


def test_every_round0_candidate_of_a_masked_suffix_sum_passes_the_gate(box):
    source = SUFFIX.read_text()
    analysis = analyse(source, "cpu")
    spec = scan.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["before"] == [["flip"]] and spec["after"] == [["flip"]]
    for knobs in scan.ROUND0:
        source_new = scan.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=source_new, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_scan_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(SUFFIX, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"scan"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
