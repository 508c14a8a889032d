"""The benchmark screen: a benchmarked shape's first outputs against the reference's, for faults that show
only at scale."""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelbrain.child.loading import (
    CandidateFault,
    Problem,
    outputs,
)
from kernelbrain.child.regime import in_regime
from kernelbrain.child.tolerance import same_as_reference
from kernelbrain.core.problem import shape_label

# a benchmark shape's outputs fail only past this many times the gate's tolerance (see screen)
SCREEN = 10


_SLICE = 1 << 24  # elements compared at once: no temporaries the size of a large output


AT_SCALE = (
    "a fault only at this size? (a wait on programs that never ran, a 32-bit offset, tiles never written)"
)
# what a timed call's wrong outputs point at: its inputs' contents changed in place since the last call
CHANGED = "a result kept from an earlier call, or a path taken only when unwatched?"


def _rms(e: torch.Tensor, rows: int) -> float:
    """The RMS of an output's finite elements, a slice at a time."""
    total, count = 0.0, 0
    for es in torch.split(e, rows):
        es = es[torch.isfinite(es)].to(torch.float64)
        total, count = total + float(es.square().sum()), count + es.numel()
    return math.sqrt(total / count) if count else 0.0


def expected_outputs(problem: Problem, ref: torch.nn.Module, inputs: list[Any]) -> list[torch.Tensor]:
    """The reference's outputs a screen compares with, its contractions in the accuracy regime measured at
    the primary shape (IEEE float32 where that is IEEE, whatever the library picks at this shape)."""
    with in_regime(problem.accuracy):
        return outputs(ref(*inputs))


def screen(
    problem: Problem,
    shape: dict,
    got: list[torch.Tensor],
    expected: list[torch.Tensor],
    when: str = "",
    hint: str = AT_SCALE,
) -> None:
    """A benchmark shape's first outputs against the reference's, on the device. The gate checked the
    candidate closely (float64, several draws) at its small shapes; here only errors SCREEN times its
    tolerance fail: those a kernel makes only at scale (a grid-wide wait on programs that never ran,
    a 32-bit offset that wrapped, tiles never written), where eager's own rounding is far inside.

    Two tests, each at SCREEN x tol: elementwise (|g - e| <= tol + tol |e|), and per line of the last
    dimension, the error's RMS against the reference's (floored at 1e-3 of the whole output's). The
    second sees what an absolute tolerance cannot: a softmax row of 393216 columns holds values near
    2.5e-6, so a row normalised by half its sum is wrong by far less than 1e-3 at every element."""
    where = f"benchmark shape {shape_label(shape)}{when}"
    if len(got) != len(expected):
        raise CandidateFault(
            "mismatch", f"{where}: {len(got)} outputs, the reference returns {len(expected)}"
        )
    # a regime that rounds the reference's contractions (core/accuracy.py): the candidate and the reference
    # each err by about its measured error, relative to the output's scale
    regime = SCREEN * 2 * problem.accuracy.error if problem.accuracy is not None else 0.0
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        same_as_reference(i, g, e, f"{where}: ")
        if e.numel() == 0:
            continue
        tol = SCREEN * problem.tolerance_of(e.dtype)  # the reference's dtype, never the candidate's
        wide = torch.float64 if torch.float64 in (g.dtype, e.dtype) else torch.float32
        g, e = g.detach(), e.detach()
        if g.dim() < 2:  # one line
            g, e = g.reshape(1, -1), e.reshape(1, -1)
        rows = max(1, _SLICE // max(1, e[0].numel()))
        scale = regime * _rms(e, rows) if regime else 0.0
        bad, err_rms, ref_rms = 0, [], []
        for gs, es in zip(g.split(rows), e.split(rows), strict=True):
            gs, es = gs.reshape(-1, gs.shape[-1]).to(wide), es.reshape(-1, es.shape[-1]).to(wide)
            # where the reference is not finite, any value goes (the gate judged those)
            finite = torch.isfinite(es)
            near = torch.isclose(gs, es, rtol=tol, atol=tol)
            if regime:
                near |= (gs - es).abs() <= scale + regime * es.abs()
            bad += int((finite & ~near).sum())
            es = torch.where(finite, es, 0)
            err_rms.append(torch.where(finite, gs - es, 0).square().mean(-1).sqrt())  # NaN in gs stays NaN
            ref_rms.append(es.square().mean(-1).sqrt())
        err, ref = torch.cat(err_rms), torch.cat(ref_rms)
        floor = 1e-3 * float(ref.square().mean().sqrt())  # the whole output's RMS: lines are equally long
        lines = int((~(err <= max(tol, regime) * ref.clamp_min(floor))).sum())
        if bad or lines:
            raise CandidateFault(
                "mismatch",
                f"{where}: output {i} differs from the reference at {bad} of {e.numel()} elements and in "
                f"{lines} of {len(err)} lines by more than {SCREEN}x the tolerance ({tol:g}): {hint}",
            )
