"""The reduce family, composed from the traced ATen graph: every reduction of its table over a leading,
middle, trailing, split and full set of axes, with chains before and after it, against the reference
through the interpreter on round-0 knob sets (odd sizes, size-1 axes, non-contiguous and fp16
inputs); what it refuses; candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from kernelbrain.child.analysis import analyse
from kernelbrain.child.graph import mark_sized
from kernelbrain.core.events import GatePassed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.templates.decompose import expand
from kernelbrain.templates.families import pointwise, reduce
from kernelbrain.templates.families.reduce.planner import MAX_SERIAL, plan_reduction
from tests.composed import graph_of, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
LOSS = ROOT / "tests" / "problems" / "reduce_loss.py"
HINGE = ROOT / "tests" / "problems" / "reduce_hinge.py"
SIGNATURE = {"init": [], "forward": ["x0", "x1"], "params": []}


def candidate(spec: dict, knobs: dict, tmp_path: Path) -> ModuleType:
    return load(reduce.render(spec, knobs, SIGNATURE), tmp_path, f"cand_{abs(hash(str(knobs)))}")


# every reduction of the table, over axes of (5, 33, 7): first, middle, last, two apart, all
CASES = [
    ("sum middle", lambda x, y: torch.sum(x, dim=1)),
    ("mean all", lambda x, y: x.mean()),
    ("max values last", lambda x, y: torch.max(x, dim=2)[0]),
    ("argmax middle", lambda x, y: torch.argmax(x, dim=1)),
    ("argmin first via min", lambda x, y: torch.min(x, dim=0)[1]),
    ("amin two apart", lambda x, y: x.amin(dim=(0, 2))),
    ("prod middle", lambda x, y: torch.prod(x / 2, dim=1)),
    ("L2 norm keepdim", lambda x, y: torch.norm(x, dim=1, keepdim=True)),
    ("frobenius", lambda x, y: torch.norm(x, p="fro")),
    ("L1 last keepdim", lambda x, y: x.abs().sum(dim=-1, keepdim=True)),
    ("max norm", lambda x, y: torch.linalg.vector_norm(x, ord=float("inf"), dim=(1, 2))),
    ("mse of two", lambda x, y: torch.mean((x - y) ** 2)),
    ("chain after", lambda x, y: torch.sqrt(torch.sum(x * y, dim=0).abs() + 1.0) * 2),
    ("max of all", lambda x, y: torch.max(x + y)),
    ("logsumexp middle, chain after", lambda x, y: torch.tanh(torch.logsumexp(x * 4, dim=1)) + 1),
    ("logsumexp last keepdim", lambda x, y: torch.logsumexp(x, dim=-1, keepdim=True)),
    # losses: ATen's fused map-and-reduce ops split by templates/decompose.py
    ("smooth L1", lambda x, y: F.smooth_l1_loss(x, y)),
    ("smooth L1 beta, summed", lambda x, y: F.smooth_l1_loss(x, y, reduction="sum", beta=0.5)),
    ("huber delta", lambda x, y: F.huber_loss(x, y, delta=2.0)),
    ("mse op", lambda x, y: F.mse_loss(x, y)),
    ("soft margin", lambda x, y: F.soft_margin_loss(x, torch.sign(y))),
    ("binary cross-entropy", lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(y))),
    ("kl divergence, summed", lambda x, y: F.kl_div(F.logsigmoid(x), torch.sigmoid(y), reduction="sum")),
]


# Every round-0 knob set on these cases; two on each other, in turn: one of a row a program (block_k 1)
# and one of several rows a program. At (5, 33, 7) no split strategy splits (R is far below two chunks a
# split) and BLOCK_R clips to the reduced length, so the knob sets differ in the rows a program takes and
# the steps along R; the splits themselves are the long middle axis' check.
EVERY_KNOB_SET = (
    "sum middle",
    "mean all",
    "argmax middle",
    "L1 last keepdim",
    "logsumexp middle, chain after",
)
ONE_ROW = [k for k in reduce.ROUND0 if k["block_k"] == 1 and k["split"] == 1]  # an argmax never splits
ROWS = [k for k in reduce.ROUND0 if k["block_k"] > 1]


def knob_sets(names: list[str]) -> dict[str, list[dict]]:
    """The round-0 knob sets each named case runs on."""
    rest = [name for name in names if name not in EVERY_KNOB_SET]
    return {
        name: reduce.ROUND0
        if name in EVERY_KNOB_SET
        else [ONE_ROW[rest.index(name) % len(ONE_ROW)], ROWS[rest.index(name) % len(ROWS)]]
        for name in names
    }


def check_case(fn, knob_sets: list[dict], tmp_path: Path) -> None:
    spec = reduce.compose(expand(graph_of(fn, (5, 33, 7), (5, 33, 7))))
    torch.manual_seed(0)
    x, y = torch.randn(5, 33, 7) * 3, torch.randn(5, 33, 7)
    x.view(-1)[::13] = x.view(-1)[::17].max()  # ties: the first index wins, as torch's
    expected = fn(x, y)
    for knobs in knob_sets:
        if not reduce.feasible(spec, knobs):
            continue
        got = candidate(spec, knobs, tmp_path).ModelNew()(x, y)
        assert got.shape == expected.shape and got.dtype == expected.dtype, knobs
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=str(knobs))


def check_logsumexp_of_infinities(tmp_path: Path) -> None:
    """Rows all -inf give -inf, a +inf gives +inf, a NaN gives NaN, as torch.logsumexp."""
    fn = lambda x, y: torch.logsumexp(x, dim=1)  # noqa: E731
    spec = reduce.compose(graph_of(fn, (4, 300), (4, 300)))
    x = torch.randn(4, 300)
    x[0] = -float("inf")
    x[1, 7] = float("inf")
    x[2, 100] = float("nan")
    for knobs in reduce.ROUND0:
        if reduce.feasible(spec, knobs):
            got = candidate(spec, knobs, tmp_path).ModelNew()(x, x)
            torch.testing.assert_close(got, fn(x, x), equal_nan=True, msg=str(knobs))


def check_long_middle_axis(tmp_path: Path) -> None:
    """A middle axis longer than a tile's rows, inner positions not a power of two: the column tiles, one
    launch and split in two (a partial a chunk), agree with torch."""
    torch.manual_seed(2)
    x = torch.randn(3, 700, 37)
    for fn in (lambda x, y: x.mean(dim=1), lambda x, y: torch.argmin(x, dim=1), lambda x, y: x.amax(dim=1)):
        spec = reduce.compose(graph_of(fn, (3, 700, 37), (3, 700, 37)))
        # split 16 of 1024-element tiles: 64 inner positions x 16 rows, R = 700 >= 2 * 16 * 16: it splits
        assert any(k["split"] == 16 and k["block_k"] * k["block_r"] == 1024 for k in reduce.ROUND0)
        for knobs in reduce.ROUND0:
            if reduce.feasible(spec, knobs):
                got = candidate(spec, knobs, tmp_path).ModelNew()(x, x)
                torch.testing.assert_close(got, fn(x, x), rtol=1e-4, atol=1e-4, msg=str(knobs))


# a split of R that also has a high axis: 16 chunks shared by the high positions, two-step chunks
SPLIT_SMALL = {"strategy": "split", "block_k": 1, "block_r": 128, "split": 16, "num_warps": 4}


def check_broadcast_inputs_read_in_place(tmp_path: Path) -> None:
    """Reduced axes no one stride walks (a broadcast among them, axes apart) with a trailing run of at
    least LONG_RUN: no input is copied, each high position takes a partial (R also split, in column
    tiles; and in rows of one), and the result is torch's."""
    torch.manual_seed(3)
    cases = [  # fn, x's and y's shapes, knobs
        (lambda x, y: torch.sum(x * y, dim=(0, 1)), (3, 1100, 5), (1100, 5), SPLIT_SMALL),
        (lambda x, y: (x - y).abs().amax(dim=(0, 2)), (3, 5, 1100), (5, 1), reduce.ROUND0[0]),
    ]
    for fn, sx, sy, knobs in cases:
        spec = reduce.compose(expand(graph_of(fn, sx, sy)))
        plan = reduce.plan(spec, knobs)
        assert plan is not None and plan["copy"] == [False, False] and plan["H"] == 3, plan
        x, y = torch.randn(sx), torch.randn(sy)
        got = candidate(spec, knobs, tmp_path).ModelNew()(x, y)
        torch.testing.assert_close(got, fn(x, y), rtol=1e-4, atol=1e-4, msg=str(knobs))


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    knobs = knob_sets([name for name, _ in CASES])
    found = {name: partial(check_case, fn, knobs[name]) for name, fn in CASES}
    return {
        **found,
        "long middle": check_long_middle_axis,
        "logsumexp infinities": check_logsumexp_of_infinities,
        "layouts": check_non_contiguous_size_one_and_half_inputs,
        "batchmean": check_a_division_by_a_size_follows_the_shape,
        "in place": check_broadcast_inputs_read_in_place,
    }


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_reduce_template")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_reduction_on_round0_knob_sets(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_logsumexp_of_infinities_as_torch(interpreted):
    assert interpreted["logsumexp infinities"] is None, interpreted["logsumexp infinities"]


