"""The cross_entropy family, composed from the traced ATen graph (a log-softmax, then a gather at each
row's target): every reduction mode, class weights, ignore_index, a chain on the logits and on the loss,
log-probabilities given, fp16 and bf16 logits, -inf logits, 1-D logits, against torch (in float64 for
half logits, as the gate) through the interpreter for every round-0 knob set at odd sizes (a row count
no multiple of ROWS, odd class counts, more classes than one block, more blocks of rows than programs);
what it refuses, named; candidates through the real gate; a whole `kb run`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelbrain.child.analysis import analyse
from kernelbrain.child.graph import capture
from kernelbrain.core.events import GatePassed, ProblemAnalysed
from kernelbrain.core.graph import Graph
from kernelbrain.core.protocol import GateRequest
from kernelbrain.generators.expert import ExpertGenerator
from kernelbrain.templates.families import cross_entropy
from tests.composed import Lambda, load
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH = ROOT / "tests" / "problems" / "cross_entropy_kernelbench.py"
WEIGHTED = ROOT / "tests" / "problems" / "cross_entropy_weighted.py"
SIGNATURE = {"init": [], "forward": ["x", "t", "w"], "params": []}
IGNORE = 3  # a class index some rows' targets are set to, where a case ignores it


def traced(fn: Callable | torch.nn.Module, *examples: torch.Tensor) -> Graph:
    """The graph of `fn` (a function is wrapped in a module) on meta tensors shaped and typed as
    `examples` (integer targets among them)."""
    model = fn if isinstance(fn, torch.nn.Module) else Lambda(fn)
    return capture(model, [torch.empty_like(x, device="meta") for x in examples])


def inputs(rows: int | None, classes: int, dtype: torch.dtype, ignored: int | None, neg_inf: bool) -> tuple:
    """Logits [rows, classes] ([classes] where rows is None), their targets (every third row's set to
    `ignored`), and class weights."""
    shape = (classes,) if rows is None else (rows, classes)
    x = torch.randn(shape) * 3
    t = torch.randint(0, classes, shape[:-1])
    if neg_inf:  # masked logits: -inf at every fourth class but the target's
        hit = torch.zeros(shape, dtype=torch.bool)
        hit[..., ::4] = True
        hit.view(-1, classes)[torch.arange(t.numel()), t.view(-1)] = False
        x = x.masked_fill(hit, float("-inf"))
    if ignored is not None:
        t.view(-1)[::3] = ignored
    return x.to(dtype), t, (torch.rand(classes) + 0.5).to(dtype)


# (name, fn of logits, targets, weights; targets set to this index on every third row or None; -inf
# logits)
CASES: list[tuple[str, Callable, int | None, bool]] = [
    ("cross entropy, mean", lambda x, t, w: F.cross_entropy(x, t), None, False),
    (
        "log_softmax then nll_loss of a chain, summed",
        lambda x, t, w: F.nll_loss(F.log_softmax(x * 0.7 + 0.1, dim=1), t, reduction="sum"),
        None,
        False,
    ),
    (
        "unreduced, ignore_index",
        lambda x, t, w: F.cross_entropy(x, t, reduction="none", ignore_index=IGNORE),
        IGNORE,
        False,
    ),
    (
        "class weights and ignore_index, mean",
        lambda x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=IGNORE),
        IGNORE,
        False,
    ),
    (
        "class weights, unreduced",
        lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction="none"),
        None,
        False,
    ),
    (
        "a mean of the unreduced losses, scaled, -100 rows ignored",
        lambda x, t, w: F.cross_entropy(x, t, reduction="none").mean() * 0.5,
        -100,
        False,
    ),
    (
        "a sum of the unreduced losses",
        lambda x, t, w: F.cross_entropy(x, t, reduction="none").sum(),
        None,
        False,
    ),
    ("log-probabilities given", lambda x, t, w: F.nll_loss(x, t), None, False),
    ("-inf logits", lambda x, t, w: F.cross_entropy(x, t, reduction="sum"), None, True),
    ("every row ignored: nan", lambda x, t, w: F.cross_entropy(x, t, ignore_index=IGNORE), "all", False),
]
# each case at (rows, classes): 37 rows (no multiple of any ROWS), 45 classes (odd, one block) with
# every round-0 knob set; 5 rows of 2500 classes (more than a block of 1024 or 2048: streamed in
# chunks) with the first two (a whole-row tile, a chunked one)
SIZES = [((37, 45), cross_entropy.ROUND0), ((5, 2500), cross_entropy.ROUND0[:2])]


def check(fn: Callable, ignored: int | str | None, neg_inf: bool, tmp_path: Path, **how) -> None:
    dtype = how.get("dtype", torch.float32)
    tol = how.get("tol", 1e-5)
    sizes = how.get("sizes", SIZES)
    torch.manual_seed(0)
    for (rows, classes), knob_sets in sizes:
        x, t, w = inputs(rows, classes, dtype, None if ignored == "all" else ignored, neg_inf)
        if ignored == "all":
            t.fill_(IGNORE)
        spec = cross_entropy.compose(traced(fn, x, t, w))
        expected = fn(x, t, w)
        if (
            dtype != torch.float32
        ):  # torch sums half losses in half on CPU: the truth is float64's, as the gate's
            expected = fn(x.double(), t, w.double()).to(dtype)
        for knobs in knob_sets:
            name = f"ce_{abs(hash(str(spec) + str(knobs)))}"
            got = load(cross_entropy.render(spec, knobs, SIGNATURE), tmp_path, name).ModelNew()(x, t, w)
            assert got.shape == expected.shape and got.dtype == expected.dtype, (rows, classes, knobs)
            msg = f"{rows}x{classes} {knobs}"
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol, equal_nan=True, msg=msg)


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    out = {name: partial(check, fn, ignored, neg_inf) for name, fn, ignored, neg_inf in CASES}
    few = [((37, 45), cross_entropy.ROUND0[:2]), ((5, 2500), cross_entropy.ROUND0[1:2])]
    for dtype in (torch.float16, torch.bfloat16):
        fn = CASES[0][1]
        out[f"{dtype} logits"] = partial(check, fn, None, False, dtype=dtype, tol=1e-2, sizes=few)
        fn = CASES[3][1]
        out[f"{dtype} logits, class weights"] = partial(
            check, fn, IGNORE, False, dtype=dtype, tol=1e-2, sizes=few
        )
    one_d = [((None, 45), cross_entropy.ROUND0[:2]), ((None, 2500), cross_entropy.ROUND0[1:2])]
    for name, fn in (("1-D logits, mean", CASES[0][1]), ("1-D logits, unreduced", CASES[2][1])):
        out[name] = partial(check, fn, None, False, sizes=one_d)
    # more blocks of rows than a reduced loss's programs: each program sums several (the parts import
    # Triton: here only, in the interpreter's process)
    from kernelbrain.templates.families.cross_entropy import parts as cross_entropy_parts

    many = [((cross_entropy_parts.MAX_PROGRAMS + 77, 3), cross_entropy.ROUND0[1:2])]
    for name, fn, ignored, _ in (CASES[3], CASES[5]):
        out[f"{name}, more row blocks than programs"] = partial(check, fn, ignored, False, sizes=many)
    return out


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_cross_entropy_template")


@pytest.mark.parametrize(
    "name",
    [c[0] for c in CASES]
    + [f"{d} logits{w}" for d in (torch.float16, torch.bfloat16) for w in ("", ", class weights")]
    + ["1-D logits, mean", "1-D logits, unreduced"]
    + [f"{c[0]}, more row blocks than programs" for c in (CASES[3], CASES[5])],
)
def test_every_case_on_every_round0_knob_set(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


def test_the_spec_names_mode_weights_and_chains():
    x, t, w = inputs(6, 9, torch.float32, None, False)
    spec = cross_entropy.compose(traced(lambda x, t, w: F.cross_entropy(x / 2, t, weight=w) * 3, x, t, w))
    assert spec["mode"] == cross_entropy.MEAN and spec["weight"] == {"input": 2} and spec["target"] == 1
    assert spec["prologue"] == ["v4 = (v0 / 2.0)"] and spec["epilogue"] == ["v4 = (v0 * 3.0)"]
    spec = cross_entropy.compose(
        traced(lambda x, t, w: F.cross_entropy(x, t, reduction="none").mean(), x, t, w)
    )
    assert spec["mode"] == cross_entropy.MEAN_ROWS and spec["weight"] is None and spec["log_softmax"]


class _TensorWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(9, device="meta")  # neither parameter nor buffer

    def forward(self, x, t, w):
        return F.cross_entropy(x, t, weight=self.w)


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x, t, w: F.cross_entropy(x, t, label_smoothing=0.1), "label smoothing"),
        (lambda x, t, w: F.cross_entropy(x, torch.softmax(x * 2, dim=1)), "probability targets"),
        (lambda x, t, w: F.nll_loss(torch.log(torch.softmax(x, dim=1)), t), "aten._softmax.default"),
        (lambda x, t, w: F.nll_loss(F.log_softmax(x, dim=0), t), "over dim 0"),
        (lambda x, t, w: F.cross_entropy(x, t.clamp(0, 3)), "a target made by aten.clamp.default"),
        (lambda x, t, w: torch.ops.aten.nll_loss_forward(x, t, None, 1, -100)[1], "total weight"),
        (lambda x, t, w: F.cross_entropy(x, t) + F.cross_entropy(x * 2, t), "2 NLL losses"),
        (lambda x, t, w: F.cross_entropy(x, t) + x.mean(), "not the loss's"),
        (lambda x, t, w: F.cross_entropy(x, t, reduction="none").mean(0, keepdim=True), "over \\[0\\]"),
        (_TensorWeight(), "a tensor attribute"),
    ],
)
def test_what_it_refuses_is_named(fn, why):
    x, t, w = inputs(6, 9, torch.float32, None, False)
    with pytest.raises(ValueError, match=why):
        cross_entropy.compose(traced(fn, x, t, w))


def test_a_loss_over_more_than_two_dims_is_refused_by_name():
    x, t = torch.randn(4, 9, 5), torch.randint(0, 9, (4, 5))
    with pytest.raises(ValueError, match="nll_loss2d"):
        cross_entropy.compose(traced(lambda x, t: F.cross_entropy(x, t), x, t))


def test_feasible_bounds_a_programs_tile_whatever_the_shape():
    spec = {"n_cols": 4096}
    assert all(cross_entropy.feasible(spec, k) for k in cross_entropy.ROUND0)
    assert not cross_entropy.feasible(spec, {**cross_entropy.ROUND0[0], "block": 32768})
    assert not cross_entropy.feasible(spec, {**cross_entropy.ROUND0[1], "num_warps": 16, "block": 256})
    for label, moves in cross_entropy.MUTATIONS.items():
        for move, _ in moves:
            moved = cross_entropy.mutate(cross_entropy.ROUND0[0], move)
            assert moved is not None and moved != cross_entropy.ROUND0[0], (label, move)


def _analysed(path: Path) -> tuple[str, ProblemAnalysed]:
    source = path.read_text()
    return source, ProblemAnalysed(**analyse(source, "cpu"), families=[])


@pytest.mark.parametrize("path", [KERNELBENCH, WEIGHTED])
def test_every_round0_candidate_passes_the_gate(box, path):
    source, analysis = _analysed(path)
    generator = ExpertGenerator()
    family, _ = generator.match_family(analysis, problem_source=source)
    assert family is cross_entropy
    proposals = generator.first_round(analysis, problem_source=source)
    assert [p.knobs for p in proposals] == cross_entropy.ROUND0
    for proposal in proposals:
        request = GateRequest(problem_source=source, cand_source=proposal.source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=300)[0]
        assert reply.passed, (proposal.knobs, reply)


def test_class_weights_the_model_holds_need_its_constructor():
    source, analysis = _analysed(WEIGHTED)
    spec = cross_entropy.matches(analysis.ops, analysis.graph)
    assert spec is not None and spec["weight"] == {"param": "class_weight"}
    assert cross_entropy.refine(spec, None) is None
    with pytest.raises(ValueError, match="refine"):
        cross_entropy.render(spec, cross_entropy.ROUND0[0], analysis.signature)
    refined = cross_entropy.refine(spec, source)
    assert refined is not None and "register_buffer" in refined["init_body"]


def test_kb_run_on_kernelbenchs_cross_entropy_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(KERNELBENCH, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"cross_entropy"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())
