"""The gate's tolerance rule (kernelbrain/child/tolerance.py) and its wide-range draws.

A correct float32 sum over a long K fails a plain allclose against float64 truth where the output is
near zero (the float32 reference fails it there too); within 16x the reference's own error it passes.
A precision downgrade and a softmax that never subtracts its row max still fail."""

from __future__ import annotations

from pathlib import Path

import torch

from kernelbrain.child.draws import SPANS, span_limit, variant
from kernelbrain.child.tolerance import REFERENCE_MULTIPLE, compare
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime.sandbox import Sandbox

HERE = Path(__file__).resolve().parent
SOFTMAX = (HERE / "problems" / "softmax_small.py").read_text()
GOOD_SOFTMAX = (HERE / "candidates" / "good_softmax.py").read_text()
# the batched GEMV of bmv_small at K = 4096: long float32 sums, outputs near zero
BMV = (
    (HERE / "problems" / "bmv_small.py")
    .read_text()
    .replace(
        'KB_SMOKE_SHAPE = {"batch": 3, "M": 19, "K": 333}',
        'KB_SMOKE_SHAPE = {"batch": 4, "M": 64, "K": 4096}',
    )
    # its own draw sums each product twice with opposite signs: every output is 0 exactly, and a float32
    # sum over K = 4096 of products near 1e4 errs far past allclose's 1e-4 there, as the reference does
    # (a passing gate reports the errors of the problem's own and the heavy-tailed draws)
    .replace(
        "    return [torch.rand(batch, M, K), torch.rand(batch, K, 1)]",
        "    a, x = 100 * torch.randn(batch, M, K // 2), 100 * torch.randn(batch, K // 2, 1)\n"
        "    return [torch.cat([a, a], 2), torch.cat([x, -x], 1)]",
    )
)

GEMV = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gemv(a_ptr, x_ptr, y_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, LOW: tl.constexpr):
    b, pm = tl.program_id(0), tl.program_id(1)
    rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + b * M * K + rows[:, None] * K + cols[None, :],
                    mask=(rows[:, None] < M) & (cols[None, :] < K), other=0.0)
        x = tl.load(x_ptr + b * K + cols, mask=cols < K, other=0.0)
        if LOW:  # the precision downgrade: bfloat16 operands
            a = a.to(tl.bfloat16).to(tl.float32)
            x = x.to(tl.bfloat16).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(y_ptr + b * M + rows, acc, mask=rows < M)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B, M, K = A.shape
        A, x = A.contiguous(), x.contiguous()
        y = torch.empty(B, M, 1, dtype=A.dtype, device=A.device)
        _gemv[(B, triton.cdiv(M, 32))](A, x, y, M, K, BLOCK_M=32, BLOCK_K=128, LOW=LOW)
        return y
"""

NO_MAX_SOFTMAX = GOOD_SOFTMAX.replace("z = x - tl.max(x, axis=0)", "z = x")


def _gate(box: Sandbox, problem: str, source: str) -> dict:
    args = {"problem_source": problem, "cand_source": source, "device": "cpu", "seeds": 3}
    return box.call(GateRequest(**args), timeout_s=300)[0].model_dump()


def _bmv_draw(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(truth, float32 reference, a tiled float32 sum like a kernel's, a bfloat16 one) on a draw."""
    torch.manual_seed(0)
    a, x = variant([torch.rand(4, 64, 4096), torch.rand(4, 4096, 64)], seed)
    truth, ref = torch.bmm(a.double(), x.double()), torch.bmm(a, x)
    tiled = sum(torch.bmm(a[:, :, k : k + 32], x[:, k : k + 32]) for k in range(0, 4096, 32))
    low = torch.bmm(a.bfloat16(), x.bfloat16()).float()
    return truth, ref, tiled, low


def test_a_correct_long_float32_sum_passes_where_plain_allclose_fails() -> None:
    truth, ref, tiled, _ = _bmv_draw(2)
    plain = ~torch.isclose(tiled.double(), truth, rtol=1e-4, atol=1e-4)
    assert int(plain.sum()) > 0  # what the old rule rejected
    assert int((~torch.isclose(ref.double(), truth, rtol=1e-4, atol=1e-4)).sum()) > 0  # the reference too
    c = compare(tiled, truth, ref, 1e-4)
    assert c.failed == 0 and c.unwritten == 0
    assert c.max_abs_err > 1e-4


