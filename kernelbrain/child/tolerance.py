"""The gate's tolerance rule: how far from float64 truth a candidate's output element may be.

An element passes where the truth is not finite (nothing to match), or where its error against the truth
is within either bound:

- KernelBench's allclose: |g - t| <= tol + tol |t|, tol the tolerance of the reference output's dtype
  (1e-4 for float32, 1e-2 for float16 and bfloat16; a problem's KB_TOLERANCE overrides it);
- REFERENCE_MULTIPLE times the reference's own error there: the reference run at its own dtype (the
  user's PyTorch, what the candidate replaces) against the same truth. An element where the reference
  happened to round exactly right would allow nothing, so its error is floored at the median of the
  reference's errors over that output where the truth is not zero (an output's exact zeros, such as the
  upper half of a triangular product, are no measure of its precision), and at the element's spread:
  how far the float64 truth moves when the inputs move by about one rounding of their dtype (the RMS
  over three random draws of it, judge.nudged).
  That is the error any correct computation in that dtype may make there, large only where huge terms
  cancel: on the heavy-tailed draws an H100 failed correct float32 matmuls and convolutions at 1 to 1157
  elements of millions so, the reference's own error small there by luck and the median set by
  ordinary elements.

The dtype is the reference's: an output of another dtype or shape is refused before any error is computed
(`same_as_reference`), so an fp16 output for an fp32 problem is never judged at fp16's tolerance.

The first bound alone fails correct kernels wherever the reference itself fails it (a float32 sum over
K = 4096 near zero, bfloat16 attention's one rounding of P); the second alone would allow nothing where
the reference is exact. Precision downgrades stay out: TF32 or 16-bit arithmetic in a float32 problem
errs by thousands of times float32's rounding, far past the multiple.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernelbrain.child.loading import CandidateFault
from kernelbrain.core.problem import REFERENCE_MULTIPLE

__all__ = ["REFERENCE_MULTIPLE", "Comparison", "compare", "same_as_reference"]


class Comparison(NamedTuple):
    """One output against the truth: which elements fail, and the worst errors."""

    failed: int
    numel: int
    max_abs_err: float  # |g - t| where |t| <= 1, |g - t| / |t| above: the error at the truth's scale
    max_rel_err: float  # |g - t| / |t|
    unwritten: int  # non-finite where the truth is finite


def compare(
    got: torch.Tensor,
    truth: torch.Tensor,
    native: torch.Tensor,
    tol: float,
    spread: torch.Tensor | None = None,
) -> Comparison:
    """`got` and `native` (the reference at its own dtype) against the float64 `truth`, by the rule above;
    `spread`, where given, each element's error scale (the rule's third floor)."""
    g = got.detach().to(torch.float64)
    t = truth.to(torch.float64)
    finite = torch.isfinite(t)
    err = (g - t).abs()
    ref_err = torch.where(finite & torch.isfinite(native), (native.detach().to(torch.float64) - t).abs(), 0)
    # the floor: the reference's typical error where the truth is not zero. An output's exact zeros (the
    # upper half of a triangular product) are right in every computation and say nothing of its
    # precision: they would sink the median to nothing, and a correct kernel's rounding elsewhere would
    # fail. Elements the reference computes exactly where the truth is not zero still count
    measured = ref_err[finite & (t != 0)]
    floor = float(measured.median()) if measured.numel() else 0.0
    allowed = ref_err.clamp_min(floor)
    if spread is not None:
        allowed = torch.maximum(allowed, spread.to(torch.float64))
    bound = torch.maximum(tol + tol * t.abs(), REFERENCE_MULTIPLE * allowed)
    ok = ~finite | (err <= bound)  # a NaN error is never <= a bound
    err = err.masked_fill(~finite, 0)
    # the absolute error reported at the truth's scale, as the rule's bound tol + tol |t| reads: absolute
    # where |t| <= 1, relative above (the draws reach 1e32, where an absolute error says nothing)
    mixed = err / t.abs().clamp_min(1.0)
    rel = (err / t.abs().clamp_min(1e-12)).masked_fill(~finite, 0)
    return Comparison(
        failed=int((~ok).sum()),
        numel=ok.numel(),
        max_abs_err=float(mixed.max()) if err.numel() else 0.0,
        max_rel_err=float(rel.max()) if rel.numel() else 0.0,
        unwritten=int((finite & ~torch.isfinite(g)).sum()),
    )


def same_as_reference(k: int, got: torch.Tensor, native: torch.Tensor, where: str = "") -> None:
    """Output `k` has the reference's own dtype and shape, before any error is computed: an fp16 output
    for an fp32 problem would otherwise be judged at fp16's tolerance, and a broadcastable shape
    compared as if it were the reference's. A `mismatch`: the output is not the reference's."""
    if got.dtype != native.dtype:
        raise CandidateFault(
            "mismatch",
            f"{where}output {k} is {str(got.dtype).removeprefix('torch.')}; the reference returns "
            f"{str(native.dtype).removeprefix('torch.')}",
        )
    if got.shape != native.shape:
        raise CandidateFault(
            "mismatch",
            f"{where}output {k} has shape {tuple(got.shape)}, expected {tuple(native.shape)}",
        )
