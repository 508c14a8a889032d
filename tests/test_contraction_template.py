"""The contraction family, composed from the traced ATen graph: mm, addmm and bmm with the views
torch.matmul, F.linear and einsum decompose into (transposed operands, a batch of 3-D and 4-D broadcast
inputs) and a pointwise epilogue on the accumulator (a bias, a scale, leaky ReLU, a residual forward
input, a clamp, swish, a parameter) and a tail after it as a second launch (a row sum, a logsumexp, a
centring, reductions in sequence: templates/compose), against torch through the interpreter on round-0
knob sets at sizes no tile divides; fp16 operands; what it refuses, by name; candidates through
the real gate; a whole `kb run`."""

from __future__ import annotations

from collections.abc import Callable
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
from kernelbrain.templates import FAMILIES, compose
from kernelbrain.templates.families import contraction, gemm_epilogue, pointwise
from tests.composed import graph_of, load
from tests.parts_check import assert_composed_of_parts, reachable_knobs
from tests.runs import QUICK_RUNGS, run_checks, run_inprocess

ROOT = Path(__file__).resolve().parents[1]
LINEAR_CHAIN = ROOT / "tests" / "problems" / "contraction_linear_chain.py"
DIVIDE_SUM = ROOT / "tests" / "problems" / "contraction_divide_sum.py"
GROUPNORM = ROOT / "tests" / "problems" / "contraction_groupnorm_hardtanh.py"
NAMES = ["a", "b", "c", "d"]