def test_a_long_middle_axis_in_column_tiles(interpreted):
    assert interpreted["long middle"] is None, interpreted["long middle"]


def test_broadcast_inputs_read_in_place(interpreted):
    assert interpreted["in place"] is None, interpreted["in place"]


def test_non_contiguous_size_one_and_half_inputs(interpreted):
    assert interpreted["layouts"] is None, interpreted["layouts"]


def check_non_contiguous_size_one_and_half_inputs(tmp_path: Path) -> None:
    spec = reduce.compose(graph_of(lambda x, y: torch.sum(x * y, dim=(1, 2)), (4, 6, 9), (4, 6, 9)))
    for knobs in (reduce.ROUND0[0], reduce.ROUND0[1]):
        new = candidate(spec, knobs, tmp_path).ModelNew()
        torch.manual_seed(1)
        x, y = torch.randn(9, 6, 4).permute(2, 1, 0), torch.randn(6, 1)  # strided, and broadcast
        torch.testing.assert_close(new(x, y), torch.sum(x * y, dim=(1, 2)), rtol=1e-4, atol=1e-4)
        x1 = torch.randn(1, 1, 300)
        torch.testing.assert_close(new(x1, x1), torch.sum(x1 * x1, dim=(1, 2)), rtol=1e-4, atol=1e-4)
        h = torch.randn(3, 5, 200, dtype=torch.float16)
        got, truth = new(h, h), torch.sum(h.double() * h.double(), dim=(1, 2))
        assert got.dtype == torch.float16
        assert ((got.double() - truth).abs() <= truth.abs() * 2**-10 + 1e-3).all()  # one fp16 rounding


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x: x / x.sum(dim=1, keepdim=True), "normalisation"),
        (lambda x: x.sum(dim=1) + x.amax(dim=1), "2 reductions"),
        (lambda x: torch.norm(x, p=3, dim=1), "order 3"),
        (lambda x: torch.cumsum(x, 1).sum(), "aten.cumsum"),
        (lambda x: torch.max(x, dim=1), "2 outputs"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    with pytest.raises((reduce.NotReduction, pointwise.NotPointwise), match=why):
        reduce.compose(graph_of(fn, (4, 8)))


def test_every_round0_candidate_of_a_loss_passes_the_gate(box):
    source = LOSS.read_text()
    analysis = analyse(source, "cpu")
    spec = reduce.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["dims"] == [1, 2] and spec["post"] == 1
    for knobs in reduce.ROUND0:
        candidate = reduce.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=candidate, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_a_full_reduction_with_broadcast_targets_split_passes_the_gate(box):
    """KernelBench's hinge loss at the smoke shape: the targets read in place, a partial a row, R also
    split (SPLIT_SMALL) or not (the sweep's split 64), both through the real gate."""
    source = HINGE.read_text()
    analysis = analyse(source, "cpu")
    spec = reduce.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["shapes"] == [[6, 1500], [1500]] and spec["dims"] is None
    for knobs, parts in ((SPLIT_SMALL, 18), (reduce.ROUND0[2], 6)):
        plan = reduce.plan(spec, knobs)
        assert plan is not None and plan["copy"] == [False, False] and plan["parts"] == parts, plan
        candidate = reduce.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=candidate, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


N = 32768  # KernelBench's level-1 losses reduce (32768, 32768) fp32 tensors: 2^30 elements


def _mse(x, y):
    return torch.mean((x - y) ** 2)


def test_a_long_serial_sum_is_infeasible_at_a_large_shape():
    """Traced on meta at 2^30 elements to one value: a knob set whose lanes would add more than
    MAX_SERIAL terms one after another in fp32 is refused (on the H200 lanes of 2^20 erred 3e-3, past
    the gate's 1e-4), and the launcher would split such a loop itself; the split the H200 passed (64 x
    2048: 2^13 terms a lane, then 64 partials) stays feasible; round 0 and more_split still offer sets,
    one of them ~1024 programs (132 SMs x a few)."""
    spec = reduce.compose(expand(graph_of(_mse, (N, N), (N, N))))
    loops = [k for k in reduce.ROUND0 if k["split"] == 1]
    assert loops and not any(reduce.feasible(spec, k) for k in loops)
    assert all(reduce.plan(spec, k)["raised"] for k in loops)
    passed = reduce.ROUND0[2]
    assert passed["split"] == 64 and passed["block_r"] == 2048 and reduce.feasible(spec, passed)
    assert reduce.plan(spec, passed)["serial"] == 2**13 + 1
    offered = [reduce.plan(spec, k) for k in reduce.ROUND0 if reduce.feasible(spec, k)]
    assert all(p["serial"] <= MAX_SERIAL and not p["raised"] for p in offered)
    assert max(p["blocks"] * p["parts"] for p in offered) >= 1024
    child = reduce.mutate(passed, "more_split")
    assert child is not None and child["split"] > 64 and reduce.feasible(spec, child)
    # int32 offsets still reach 2^30 elements; past 2^31 they are int64
    assert not reduce.plan(spec, passed)["wide"]
    assert plan_reduction([2**16, 2**16], [0, 1], [[2**16, 1]], 1, 2048, 1024, 0)["wide"]


def test_a_middle_axis_counts_the_rows_its_column_tiles_take():
    """Along a middle axis the launcher tiles 8 inner positions x 128 rows of R out of a 1 x 1024 knob
    set: 2^23 rows are 2^16 serial terms a lane there (refused: the launcher would split R itself), 2^13
    along the last axis (feasible)."""
    fn = lambda x, y: x.sum(dim=1)  # noqa: E731
    loop = reduce.ROUND0[0]
    assert loop["block_k"] * loop["block_r"] == 1024 and loop["split"] == 1
    middle = reduce.compose(graph_of(fn, (2, 2**23, 8), (1,)))
    plan = reduce.plan(middle, loop)
    assert (
        (plan["block_k"], plan["block_r"]) == (8, 128)
        and plan["raised"]
        and not reduce.feasible(middle, loop)
    )
    last = reduce.compose(graph_of(lambda x, y: x.sum(dim=2), (2, 8, 2**23), (1,)))
    assert reduce.plan(last, loop)["serial"] == 2**13 and reduce.feasible(last, loop)


def test_a_broadcast_input_is_read_in_place_at_the_full_size():
    """KernelBench's hinge loss at its own shape (meta): every round-0 set reads the targets in place
    (no 4.3 GB expanded copy), a partial for each of the 32768 rows, every set feasible."""
    spec = reduce.compose(expand(graph_of(lambda x, y: torch.clamp(1 - x * y, min=0).mean(), (N, N), (N,))))
    for knobs in reduce.ROUND0:
        plan = reduce.plan(spec, knobs)
        assert plan["copy"] == [False, False] and (plan["H"], plan["R"], plan["parts"]) == (N, N, N), knobs
        assert reduce.feasible(spec, knobs) and plan["strides"][1] == [0, 0, 1, 0]


def test_kb_run_on_a_loss_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(LOSS, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"reduce"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_a_loss_without_reduction_is_the_elementwise_map_alone():
    graph = expand(graph_of(lambda x, y: F.huber_loss(x, y, reduction="none", delta=0.5), (4, 8), (4, 8)))
    assert [n.op for n in graph.nodes[2:]] == ["kb.huber_loss"]
    spec = pointwise.compose(graph)
    assert spec["inputs"] == [0, 1] and "tl.where" in spec["body"][0] and "0.5" in spec["body"][0]


def _batchmean(x, y):
    return F.kl_div(F.logsigmoid(x), torch.sigmoid(y), reduction="batchmean")  # the sum / x.size(0)


def check_a_division_by_a_size_follows_the_shape(tmp_path: Path) -> None:
    graph = mark_sized(graph_of(_batchmean, (6, 40), (6, 40)), graph_of(_batchmean, (3, 50), (3, 50)))
    spec = reduce.compose(expand(graph))
    assert spec["divide_by"] == [0, 0, 1] and spec["epilogue"] == []
    torch.manual_seed(2)
    for knobs in reduce.ROUND0:
        new = candidate(spec, knobs, tmp_path).ModelNew()
        for shape in ((6, 40), (9, 3000)):  # at a shape the trace never saw, divided by its own batch
            x, y = torch.randn(shape), torch.randn(shape)
            torch.testing.assert_close(new(x, y), _batchmean(x, y), rtol=1e-4, atol=1e-5, msg=str(knobs))


def test_a_division_by_a_size_follows_the_shape(interpreted):
    assert interpreted["batchmean"] is None, interpreted["batchmean"]


def test_a_number_that_changes_with_the_shape_unexplained_is_refused():
    def fn(x):
        return x.sum() / (x.size(0) * 3 + 7)

    graph = mark_sized(graph_of(fn, (6, 40)), graph_of(fn, (3, 40)))
    assert [(s.arg, s.input) for s in graph.sized] == [("other", -1)]
    with pytest.raises(reduce.NotReduction, match="computed from a size"):
        reduce.compose(graph)
    with pytest.raises(pointwise.NotPointwise, match="computed from a size"):
        pointwise.compose(
            mark_sized(graph_of(lambda x: x * x.size(1), (6, 40)), graph_of(lambda x: x * x.size(1), (6, 41)))
        )


def test_the_analysis_finds_a_batch_mean_divides_by_a_size():
    """Traced at the CPU shape (batch 5) and again on meta at the file's own (batch 64): the division's
    5 is input 0's first axis, which the candidate reads from its input at each call."""
    analysis = analyse((ROOT / "tests" / "problems" / "reduce_batchmean.py").read_text(), "cpu")
    graph = Graph.model_validate(analysis["graph"])
    assert [(graph.nodes[s.node].op, s.arg, s.input, s.start, s.end) for s in graph.sized] == [
        ("aten.div.Tensor", "other", 0, 0, 1)
    ]
    spec = reduce.compose(expand(graph))
    assert spec["divide_by"] == [0, 0, 1] and spec["post"] == 0 and spec["epilogue"] == []