def test_a_correct_triangular_product_passes_where_half_the_truth_is_exact_zeros() -> None:
    """tril(A @ B) of lower-triangular A and B: the zeros above the diagonal are exact in every computation
    and measure nothing of the reference's precision; floored by them, the bound of an element the
    reference happened to round well would allow a correct kernel's rounding nothing. A bfloat16 product
    still fails."""
    n = 512
    torch.manual_seed(2)
    a, b = variant([torch.rand(n, n), torch.rand(n, n)], 2)  # a wide draw: products near 1e4
    a, b = torch.tril(a), torch.tril(b)
    truth, ref = torch.tril(a.double() @ b.double()), torch.tril(a @ b)
    tiled = torch.tril(sum(a[:, k : k + 32] @ b[k : k + 32] for k in range(0, n, 32)))  # a kernel's order
    errs = (ref.double() - truth).abs()
    assert float(errs.median()) < 1e-3 * float(errs[errs > 0].median())  # the zeros sink the plain median
    assert compare(tiled, truth, ref, 1e-4).failed == 0
    low = compare(torch.tril((a.bfloat16() @ b.bfloat16()).float()), truth, ref, 1e-4)
    assert low.failed > low.numel // 4, low


def _cancelling(seed: int) -> tuple[torch.Tensor, ...]:
    """A float32 product where four rows hold two huge terms that cancel (as the heavy-tailed draws' do
    at a few elements): (truth, the reference, a blocked kernel's sum that adds 16 blocks onto the huge
    partial sum, a bfloat16 product, a TF32 one, the spread)."""
    from kernelbrain.child import judge

    torch.manual_seed(seed)
    n, k = 256, 512
    a, b = torch.randn(n, k), torch.randn(k, n)
    rows = torch.randperm(n)[:4]
    a[rows, 0], a[rows, 1] = 1e5, 1e5 * (1 + torch.randn(4) * 1e-7)
    b[0], b[1] = 1.0, -1.0
    truth, ref = a.double() @ b.double(), a @ b
    blocked = a[:, :1] @ b[:1]
    for j in range(2, k, 32):
        blocked = blocked + a[:, j : j + 32] @ b[j : j + 32]
    blocked = blocked + a[:, 1:2] @ b[1:2]
    low = (a.bfloat16() @ b.bfloat16()).float()
    cut = (a.view(torch.int32) & -8192).view(torch.float32) @ (b.view(torch.int32) & -8192).view(
        torch.float32
    )
    gaps = [
        judge.apart(judge.nudged(a, "cpu", s) @ judge.nudged(b, "cpu", s), truth) for s in range(judge.NUDGES)
    ]
    return truth, ref, blocked, low, cut, torch.stack(gaps).square().mean(0).sqrt()


def test_a_correct_sum_whose_huge_terms_cancel_passes_within_its_spread() -> None:
    """Where huge terms cancel, a correct float32 kernel that sums in another order than the reference errs
    by their rounding, far past the reference's own error there (small by luck) and its median: an H100
    failed correct matmuls and convolutions at 1 to 1157 such elements of millions. The spread (how far
    the truth moves when the inputs move by a rounding) floors the bound there; TF32 and bfloat16 still
    fail nearly everywhere."""
    truth, ref, blocked, low, cut, spread = _cancelling(0)
    assert compare(blocked, truth, ref, 1e-4).failed > 500  # the old rule, on those four rows
    assert compare(blocked, truth, ref, 1e-4, spread).failed == 0
    for downgrade in (low, cut):
        c = compare(downgrade, truth, ref, 1e-4, spread)
        assert c.failed > c.numel * 0.9, c


def test_elements_the_reference_copies_exactly_still_floor_the_bound() -> None:
    """Where most of an output is computed exactly (nonzero copies) and a few elements err, the few do
    not widen the bound of the exact ones: an error the reference never makes there still fails."""
    truth = torch.linspace(0.5, 1.5, 1000, dtype=torch.float64)
    ref = truth.float()
    ref[:100] += 0.01  # a tenth of the elements err
    got = truth.float() + 0.1  # wrong everywhere by 0.1 (about 10%)
    assert compare(got, truth, ref, 1e-4).failed >= 900