def _swish(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = F.linear(x, w, bias)
    return torch.sigmoid(y) * y


def _centred(y: torch.Tensor) -> torch.Tensor:
    return y - y.mean(dim=1, keepdim=True)


def _five_reductions(y: torch.Tensor) -> torch.Tensor:
    """KernelBench level 2's 18: sum, max, mean, logsumexp, logsumexp, each over dim 1 kept."""
    y = torch.max(torch.sum(y, dim=1, keepdim=True), dim=1, keepdim=True)[0]
    y = torch.mean(y, dim=1, keepdim=True)
    return torch.logsumexp(torch.logsumexp(y, dim=1, keepdim=True), dim=1, keepdim=True)


def _pool_gelu_scale_max(y: torch.Tensor) -> torch.Tensor:
    """KernelBench level 2's 98 after its matmul: avg_pool1d over the unsqueezed rows, gelu, scale, max."""
    y = F.gelu(F.avg_pool1d(y.unsqueeze(1), kernel_size=3).squeeze(1)) * 2.0
    return torch.max(y, dim=1).values


# name -> (function of the forward inputs, their shapes); M, N, K = 37, 45, 19: no tile divides them
FUNCTIONS: dict[str, tuple[Callable, list[tuple[int, ...]]]] = {
    "mm": (lambda a, b: a @ b, [(37, 19), (19, 45)]),
    "transposed A": (lambda a, b: a.T @ b, [(19, 37), (19, 45)]),
    "transposed B": (lambda a, b: torch.matmul(a, b.T), [(37, 19), (45, 19)]),
    "transposed both": (lambda a, b: a.T @ b.transpose(0, 1), [(19, 37), (45, 19)]),
    "bmm": (torch.bmm, [(3, 37, 19), (3, 19, 45)]),
    "bmm, transposed B": (lambda a, b: torch.bmm(a, b.transpose(1, 2)), [(3, 37, 19), (3, 45, 19)]),
    "3-D by a 2-D weight": (torch.matmul, [(3, 37, 19), (19, 45)]),
    "4-D broadcast matmul": (torch.matmul, [(2, 3, 37, 19), (3, 19, 45)]),
    "einsum": (lambda a, b: torch.einsum("bik,bjk->bij", a, b), [(2, 37, 19), (2, 45, 19)]),
    "linear with bias, scale, leaky relu, residual, clamp": (
        lambda x, w, bias, r: torch.clamp(F.leaky_relu(F.linear(x, w, bias) * 0.5, 0.1) + r, -0.5, 1.0),
        [(37, 19), (45, 19), (45,), (37, 45)],
    ),
    "3-D linear, swish": (_swish, [(2, 5, 19), (45, 19), (45,)]),
    # a tail after the chain, composed by a memory-bound family as a second launch
    "linear, /2, row sum, scale (reduce tail)": (
        lambda x, w: (F.linear(x, w) / 2).sum(dim=1, keepdim=True) * 1.5,
        [(37, 19), (45, 19)],
    ),
    "3-D matmul, sigmoid, sum (reduce tail)": (
        lambda a, b: torch.sigmoid(torch.matmul(a, b)).sum(dim=-1, keepdim=True),
        [(3, 37, 19), (19, 45)],
    ),
    "linear, logsumexp, leaky relu (reduce tail)": (
        lambda x, w, bias: F.leaky_relu(torch.logsumexp(F.linear(x, w, bias), dim=1, keepdim=True), 0.01),
        [(37, 19), (45, 19), (45,)],
    ),
    "linear, x - mean, gelu (normalize tail)": (
        lambda x, w, bias: F.gelu(_centred(F.linear(x, w, bias))),
        [(37, 19), (45, 19), (45,)],
    ),
    "linear, x - amax times a forward input (normalize tail)": (
        lambda x, w, r: (lambda y: (y - y.amax(dim=1, keepdim=True)) * r)(F.linear(x, w)),
        [(37, 19), (45, 19), (37, 45)],
    ),
    "gemm, max, x - mean, gelu (reduce, then normalize)": (
        lambda x, w, bias: F.gelu(_centred(torch.max(F.linear(x, w, bias), dim=1, keepdim=True).values)),
        [(37, 19), (45, 19), (45,)],
    ),
    "gemm, row sum, minus the batch mean, gelu (reduce, then normalize)": (
        lambda x, w, bias: F.gelu((lambda s: s - s.mean())(F.linear(x, w, bias).sum(dim=1))),
        [(37, 19), (45, 19), (45,)],
    ),
    "linear, sum, max, mean, logsumexp, logsumexp (staged tail)": (
        lambda x, w, bias: _five_reductions(F.linear(x, w, bias)),
        [(37, 19), (45, 19), (45,)],
    ),
    "linear, 1-D avg pool, gelu (pool, then pointwise)": (
        lambda x, w, bias: F.gelu(F.avg_pool1d(F.linear(x, w, bias).unsqueeze(1), 4).squeeze(1)),
        [(37, 19), (45, 19), (45,)],
    ),
    "matmul, 1-D avg pool, gelu, scale, max (pool, then reduce: level 2's 98)": (
        lambda x, w: _pool_gelu_scale_max(F.linear(x, w)),
        [(37, 19), (45, 19)],
    ),
}


class LinearParameter(nn.Module):
    """nn.Linear, then swish, then a subtracted nn.Parameter and GELU: the parameters read by name."""

    INIT = (
        "super().__init__()\nself.linear = nn.Linear(19, 45)\nself.subtract = nn.Parameter(torch.randn(45))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(19, 45)
        self.subtract = nn.Parameter(torch.randn(45))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = torch.sigmoid(x) * x
        return F.gelu(x - self.subtract)


class MatmulWeightT(nn.Module):
    """`torch.matmul(x, self.weight.T) + self.bias` over a 3-D input, then hardtanh."""

    INIT = (
        "super().__init__()\nself.weight = nn.Parameter(torch.randn(45, 19))\n"
        "self.bias = nn.Parameter(torch.randn(45))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(45, 19))
        self.bias = nn.Parameter(torch.randn(45))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(torch.matmul(x, self.weight.T) + self.bias, -2.0, 2.0)


class LinearCentredScaled(nn.Module):
    """nn.Linear, then centred along its rows and scaled by a parameter: a tail reading a parameter."""

    INIT = "super().__init__()\nself.linear = nn.Linear(19, 45)\nself.gamma = nn.Parameter(torch.randn(45))"

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(19, 45)
        self.gamma = nn.Parameter(torch.randn(45))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _centred(self.linear(x)) * self.gamma


class LinearGroupNormHardtanh(nn.Module):
    """Level 2's 30: nn.Linear, nn.GroupNorm (its affine parameters read by name), hardtanh."""

    INIT = "super().__init__()\nself.gemm = nn.Linear(19, 45)\nself.group_norm = nn.GroupNorm(5, 45)"

    def __init__(self) -> None:
        super().__init__()
        self.gemm = nn.Linear(19, 45)
        self.group_norm = nn.GroupNorm(5, 45)
        with torch.no_grad():  # not the identity torch initialises them to
            self.group_norm.weight.uniform_(0.5, 1.5)
            self.group_norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(self.group_norm(self.gemm(x)), -0.5, 0.5)


class LinearGroupNormSwish(nn.Module):
    """Level 2's 88 without affine: nn.Linear, a group norm, swish, times a parameter, swish."""

    INIT = (
        "super().__init__()\nself.gemm = nn.Linear(19, 45)\n"
        "self.group_norm = nn.GroupNorm(3, 45, affine=False)\nself.multiply = nn.Parameter(torch.randn(45))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.gemm = nn.Linear(19, 45)
        self.group_norm = nn.GroupNorm(3, 45, affine=False)
        self.multiply = nn.Parameter(torch.randn(45))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group_norm(self.gemm(x))
        y = y * torch.sigmoid(y) * self.multiply
        return y * torch.sigmoid(y)


class LinearBatchNormScale(nn.Module):
    """Level 2's 84 before its softmax, in eval mode (kb times references so): nn.Linear, nn.BatchNorm1d
    by its running statistics, times a parameter."""

    INIT = (
        "super().__init__()\nself.gemm = nn.Linear(19, 45)\nself.bn = nn.BatchNorm1d(45)\n"
        "self.scale = nn.Parameter(torch.ones(1))"
    )

    def __init__(self) -> None:
        super().__init__()
        self.gemm = nn.Linear(19, 45)
        self.bn = nn.BatchNorm1d(45)
        self.scale = nn.Parameter(torch.full((1,), 1.5))
        with torch.no_grad():  # running statistics and affine parameters a batch might have left
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.bn(self.gemm(x))


MODELS: dict[str, tuple[type[nn.Module], list[tuple[int, ...]]]] = {
    "linear, swish, a parameter subtracted, gelu": (LinearParameter, [(37, 19)]),
    "matmul by a parameter's transpose, bias, hardtanh": (MatmulWeightT, [(2, 37, 19)]),
    "linear, centred, scaled by a parameter (normalize tail)": (LinearCentredScaled, [(37, 19)]),
    "linear, group norm, hardtanh (moments, then pointwise)": (LinearGroupNormHardtanh, [(37, 19)]),
    "linear, group norm without affine, swish, a parameter, swish (moments, then pointwise)": (
        LinearGroupNormSwish,
        [(37, 19)],
    ),
    "linear, batch norm in eval mode, scale (moments, then pointwise)": (LinearBatchNormScale, [(37, 19)]),
}


# Every round-0 knob set on these cases; one on each of the others, the knob sets taken in turn. At these
# sizes the knob sets differ in the dot's precision, the operands' layout and the K step (the tiles clip to
# one), which no epilogue, extra tensor or tail reads: each knob set still meets several of them. Round 0's
# split-K sets are not feasible at these shapes (SPLIT_K below runs split-K at a K it cuts unevenly).
EVERY_KNOB_SET = (
    "mm",
    "transposed both",
    "bmm",
    "mm, fp16",
    "linear, group norm, hardtanh (moments, then pointwise)",
)
UNSPLIT = [k for k in contraction.ROUND0 if k["split_k"] == 1]


def knob_sets(names: list[str]) -> dict[str, list[dict]]:
    """The round-0 knob sets each named case runs on (EVERY_KNOB_SET: all; the rest one each, in turn)."""
    n = len(UNSPLIT)
    rest = [name for name in names if name not in EVERY_KNOB_SET]
    return {name: UNSPLIT if name in EVERY_KNOB_SET else [UNSPLIT[rest.index(name) % n]] for name in names}


_SMALL = {"block_m": 16, "block_n": 16, "block_k": 16, "group_m": 8, "num_warps": 4, "num_stages": 2}
# K = 203 in three or four slices of whole 16-steps (80, 80, 43; 64, 64, 64, 11): the last one ragged;
# each case with an epilogue tensor or a tail, which must see the slices' sum, not each slice
SPLIT_K: dict[str, tuple[Callable, list[tuple[int, ...]], list[dict]]] = {
    "split-K: linear with bias, scale, leaky relu, residual, clamp": (
        FUNCTIONS["linear with bias, scale, leaky relu, residual, clamp"][0],
        [(37, 203), (45, 203), (45,), (37, 45)],
        [
            {"strategy": "tf32x3", **_SMALL, "layout": "strided", "split_k": 3},
            {"strategy": "presplit", **_SMALL, "layout": "mn", "split_k": 4},
        ],
    ),
    "split-K: 3-D matmul, sigmoid, sum (reduce tail)": (
        FUNCTIONS["3-D matmul, sigmoid, sum (reduce tail)"][0],
        [(2, 5, 203), (203, 6)],
        [{"strategy": "ieee", **_SMALL, "layout": "k", "split_k": 3}],
    ),
}


# triu/tril in the epilogue on 16 x 16 tiles, so that some tiles lie wholly on the side a triangle zeroes:
# irregular sizes, diagonals -1, 0, 2, 5 and a band, batched (a bmm; a 3-D matmul folded into one mm, its
# rows repeating per batch), a pointwise op before the mask and ops after it that map 0 elsewhere, split-K;
# the precision and layout knobs in turn
TRIANGLES: dict[str, tuple[Callable, list[tuple[int, ...]], dict]] = {
    "triu": (
        lambda a, b: torch.triu(a @ b),
        [(45, 19), (19, 45)],
        {"strategy": "ieee", **_SMALL, "layout": "strided", "split_k": 1},
    ),
    "bmm, + 1, tril_(-1), sigmoid": (
        lambda a, b: torch.sigmoid(torch.bmm(a, b).add(1).tril_(-1)),
        [(2, 37, 19), (2, 19, 45)],
        {"strategy": "tf32x3", **_SMALL, "layout": "k", "split_k": 1},
    ),
    "3-D matmul folded into one mm, triu(2), times 2, plus a forward input": (
        lambda a, b, r: torch.triu(torch.matmul(a, b), 2) * 2 + r,
        [(3, 37, 19), (19, 45), (37, 45)],
        {"strategy": "presplit", **_SMALL, "layout": "mn", "split_k": 1},
    ),
    "triu(-2) of tril(3): a band, minus 1": (
        lambda a, b: torch.triu(torch.tril(a @ b, 3), -2) - 1,
        [(45, 19), (19, 45)],
        {"strategy": "ieee", **_SMALL, "layout": "mn", "split_k": 1},
    ),
    "split-K: tril(5), times 3": (
        lambda a, b: torch.tril(a @ b, 5) * 3,
        [(45, 203), (203, 37)],
        {"strategy": "tf32x3", **_SMALL, "layout": "strided", "split_k": 3},
    ),
}


class _Calls:
    """A jitted helper's stand-in that counts its calls (the interpreter runs a kernel as Python)."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def _tiles(mask: torch.Tensor, size: int) -> int:
    """How many size x size tiles of a [batch, M, N] mask hold a True."""
    b, m, n = mask.shape
    padded = F.pad(mask.int(), (0, -n % size, 0, -m % size))
    return int(padded.reshape(b, -(-m // size), size, -(-n // size), size).amax((2, 4)).sum())


def _triangle_case(name: str, folder: Path) -> None:
    """Against eager, and the K steps the GEMM ran (`_dot_tile`'s calls): those of the tiles where the
    output moves with the product, fewer than all (these cases' bands are exact: no tile runs in vain)."""
    fn, shapes, knobs = TRIANGLES[name]
    spec = compose.contraction.compose(graph_of(fn, *shapes))
    signature = {"init": [], "forward": NAMES[: len(shapes)], "params": []}
    torch.manual_seed(0)
    xs = [torch.randn(s) for s in shapes]
    want = fn(*(x.double() for x in xs))
    new = load(compose.contraction.render(spec, knobs, signature), folder, f"t_{abs(hash(name))}")
    new._dot_tile = steps = _Calls(new._dot_tile)
    got = new.ModelNew()(*xs)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=f"{name} {knobs}")
    moved = fn(xs[0].double() + 1, *(x.double() for x in xs[1:])) != want
    needed = _tiles(moved.reshape(-1, spec["m"], spec["n"]), 16)
    every = _tiles(torch.ones(moved.numel() // (spec["m"] * spec["n"]), spec["m"], spec["n"]), 16)
    k_steps = -(-spec["k"] // 16)
    assert steps.calls == needed * k_steps < every * k_steps, (steps.calls, needed, every, k_steps)


class _Launches:
    """A kernel stand-in that counts its launches and runs the kernel."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def _split_k_case(name: str, folder: Path) -> None:
    fn, shapes, knob_list = SPLIT_K[name]
    spec = compose.contraction.compose(graph_of(fn, *shapes))
    signature = {"init": [], "forward": NAMES[: len(shapes)], "params": []}
    torch.manual_seed(0)
    xs = [torch.randn(s) for s in shapes]
    want = fn(*(x.double() for x in xs))
    for i, knobs in enumerate(knob_list):
        new = load(compose.contraction.render(spec, knobs, signature), folder, f"s{i}_{abs(hash(name))}")
        new._contraction_kernel = gemm = _Launches(new._contraction_kernel)
        new._split_k_sum = summed = _Launches(new._split_k_sum)
        got = new.ModelNew()(*xs)
        assert [g[2] for g in gemm.grids] == [knobs["split_k"]] and len(summed.grids) == 1, (gemm.grids,)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=f"{name} {knobs}")


def _fn_case(name: str, dtype: torch.dtype, knob_sets: list[dict], folder: Path) -> None:
    fn, shapes = FUNCTIONS[name]
    spec = compose.contraction.compose(graph_of(fn, *shapes))
    signature = {"init": [], "forward": NAMES[: len(shapes)], "params": []}
    torch.manual_seed(0)
    xs = [torch.randn(s).to(dtype) for s in shapes]
    want = fn(*(x.double() for x in xs))
    for i, knobs in enumerate(knob_sets):
        new = load(compose.contraction.render(spec, knobs, signature), folder, f"c{i}_{abs(hash(name))}")
        got = new.ModelNew()(*xs)
        assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol, msg=f"{name} {knobs}")


def _model_case(name: str, knob_sets: list[dict], folder: Path) -> None:
    cls, shapes = MODELS[name]
    with torch.device("meta"):
        traced = cls()
    spec = compose.contraction.compose(graph_of(traced, *shapes))
    spec = {**spec, "init_params": "", "init_body": cls.INIT}
    signature = {"init": [], "forward": ["x"], "params": []}
    torch.manual_seed(0)
    ref = cls().double()
    x = torch.randn(shapes[0], dtype=torch.float64)
    for i, knobs in enumerate(knob_sets):
        new = load(
            compose.contraction.render(spec, knobs, signature), folder, f"m{i}_{abs(hash(name))}"
        ).ModelNew()
        new.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
        got = new(x.float())
        torch.testing.assert_close(got.double(), ref(x), rtol=1e-4, atol=1e-4, msg=f"{name} {knobs}")


def checks() -> dict:
    """What runs in one interpreter process (tests.runs.run_checks), by the name its test asks for."""
    half = ("mm", "transposed B", "bmm", "linear, /2, row sum, scale (reduce tail)")
    knobs = knob_sets([*FUNCTIONS, *(f"{name}, fp16" for name in half), *MODELS])
    out = {name: partial(_fn_case, name, torch.float32, knobs[name]) for name in FUNCTIONS}
    out |= {f"{name}, fp16": partial(_fn_case, name, torch.float16, knobs[f"{name}, fp16"]) for name in half}
    out |= {name: partial(_split_k_case, name) for name in SPLIT_K}
    out |= {name: partial(_triangle_case, name) for name in TRIANGLES}
    return out | {name: partial(_model_case, name, knobs[name]) for name in MODELS}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None]:
    return run_checks("tests.test_contraction_template")


@pytest.mark.parametrize("name", list(checks()))
def test_every_case_on_its_round0_knob_sets(interpreted, name):
    assert interpreted[name] is None, interpreted[name]


@pytest.mark.parametrize(
    ("fn", "shapes", "why"),
    [
        (lambda a, b: a @ b @ b, [(5, 5), (5, 5)], "2 contractions"),
        (lambda a, b: (a @ b).cumsum(1), [(5, 4), (4, 6)], "aten.cumsum.default after the contraction"),
        (lambda a, b: (a * 2) @ b, [(5, 4), (4, 6)], "an operand produced by aten.mul.Tensor"),
        (lambda a, b: (a @ b).T.contiguous(), [(5, 4), (4, 6)], "reordering the contraction's result"),
        (lambda a, b: a * b, [(5, 4), (5, 4)], "0 contractions"),
        (lambda a, b: a @ b + a[:, :1], [(5, 5), (5, 5)], "an epilogue tensor made by aten.slice.Tensor"),
        (
            lambda a, b, m, v: F.batch_norm(a @ b, m, v),
            [(5, 4), (4, 6), (6,), (6,)],
            "moments: a norm's weight made by input",
        ),
        (
            lambda a, b: F.avg_pool1d((a @ b).unsqueeze(1), 600),
            [(5, 4), (4, 700)],
            "pool: a window of 600 taps",
        ),
        (
            lambda a, b: torch.triu(torch.bmm(a, b).reshape(10, 6)),
            [(2, 5, 4), (2, 4, 6)],
            "aten.triu.default on axes other than the contraction's rows and columns",
        ),
        (
            lambda a, b: torch.softmax(F.dropout(a @ b, 0.5, training=True), 1),
            [(5, 4), (4, 6)],
            r"aten.bernoulli_.float \(random numbers: dropout in training mode\) after the contraction",
        ),
    ],
)
def test_what_it_refuses_is_named(fn, shapes, why):
    with pytest.raises(contraction.NotContraction, match=why):
        compose.contraction.compose(graph_of(fn, *shapes))


@pytest.mark.parametrize(
    ("fn", "diagonals"),
    [
        (lambda h: torch.triu(h + 1, 2) - 1, [2, None]),
        (lambda h: torch.tril(torch.triu(h, -2), 3), [-2, 3]),
        (lambda h: torch.triu(h) + h, [None, None]),  # read below the diagonal too: every tile runs
        (lambda h: torch.triu(h, 1) + torch.tril(h, -4), [None, None]),  # the band's hull
        (lambda h: torch.triu(torch.tril(h, -3), -1), [1, 0]),  # read nowhere: no tile runs
    ],
)
def test_a_triangle_bands_the_diagonals_whose_tiles_run_the_k_loop(fn, diagonals):
    spec = compose.contraction.compose(graph_of(lambda a, b: fn(a @ b), (5, 4), (4, 6)))
    assert spec["triangle"] == {"rows": [[0, 0]], "diagonals": diagonals}


def test_a_batch_norm_in_training_mode_after_it_is_a_moments_tail_counting_its_batch():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    rest = compose.contraction.compose(graph_of(model, (5, 4)))["tail"]
    assert rest["family"] == "moments" and rest["spec"]["count"] == "1.num_batches_tracked"


def test_every_reachable_knob_set_renders_from_its_parts():
    fn, shapes = FUNCTIONS["linear with bias, scale, leaky relu, residual, clamp"]
    spec = compose.contraction.compose(graph_of(fn, *shapes))
    signature = {"init": [], "forward": NAMES, "params": []}
    for knobs in reachable_knobs(contraction):
        source = compose.contraction.render(spec, knobs, signature)
        # the one generated function, the traced chain, apart; all else is the parts module's
        traced = contraction.epilogue(spec)
        assert not spec["helpers"] and traced in source
        made = assert_composed_of_parts(
            source.replace(traced, ""), contraction.PARTS, knobs, (pointwise.PARTS,)
        )
        assert "_contraction_kernel" in made.kernels


def test_round0_is_feasible_at_the_traced_shapes_and_large_tiles_are_not():
    spec = {"m": 4096, "n": 4096, "k": 4096, "batch": 1, "extras": [[], [], []]}
    assert len(contraction.ROUND0) <= 6
    assert [k for k in contraction.ROUND0 if compose.contraction.feasible(spec, k)] == UNSPLIT
    huge = {**UNSPLIT[0], "block_m": 256, "block_n": 256, "num_warps": 4}
    assert not compose.contraction.feasible(spec, huge)


def test_split_k_only_where_few_output_tiles_meet_a_long_k():
    long_k = {"m": 256, "n": 256, "k": 524288, "batch": 1, "extras": []}  # level 1's 6
    split = [k for k in contraction.ROUND0 if k["split_k"] > 1]
    assert split and all(compose.contraction.feasible(long_k, k) for k in split)
    for shape in ({"k": 4096}, {"m": 4096, "n": 4096}, {"batch": 128}):  # short K; many tiles
        assert not any(compose.contraction.feasible({**long_k, **shape}, k) for k in split), shape


def test_gemm_epilogue_keeps_the_linear_relu_divide_it_was_measured_on():
    names = [f.FAMILY for f in FAMILIES]
    assert names.index("gemm_epilogue") < names.index("contraction")
    assert names.index("gemv") < names.index("contraction") < names.index("pointwise")
    assert gemm_epilogue.FAMILY == "gemm_epilogue"


def test_every_round0_candidate_of_a_linear_chain_passes_the_gate(box):
    source = LINEAR_CHAIN.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.contraction.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and len(spec["extras"]) == 3  # the bias, the scale, the residual
    spec = compose.contraction.refine(spec, source)
    assert spec is not None
    for knobs in UNSPLIT:
        new_source = compose.contraction.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_linear_chain_no_hand_written_family_covers(tmp_path):
    state = run_inprocess(LINEAR_CHAIN, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"contraction"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_every_round0_candidate_of_a_divide_sum_tail_passes_the_gate(box):
    source = DIVIDE_SUM.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.contraction.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["tail"]["family"] == "reduce"
    spec = compose.contraction.refine(spec, source)
    assert spec is not None
    for knobs in UNSPLIT:
        new_source = compose.contraction.render(spec, knobs, analysis["signature"])
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)


def test_kb_run_on_a_divide_sum_tail(tmp_path):
    state = run_inprocess(DIVIDE_SUM, tmp_path / "kb.db", max_candidates=2, rungs=QUICK_RUNGS)
    assert {c.proposal.family for c in state.candidates.values()} == {"contraction"}
    assert state.finished is not None and state.finished.winner
    assert all(isinstance(c.gate, GatePassed) for c in state.candidates.values())


def test_every_round0_candidate_of_a_group_norm_tail_passes_the_gate(box):
    source = GROUPNORM.read_text()
    analysis = analyse(source, "cpu")
    spec = compose.contraction.matches(analysis["ops"], Graph.model_validate(analysis["graph"]))
    assert spec is not None and spec["tail"]["family"] == "moments"
    assert spec["tail"]["then"]["family"] == "pointwise"
    spec = compose.contraction.refine(spec, source)
    assert spec is not None and "init_body" in spec
    for knobs in UNSPLIT:
        new_source = compose.contraction.render(spec, knobs, analysis["signature"])
        assert "self.group_norm.weight" in new_source  # ModelNew's parameter, read as kb's subset reads it
        request = GateRequest(problem_source=source, cand_source=new_source, device="cpu", seeds=3)
        reply = box.call(request, timeout_s=120)[0]
        assert reply.passed, (knobs, reply)