def test_a_precision_downgrade_fails_on_every_draw() -> None:
    for seed in (1, 2):
        truth, ref, _, low = _bmv_draw(seed)
        c = compare(low, truth, ref, 1e-4)
        assert c.failed > c.numel // 4, (seed, c)


def test_where_the_reference_is_exact_only_allclose_remains() -> None:
    truth = torch.linspace(-3, 3, 101, dtype=torch.float64)
    exact = truth.float()  # a ReLU-like reference: no arithmetic, no error beyond the cast
    assert compare(exact, truth, exact, 1e-4).failed == 0
    off = exact + 1e-3  # an error the reference never makes, past allclose at |t| < 9
    c = compare(off, truth, exact, 1e-4)
    assert c.failed == 101
    # a reference error floors every element's bound at its median times the multiple
    noisy = exact + torch.full_like(exact, 1e-3)
    assert compare(off, truth, noisy, 1e-4).failed == 0
    assert compare(exact + REFERENCE_MULTIPLE * 1.1e-3, truth, noisy, 1e-4).failed == 101


def test_wide_draws_are_signed_and_span_the_range() -> None:
    (x,) = variant([torch.rand(100_000)], 2)
    assert bool((x < 0).any()) and bool((x > 0).any())
    assert 50 < float(x.abs().max()) <= SPANS[0]
    assert float(x.abs().min()) < 0.02
    (y,) = variant([torch.rand(100_000)], 2, span=3.0)
    assert float(y.abs().max()) <= 3.0
    (z,) = variant([torch.rand(100_000)], 1, span=1e38)
    assert bool((z < 0).any()) and bool((z > 0).any())
    assert 0.8 < float(z.abs().median()) < 1.25  # odd seeds: a normal-like body, half of it under 1
    assert float(z.abs().max()) > 1e4  # and a Pareto tail: one element in n near n
    (w,) = variant([torch.rand(100_000)], 2, span=1e38)
    assert float(w.abs().max()) > 1e37 and bool(torch.isfinite(w).all())
    (h,) = variant([torch.rand(100_000, dtype=torch.float16)], 2, span=1e38)
    assert bool(torch.isfinite(h).all()) and float(h.abs().max()) <= span_limit(torch.float16)


def test_the_gate_passes_a_correct_gemv_over_k_4096(box: Sandbox) -> None:
    r = _gate(box, BMV, "LOW = False\n" + GEMV)
    assert r["passed"] is True, r
    assert r["max_abs_err"] > 1e-4  # past the plain tolerance somewhere, inside the rule


def test_the_gate_fails_a_bfloat16_gemv(box: Sandbox) -> None:
    r = _gate(box, BMV, "LOW = True\n" + GEMV)
    assert (r["passed"], r["category"]) == (False, "mismatch"), r
    assert "16x the reference's own error" in r["detail"]


def test_the_gate_fails_a_softmax_without_its_row_max(box: Sandbox) -> None:
    r = _gate(box, SOFTMAX, NO_MAX_SOFTMAX)
    assert r["passed"] is False, r
    # exp overflows on the heavy-tailed draw's outliers: the problem's own [0, 1) draw passes
    assert r["category"] == "nan" and "seed 1" in r["detail"], r


def test_the_exported_harness_states_the_same_rule() -> None:
    from kernelbrain.views import export_harness

    within = vars(export_harness)["_kb_within"]  # the harness's names are private by design
    for seed in (1, 2):
        truth, ref, tiled, low = _bmv_draw(seed)
        for got in (tiled, low, ref):
            c = compare(got, truth, ref, 1e-4)
            assert within(got, truth, ref, 1e-4, REFERENCE_MULTIPLE) == (c.failed, c.max_abs_err)
    truth, ref, blocked, low, _, spread = _cancelling(0)
    for got in (blocked, low):
        c = compare(got, truth, ref, 1e-4, spread)
        assert within(got, truth, ref, 1e-4, REFERENCE_MULTIPLE, spread) == (c.failed, c.max_abs_err)
    # and it draws its spread as the judge does
    nudged = vars(export_harness)["_kb_nudged"]
    from kernelbrain.child import judge

    x = torch.randn(64, 32)
    assert all(torch.equal(nudged(x, s), judge.nudged(x, "cpu", s)) for s in range(judge.NUDGES))
